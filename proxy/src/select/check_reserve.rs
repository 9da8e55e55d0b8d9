//! The health checks' descriptor reserve (issue 12 item 1), on wire's [`Reserve`]. When the
//! process has run out (EMFILE: a flood holds every descriptor it may open), a check that met
//! the shortage gives one back and runs again on it, so a master that dies during the
//! exhaustion is still found DOWN (and a healthy one still passes); right after the check the
//! descriptor is taken back. Topped up before every check.

use saltgate_wire::reserve::Reserve;

/// Descriptors held back: enough for the checks of a few master ports at once.
pub const RESERVED: usize = 4;

/// The process's reserve.
static GLOBAL: Reserve = Reserve::new(RESERVED);

/// Tops the process's reserve up (see [`Reserve::refill`]).
pub fn refill() {
    GLOBAL.refill()
}

/// Gives one of the process's reserved descriptors back (see [`Reserve::release_one`]).
pub fn release_one() -> bool {
    GLOBAL.release_one()
}
