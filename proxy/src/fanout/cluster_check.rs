//! Refuses `mode: fanout` on masters that are not one Salt cluster (docs/fanout.md, "Refusing a
//! non-cluster master set").
//!
//! A fan-out minion receives every master's publishes, so every master must encrypt them with the
//! key the minion holds: the cluster AES key of a Salt 3008 cluster. saltgate holds no key, but it
//! can see which key a master *signs* with. A master answers a clear `_auth` whose minion id it
//! refuses (an id with a `/`, `salt/utils/verify.py` `valid_id`) before any key lookup, with
//! `{"enc": "clear", "load": msgpack({"ret": False, "nonce": <ours>}), "sig": ...}` signed by its
//! master key (`salt/master.py`, `AuthFuncs._auth_impl_sync` and `_clear_signed_sync`, Salt
//! 3008.5); in a cluster that key *is* the cluster key (`salt/crypt.py` `MasterKeys`:
//! `self.cluster_key = self.key = ...`), shared by every member. RSA PKCS#1 v1.5 signatures are
//! deterministic, so the same request (one nonce for all) gives byte-identical signatures from the
//! members of one cluster and different ones from masters with their own keys.
//!
//! The request creates nothing on the master: no key is stored (the id is refused first), the
//! master logs one `Authentication request from invalid id` line. A master that cannot be asked
//! (down, not answering, or answering unsigned: Salt before version 2 requests) is not evidence
//! either way: it is reported, not refused; two masters that sign differently are refused.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use saltgate_wire::envelope::{map, text, Reply, RequestEnvelope};
use saltgate_wire::transport::{Prober, Transport};

/// The minion id of the check: Salt refuses any id with a `/` before looking at keys.
pub const CHECK_ID: &str = "saltgate/cluster-check";

/// The check's `_auth` request with `nonce` (the same for every master of one check).
pub fn request(nonce: &str) -> RequestEnvelope {
    RequestEnvelope::clear(map(vec![
        ("cmd", text("_auth")),
        ("id", text(CHECK_ID)),
        ("nonce", text(nonce)),
        ("enc_algo", text("OAEP-SHA1")),
        ("sig_algo", text("PKCS1v15-SHA1")),
        ("pub", text("")),
    ]))
}

/// What one master's answer says about its signing key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The signature over the refusal: equal bytes, same key.
    Signed(Vec<u8>),
    /// It answered without a signature, or not to this request: nothing to compare.
    Unusable(String),
    /// It could not be asked.
    Failed(String),
}

/// Reads a master's reply to [`request`].
pub fn interpret(reply: &Reply) -> Answer {
    match reply {
        Reply::Envelope {
            enc, sig: Some(s), ..
        } if enc == "clear" && !s.is_empty() => Answer::Signed(s.clone()),
        Reply::Envelope { .. } => Answer::Unusable("its _auth refusal is not signed".into()),
        Reply::Text(t) => Answer::Unusable(format!("it answered {t:?}")),
        _ => Answer::Unusable("its reply is not an _auth refusal".into()),
    }
}

/// The verdict over every master's answer: `Err(refusal)` when two masters sign with different
/// keys, else `Ok(notes)` naming the masters that could not be compared (empty: all agree).
pub fn judge(answers: &[(String, Answer)]) -> Result<Vec<String>, String> {
    let mut groups: Vec<(&[u8], Vec<&str>)> = Vec::new();
    let mut notes = Vec::new();
    for (name, a) in answers {
        match a {
            Answer::Signed(sig) => match groups.iter_mut().find(|(s, _)| *s == sig.as_slice()) {
                Some((_, names)) => names.push(name),
                None => groups.push((sig, vec![name])),
            },
            Answer::Unusable(why) | Answer::Failed(why) => {
                notes.push(format!("master {name} not compared: {why}"))
            }
        }
    }
    if groups.len() > 1 {
        let keys: Vec<String> = groups.iter().map(|(_, names)| names.join(", ")).collect();
        return Err(format!(
            "listeners.publish.mode: fanout needs the masters to be one Salt cluster (one cluster key), \
             but they sign with {} different keys (masters grouped by key: {}); a minion behind the \
             fan-out would receive publishes it cannot decrypt. Make them one cluster (cluster_id, \
             cluster_peers and a shared cluster_pki_dir), list only the masters of one cluster, or set \
             listeners.publish.mode: l4",
            groups.len(),
            keys.join(" | ")
        ));
    }
    Ok(notes)
}

/// A fresh nonce for one check (it need not be secret, only the same for every master of it).
fn nonce() -> String {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{:032x}", t ^ ((std::process::id() as u128) << 96))
}

/// Asks every master (`(name, request address)`) at once, each bounded by `handshake` (connect and
/// ZMTP handshake: a stopped master fails here) and `timeout` (the answer), and judges.
pub async fn check(
    masters: &[(String, SocketAddr)],
    handshake: Duration,
    timeout: Duration,
) -> Result<Vec<String>, String> {
    let req = request(&nonce());
    let mut set = tokio::task::JoinSet::new();
    for (i, (name, addr)) in masters.iter().enumerate() {
        let (req, name, addr) = (req.clone(), name.clone(), *addr);
        set.spawn(async move {
            // ZeroMQ until the proxy reads `transport` (issue 27).
            let probe = Transport::default();
            let a = match probe.request(addr, handshake, timeout, &req).await {
                Ok(reply) => interpret(&reply),
                Err(e) => Answer::Failed(e.to_string()),
            };
            (i, name, a)
        });
    }
    let mut answers = Vec::new();
    while let Some(r) = set.join_next().await {
        if let Ok(a) = r {
            answers.push(a);
        }
    }
    answers.sort_by_key(|(i, _, _)| *i);
    let answers: Vec<(String, Answer)> = answers.into_iter().map(|(_, n, a)| (n, a)).collect();
    judge(&answers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signed(b: &[u8]) -> Answer {
        Answer::Signed(b.to_vec())
    }

    #[test]
    fn one_key_passes_and_unreachable_masters_are_noted_not_refused() {
        let a = [
            ("m1".to_string(), signed(b"k1")),
            ("m2".to_string(), signed(b"k1")),
            ("m3".to_string(), Answer::Failed("connect: refused".into())),
        ];
        let notes = judge(&a).unwrap();
        assert_eq!(notes, vec!["master m3 not compared: connect: refused"]);
    }

    #[test]
    fn two_keys_are_refused_naming_the_groups_and_the_fix() {
        let a = [
            ("m1".to_string(), signed(b"k1")),
            ("m2".to_string(), signed(b"k2")),
            ("m3".to_string(), signed(b"k1")),
        ];
        let e = judge(&a).unwrap_err();
        assert!(e.contains("listeners.publish.mode: fanout"), "{e}");
        assert!(e.contains("2 different keys"), "{e}");
        assert!(e.contains("m1, m3 | m2"), "{e}");
        assert!(e.contains("mode: l4"), "{e}");
    }

    #[test]
    fn unsigned_and_text_replies_are_not_evidence() {
        let r = Reply::Envelope {
            enc: "clear".into(),
            load: text("x"),
            sig: None,
        };
        assert!(matches!(interpret(&r), Answer::Unusable(_)));
        assert!(matches!(
            interpret(&Reply::Text("bad load".into())),
            Answer::Unusable(_)
        ));
    }

    #[test]
    fn the_request_uses_an_id_salt_refuses_before_any_key_lookup() {
        let v = request("abc").to_value();
        let load = saltgate_wire::envelope::get(&v, "load").unwrap();
        let id = saltgate_wire::envelope::get(load, "id").and_then(saltgate_wire::envelope::as_str);
        assert!(id.unwrap().contains('/'));
        assert_eq!(
            saltgate_wire::envelope::get(load, "nonce").and_then(saltgate_wire::envelope::as_str),
            Some("abc")
        );
    }
}
