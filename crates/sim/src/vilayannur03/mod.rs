//! The 2003 discretionary caching model (Vilayannur, Sivasubramaniam,
//! Kandemir, Thakur & Ross 2003): one application node with a local cache,
//! a global cache below it, and I/O servers, running out-of-core array
//! sweeps. The caches are the core's: the local cache is a
//! [`parcache_core::Cache`] (LRU, write-back), the global cache is
//! [`parcache_core::cooperative::global::GlobalCache`] with the runtime
//! bypass and `harvest`, and hints are [`parcache_core::bypass`]'s segment
//! bits. Request times come from the paper's own measurements (Table 1 and
//! 2), fitted per case as a fixed cost plus a cost per KiB.

pub mod costs;
pub mod model;
pub mod workload;
