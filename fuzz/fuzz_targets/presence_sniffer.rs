//! Arbitrary bytes as the client → master stream of a request connection, cut into arbitrary
//! chunks, through the presence sniffer (`saltgate_wire::sniff`): no panic, the verdict does not
//! depend on the chunking, the sniffer never holds more than its budget, and an id it reports is
//! one Salt would accept.
//!
//! Input: one byte picking the budget, one seeding the chunk sizes, then the stream. Seeds
//! (`seeds/presence_sniffer/`) are real `_auth` and `aes` streams with those two bytes in front.
#![no_main]

use libfuzzer_sys::fuzz_target;
use saltgate_wire::envelope;
use saltgate_wire::sniff::{self, Sniffer, Verdict};

fuzz_target!(|data: &[u8]| {
    let [knob, seed, stream @ ..] = data else {
        return;
    };
    let budget = [sniff::MIN_BUDGET, 1024, sniff::DEFAULT_BUDGET][usize::from(knob % 3)];
    let whole = sniff::sniff(stream, budget);
    let mut s = Sniffer::new(budget);
    let mut x = u32::from(*seed) | 1;
    let mut at = 0;
    while at < stream.len() {
        // A small LCG: chunks of 1 to 97 bytes.
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let n = ((x >> 16) as usize % 97 + 1).min(stream.len() - at);
        let before = s.verdict().clone();
        let now = s.feed(&stream[at..at + n]).clone();
        if before.is_final() {
            assert_eq!(now, before, "a final verdict changed");
        }
        assert!(s.buffered() <= budget, "holds {} > {budget}", s.buffered());
        at += n;
    }
    assert_eq!(s.verdict(), &whole, "chunking changed the verdict");
    if s.verdict().is_final() {
        assert_eq!(s.buffered(), 0, "the buffer outlived the verdict");
    }
    if let Verdict::Found(f) = &whole {
        assert!(sniff::valid_id(&envelope::text(&f.id)).is_some(), "{:?}", f.id);
    }
});
