//! Arbitrary bytes through the ZMTP frame decoder, message assembler and command parser.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use saltgate_wire::zmtp::command::Command;
use saltgate_wire::zmtp::frame::{Frame, FrameDecoder, MessageAssembler};

fuzz_target!(|data: &[u8]| {
    // Feed in two chunks to exercise partial-input paths too.
    let split = data
        .first()
        .map(|b| usize::from(*b))
        .unwrap_or(0)
        .min(data.len());
    let (a, b) = data.split_at(split);
    let dec = FrameDecoder::new(4096);
    let mut asm = MessageAssembler::new(16, 8192);
    let mut buf = BytesMut::from(a);
    for chunk in [b, &[][..]] {
        loop {
            // `bytes_needed` agrees with `decode`: 0 exactly when a frame is ready, an error
            // exactly when decode errs; and decode never reserves for an announced body.
            let needed = dec.bytes_needed(&buf);
            let capacity = buf.capacity();
            let decoded = dec.decode(&mut buf);
            match (&needed, &decoded) {
                (Ok(0), Ok(Some(_))) | (Err(_), Err(_)) => {}
                (Ok(n), Ok(None)) if *n > 0 => assert_eq!(buf.capacity(), capacity),
                other => panic!("bytes_needed and decode disagree: {other:?}"),
            }
            match decoded {
                Ok(Some(Frame::Command(body))) => {
                    if let Ok(cmd) = Command::parse(&body) {
                        // Re-encoding what we parsed must parse back to the same command.
                        let again = Command::parse(&cmd.encode_body().freeze());
                        assert_eq!(again.as_ref().ok(), Some(&cmd));
                    }
                }
                Ok(Some(Frame::Message { body, more })) => {
                    if asm.push(body, more).is_err() {
                        return;
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
        buf.extend_from_slice(chunk);
    }
});
