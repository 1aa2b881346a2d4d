//! Biswas, Ramakrishnan, Towsley and Krishna 1993, "Performance Benefits
//! of Non-Volatile Caches in Distributed File Systems": the synthetic
//! open–close session workload ([`workload`]) and the client–server
//! system with volatile read caches and NV write caches at both levels
//! ([`model`]), built on the core's caches, write policies and `sprite`
//! server half.

pub mod model;
pub mod workload;
