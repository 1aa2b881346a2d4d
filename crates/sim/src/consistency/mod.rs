//! The consistency plug-ins in the simulator (Vilayannur et al. 2005 §3.6;
//! DESIGN.md §3): a model of several nodes and a server running the core's
//! plug-ins over a modelled network ([`model`]), and a checker of the
//! histories each plug-in promises ([`history`]).

pub mod history;
pub mod model;
