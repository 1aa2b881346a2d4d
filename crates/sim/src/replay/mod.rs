//! Trace replay (docs/advisor.md): a real trace ([`crate::trace`]) run
//! through the core's caches and consistency plug-ins on a modelled
//! cluster ([`cluster`]) under one combination of policies ([`choice`]),
//! measuring time, disk traffic and hit ratios ([`model`]); [`advise`]
//! sweeps the combinations a trace's sharing allows and ranks them.

pub mod advise;
pub mod choice;
pub mod cluster;
pub mod model;

pub use choice::Choice;
pub use cluster::ClusterModel;
pub use model::{replay, Outcome, ReplayError};
