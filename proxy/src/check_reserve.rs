//! A few descriptors held back for health checks (issue 12 item 1). When the process has run out
//! (EMFILE: a flood holds every descriptor it may open), a check that met the shortage gives one
//! back and runs again on it, so a master that dies during the exhaustion is still found DOWN (and
//! a healthy one still passes); right after the check the descriptor is taken back. The reserve is
//! handles on `/dev/null`, topped up before every check.

use std::fs::File;
use std::sync::Mutex;

/// Descriptors held back: enough for the checks of a few master ports at once.
pub const RESERVED: usize = 4;

static HELD: Mutex<Vec<File>> = Mutex::new(Vec::new());

fn held() -> std::sync::MutexGuard<'static, Vec<File>> {
    HELD.lock().unwrap_or_else(|p| p.into_inner())
}

/// Tops the reserve up to [`RESERVED`]; stops at the first descriptor it cannot open (the
/// shortage goes on: it is topped up at a later check).
pub fn refill() {
    let mut h = held();
    while h.len() < RESERVED {
        match File::open("/dev/null") {
            Ok(f) => h.push(f),
            Err(_) => break,
        }
    }
}

/// Gives one reserved descriptor back to the process; false when the reserve is empty.
pub fn release_one() -> bool {
    held().pop().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_topped_up_and_given_back_one_at_a_time() {
        refill();
        let mut n = 0;
        while release_one() {
            n += 1;
        }
        assert_eq!(n, RESERVED);
        assert!(!release_one());
        refill();
        assert!(release_one());
        refill();
    }
}
