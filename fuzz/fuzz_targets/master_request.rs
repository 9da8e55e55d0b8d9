//! Arbitrary bytes through saltgate-master's request decoder (what the request port parses
//! before any state is touched): it must refuse or accept, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use saltgate_master::request::{decode_request, Request};
use saltgate_wire::envelope;

fuzz_target!(|data: &[u8]| {
    match decode_request(data) {
        Ok(Request::Clear { cmd, load }) => {
            assert!(cmd == "_auth" || cmd == "ping", "clear allowlist bypassed: {cmd:?}");
            assert!(load.is_map());
        }
        Ok(Request::Aes { id, .. }) => {
            assert!(saltgate_master::id::validate_minion_id(&id).is_ok());
        }
        Err(refusal) => {
            // The reply must encode.
            let _ = envelope::encode(&refusal.reply);
        }
    }
});
