//! The architecture and workload of Kotz & Ellis 1992 ("Caching and
//! writeback policies in parallel file systems"): a shared-memory
//! multiprocessor whose processes write one file through a shared cache
//! onto parallel independent disks (§3.1), with the write-only patterns
//! `lw1`, `seg` and `gw` (§3.2).
//!
//! The model is the paper's queueing model plus, optionally, two per-call
//! CPU costs ([`Overheads`]) that stand for what the BBN GP1000 testbed
//! spent in software. With both at zero the model is the bare architecture
//! (lw1 writing 4000 one-block records to 30 ms disks takes exactly 120 s).

mod calibration;
mod model;
mod params;

pub use calibration::{fit, Fit, FIT_CELLS};
pub use model::{run, KotzResult};
pub use params::{Compute, KotzParams, OverheadDist, Overheads, ParamError, Pattern};
