//! How big the node cache is. Which policies a file's blocks get is the
//! catalogue's business ([`FilePolicies`], parsed in `parcache-core`).

pub use parcache_core::FilePolicies;
use parcache_core::Span;

/// How the node cache is built.
#[derive(Clone, Debug)]
pub struct NodeCacheConfig {
    /// Bytes of each pool (one pool per combination of policies in use).
    pub pool_bytes: u64,
    /// Block size of the node cache.
    pub block_size: u32,
    /// Block accesses in progress at once, per pool.
    pub lanes: usize,
    /// The syncer interval: dirty blocks older than this go down whatever
    /// the write policy (Unix's update daemon).
    pub syncer: Span,
    /// Auxiliary buffers per pool: a dirty block that must leave is copied
    /// to one and written from there, so the request that needs its buffer
    /// does not wait (delayed clean, Cortes et al. 1996 §6.2).
    pub aux_buffers: usize,
    /// Bytes of this node's share of the global cache (`cooperative=global`,
    /// Vilayannur et al. 2003).
    pub global_bytes: u64,
    /// The node's durable write cache for `nv=on` files (`--nv-dir`,
    /// `--nv-mib`); without one such files are written through, durably.
    pub nv: Option<crate::NvConfig>,
    /// Read a random reader's missed blocks from the part files of data
    /// servers on this machine, without asking them (`--no-local-reads`
    /// turns it off; `crate::local_part`).
    pub local_reads: bool,
}

impl Default for NodeCacheConfig {
    fn default() -> Self {
        NodeCacheConfig {
            pool_bytes: 64 << 20,
            block_size: 64 << 10,
            lanes: 64,
            syncer: Span::from_secs(30),
            aux_buffers: 16,
            global_bytes: 64 << 20,
            nv: None,
            local_reads: true,
        }
    }
}
