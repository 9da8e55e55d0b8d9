//! saltgate proxy (being written).
