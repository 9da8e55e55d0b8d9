//! A few descriptors held back for what must keep working when the process runs out (EMFILE:
//! a flood of connections holds every descriptor it may open): the proxy's health checks, the
//! master's CLI socket. The reserve is handles on `/dev/null`; when an operation meets the
//! shortage it gives one back ([`Reserve::release_one`]) and tries again on it, then the
//! reserve is topped up ([`Reserve::refill`]) once descriptors are free again.

use std::fs::File;
use std::sync::Mutex;

/// A reserve of `size` descriptors.
pub struct Reserve {
    held: Mutex<Vec<File>>,
    size: usize,
}

impl Reserve {
    pub const fn new(size: usize) -> Reserve {
        Reserve {
            held: Mutex::new(Vec::new()),
            size,
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Vec<File>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tops the reserve up to its size; stops at the first descriptor it cannot open (the
    /// shortage goes on: it is topped up at a later call).
    pub fn refill(&self) {
        let mut h = self.held();
        while h.len() < self.size {
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

    /// Descriptors held now.
    pub fn held_now(&self) -> usize {
        self.held().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_topped_up_and_given_back_one_at_a_time() {
        let r = Reserve::new(4);
        r.refill();
        assert_eq!(r.held_now(), 4);
        let mut n = 0;
        while r.release_one() {
            n += 1;
        }
        assert_eq!(n, 4);
        assert!(!r.release_one());
        r.refill();
        assert!(r.release_one());
        r.refill();
        assert_eq!(r.held_now(), 4);
    }
}
