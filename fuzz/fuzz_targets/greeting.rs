//! Arbitrary 64-byte greetings through the parser.
#![no_main]

use libfuzzer_sys::fuzz_target;
use saltgate_wire::zmtp::greeting::Greeting;

fuzz_target!(|data: &[u8]| {
    if let Ok(g) = <[u8; 64]>::try_from(data) {
        if let Ok(parsed) = Greeting::parse(&g) {
            let _ = parsed.mechanism.name();
            let _ = parsed.supports_3_1();
        }
    }
});
