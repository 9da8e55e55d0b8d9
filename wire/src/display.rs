//! Text from the network, made safe for a terminal: see [`saltgate_display`] (shared with the
//! configuration's error messages).

pub use saltgate_display::{is_unsafe_for_terminal, terminal_safe};
