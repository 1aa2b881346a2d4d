//! parcache-store: what a parcache server keeps on its local disk.
//!
//! - [`wal`]: the durable write log, replayed at start-up, with a torn or
//!   corrupt tail cut off; [`group`]: group commit over it (one fsync for
//!   many writers). Guarantee: an entry acknowledged by [`GroupLog::append`]
//!   survives a crash of the process or the machine.
//! - [`media`]: the log's storage, real or a crash model that drops unsynced
//!   bytes, for tests.
//! - [`lock`]: one process per directory.
//! - [`blocks`]: the block store, one local file per handle.
//! - [`chunks`]: the content-addressed chunk store (CAPFS, 2005), one local
//!   file per chunk named by its blake3 hash.

pub mod blocks;
pub mod chunks;
pub mod group;
pub mod lock;
pub mod media;
pub mod wal;

pub use blocks::{BlockStore, DIRECT_ALIGN};
pub use chunks::{chunk_hash, ChunkHash, ChunkStats, ChunkStore};
pub use group::GroupLog;
pub use lock::lock_dir;
pub use media::{CrashMedia, CrashMode, FileMedia, Media};
pub use wal::{Entry, Replay, Wal};
