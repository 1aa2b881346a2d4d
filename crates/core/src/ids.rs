//! The names the core gives things: files, nodes, processes, buffers and
//! I/Os. A leaf module (it imports nothing of the core), so the cache, the
//! policies and the consistency protocols can all use it without importing
//! each other.

/// Identifies a file to the core. The drivers map their own handles to it
/// (the daemons use the metadata server's handle).
pub type FileId = u64;

/// A node: a client machine, or a mount (each mount has its own cache).
pub type NodeId = u64;

/// Identifies a process (or any independent requester) to a cache.
pub type ProcId = u32;

/// Index of a buffer in a cache, `0..buffers`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BufId(pub u32);

impl BufId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Names one I/O the cache asked for, so its completion can be reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IoToken(pub u64);
