//! The level below a cache, as the driver sees it.

use bytes::Bytes;
use parcache_core::{BlockKey, FileId};
use parcache_mem::Block;
use std::future::Future;
use thiserror::Error;

/// Why the level below could not do what was asked, with the POSIX errno a
/// program should see.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("{message}")]
pub struct BelowError {
    pub errno: i32,
    pub message: String,
}

impl BelowError {
    pub fn io(message: impl Into<String>) -> Self {
        BelowError {
            errno: 5,
            message: message.into(),
        }
    }
}

/// Where a cache's blocks come from and go to.
pub trait Below: Send + Sync + 'static {
    /// Writes the given pieces of block `key` (offset within the block,
    /// bytes) and returns once the level below holds them as durably as it
    /// promises.
    fn write(&self, key: BlockKey, pieces: Vec<(u32, Bytes)>) -> impl Future<Output = Result<(), BelowError>> + Send;
    /// Reads block `key`. An answer shorter than a block means zeros after it.
    fn fetch(&self, key: BlockKey) -> impl Future<Output = Result<Bytes, BelowError>> + Send;
    /// Reads block `key` ahead of need (a prefetch, which no reader waits
    /// for yet); as [`Below::fetch`] unless the level below treats the two
    /// apart.
    fn prefetch(&self, key: BlockKey) -> impl Future<Output = Result<Bytes, BelowError>> + Send {
        self.fetch(key)
    }
    /// Reads block `key` (ahead of need if `prefetch`) into `buf`, whose
    /// bytes are stale, and gives it back with the block's bytes at its
    /// start and how many there are (zeros after them). The cache lends
    /// the block's own buffer (pages on page boundaries: a direct read
    /// may fill it), so a level below that can read straight into it
    /// saves a copy of every byte fetched (issue 14); by default
    /// [`Below::fetch`] or [`Below::prefetch`], then a copy.
    fn fetch_into(
        &self,
        key: BlockKey,
        buf: Block,
        prefetch: bool,
    ) -> impl Future<Output = (Block, Result<usize, BelowError>)> + Send {
        async move {
            let got = if prefetch {
                self.prefetch(key).await
            } else {
                self.fetch(key).await
            };
            copied(buf, got)
        }
    }
    /// Whether [`Below::evicted`] should be told of clean blocks the cache
    /// replaces (a copy per eviction; a cooperative tier wants it).
    fn wants_evictions(&self) -> bool {
        false
    }
    /// The cache replaced clean block `key`, whose bytes were `data`. Must
    /// not block (it runs with the cache locked): spawn any I/O.
    fn evicted(&self, _key: BlockKey, _data: Bytes) {}
    /// The cache was told to drop blocks of `file` (its consistency
    /// plug-in says they may be stale): anything the level below keeps
    /// that stands for the file's bytes as of a moment goes too.
    fn discarded(&self, _file: FileId) {}
}

/// `buf` holding a fetch's bytes (copied), for [`Below::fetch_into`].
pub fn copied(mut buf: Block, got: Result<Bytes, BelowError>) -> (Block, Result<usize, BelowError>) {
    match got {
        Ok(d) => {
            buf.clear();
            buf.extend_from_slice(&d);
            (buf, Ok(d.len()))
        }
        Err(e) => (buf, Err(e)),
    }
}

/// A shared level below is a level below.
impl<T: Below> Below for std::sync::Arc<T> {
    fn write(&self, key: BlockKey, pieces: Vec<(u32, Bytes)>) -> impl Future<Output = Result<(), BelowError>> + Send {
        T::write(self, key, pieces)
    }
    fn fetch(&self, key: BlockKey) -> impl Future<Output = Result<Bytes, BelowError>> + Send {
        T::fetch(self, key)
    }
    fn prefetch(&self, key: BlockKey) -> impl Future<Output = Result<Bytes, BelowError>> + Send {
        T::prefetch(self, key)
    }
    fn fetch_into(
        &self,
        key: BlockKey,
        buf: Block,
        prefetch: bool,
    ) -> impl Future<Output = (Block, Result<usize, BelowError>)> + Send {
        T::fetch_into(self, key, buf, prefetch)
    }
    fn wants_evictions(&self) -> bool {
        T::wants_evictions(self)
    }
    fn evicted(&self, key: BlockKey, data: Bytes) {
        T::evicted(self, key, data)
    }
    fn discarded(&self, file: FileId) {
        T::discarded(self, file)
    }
}
