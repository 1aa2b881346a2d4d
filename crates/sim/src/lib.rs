//! parcache-sim: a deterministic discrete-event simulator that drives the
//! same policy code as the real file system (`parcache-core`) against
//! modelled hardware (DESIGN.md §4).
//!
//! Parts: the event [`kernel`] (virtual time), FCFS [`resource`]s, [`disk`]
//! models, the [`cache_driver`] every model drives a core cache with, the seeded random source [`rng`], the models of each paper
//! ([`kotz92`]), the consistency plug-ins' model and checker ([`consistency`]), and the named [`scenario`]s that reproduce their tables and
//! figures. Given a seed, every run produces the same result, bit for bit.

pub mod biswas93;
pub mod cache_driver;
pub mod capfs05;
pub mod consistency;
pub mod disk;
pub mod kernel;
pub mod kotz92;
pub mod paca96;
pub mod parallel;
pub mod plot;
pub mod replay;
pub mod resource;
pub mod rng;
pub mod scenario;
pub mod trace;
pub mod vilayannur03;
