//! Salt's `presence_callback` for the `tcp` publish port (`salt/channel/server.py`,
//! `PubServerChannel.presence_callback` in 3008.5): a minion's first message on the publish port
//! is `{"enc": "aes", "load": <{"id", "tok"} encrypted with the publish key>}`; when the `tok`
//! verifies against the minion's accepted key, the connection is tagged with the id, and
//! publishes aimed at that minion are sent to it ([`saltgate_wire::transport::PresenceCheck`]).
//!
//! The publish key is the current one: a minion that authenticated before a rotation still
//! holds its connection's tag (Salt's too); after a reconnect it authenticates again first.

use std::sync::{Arc, OnceLock};

use saltgate_wire::crypticle::Crypticle;
use saltgate_wire::envelope::{self, as_bytes, as_str, get};
use saltgate_wire::rsa::PublicKey;
use saltgate_wire::transport::PresenceCheck;

use crate::id::validate_minion_id;
use crate::keyring::KeyRing;

/// The minion id `hello` (a publish-port message's body, msgpack) proves, if it proves one.
pub fn verify_hello(ring: &KeyRing, hello: &[u8]) -> Option<String> {
    let msg = envelope::decode(hello).ok()?;
    if get(&msg, "enc").and_then(as_str) != Some("aes") {
        return None;
    }
    let ciphertext = get(&msg, "load").and_then(as_bytes)?;
    let load = Crypticle::new(ring.aes.current())
        .loads(ciphertext, None)
        .ok()?;
    let id = get(&load, "id").and_then(as_str)?.to_string();
    let tok = get(&load, "tok").and_then(as_bytes)?;
    validate_minion_id(&id).ok()?;
    let accepted = ring.keys.accepted(&id).ok()??;
    if let Err(digest) = ring.toks.known_good(&id, &accepted, tok) {
        let key = PublicKey::from_pem(&accepted).ok()?;
        if key.public_decrypt_x931(tok).ok().as_deref() != Some(b"salt") {
            tracing::warn!(minion = %id, "publish-port hello: tok does not verify against the accepted key");
            return None;
        }
        ring.toks.remember(&id, digest);
    }
    Some(id)
}

/// A [`PresenceCheck`] for a publish server bound before the master's keys exist: it verifies
/// nothing until [`LateRing::set`] (the port is not announced to minions before that).
#[derive(Debug, Clone, Default)]
pub struct LateRing(Arc<OnceLock<Arc<KeyRing>>>);

impl LateRing {
    pub fn set(&self, ring: Arc<KeyRing>) {
        let _ = self.0.set(ring);
    }

    pub fn check(&self) -> PresenceCheck {
        let cell = self.0.clone();
        PresenceCheck::new(move |hello| verify_hello(cell.get()?, hello))
    }
}
