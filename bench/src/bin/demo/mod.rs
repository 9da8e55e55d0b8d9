//! `saltgate-demo`'s parts: one side (a saltgate and its swarm) in `side`, the job stream around
//! the kill and its analysis in `stream`, the table and the verdict in `report`. The binary's
//! root (`saltgate-demo.rs`) starts the masters and runs the phases.

pub mod report;
pub mod side;
pub mod stream;
