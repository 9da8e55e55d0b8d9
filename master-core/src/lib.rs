//! saltgate-master: a Salt-wire-compatible master. Work in progress (issue 8).
