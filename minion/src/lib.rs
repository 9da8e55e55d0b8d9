//! saltgate-minion: a Salt-wire-compatible minion. Work in progress (issue 9).
