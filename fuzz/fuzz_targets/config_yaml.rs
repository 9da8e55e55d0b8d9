//! Arbitrary text as saltgate YAML: an error or a config, never a panic; a valid config survives
//! a round trip through the emitter.
#![no_main]

use libfuzzer_sys::fuzz_target;
use saltgate_config::{emit, parse, Format};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(l) = parse(text, None, Format::Yaml) {
        let back = parse(&emit::to_yaml(&l.config, "fuzz"), None, Format::Yaml).expect("emitted YAML loads");
        assert_eq!(back.config, l.config);
    }
});
