//! A few descriptors held back for health checks (issue 12 item 1). When the process has run out
//! (EMFILE: a flood holds every descriptor it may open), a check that met the shortage gives one
//! back and runs again on it, so a master that dies during the exhaustion is still found DOWN (and
//! a healthy one still passes); right after the check the descriptor is taken back. The reserve is
//! handles on `/dev/null`, topped up before every check.

use std::fs::File;
use std::sync::Mutex;

/// Descriptors held back: enough for the checks of a few master ports at once.
pub const RESERVED: usize = 4;

/// A reserve of descriptors; the process has one, [`GLOBAL`] (an instance so that tests can
/// hold their own while check loops in the same test binary use the process's).
pub struct Reserve(Mutex<Vec<File>>);

static GLOBAL: Reserve = Reserve::new();

impl Reserve {
    pub const fn new() -> Reserve {
        Reserve(Mutex::new(Vec::new()))
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Vec<File>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tops the reserve up to [`RESERVED`]; stops at the first descriptor it cannot open (the
    /// shortage goes on: it is topped up at a later check).
    pub fn refill(&self) {
        let mut h = self.held();
        while h.len() < RESERVED {
            match File::open("/dev/null") {
                Ok(f) => h.push(f),
                Err(_) => break,
            }
        }
    }

    /// Gives one reserved descriptor back to the process; false when the reserve is empty.
    pub fn release_one(&self) -> bool {
        self.held().pop().is_some()
    }
}

impl Default for Reserve {
    fn default() -> Reserve {
        Reserve::new()
    }
}

/// Tops the process's reserve up (see [`Reserve::refill`]).
pub fn refill() {
    GLOBAL.refill()
}

/// Gives one of the process's reserved descriptors back (see [`Reserve::release_one`]).
pub fn release_one() -> bool {
    GLOBAL.release_one()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a reserve of its own: the check loops of other tests in this binary use the process's.
    #[test]
    fn the_reserve_is_topped_up_and_given_back_one_at_a_time() {
        let r = Reserve::new();
        r.refill();
        let mut n = 0;
        while r.release_one() {
            n += 1;
        }
        assert_eq!(n, RESERVED);
        assert!(!r.release_one());
        r.refill();
        assert!(r.release_one());
        r.refill();
    }
}
