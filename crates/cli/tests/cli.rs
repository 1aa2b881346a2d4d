//! The command line's tests in one binary: each file beside this one is
//! a module (the mount as programs see it, whole clusters, crashes, the
//! tiers, the simulator's commands), sharing `common`. One binary links
//! the client, the servers and the mount once, where eleven did so eleven
//! times, and its tests share the CPUs as they wait on their daemons.

mod common;

mod advise;
mod cas_crash;
mod cluster;
mod cooperative;
mod discretionary;
mod iod_crash;
mod mount;
mod nv;
mod power_cut;
mod replay;
mod sim_cli;
mod trust;
