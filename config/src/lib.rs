//! saltgate configuration (being written).
