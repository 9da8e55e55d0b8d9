//! saltgate-bench: side-by-side benchmarks of saltgate, HAProxy and no proxy at all (issue 11).
//!
//! `runner` runs `scenarios` against `targets` (each proxy a fresh process per run, in front of
//! the fake masters of `backend`, a child process), measures with `measure`/`procfs`, and
//! `report`/`chart` turn the samples into Markdown, JSON and a PNG. The proxy's own hot paths
//! are not benchmarked here (Criterion benches belong beside the proxy's code).

pub mod backend;
pub mod chart;
pub mod client;
pub mod lab;
pub mod measure;
pub mod procfs;
pub mod report;
pub mod runner;
pub mod scenarios;
pub mod stats;
pub mod targets;

/// What can go wrong, with what to do about it where there is something to do.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Io(String),
    #[error("{0}")]
    Proc(String),
    #[error("{0}")]
    Target(String),
    #[error("{0}")]
    Scenario(String),
    #[error("{0}")]
    Chart(String),
    #[error("{0}")]
    NotYet(String),
}
