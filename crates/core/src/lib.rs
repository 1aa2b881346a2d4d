//! parcache-core: the policies and protocol logic of parcache as pure state
//! machines (DESIGN.md §1).
//!
//! Nothing here performs I/O, reads a clock or spawns a thread. Inputs carry
//! the time; outputs are values ([`cache::Effect`]) that a driver carries
//! out. Two drivers exist: the simulator (`parcache-sim`), which executes
//! effects against modelled disks in virtual time, and the daemons, which
//! execute them with real sockets and files. Given the same inputs, the core
//! produces the same outputs, which is what makes simulations repeatable.
//!
//! Parts:
//! - [`block`] and [`stripe`]: byte ranges, blocks, and where blocks live.
//! - [`cache`]: the cache table and its protocol.
//! - [`replacement`], [`write`], [`prefetch`], [`consistency`]: the policy
//!   catalogue, one policy per file, named as DESIGN.md §3 names it;
//!   [`catalogue`] parses their names.
//! - [`cooperative`]: where a node finds a block another node's cache holds
//!   and what becomes of a block it evicts (1996 PACA).
//! - [`bypass`]: which requests go around a cache level (2003
//!   discretionary caching): segment hints, runtime bypass, `harvest`.
//! - [`ids`]: the names of files, nodes, processes, buffers and I/Os.
//! - [`page_cache`]: whether the kernel above a mount keeps a file's pages.
//! - [`trace`]: one recorded file operation (the format `mount --record`
//!   writes and `sim replay` reads).

pub mod block;
pub mod bypass;
pub mod cache;
pub mod catalogue;
pub mod consistency;
pub mod cooperative;
pub mod error;
pub mod ids;
pub mod page_cache;
pub mod prefetch;
pub mod replacement;
pub mod stripe;
pub mod time;
pub mod trace;
pub mod write;

pub use block::{split_blocks, BlockKey, BlockPiece, ByteRange, FileId, RangeSet};
pub use cache::{Access, Begin, BufId, Cache, CacheConfig, CacheStats, Effect, IoToken, ProcId, WriteCause};
pub use catalogue::{FilePolicies, PoolKey, StoreKind};
pub use consistency::ConsistencyKind;
pub use error::{AccessError, PolicyError};
pub use page_cache::PageCache;
pub use prefetch::PrefetchKind;
pub use replacement::ReplacementKind;
pub use stripe::StripeLayout;
pub use time::{Span, Time};
pub use trace::{TraceOp, TraceRecord};
pub use write::WritePolicyKind;
