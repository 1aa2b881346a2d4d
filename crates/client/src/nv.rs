//! The node's durable write cache (`--nv-dir DIR --nv-mib N`): the client
//! non-volatile write cache of Biswas et al. 1993 §2.2, as an append-only,
//! group-committed, fsynced log on the node's own disk (DESIGN.md §2).
//!
//! A write to an `nv=on` file goes into the node cache (its NV pool, of
//! `--nv-mib`), then into this log; it is acknowledged once the log's
//! fsync covers it. When the pool writes a block down (by the file's write
//! policy, a consistency recall, an fsync elsewhere …) it writes it durably
//! to the data servers and then logs that the block is clean. At start the
//! log is replayed: what is not known clean is delivered to the data
//! servers before the node serves anything.
//!
//! Order: one write at a time goes into the pool and gets its number, and
//! entries reach the log in number order, so replay rebuilds exactly the
//! bytes the cache held. A block's clean mark covers the writes numbered
//! below the number taken when its write-down began; the NV pool has no
//! auxiliary buffers, so no write reaches a block while it is being written
//! down, and a write numbered below the mark is in what went down.

use bytes::Bytes;
use parcache_core::{split_blocks, BlockKey, ByteRange, RangeSet};
use parcache_store::{Entry, FileMedia, GroupLog, Wal};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where a node keeps its durable write cache, and how big the cache is.
#[derive(Clone, Debug)]
pub struct NvConfig {
    /// Directory of the log (`DIR/nv.log`), locked while the node runs.
    pub dir: PathBuf,
    /// Bytes of the NV pool: dirty blocks of `nv=on` files held at most.
    pub bytes: u64,
}

/// Index in a clean mark that means every block of the file (it was removed).
const ALL_BLOCKS: u64 = u64::MAX;

/// The log grows to this many times the cache's size before it is
/// rewritten with only what is not clean.
const COMPACT_FACTOR: u64 = 4;
const COMPACT_MIN: u64 = 16 << 20;

/// The bytes of one block not known to be on the data servers.
struct Overlay {
    /// Number of the last write in it.
    seq: u64,
    image: Vec<u8>,
    written: RangeSet,
}

impl Overlay {
    fn apply(&mut self, seq: u64, at: u32, data: &[u8]) {
        self.seq = self.seq.max(seq);
        self.image[at as usize..at as usize + data.len()].copy_from_slice(data);
        self.written.insert(ByteRange::new(at, at + data.len() as u32));
    }

    fn pieces(&self) -> Vec<(u32, Bytes)> {
        self.written
            .ranges()
            .iter()
            .map(|r| {
                (
                    r.start,
                    Bytes::copy_from_slice(&self.image[r.start as usize..r.end as usize]),
                )
            })
            .collect()
    }
}

#[derive(Default)]
struct Live {
    next_seq: u64,
    blocks: HashMap<BlockKey, Overlay>,
}

impl Live {
    fn apply(&mut self, e: &Entry, block_size: u32) {
        match e {
            Entry::NodeWrite {
                seq,
                handle,
                offset,
                data,
            } => {
                let mut at = 0usize;
                for p in split_blocks(*offset, data.len() as u64, block_size) {
                    let n = p.range.len() as usize;
                    let o = self.blocks.entry(BlockKey::new(*handle, p.index)).or_insert(Overlay {
                        seq: *seq,
                        image: vec![0; block_size as usize],
                        written: RangeSet::new(),
                    });
                    o.apply(*seq, p.range.start, &data[at..at + n]);
                    at += n;
                }
                self.next_seq = self.next_seq.max(seq + 1);
            }
            Entry::NodeClean { handle, index, upto } => {
                if *index == ALL_BLOCKS {
                    self.blocks.retain(|k, o| k.file != *handle || o.seq >= *upto);
                } else if let Some(o) = self.blocks.get(&BlockKey::new(*handle, *index)) {
                    if o.seq < *upto {
                        self.blocks.remove(&BlockKey::new(*handle, *index));
                    }
                }
            }
            _ => {}
        }
    }

    /// The live bytes as log entries (what a compaction keeps).
    fn entries(&self) -> Vec<Entry> {
        let mut keys: Vec<_> = self.blocks.iter().map(|(k, o)| (o.seq, *k)).collect();
        keys.sort();
        let mut out = Vec::new();
        for (seq, k) in keys {
            for (at, data) in self.blocks[&k].pieces() {
                out.push(Entry::NodeWrite {
                    seq,
                    handle: k.file,
                    offset: k.index * self.block_size_of(&k) as u64 + at as u64,
                    data,
                });
            }
        }
        out
    }

    fn block_size_of(&self, k: &BlockKey) -> usize {
        self.blocks[k].image.len()
    }
}

/// A block the log holds that the data servers may not have.
pub(crate) struct Undelivered {
    pub(crate) key: BlockKey,
    pub(crate) seq: u64,
    pub(crate) pieces: Vec<(u32, Bytes)>,
}

/// Counters of the durable write cache.
#[derive(Clone, Copy, Debug, Default)]
pub struct NvStats {
    /// Writes acknowledged from the log.
    pub logged_writes: u64,
    pub logged_bytes: u64,
    /// Blocks marked clean after they reached the data servers.
    pub cleaned: u64,
    pub compactions: u64,
    /// Blocks delivered at start from a previous run's log.
    pub replayed: u64,
    /// Blocks the log holds now that the data servers may not have.
    pub live_blocks: u64,
    pub log_bytes: u64,
    pub capacity_bytes: u64,
}

/// The node's durable write cache.
pub(crate) struct Nv {
    log: GroupLog,
    pub(crate) bytes: u64,
    block_size: u32,
    live: Mutex<Live>,
    /// One write at a time goes into the pool and takes its number.
    pub(crate) order: tokio::sync::Mutex<()>,
    /// Sends share it; a compaction holds it alone, so nothing is logged
    /// between its snapshot of the live bytes and its rewrite of the log.
    gate: tokio::sync::RwLock<()>,
    compacting: std::sync::atomic::AtomicBool,
    logged_writes: AtomicU64,
    logged_bytes: AtomicU64,
    cleaned: AtomicU64,
    compactions: AtomicU64,
    pub(crate) replayed: AtomicU64,
    _lock: std::fs::File,
}

impl Nv {
    /// Opens (locks and replays) the log in `cfg.dir`; returns the blocks a
    /// previous run left undelivered, oldest first.
    pub(crate) fn open(cfg: &NvConfig, block_size: u32) -> io::Result<(Nv, Vec<Undelivered>)> {
        let lock = parcache_store::lock_dir(&cfg.dir, "node with this durable write cache (--nv-dir)")?;
        let (wal, replay) = Wal::open(FileMedia::open(&cfg.dir.join("nv.log"))?)?;
        let mut live = Live::default();
        for e in &replay.entries {
            match e {
                Entry::NodeWrite { .. } | Entry::NodeClean { .. } => live.apply(e, block_size),
                other => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "{}: not a node's durable write cache (it holds a data server's entry for handle {})",
                            cfg.dir.join("nv.log").display(),
                            other.handle()
                        ),
                    ))
                }
            }
        }
        let mut left: Vec<Undelivered> = live
            .blocks
            .iter()
            .map(|(k, o)| Undelivered {
                key: *k,
                seq: o.seq,
                pieces: o.pieces(),
            })
            .collect();
        left.sort_by_key(|u| (u.seq, u.key.file, u.key.index));
        let nv = Nv {
            log: GroupLog::start(wal),
            bytes: cfg.bytes,
            block_size,
            live: Mutex::new(live),
            order: tokio::sync::Mutex::new(()),
            gate: tokio::sync::RwLock::new(()),
            compacting: false.into(),
            logged_writes: AtomicU64::new(0),
            logged_bytes: AtomicU64::new(0),
            cleaned: AtomicU64::new(0),
            compactions: AtomicU64::new(0),
            replayed: AtomicU64::new(0),
            _lock: lock,
        };
        Ok((nv, left))
    }

    /// Logs a write the NV pool took (the caller holds [`Nv::order`] across
    /// the pool's write and this call); the returned wait ends once it is
    /// durable.
    pub(crate) async fn log(
        &self,
        handle: u64,
        offset: u64,
        data: &[u8],
    ) -> impl std::future::Future<Output = io::Result<()>> + Send + 'static {
        let _g = self.gate.read().await;
        let sent = {
            let mut live = self.live.lock();
            let e = Entry::NodeWrite {
                seq: live.next_seq,
                handle,
                offset,
                data: Bytes::copy_from_slice(data),
            };
            live.apply(&e, self.block_size);
            self.log.send_buffered(e)
        };
        self.logged_writes.fetch_add(1, Ordering::Relaxed);
        self.logged_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        let log = self.log.clone();
        async move {
            sent.await?;
            log.sync().await
        }
    }

    /// The number a block's write-down takes as it begins.
    pub(crate) fn upto(&self) -> u64 {
        self.live.lock().next_seq
    }

    /// Block `key` is durably on the data servers as of the writes numbered
    /// below `upto`: marked so (durably) in the log.
    pub(crate) async fn cleaned(&self, key: BlockKey, upto: u64) -> io::Result<()> {
        self.mark(key.file, key.index, upto).await
    }

    /// The file was removed: nothing of it is to be delivered.
    pub(crate) async fn forget_file(&self, handle: u64) -> io::Result<()> {
        let upto = self.upto();
        self.mark(handle, ALL_BLOCKS, upto).await
    }

    async fn mark(&self, handle: u64, index: u64, upto: u64) -> io::Result<()> {
        let sent = {
            let _g = self.gate.read().await;
            let mut live = self.live.lock();
            let held = if index == ALL_BLOCKS {
                live.blocks.keys().any(|k| k.file == handle)
            } else {
                live.blocks.contains_key(&BlockKey::new(handle, index))
            };
            if !held {
                return Ok(());
            }
            let e = Entry::NodeClean { handle, index, upto };
            live.apply(&e, self.block_size);
            self.log.send_buffered(e)
        };
        let logged = match sent.await {
            Ok(()) => self.log.sync().await,
            Err(e) => Err(e),
        };
        match logged {
            Ok(()) => {}
            // The block is durably down already: a mark the full disk
            // cannot take only means it is delivered again after a crash.
            // The next compaction drops it from the log.
            Err(e) if e.kind() == io::ErrorKind::StorageFull => {
                tracing::warn!("durable write cache: the log's disk is full; a clean mark waits for compaction");
            }
            Err(e) => return Err(e),
        }
        self.cleaned.fetch_add(1, Ordering::Relaxed);
        self.maybe_compact().await;
        Ok(())
    }

    /// Makes everything logged so far durable (an `fsync` of an `nv=on` file).
    pub(crate) async fn sync(&self) -> io::Result<()> {
        self.log.sync().await
    }

    /// Rewrites the log with only the live bytes once it has grown to
    /// [`COMPACT_FACTOR`] times the cache (in the background: a write-down
    /// calls this and writers wait on write-downs).
    async fn maybe_compact(&self) {
        let due = self.log.bytes() > (COMPACT_FACTOR * self.bytes).max(COMPACT_MIN);
        if due && !self.compacting.swap(true, Ordering::SeqCst) {
            if let Err(e) = self.compact().await {
                tracing::warn!("durable write cache: compaction failed (the log keeps everything): {e}");
            }
            self.compacting.store(false, Ordering::SeqCst);
        }
    }

    /// Rewrites the log with only the live bytes.
    pub(crate) async fn compact(&self) -> io::Result<()> {
        let _alone = self.gate.write().await;
        let entries = self.live.lock().entries();
        self.log.compact(entries).await?;
        self.compactions.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    pub(crate) async fn stats(&self) -> NvStats {
        let live_blocks = self.live.lock().blocks.len() as u64;
        NvStats {
            logged_writes: self.logged_writes.load(Ordering::Relaxed),
            logged_bytes: self.logged_bytes.load(Ordering::Relaxed),
            cleaned: self.cleaned.load(Ordering::Relaxed),
            compactions: self.compactions.load(Ordering::Relaxed),
            replayed: self.replayed.load(Ordering::Relaxed),
            live_blocks,
            log_bytes: self.log.bytes(),
            capacity_bytes: self.bytes,
        }
    }
}

impl crate::Fs {
    /// Delivers what a previous run left in the log to the data servers,
    /// durably, and reports the files' sizes; a file removed meanwhile is
    /// skipped. Fails (keeping everything in the log) if a data server
    /// cannot take it.
    pub(crate) async fn deliver(&self, left: Vec<Undelivered>) -> crate::Result<()> {
        let Some(nv) = &self.nv else { return Ok(()) };
        if left.is_empty() {
            return Ok(());
        }
        tracing::info!(
            "durable write cache: delivering {} blocks a previous run acknowledged",
            left.len()
        );
        let bs = self.cache.block_size as u64;
        let mut touched = Vec::new();
        for u in left {
            let handle = u.key.file;
            let a = match self.getattr(handle).await {
                Ok(a) => a,
                Err(e) if e.code() == Some(parcache_proto::ErrorCode::NotFound) => {
                    tracing::warn!(
                        "durable write cache: handle {handle} was removed meanwhile; its writes are dropped"
                    );
                    nv.forget_file(handle)
                        .await
                        .map_err(|e| crate::FsError::Protocol(e.to_string()))?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            self.state(&a).await?;
            let upto = u.seq + 1;
            for (at, data) in &u.pieces {
                let off = u.key.index * bs + *at as u64;
                self.data.write_with(handle, off, data, true).await?;
                let end = off + data.len() as u64;
                if let Some(st) = self.files.lock().get_mut(&handle) {
                    st.file.wrote(end);
                }
            }
            if !touched.contains(&handle) {
                touched.push(handle);
            }
            nv.cleaned(u.key, upto)
                .await
                .map_err(|e| crate::FsError::Protocol(format!("durable write cache: {e}")))?;
            nv.replayed.fetch_add(1, Ordering::Relaxed);
        }
        for h in touched {
            self.report_attr(h).await?;
        }
        nv.compact()
            .await
            .map_err(|e| crate::FsError::Protocol(format!("durable write cache: {e}")))?;
        Ok(())
    }

    /// Counters of the node's durable write cache, if it has one.
    pub async fn nv_stats(&self) -> Option<NvStats> {
        match &self.nv {
            Some(nv) => Some(nv.stats().await),
            None => None,
        }
    }
}

impl crate::Fs {
    /// The NV pool writes block `key` down: durably on the data servers,
    /// then marked clean in the log (writes numbered from the mark on stay).
    pub(crate) async fn nv_write_down(
        &self,
        key: BlockKey,
        pieces: Vec<(u32, Bytes)>,
    ) -> std::result::Result<(), parcache_driver::BelowError> {
        let upto = self.nv.as_ref().map(|nv| nv.upto());
        let base = key.index * self.cache.block_size as u64;
        let calls = pieces
            .iter()
            .map(|(at, d)| self.data.write_with(key.file, base + *at as u64, d, true));
        for r in parcache_driver::join_all(calls).await {
            r.map_err(crate::data::below_err)?;
        }
        // The size these bytes make must outlive the mark: once clean, the
        // log no longer says how far the file reaches.
        let end = base
            + pieces
                .iter()
                .map(|(at, d)| *at as u64 + d.len() as u64)
                .max()
                .unwrap_or(0);
        let short = self
            .files
            .lock()
            .get(&key.file)
            .is_some_and(|s| s.file.known_size < end && s.file.unreported());
        if short && self.nv.is_some() {
            self.report_attr(key.file).await.map_err(crate::data::below_err)?;
        }
        if let (Some(nv), Some(upto)) = (&self.nv, upto) {
            nv.cleaned(key, upto).await.map_err(|e| parcache_driver::BelowError {
                errno: e.raw_os_error().unwrap_or(5),
                message: format!("durable write cache: marking a block clean: {e}"),
            })?;
        }
        Ok(())
    }

    /// Writes into the NV pool, logged: returns once the log's fsync covers
    /// the write (the acknowledgement of an `nv=on` write).
    pub(crate) async fn nv_write(
        &self,
        pool: &crate::Pool,
        handle: u64,
        offset: u64,
        data: &[u8],
    ) -> crate::Result<()> {
        let nv = self.nv.as_ref().expect("nv_write on a node with a durable write cache");
        let durable = {
            let _one = nv.order.lock().await;
            pool.write(handle, offset, data)
                .await
                .map_err(|e| crate::from_driver(self.what(handle), e))?;
            nv.log(handle, offset, data).await
        };
        let err = match durable.await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if err.kind() == io::ErrorKind::StorageFull {
            // The log's disk is full: the write goes through to the data
            // servers instead (durably), and the log is compacted.
            tracing::warn!(
                "durable write cache: its disk is full; writing {} through to the data servers",
                self.what(handle)
            );
            pool.flush_file(handle)
                .await
                .map_err(|e| crate::from_below(self.what(handle), e))?;
            if let Err(e) = nv.compact().await {
                tracing::warn!("durable write cache: compaction on a full disk: {e}");
            }
            return Ok(());
        }
        Err(crate::FsError::Remote {
            path: self.what(handle),
            code: parcache_proto::ErrorCode::from_errno(err.raw_os_error().unwrap_or(5)),
            message: format!("node's durable write cache: {err}"),
        })
    }

    /// Whether writes of this pool go to the node's durable write cache.
    pub(crate) fn nv_logged(&self, policies: &parcache_core::FilePolicies) -> bool {
        policies.nv && self.nv.is_some()
    }

    /// `fsync` of an `nv=on` file on a node with a durable write cache:
    /// everything logged is durable (it already is once acknowledged).
    pub(crate) async fn nv_sync(&self) -> crate::Result<()> {
        match &self.nv {
            Some(nv) => nv
                .sync()
                .await
                .map_err(|e| crate::FsError::Protocol(format!("node's durable write cache: {e}"))),
            None => Ok(()),
        }
    }

    /// A removed file's logged writes are not to be delivered.
    pub(crate) async fn nv_forget(&self, handle: u64) {
        if let Some(nv) = &self.nv {
            if let Err(e) = nv.forget_file(handle).await {
                tracing::warn!("durable write cache: forgetting removed handle {handle}: {e}");
            }
        }
    }
}

impl crate::Fs {
    /// The durable write cache's counters in the node's statistics: the NV
    /// pools' (hits, absorbed overwrites, write-backs) and the log's.
    pub(crate) fn nv_counters(&self, s: &mut parcache_proto::NodeStats) {
        for (key, pool) in self.pools.lock().iter() {
            if key.4 {
                let c = pool.stats();
                s.nv_hits += c.read_hits;
                s.nv_overwrites += c.overwrites;
                s.nv_write_backs += c.writes;
                s.nv_immediate += c.immediate_writes;
            }
        }
        if let Some(nv) = &self.nv {
            s.nv_capacity_bytes = nv.bytes;
            s.nv_writes = nv.logged_writes.load(Ordering::Relaxed);
            s.nv_live_blocks = nv.live.lock().blocks.len() as u64;
            s.nv_replayed = nv.replayed.load(Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(seq: u64, handle: u64, offset: u64, data: &[u8]) -> Entry {
        Entry::NodeWrite {
            seq,
            handle,
            offset,
            data: Bytes::copy_from_slice(data),
        }
    }

    #[test]
    fn replay_keeps_what_is_not_clean_and_the_last_bytes_win() {
        let mut l = Live::default();
        l.apply(&write(0, 1, 0, b"aaaa"), 8);
        l.apply(&write(1, 1, 2, b"bbbbbbbb"), 8); // blocks 0 and 1
        l.apply(
            &Entry::NodeClean {
                handle: 1,
                index: 0,
                upto: 1,
            },
            8,
        ); // older than seq 1: kept
        l.apply(&write(2, 2, 0, b"c"), 8);
        l.apply(
            &Entry::NodeClean {
                handle: 2,
                index: 0,
                upto: 3,
            },
            8,
        ); // clean
        assert_eq!(l.next_seq, 3);
        let b0 = &l.blocks[&BlockKey::new(1, 0)];
        assert_eq!(b0.pieces(), vec![(0, Bytes::from_static(b"aabbbbbb"))]);
        let b1 = &l.blocks[&BlockKey::new(1, 1)];
        assert_eq!(b1.pieces(), vec![(0, Bytes::from_static(b"bb"))]);
        assert!(!l.blocks.contains_key(&BlockKey::new(2, 0)));
        // Compaction keeps the same live bytes.
        let mut again = Live::default();
        for e in l.entries() {
            again.apply(&e, 8);
        }
        assert_eq!(again.blocks.len(), 2);
        assert_eq!(again.blocks[&BlockKey::new(1, 0)].pieces(), b0.pieces());
        // A removed file's blocks all go.
        l.apply(
            &Entry::NodeClean {
                handle: 1,
                index: ALL_BLOCKS,
                upto: 3,
            },
            8,
        );
        assert!(l.blocks.is_empty());
    }
}
