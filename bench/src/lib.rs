//! saltgate-bench: side-by-side benchmarks. Work in progress (issue 11).
