//! Salt wire protocol (being written).
