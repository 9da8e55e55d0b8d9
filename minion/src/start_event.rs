//! The start event Salt's minion fires on the master once it is connected
//! (`Minion._fire_master_minion_start`, salt/minion.py 3008.5): a `_minion_event` request with
//! `tag` `salt/minion/<id>/start` and `data` `"Minion <id> started at <asctime>"`.
//! `enable_legacy_startup_events` (the old `minion_start` tag) is off by default in Salt and
//! not sent; `start_event_grains` is empty by default in Salt and not sent either.
//!
//! A side effect the master relies on: the request carries the minion's `tok`, so the master
//! checks it (one RSA public operation) here, not on the minion's first `_return`.

use saltgate_wire::envelope::{self, Value};

/// Salt's `tagify([id, "start"], "minion")`.
pub fn tag(id: &str) -> String {
    format!("salt/minion/{id}/start")
}

/// The load before the channel adds `id`, `tok`, `nonce` and `ts` (as Salt's
/// `_fire_master_prepare`: `pretag` None, `data`, `tag`).
pub fn load(id: &str, started: &str) -> Value {
    envelope::map(vec![
        ("cmd", envelope::text("_minion_event")),
        ("pretag", Value::Nil),
        (
            "data",
            envelope::text(&format!("Minion {id} started at {started}")),
        ),
        ("tag", envelope::text(&tag(id))),
    ])
}

/// Python's `time.asctime()` of now, local time: `Mon Nov  2 11:52:35 2026`.
pub fn asctime_now() -> String {
    let mut buf = [0u8; 64];
    // SAFETY: time(2), localtime_r(3) and strftime(3) with a valid `tm` and a buffer of the
    // given size; strftime returns 0 on overflow, handled below.
    let n = unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return String::new();
        }
        libc::strftime(
            buf.as_mut_ptr().cast(),
            buf.len(),
            c"%a %b %e %H:%M:%S %Y".as_ptr(),
            &tm,
        )
    };
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_is_salts_namespaced_start_event() {
        let v = load("web-7", "Mon Nov  2 11:52:35 2026");
        let get = |k: &str| envelope::get(&v, k).cloned();
        assert_eq!(get("cmd"), Some(envelope::text("_minion_event")));
        assert_eq!(get("tag"), Some(envelope::text("salt/minion/web-7/start")));
        assert_eq!(
            get("data"),
            Some(envelope::text(
                "Minion web-7 started at Mon Nov  2 11:52:35 2026"
            ))
        );
        assert_eq!(get("pretag"), Some(Value::Nil));
    }

    #[test]
    fn asctime_has_pythons_shape() {
        let s = asctime_now();
        // "Www Mmm dd hh:mm:ss yyyy": 24 characters, day space-padded.
        assert_eq!(s.len(), 24, "{s:?}");
        let parts: Vec<&str> = s.split_whitespace().collect();
        assert_eq!(parts.len(), 5, "{s:?}");
        assert_eq!(parts[3].matches(':').count(), 2, "{s:?}");
    }
}
