//! Discretionary caching (Vilayannur et al. 2003): a request may go around
//! a cache rather than through it, because caching everything can lose to
//! caching nothing. The decisions are per *segment* of `k` contiguous
//! blocks (default 4, §3), per operation and per level:
//! - [`hints`]: the rules a file carries (setting `bypass`), as text.
//! - [`segments`]: the bits the application sets (a library call, `parcache
//!   hint`, an xattr; a file-wide hint is the coarse form), §3.
//! - [`runtime`]: the runtime's own decision from segment counters and a
//!   threshold, made once per block (§5).
//! - [`harvest`]: the global cache's replacement that prefers blocks whose
//!   segment counter is below the threshold, ageing counters as it scans
//!   (§5).

pub mod harvest;
pub mod hints;
pub mod runtime;
pub mod segments;

use crate::block::BlockKey;
use std::fmt;

/// The paper's segment: 4 contiguous blocks (§3).
pub const DEFAULT_SEGMENT_BLOCKS: u64 = 4;

/// A cache level a request can pass through or go around.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    /// The node's own cache.
    Local,
    /// The global cache: the node memories, hash-placed (the cooperative
    /// tier).
    Global,
}

/// The operation a bypass bit is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Read,
    Write,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Local => "local",
            Level::Global => "global",
        })
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Read => "read",
            Op::Write => "write",
        })
    }
}

/// Where one request goes: through each level, or around it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub local: bool,
    pub global: bool,
}

impl Route {
    /// Through every cache (no bypass).
    pub const CACHED: Route = Route {
        local: true,
        global: true,
    };

    pub fn through(&self, level: Level) -> bool {
        match level {
            Level::Local => self.local,
            Level::Global => self.global,
        }
    }
}

/// A block's segment: (file, block index / segment size).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SegmentKey {
    pub file: u64,
    pub segment: u64,
}

impl SegmentKey {
    /// The segment of `block` for segments of `blocks` blocks (at least 1).
    pub fn of(block: BlockKey, blocks: u64) -> SegmentKey {
        SegmentKey {
            file: block.file,
            segment: block.index / blocks.max(1),
        }
    }
}
