//! The data server (`parcache iod`): holds its stripes of every file.
//!
//! A write is appended to the durable write log (group commit, fsync) and
//! acknowledged only then, so an acknowledged write survives `kill -9` and a
//! power cut. A buffered write (`WriteBuffered`, what node caches send) is
//! acknowledged once written to the log, before the fsync: it survives
//! `kill -9` of the server, and a power cut once a `Sync` (a client's
//! `fsync`) has returned. A buffered write of whole blocks goes straight to
//! the block store instead, with the same promises ([`crate::direct`]).
//! A logged write's bytes then sit in the server's cache (the core's cache,
//! run by `parcache-driver`): clean blocks there are the volatile LRU read
//! cache, dirty ones the durable write cache (their bytes are in the log),
//! whose write-back to the block store follows the server's write policy,
//! `threshold(high=90%,low=50%)` by default, or `periodic` or
//! `lru-writeback` (Biswas et al. 1993 §3). A checkpoint (when the log
//! passes `checkpoint_bytes`, and at shutdown) writes every dirty block
//! down, syncs the files written since the last one and empties the log.
//! It also runs when a file is removed or the disk runs low (so deleting
//! files frees their logged bytes), and once before a write that failed
//! for want of space is tried again. At start the log is replayed into the
//! write cache, not the block store, so a restart on a full disk needs no
//! space; the log is emptied by the next checkpoint.
//!
//! A data server holds the lock `DIR/lock` while it runs (a second one on
//! the same directory is refused) and keeps its place in its cluster in
//! `DIR/identity` (see [`ServerIdentity`]).

use crate::direct::DirectWrites;
use crate::incarnation::Incarnation;
use crate::read_queue::ReadQueue;
use bytes::Bytes;
use parcache_core::{BlockKey, CacheConfig, PrefetchKind, ReplacementKind, WritePolicyKind};
use parcache_driver::{take_ahead::take_ahead, Below, BelowError, Block, Driver, Placed};
use parcache_proto::msg::{ServerIdentity, ServerStats};
use parcache_proto::{serve, ErrorCode, Handler, LocalFile, Request, Response, Secret};
use parcache_store::{BlockStore, ChunkStore, Entry, FileMedia, GroupLog, Wal};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::{watch, RwLock};

/// How a data server runs.
#[derive(Clone, Debug)]
pub struct IodConfig {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub secret: Secret,
    /// Log size that triggers a checkpoint.
    pub checkpoint_bytes: u64,
    /// Bytes of the server's cache (read cache and write cache together).
    pub cache_bytes: u64,
    /// When dirty blocks of the write cache go to the block store.
    pub write_policy: WritePolicyKind,
    /// Read the block store through the kernel's page cache; by default
    /// aligned reads go around it (`O_DIRECT`, where the file system
    /// allows), since the server's own cache keeps what it read.
    pub page_cache_reads: bool,
    /// Let the cache take its memory as blocks fill it. By default the
    /// server takes all of it once it has started, in the background
    /// ([`parcache_driver::take_ahead`]), as a database takes its buffer pool: the
    /// kernel's first touch of each page then costs nothing later, on
    /// the data path.
    pub lazy_cache: bool,
}

impl IodConfig {
    /// Defaults for everything but where to keep data, where to listen and the secret.
    pub fn new(data_dir: PathBuf, listen: SocketAddr, secret: Secret) -> Self {
        IodConfig {
            data_dir,
            listen,
            secret,
            checkpoint_bytes: 64 << 20,
            cache_bytes: 256 << 20,
            write_policy: WritePolicyKind::THRESHOLD_DEFAULT,
            page_cache_reads: false,
            lazy_cache: false,
        }
    }
}

/// Block size of a data server's cache.
pub const IOD_BLOCK: u32 = 64 << 10;

/// Most logged blocks of a part named in an answer to `LocalPart` (8 KiB
/// of them); a part with more is read through the server.
const LOCAL_LOGGED_MOST: usize = 1024;

/// Rounds of writing down and syncing before a checkpoint holds writes,
/// at most; a round after the first starts only while more than
/// [`PRE_CHECKPOINT_LEFT`] bytes are dirty, and its writing down waits at most
/// [`PRE_CHECKPOINT_FLUSH`].
const PRE_CHECKPOINT_ROUNDS: usize = 3;
const PRE_CHECKPOINT_LEFT: usize = 4 << 20;
const PRE_CHECKPOINT_FLUSH: std::time::Duration = std::time::Duration::from_secs(2);

/// The largest part removed on the thread that handles the request; a
/// larger one (whose unlink frees many extents) on a blocking thread.
const REMOVE_IN_PLACE_MAX: u64 = 1 << 20;

/// The block store, as the level below the server's cache.
struct StoreBelow {
    store: Arc<BlockStore>,
    /// Fetches of blocks, merged into runs ([`ReadQueue`]).
    reads: Arc<ReadQueue>,
    /// Handles written since the last checkpoint (to sync then).
    touched: Mutex<HashSet<u64>>,
}

impl Below for StoreBelow {
    async fn write(&self, key: BlockKey, pieces: Vec<(u32, Bytes)>) -> Result<(), BelowError> {
        self.touched.lock().insert(key.file);
        let store = self.store.clone();
        let base = key.index * IOD_BLOCK as u64;
        tokio::task::spawn_blocking(move || {
            for (at, d) in pieces {
                store.write(key.file, base + at as u64, &d)?;
            }
            Ok(())
        })
        .await
        .map_err(io::Error::other)
        .and_then(|r| r)
        .map_err(|e: io::Error| below_err(&format!("block store write of handle {}", key.file), e))
    }

    /// A reader waits for this block: read here if the store is idle
    /// ([`ReadQueue::read_here`]), else in the queue.
    async fn fetch(&self, key: BlockKey) -> Result<Bytes, BelowError> {
        let got = match self.reads.read_here(key.file, key.index) {
            Some(got) => got,
            None => self.reads.fetch(key.file, key.index).await,
        };
        got.map_err(|e| read_err(key, e))
    }

    /// Read ahead: always through the queue, whose readers read a run of
    /// them at once.
    async fn prefetch(&self, key: BlockKey) -> Result<Bytes, BelowError> {
        self.reads
            .fetch(key.file, key.index)
            .await
            .map_err(|e| read_err(key, e))
    }

    /// As [`StoreBelow::fetch`] and [`StoreBelow::prefetch`], read from the
    /// store straight into the cache's buffer for the block (its pages
    /// are aligned for a direct read): the copy of every byte of a cold
    /// read into the cache is gone (issue 14).
    async fn fetch_into(&self, key: BlockKey, buf: Block, prefetch: bool) -> (Block, Result<usize, BelowError>) {
        let here = if prefetch {
            Err(buf)
        } else {
            self.reads.read_here_into(key.file, key.index, buf)
        };
        let (buf, got) = match here {
            Ok(done) => done,
            Err(buf) => self.reads.fetch_into(key.file, key.index, buf).await,
        };
        (buf, got.map_err(|e| read_err(key, e)))
    }
}

/// A failed read of block `key` from the block store.
fn read_err(key: BlockKey, e: io::Error) -> BelowError {
    below_err(&format!("block store read of handle {}", key.file), e)
}

fn below_err(what: &str, e: io::Error) -> BelowError {
    BelowError {
        errno: e
            .raw_os_error()
            .unwrap_or(if e.kind() == io::ErrorKind::StorageFull { 28 } else { 5 }),
        message: format!("{what}: {e}"),
    }
}

struct Iod {
    store: Arc<BlockStore>,
    /// Content-addressed chunks (`store=cas` files).
    chunks: Arc<ChunkStore>,
    cache: Driver<Arc<StoreBelow>>,
    below: Arc<StoreBelow>,
    data_dir: PathBuf,
    log: GroupLog,
    /// What the log holds since the last checkpoint, for direct writes.
    direct: DirectWrites,
    /// Held by a sync (see [`Iod::sync`]).
    syncing: tokio::sync::Mutex<()>,
    /// Writes hold it shared between logging and caching; a checkpoint
    /// holds it exclusively, so everything logged is in the block store
    /// when it syncs.
    gate: RwLock<()>,
    checkpoint_bytes: u64,
    checkpointing: std::sync::atomic::AtomicBool,
    reads: AtomicU64,
    /// Reads answered from the store alone ([`IodHandler::read_pages`]).
    page_reads: AtomicU64,
    writes: AtomicU64,
    /// Syncs asked for (`Request::Sync`).
    syncs: AtomicU64,
    /// Requests answered ([`ServerStats::requests`]).
    requests: AtomicU64,
    identity: Mutex<Option<ServerIdentity>>,
    /// This machine's boot id (empty if unknown): a node whose own matches
    /// may read parts' files itself ([`Request::LocalPart`]).
    boot: String,
    /// Each part's length as its writes, truncates and extensions made it
    /// (dirty bytes in the cache included): a read that needs more than
    /// this finds stripes missing. See [`PartLen`].
    part_len: Mutex<HashMap<u64, PartLen>>,
    /// The disk's free bytes as last asked, when, and the log's size then
    /// (see [`Iod::low_on_space`]).
    free: Mutex<Option<FreeSpace>>,
    /// This start, and whether the one before lost nothing it acknowledged.
    incarnation: Incarnation,
    /// Memory for writes' payloads to land in ([`Iod::landing`]): mostly
    /// what the cache's buffers held before they took a landed block's
    /// memory, kept for the next write.
    spare_blocks: Mutex<Vec<Block>>,
    /// Bytes of written blocks the cache took in the memory they landed in
    /// ([`ServerStats::landed_write_bytes`]).
    landed: AtomicU64,
}

/// Blocks of memory kept for writes to land in, at most (4 MiB).
const SPARE_BLOCKS: usize = 64;

/// What a data server knows of a part's length.
#[derive(Clone, Copy, Debug)]
enum PartLen {
    /// The part's length.
    Known(u64),
    /// At least this long: written to since the server started, the block
    /// store not yet asked (a new file's first write would `stat` a part
    /// that does not exist; the first read asks).
    AtLeast(u64),
}

/// A reading of the disk's free space.
#[derive(Clone, Copy, Debug)]
struct FreeSpace {
    at: std::time::Instant,
    log_bytes: u64,
    free: u64,
}

/// How long a reading of the disk's free space stands, and how many bytes
/// the log may take meanwhile, before the disk is asked again (a `statvfs`
/// on every small write cost a data server 3 % of its time, issue 14).
const FREE_SPACE_FOR: std::time::Duration = std::time::Duration::from_millis(100);
const FREE_SPACE_LOG: u64 = 1 << 20;

/// The file in a data server's directory that names its cluster and index.
const IDENTITY: &str = "identity";

/// Reads `DIR/identity` (`CLUSTER INDEX`), `None` if the server was never adopted.
pub fn read_identity(dir: &std::path::Path) -> io::Result<Option<ServerIdentity>> {
    let p = dir.join(IDENTITY);
    let s = match std::fs::read_to_string(&p) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("{} is damaged: {s:?}", p.display()));
    let (cluster, index) = s.trim().split_once(' ').ok_or_else(bad)?;
    Ok(Some(ServerIdentity {
        cluster: cluster.to_string(),
        index: index.parse().map_err(|_| bad())?,
    }))
}

/// Writes `DIR/identity` durably (a temporary file, synced, renamed over).
fn write_identity(dir: &std::path::Path, id: &ServerIdentity) -> io::Result<()> {
    use std::io::Write;
    let tmp = dir.join("identity.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    writeln!(f, "{} {}", id.cluster, id.index)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(IDENTITY))?;
    std::fs::File::open(dir)?.sync_all()
}

fn io_reply(what: &str, e: io::Error) -> Response {
    let code = if e.kind() == io::ErrorKind::StorageFull {
        ErrorCode::NoSpace
    } else {
        ErrorCode::Io
    };
    Response::error(code, format!("{what}: {e}"))
}

impl Iod {
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&BlockStore) -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(io::Error::other)?
    }

    /// Logs a write (durably, or `buffered` until the next sync), then puts
    /// its bytes in the write cache; a buffered write of whole blocks the
    /// log and the cache hold nothing of goes to the block store directly
    /// ([`crate::direct`]).
    async fn write(self: &Arc<Self>, handle: u64, offset: u64, data: Bytes, buffered: bool) -> io::Result<()> {
        let _g = self.gate.read().await;
        let len = data.len() as u64;
        if buffered && DirectWrites::whole_blocks(offset, len, IOD_BLOCK) && self.may_place(handle, offset, len) {
            return self.write_direct(handle, offset, data).await;
        }
        self.write_logged(handle, offset, data, buffered).await
    }

    /// Whether every block of the range may be written directly: nothing
    /// of it in the log or dirty or busy in the cache, no cut of the part
    /// below it in the log.
    fn may_place(&self, handle: u64, offset: u64, len: u64) -> bool {
        let b = IOD_BLOCK as u64;
        (offset / b..(offset + len) / b).all(|k| {
            self.direct.may_place(handle, k, IOD_BLOCK) && self.cache.clean_or_absent(BlockKey::new(handle, k))
        })
    }

    /// Writes whole blocks straight to the block store, then checks each
    /// again: a block that a concurrent logged write, fetch or cut reached
    /// meanwhile is written through the log and the cache after all (this
    /// write then comes last, in the log and the cache alike). Each other
    /// block replaces the cache's clean copy, or becomes one (the read
    /// cache), before the part's next write goes to the disk: the cache
    /// gets a part's writes in the disk's order (four connections racing
    /// writes of the same blocks left the cache with one writer's bytes
    /// and the disk with another's). Called with the gate held.
    async fn write_direct(self: &Arc<Self>, handle: u64, offset: u64, data: Bytes) -> io::Result<()> {
        let len = data.len() as u64;
        self.direct.placed(handle);
        self.below.touched.lock().insert(handle);
        // On a blocking thread: a page-cache write may wait for the disk
        // (the kernel throttles writers of many dirty pages).
        let iod = Arc::clone(self);
        let b = IOD_BLOCK as usize;
        let (data, busy) = self
            .blocking(move |s| {
                s.write_streamed_then(handle, offset, &mut vec![data], |d| {
                    iod.grow(handle, offset + len);
                    let data = std::mem::take(&mut d[0]);
                    let busy: Vec<usize> = (0..data.len().div_ceil(b))
                        .filter(|&i| {
                            let k = offset / b as u64 + i as u64;
                            let piece = &data[i * b..((i + 1) * b).min(data.len())];
                            !(iod.direct.may_place(handle, k, IOD_BLOCK)
                                && iod.cache.place_clean(BlockKey::new(handle, k), piece) != Placed::Busy)
                        })
                        .collect();
                    (data, busy)
                })
            })
            .await?;
        for i in busy {
            let k = offset / b as u64 + i as u64;
            self.write_logged(handle, k * b as u64, data.slice(i * b..(i + 1) * b), true)
                .await?;
        }
        Ok(())
    }

    /// Buffers for the payload of a buffered write of `len` bytes at
    /// `offset` of `handle` to land in, one per block, if it is of whole
    /// blocks and may go straight to the block store as things stand
    /// ([`Iod::write_landed`] takes it then); `None` otherwise (it lands
    /// in the connection's buffer, as any other).
    fn landing(&self, handle: u64, offset: u64, len: usize) -> Option<Vec<Block>> {
        let (b, len64) = (IOD_BLOCK as usize, len as u64);
        let fits = DirectWrites::whole_blocks(offset, len64, IOD_BLOCK)
            && beyond_limit("write", handle, offset, len64).is_none()
            && self.may_place(handle, offset, len64);
        if !fits {
            return None;
        }
        let mut spare = self.spare_blocks.lock();
        let blocks = (0..len / b).map(|_| {
            let mut k = spare.pop().unwrap_or_default();
            k.stale(b);
            k
        });
        Some(blocks.collect())
    }

    /// Takes the memory writes land in before a buffer of the cache gives
    /// its own back ([`Iod::landing`]), every page touched, so the first
    /// writes cost no page fault.
    fn take_landing_memory(&self) {
        let mut spare = self.spare_blocks.lock();
        while spare.len() < SPARE_BLOCKS {
            spare.push(Block::with_pages_touched(IOD_BLOCK as usize));
        }
    }

    /// Keeps `block`'s memory for a later write to land in, if it has a
    /// whole block's and there is room.
    fn keep_spare(&self, block: Block) {
        if block.capacity() >= IOD_BLOCK as usize {
            let mut spare = self.spare_blocks.lock();
            if spare.len() < SPARE_BLOCKS {
                spare.push(block);
            }
        }
    }

    /// A buffered write of whole blocks whose payload landed in `blocks`
    /// (one each, as [`Iod::landing`] lent them): written straight to the
    /// block store from them, as [`Iod::write_direct`] writes, and each
    /// then made the cache's clean copy with its own memory, not a copy of
    /// its bytes (the memory the cache's buffer held is kept for the next
    /// write). `Err` gives the blocks back when the write cannot go so
    /// (the log or the cache came to hold some of it, or the store
    /// refused it): the caller writes them the usual way, which says why.
    async fn write_landed(
        self: &Arc<Self>,
        handle: u64,
        offset: u64,
        blocks: Vec<Block>,
    ) -> Result<io::Result<()>, Vec<Block>> {
        let _g = self.gate.read().await;
        let len: u64 = blocks.iter().map(|k| k.len() as u64).sum();
        if !self.may_place(handle, offset, len) {
            return Err(blocks);
        }
        self.direct.placed(handle);
        self.below.touched.lock().insert(handle);
        // Placed before the part's next write goes to the disk, as in
        // `write_direct`.
        let iod = Arc::clone(self);
        let written = self
            .blocking(move |s| {
                let mut blocks = blocks;
                let r = s.write_streamed_then(handle, offset, &mut blocks, |blocks| {
                    iod.grow(handle, offset + len);
                    iod.place_landed(handle, offset, blocks)
                });
                Ok((blocks, r))
            })
            .await;
        let busy = match written {
            Ok((_, Ok(busy))) => busy,
            Ok((blocks, Err(_))) => return Err(blocks),
            Err(e) => return Ok(Err(e)),
        };
        // Reached by a logged write, a fetch or a cut meanwhile: through
        // the log and the cache after all, as in `write_direct`.
        for (k, block) in busy {
            if let Err(e) = self
                .write_logged(handle, k * IOD_BLOCK as u64, Bytes::from(block), true)
                .await
            {
                return Ok(Err(e));
            }
        }
        Ok(Ok(()))
    }

    /// Makes each of `blocks` (from block `offset` of `handle`'s part on,
    /// just written to the block store) the cache's clean copy with its
    /// own memory, keeping the memory the cache gives back; returns those
    /// the cache or the log holds bytes of now, with their block's index,
    /// for the log and the cache to take after all.
    fn place_landed(&self, handle: u64, offset: u64, blocks: &mut Vec<Block>) -> Vec<(u64, Block)> {
        let b = IOD_BLOCK as u64;
        let mut busy = Vec::new();
        for (i, block) in blocks.drain(..).enumerate() {
            let k = offset / b + i as u64;
            if !self.direct.may_place(handle, k, IOD_BLOCK) {
                busy.push((k, block));
                continue;
            }
            match self.cache.place_clean_block(BlockKey::new(handle, k), block) {
                Ok(old) => {
                    self.landed.fetch_add(IOD_BLOCK as u64, Ordering::Relaxed);
                    self.keep_spare(old);
                }
                Err((Placed::NoRoom, block)) => self.keep_spare(block),
                Err((Placed::Busy | Placed::Cached, block)) => busy.push((k, block)),
            }
        }
        busy
    }

    /// The log then the cache (see [`Iod::write`]). Called with the gate held.
    async fn write_logged(&self, handle: u64, offset: u64, data: Bytes, buffered: bool) -> io::Result<()> {
        self.direct.logging_write(handle, offset, data.len() as u64, IOD_BLOCK);
        let e = Entry::Write {
            handle,
            offset,
            data: data.clone(),
        };
        if buffered {
            self.log.append_buffered(e).await?;
        } else {
            self.log.append(e).await?;
        }
        self.grow(handle, offset + data.len() as u64);
        self.cache
            .write(handle, offset, &data)
            .await
            .map_err(|e| io::Error::other(e.to_string()))
    }

    /// The part's length, the block store asked on first use: one `stat`,
    /// done in place (a hop to a blocking thread cost more than the `stat`).
    async fn part_len(&self, handle: u64) -> io::Result<u64> {
        if let Some(PartLen::Known(l)) = self.part_len.lock().get(&handle) {
            return Ok(*l);
        }
        let stored = self.store.len(handle)?;
        let mut m = self.part_len.lock();
        let l = m.entry(handle).or_insert(PartLen::Known(stored));
        let known = match *l {
            PartLen::Known(k) => k,
            PartLen::AtLeast(a) => a.max(stored),
        };
        *l = PartLen::Known(known);
        Ok(known)
    }

    /// The part's file, for a node on this machine that would read it
    /// itself ([`Request::LocalPart`]), with the blocks the write log
    /// holds bytes of since the last checkpoint (the file may lack them;
    /// the cache answers with them): the node reads those through this
    /// server. None if the part has no file, or the log's account cannot
    /// name its blocks. A write logged after this answer is one the node's
    /// reads need not see until its consistency plug-in has it drop what
    /// it cached (`docs/client.md`, "Local reads").
    fn local_file(&self, handle: u64) -> Option<LocalFile> {
        let logged = self.direct.logged_blocks(handle, LOCAL_LOGGED_MOST)?;
        match self.store.part_file(handle) {
            Ok(Some((path, dev, ino))) => Some(LocalFile {
                path: path.into_os_string().into_encoded_bytes(),
                dev,
                ino,
                block: IOD_BLOCK,
                logged,
            }),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!("handle {handle}: the part's file for a local read: {e}");
                None
            }
        }
    }

    /// The part is at least `end` bytes long now. Its stored length is
    /// left for a read to ask.
    fn grow(&self, handle: u64, end: u64) {
        let mut m = self.part_len.lock();
        let l = m.entry(handle).or_insert(PartLen::AtLeast(0));
        *l = match *l {
            PartLen::Known(k) => PartLen::Known(k.max(end)),
            PartLen::AtLeast(a) => PartLen::AtLeast(a.max(end)),
        };
    }

    /// Removes a part. On a full disk whose log cannot take the removal
    /// (direct writes leave the log nearly empty, so nothing else frees
    /// space), the part goes first, which frees its space, and the removal
    /// is logged after: a crash between the two can bring back only logged
    /// bytes of a part whose file is gone (space, never a file's data).
    async fn remove(&self, handle: u64) -> io::Result<()> {
        let e = Entry::Remove { handle };
        match self.cut(e.clone()).await {
            Err(err) if err.kind() == io::ErrorKind::StorageFull => {
                tracing::warn!("write log: the disk is full; removing handle {handle} before logging it");
                let _g = self.gate.read().await;
                self.logging_cut(&e);
                self.cut_logged(e.clone()).await?;
                self.log.append_buffered(e).await
            }
            r => r,
        }
    }

    /// Tells the account of direct writes of a truncate or removal about
    /// to be logged (or replayed).
    fn logging_cut(&self, e: &Entry) {
        match *e {
            Entry::Truncate { handle, len } => self.direct.logging_cut(handle, len),
            Entry::Remove { handle } => self.direct.logging_cut(handle, 0),
            _ => {}
        }
    }

    /// Truncates, removes or extends a part: the change is logged, then
    /// applied (see [`Iod::cut_logged`]).
    async fn cut(&self, entry: Entry) -> io::Result<()> {
        let _g = self.gate.read().await;
        self.logging_cut(&entry);
        if let Entry::Remove { .. } = entry {
            // Like the metadata server's unlink, not durable until the
            // next sync: a crash that loses it leaves the part behind
            // (space, never a file whose data is gone).
            self.log.append_buffered(entry.clone()).await?;
        } else {
            self.log.append(entry.clone()).await?;
        }
        self.cut_logged(entry).await
    }

    /// Applies a logged truncate or remove (the cache forgets the handle's
    /// blocks, a truncate writing them down first; the block store
    /// follows) or extension (the block store's part grows).
    async fn cut_logged(&self, entry: Entry) -> io::Result<()> {
        let h = entry.handle();
        match entry {
            Entry::Extend { handle, len } => {
                // Only the length changes: cached bytes stay.
                self.grow(handle, len);
                self.below.touched.lock().insert(h);
                return self.blocking(move |s| apply(s, &entry)).await;
            }
            Entry::Truncate { handle, len } => {
                self.part_len.lock().insert(handle, PartLen::Known(len));
            }
            Entry::Remove { handle } => {
                self.part_len.lock().remove(&handle);
            }
            Entry::Write { .. } => {}
            // A node's durable write cache's kinds: never in a server's log.
            Entry::NodeWrite { .. } | Entry::NodeClean { .. } => return Ok(()),
        }
        if let Entry::Truncate { .. } = entry {
            self.cache
                .flush_file(h)
                .await
                .map_err(|e| io::Error::other(e.message))?;
        }
        self.cache.discard_file(h, 0).await;
        self.below.touched.lock().insert(h);
        if let Entry::Remove { handle } = entry {
            // The part of a file never written (none) or of a small one is
            // removed here: the hop to a blocking thread and back cost
            // more than the unlink (most of a data server's time while
            // files were removed, as mdtest does).
            match self.store.stored(handle)? {
                None => return Ok(()),
                Some(len) if len <= REMOVE_IN_PLACE_MAX => return apply(&self.store, &entry),
                Some(_) => {}
            }
        }
        self.blocking(move |s| apply(s, &entry)).await
    }

    /// Redoes one entry of the log found at start (it stays in the log).
    async fn redo(&self, e: Entry) -> io::Result<()> {
        match e {
            Entry::Write { handle, offset, data } => {
                self.direct.logging_write(handle, offset, data.len() as u64, IOD_BLOCK);
                self.grow(handle, offset + data.len() as u64);
                self.cache
                    .write(handle, offset, &data)
                    .await
                    .map_err(|e| io::Error::other(e.to_string()))
            }
            cut => {
                self.logging_cut(&cut);
                self.cut_logged(cut).await
            }
        }
    }

    /// Writes every dirty block down, syncs the files written since the last
    /// checkpoint and empties the log. The bulk of the writing down and
    /// syncing is done first while writes go on ([`Iod::pre_checkpoint`]);
    /// writes are held only for what came in meanwhile.
    async fn checkpoint(&self) -> io::Result<()> {
        self.pre_checkpoint().await;
        let _g = self.gate.write().await;
        self.cache.flush_all().await.map_err(|e| io::Error::other(e.message))?;
        let touched: Vec<u64> = self.below.touched.lock().drain().collect();
        self.blocking(move |s| {
            for h in touched {
                s.sync(h)?;
            }
            s.sync_dir()
        })
        .await?;
        let chunks = self.chunks.clone();
        tokio::task::spawn_blocking(move || chunks.sync())
            .await
            .map_err(io::Error::other)??;
        self.log.compact(Vec::new()).await?;
        self.direct.checkpointed();
        Ok(())
    }

    /// Makes every acknowledged write durable: the parts written directly
    /// since the last sync (and the directory, for the parts they
    /// created), then the log, then the chunk store. One sync at a time,
    /// so a sync that finds nothing left to fsync does not return while
    /// another still fsyncs parts written before it came.
    async fn sync(&self) -> io::Result<()> {
        let _one = self.syncing.lock().await;
        let parts = self.direct.take_unsynced();
        if !parts.is_empty() {
            let todo = parts.clone();
            let r = self
                .blocking(move |s| {
                    todo.into_iter().try_for_each(|h| s.sync(h))?;
                    s.sync_dir()
                })
                .await;
            if let Err(e) = r {
                for h in parts {
                    self.direct.placed(h);
                }
                return Err(e);
            }
        }
        self.log.sync().await?;
        let chunks = self.chunks.clone();
        tokio::task::spawn_blocking(move || chunks.sync())
            .await
            .map_err(io::Error::other)?
    }

    /// Before a checkpoint holds writes: writes the dirty blocks down and
    /// syncs the files written so far, while writes go on, in rounds until
    /// little is left (at most [`PRE_CHECKPOINT_ROUNDS`]). Only a head
    /// start: the checkpoint itself still writes down and syncs everything
    /// under the gate, so a failure here (logged) changes nothing.
    async fn pre_checkpoint(&self) {
        for round in 0..PRE_CHECKPOINT_ROUNDS {
            // The first round syncs what the write policy wrote down before.
            if round > 0 && self.cache.dirty_buffers() * (IOD_BLOCK as usize) < PRE_CHECKPOINT_LEFT {
                return;
            }
            // Bounded: writers may keep the cache from ever being clean.
            if let Ok(Err(e)) = tokio::time::timeout(PRE_CHECKPOINT_FLUSH, self.cache.flush_all()).await {
                tracing::warn!("writing down before a checkpoint: {}", e.message);
                return;
            }
            let touched: Vec<u64> = self.below.touched.lock().iter().copied().collect();
            if let Err(e) = self
                .blocking(move |s| touched.into_iter().try_for_each(|h| s.sync(h)))
                .await
            {
                tracing::warn!("syncing before a checkpoint: {e}");
                return;
            }
        }
    }

    /// Whether the disk is short of space for what the log holds: its
    /// free space is below the log's size or 64 MiB.
    /// Whether the disk's free space is below what the log holds (or 64
    /// MiB). The disk is asked at most every [`FREE_SPACE_FOR`] or
    /// [`FREE_SPACE_LOG`] bytes of log; meanwhile the log's growth comes
    /// off the last reading.
    fn low_on_space(&self, log_bytes: u64) -> bool {
        let now = std::time::Instant::now();
        let mut last = self.free.lock();
        let free = match *last {
            Some(r)
                if now.duration_since(r.at) < FREE_SPACE_FOR
                    && log_bytes >= r.log_bytes
                    && log_bytes - r.log_bytes < FREE_SPACE_LOG =>
            {
                r.free.saturating_sub(log_bytes - r.log_bytes)
            }
            _ => {
                let (_, free) = crate::capacity(&self.data_dir);
                *last = Some(FreeSpace {
                    at: now,
                    log_bytes,
                    free,
                });
                free
            }
        };
        free < log_bytes.max(64 << 20)
    }

    /// Starts a checkpoint in the background when the log has passed its
    /// size, or (`removed`: after a file was removed) holds a quarter of
    /// it, or the disk runs low: it frees the log's space.
    async fn maybe_checkpoint(self: &Arc<Self>, removed: bool) {
        let bytes = self.log.bytes();
        let due = bytes >= self.checkpoint_bytes
            || (removed && bytes >= self.checkpoint_bytes / 4)
            || (bytes > 0 && self.low_on_space(bytes));
        if !due || self.checkpointing.swap(true, Ordering::SeqCst) {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            if let Err(e) = me.checkpoint().await {
                tracing::error!("checkpoint failed: {e}");
            }
            me.checkpointing.store(false, Ordering::SeqCst);
        });
    }
}

fn apply(s: &BlockStore, e: &Entry) -> io::Result<()> {
    match e {
        Entry::Write { handle, offset, data } => s.write(*handle, *offset, data),
        Entry::Truncate { handle, len } => s.truncate(*handle, *len),
        Entry::Remove { handle } => s.remove(*handle),
        Entry::Extend { handle, len } => s.extend(*handle, *len),
        Entry::NodeWrite { .. } | Entry::NodeClean { .. } => Ok(()),
    }
}

/// The largest part of one file a data server keeps (16 TiB, ext4's limit
/// for one file): requests beyond it are refused before anything is logged.
pub const MAX_PART: u64 = 1 << 44;

fn beyond_limit(what: &str, handle: u64, offset: u64, len: u64) -> Option<Response> {
    match offset.checked_add(len) {
        Some(end) if end <= MAX_PART => None,
        _ => Some(Response::error(
            ErrorCode::Invalid,
            format!("{what} of {len} bytes at {offset} of handle {handle}: beyond the limit of {MAX_PART} bytes"),
        )),
    }
}

struct IodHandler(Arc<Iod>, Arc<watch::Sender<bool>>);

impl IodHandler {
    /// A random reader's first touch of a block ([`Request::ReadPages`]):
    /// the bytes from the store alone when every block they lie in is in
    /// the store as a read through the cache would find it (none in the
    /// cache, nothing of it logged or cut since the last checkpoint, under
    /// the gate a checkpoint takes); else as [`IodHandler::read`]. Neither
    /// this server's cache nor its read-ahead sees it.
    async fn read_pages(&self, handle: u64, offset: u64, len: u64, need: u64) -> (Response, Vec<Bytes>) {
        let iod = &self.0;
        let b = IOD_BLOCK as u64;
        if len == 0 || len > b || beyond_limit("read", handle, offset, len).is_some() {
            return self.read(handle, offset, len, need).await;
        }
        let gate = iod.gate.read().await;
        let in_store = (offset / b..(offset + len).div_ceil(b))
            .all(|k| iod.direct.may_place(handle, k, IOD_BLOCK) && !iod.cache.holds(BlockKey::new(handle, k)));
        let have = match in_store {
            true => iod.part_len(handle).await.ok().filter(|&have| have >= need),
            false => None,
        };
        let Some(have) = have else {
            // As a read through the cache, which says what is wrong.
            drop(gate);
            return self.read(handle, offset, len, need).await;
        };
        iod.reads.fetch_add(1, Ordering::Relaxed);
        iod.page_reads.fetch_add(1, Ordering::Relaxed);
        let held = have.saturating_sub(offset).min(len);
        if held == 0 {
            return (Response::Data { len: 0 }, Vec::new());
        }
        // On this thread if the store is idle, as a block's demand read.
        let got = match iod.below.reads.read_range_here(handle, offset, held) {
            Some(got) => got,
            None => iod.blocking(move |s| s.read(handle, offset, held)).await,
        };
        match got {
            Ok(d) if d.len() as u64 == held => (Response::Data { len: held }, vec![d]),
            // The part's length counts what a cut or an extension left
            // past its stored bytes: zeros.
            Ok(d) => {
                let mut v = d.to_vec();
                v.resize(held as usize, 0);
                (Response::Data { len: held }, vec![Bytes::from(v)])
            }
            Err(e) => (io_reply(&format!("read of handle {handle}"), e), Vec::new()),
        }
    }

    /// A read, answered with the blocks straight out of the cache, one
    /// piece each (no copy).
    async fn read(&self, handle: u64, offset: u64, len: u64, need: u64) -> (Response, Vec<Bytes>) {
        let iod = &self.0;
        if len > parcache_proto::frame::MAX_PAYLOAD as u64 {
            return (
                Response::error(ErrorCode::Invalid, format!("read of {len} bytes is over the limit")),
                Vec::new(),
            );
        }
        if let Some(r) = beyond_limit("read", handle, offset, len) {
            return (r, Vec::new());
        }
        iod.reads.fetch_add(1, Ordering::Relaxed);
        let have = match iod.part_len(handle).await {
            Ok(have) => have,
            Err(e) => return (io_reply(&format!("read of handle {handle}"), e), Vec::new()),
        };
        if have < need {
            tracing::error!(
                "handle {handle}: this server holds {have} bytes of its part, the file's size needs \
                 {need}: stripes are missing from the store"
            );
            return (
                Response::error(
                    ErrorCode::Io,
                    format!(
                        "stripes of handle {handle} are missing from this data server's store \
                         (it holds {have} bytes of its part, the file needs {need})"
                    ),
                ),
                Vec::new(),
            );
        }
        // Only what the part holds: past its end the reader has zeros
        // without them crossing the wire (a 4 KiB file's read asks for
        // its whole 64 KiB block).
        let held = have.saturating_sub(offset).min(len);
        // Nothing past the part's end is read ahead.
        iod.cache.open(handle, have);
        match iod.cache.read_pieces(handle, offset, held as usize).await {
            Ok(pieces) => (Response::Data { len: held }, pieces),
            Err(e) => (
                Response::error(ErrorCode::Io, format!("read of handle {handle}: {e}")),
                Vec::new(),
            ),
        }
    }
}

impl IodHandler {
    /// The answer to a write of `len` bytes at `offset` of `handle` that
    /// ended with `r`.
    async fn written(&self, r: io::Result<()>, handle: u64, offset: u64, len: u64) -> Response {
        match r {
            Ok(()) => {
                self.0.writes.fetch_add(1, Ordering::Relaxed);
                self.0.maybe_checkpoint(false).await;
                Response::Written { len }
            }
            Err(e) => io_reply(&format!("write of {len} bytes at {offset} of handle {handle}"), e),
        }
    }
}

impl Handler for IodHandler {
    fn landing(&self, req: &Request, len: usize) -> Option<Vec<Block>> {
        match *req {
            Request::WriteBuffered { handle, offset } => self.0.landing(handle, offset, len),
            _ => None,
        }
    }

    async fn handle_landed(&self, req: Request, landed: Vec<Block>) -> (Response, Vec<Bytes>) {
        let Request::WriteBuffered { handle, offset } = req else {
            return self
                .handle_pieces(req, Bytes::from(parcache_mem::concat(&landed)))
                .await;
        };
        let len: u64 = landed.iter().map(|k| k.len() as u64).sum();
        match self.0.write_landed(handle, offset, landed).await {
            Ok(r) => {
                self.0.requests.fetch_add(1, Ordering::Relaxed);
                (self.written(r, handle, offset, len).await, vec![Bytes::new()])
            }
            // The usual way (one copy into a payload), which says why if
            // it fails too.
            Err(blocks) => {
                self.handle_pieces(req, Bytes::from(parcache_mem::concat(&blocks)))
                    .await
            }
        }
    }

    async fn handle_pieces(&self, req: Request, data: Bytes) -> (Response, Vec<Bytes>) {
        self.0.requests.fetch_add(1, Ordering::Relaxed);
        match req {
            Request::Read {
                handle,
                offset,
                len,
                need,
            } => self.read(handle, offset, len, need).await,
            Request::ReadPages {
                handle,
                offset,
                len,
                need,
            } => self.read_pages(handle, offset, len, need).await,
            req => {
                let (resp, data) = self.handle(req, data).await;
                (resp, vec![data])
            }
        }
    }

    async fn handle(&self, req: Request, data: Bytes) -> (Response, Bytes) {
        let iod = &self.0;
        let resp = match req {
            Request::Sync => {
                iod.syncs.fetch_add(1, Ordering::Relaxed);
                match iod.sync().await {
                    Ok(()) => Response::Ok,
                    Err(e) => io_reply("sync (parts written directly, write log, chunk store)", e),
                }
            }
            Request::Write { handle, offset } | Request::WriteBuffered { handle, offset } => {
                let buffered = matches!(req, Request::WriteBuffered { .. });
                let len = data.len() as u64;
                if let Some(r) = beyond_limit("write", handle, offset, len) {
                    return (r, Bytes::new());
                }
                let mut r = iod.write(handle, offset, data.clone(), buffered).await;
                if r.as_ref().is_err_and(|e| e.kind() == io::ErrorKind::StorageFull) {
                    // The log filled the disk: a checkpoint frees the space
                    // of what is already in the block store; try once more.
                    tracing::warn!("write log: the disk is full; checkpointing to free the log's space");
                    if let Err(e) = iod.checkpoint().await {
                        tracing::warn!("checkpoint on a full disk: {e}");
                    }
                    r = iod.write(handle, offset, data, buffered).await;
                }
                self.written(r, handle, offset, len).await
            }
            Request::Extend { handle, len } if len > MAX_PART => Response::error(
                ErrorCode::Invalid,
                format!("extend of handle {handle} to {len} bytes: over the limit of {MAX_PART}"),
            ),
            Request::Extend { handle, len } => match iod.cut(Entry::Extend { handle, len }).await {
                Ok(()) => Response::Ok,
                Err(e) => io_reply(&format!("extend of handle {handle}"), e),
            },
            Request::Read {
                handle,
                offset,
                len,
                need,
            } => {
                // The connection asks `handle_pieces`, which sends the
                // pieces uncopied; this is for a caller that wants one.
                let (resp, pieces) = self.read(handle, offset, len, need).await;
                return (resp, Bytes::from(pieces.concat()));
            }
            Request::ReadPages {
                handle,
                offset,
                len,
                need,
            } => {
                let (resp, pieces) = self.read_pages(handle, offset, len, need).await;
                return (resp, Bytes::from(pieces.concat()));
            }
            Request::Truncate { handle, len } if len > MAX_PART => Response::error(
                ErrorCode::Invalid,
                format!("truncate of handle {handle} to {len} bytes: over the limit of {MAX_PART}"),
            ),
            Request::Truncate { handle, len } => match iod.cut(Entry::Truncate { handle, len }).await {
                Ok(()) => Response::Ok,
                Err(e) => io_reply(&format!("truncate of handle {handle}"), e),
            },
            Request::Remove { handle } => match iod.remove(handle).await {
                Ok(()) => {
                    iod.cache.close(handle);
                    iod.maybe_checkpoint(true).await;
                    Response::Ok
                }
                Err(e) => io_reply(&format!("remove of handle {handle}"), e),
            },
            Request::Shutdown => {
                // Checkpoint before answering, so `parcache down` can say
                // when it fails (the log keeps everything then: nothing is
                // lost, the next start replays it).
                let r = iod.checkpoint().await;
                crate::stop_soon(&self.1);
                match r {
                    Ok(()) => Response::Ok,
                    Err(e) => io_reply("checkpoint at shutdown (the write log keeps the data)", e),
                }
            }
            Request::LocalPart { handle } => Response::LocalPart {
                boot: iod.boot.clone(),
                file: iod.local_file(handle),
            },
            Request::Identity => Response::Identity(iod.identity.lock().clone()),
            Request::Adopt { cluster, index } => {
                let mut id = iod.identity.lock();
                let want = ServerIdentity { cluster, index };
                match &*id {
                    Some(have) if *have == want => Response::Ok,
                    Some(have) => Response::error(
                        ErrorCode::Invalid,
                        format!(
                            "{} is data server {} of cluster {}, not data server {} of cluster {}",
                            iod.data_dir.display(),
                            have.index,
                            have.cluster,
                            want.index,
                            want.cluster
                        ),
                    ),
                    None => match write_identity(&iod.data_dir, &want) {
                        Ok(()) => {
                            tracing::info!("adopted as data server {} of cluster {}", want.index, want.cluster);
                            *id = Some(want);
                            Response::Ok
                        }
                        Err(e) => io_reply(&format!("writing the identity file in {}", iod.data_dir.display()), e),
                    },
                }
            }
            Request::PutChunks { lens } => {
                let chunks = iod.chunks.clone();
                let total: u64 = lens.iter().map(|&l| l as u64).sum();
                if total != data.len() as u64 {
                    Response::error(
                        ErrorCode::Invalid,
                        format!("chunk lengths add up to {total} bytes, the payload has {}", data.len()),
                    )
                } else {
                    let n = lens.len();
                    let put = move || {
                        let mut at = 0;
                        let pieces: Vec<&[u8]> = lens
                            .iter()
                            .map(|&l| {
                                at += l as usize;
                                &data[at - l as usize..at]
                            })
                            .collect();
                        chunks.put_many(&pieces)
                    };
                    match tokio::task::spawn_blocking(put).await {
                        Ok(Ok(stored)) => Response::ChunksStored {
                            new: stored.iter().filter(|(_, new)| *new).count() as u32,
                            hashes: stored.into_iter().map(|(h, _)| h).collect(),
                        },
                        Ok(Err(e)) => io_reply(&format!("storing {n} chunks of {total} bytes"), e),
                        Err(e) => Response::error(ErrorCode::Io, format!("storing chunks: {e}")),
                    }
                }
            }
            Request::GetChunks { hashes } => {
                let chunks = iod.chunks.clone();
                return match tokio::task::spawn_blocking(move || chunks.get_many(&hashes)).await {
                    Ok(Ok(all)) => (
                        Response::Chunks {
                            lens: all.iter().map(|b| b.len() as u32).collect(),
                        },
                        Bytes::from(all.concat()),
                    ),
                    Ok(Err(e)) => (io_reply("reading chunks", e), Bytes::new()),
                    Err(e) => (
                        Response::error(ErrorCode::Io, format!("reading chunks: {e}")),
                        Bytes::new(),
                    ),
                };
            }
            Request::ListChunks { older_than_secs, after } => {
                let chunks = iod.chunks.clone();
                let age = std::time::Duration::from_secs(older_than_secs);
                let list = move || chunks.list_older_than(age, after, parcache_proto::LIST_CHUNKS_PAGE);
                match tokio::task::spawn_blocking(list).await {
                    Ok(Ok(h)) => Response::Hashes(h),
                    Ok(Err(e)) => io_reply("listing chunks", e),
                    Err(e) => Response::error(ErrorCode::Io, format!("listing chunks: {e}")),
                }
            }
            Request::ListParts { older_than_secs, after } => {
                let store = iod.store.clone();
                let age = std::time::Duration::from_secs(older_than_secs);
                let list = move || store.list_older_than(age, after, parcache_proto::LIST_PARTS_PAGE);
                match tokio::task::spawn_blocking(list).await {
                    Ok(Ok(h)) => Response::Handles(h),
                    Ok(Err(e)) => io_reply("listing parts", e),
                    Err(e) => Response::error(ErrorCode::Io, format!("listing parts: {e}")),
                }
            }
            Request::DropChunks { hashes } => {
                let chunks = iod.chunks.clone();
                let r = tokio::task::spawn_blocking(move || hashes.iter().try_for_each(|h| chunks.remove(h))).await;
                match r {
                    Ok(Ok(())) => Response::Ok,
                    Ok(Err(e)) => io_reply("removing chunks", e),
                    Err(e) => Response::error(ErrorCode::Io, format!("removing chunks: {e}")),
                }
            }
            Request::Incarnation => Response::Incarnation {
                now: iod.incarnation.now,
                after_graceful_stop_of: iod.incarnation.kept_all_of,
            },
            Request::DropCaches => match iod.cache.flush_all().await {
                Ok(()) => {
                    let n = iod.cache.drop_clean();
                    tracing::info!("drop-caches: {n} blocks forgotten");
                    Response::Ok
                }
                Err(e) => Response::error(
                    ErrorCode::Io,
                    format!("drop-caches: writing the cache's dirty blocks down: {e}"),
                ),
            },
            Request::Stats => {
                let c = iod.cache.stats();
                let chunks = iod.chunks.clone();
                let cs = tokio::task::spawn_blocking(move || chunks.stats())
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or_default();
                let (capacity_bytes, free_bytes, fs_id) = crate::disk(&iod.data_dir);
                Response::Stats(ServerStats {
                    role: format!("iod ({})", iod.cache.config().write),
                    capacity_bytes,
                    free_bytes,
                    read_hits: c.read_hits,
                    read_misses: c.read_misses,
                    log_bytes: iod.log.bytes(),
                    dirty_blocks: iod.cache.dirty_buffers() as u64,
                    immediate_writes: c.immediate_writes,
                    writes_down: c.writes,
                    overwrites: c.overwrites,
                    chunks: cs.chunks,
                    chunk_bytes: cs.bytes,
                    fs_id,
                    prefetches: c.prefetches,
                    prefetch_hits: c.prefetch_hits,
                    syncs: iod.syncs.load(Ordering::Relaxed),
                    requests: iod.requests.load(Ordering::Relaxed),
                    cache_memory_bytes: iod.cache.memory_bytes(),
                    direct_write_bytes: iod.store.written_direct(),
                    landed_write_bytes: iod.landed.load(Ordering::Relaxed),
                    page_reads: iod.page_reads.load(Ordering::Relaxed),
                })
            }
            other => Response::error(
                ErrorCode::BadRequest,
                format!("this is a parcache data server, not a metadata server; it does not serve {other:?}"),
            ),
        };
        (resp, Bytes::new())
    }
}

/// The buffers of a data server's cache of `cache_bytes` (of
/// [`IOD_BLOCK`] each, at least 4).
pub fn cache_buffers(cache_bytes: u64) -> usize {
    (cache_bytes / IOD_BLOCK as u64).max(4) as usize
}

/// Opens the stores (replaying the log) and binds. Await `served` to run.
pub async fn start(cfg: IodConfig) -> io::Result<crate::Running> {
    let lock = crate::lock_dir(&cfg.data_dir, "data server")?;
    let identity = read_identity(&cfg.data_dir)?;
    let boot = crate::incarnation::boot_id();
    let incarnation = crate::incarnation::begin(&cfg.data_dir, &boot)?;
    if incarnation.kept_all_of.is_none() && incarnation.now > 1 {
        tracing::warn!(
            "the last start of this data server ended in a crash of the machine (no graceful stop, another boot): writes it acknowledged and no sync covered may be lost; nodes' fsyncs of such files say EIO"
        );
    }
    let store = Arc::new(BlockStore::open(&cfg.data_dir)?);
    store.set_direct_reads(!cfg.page_cache_reads);
    let (wal, replay) = Wal::open(FileMedia::open(&cfg.data_dir.join("log"))?)?;
    let below = Arc::new(StoreBelow {
        store: store.clone(),
        reads: ReadQueue::new(store.clone(), IOD_BLOCK),
        touched: Mutex::new(HashSet::new()),
    });
    let cache = Driver::new(
        CacheConfig {
            buffers: cache_buffers(cfg.cache_bytes),
            block_size: IOD_BLOCK,
            replacement: ReplacementKind::Lru,
            write: cfg.write_policy,
            // A data server reads its store around the kernel's page cache
            // (so without the kernel's read-ahead): its own cache reads
            // ahead of each sequential stream of a part instead, as the
            // node's does (Cortes et al. 1996 §7.4), bounded by the part's
            // length as each read finds it.
            prefetch: PrefetchKind::ReadAhead,
            aux_buffers: 0,
            syncer: None,
            fill_partial_writes: false,
        },
        64,
        below.clone(),
    )
    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("data server cache: {e}")))?;
    let iod = Arc::new(Iod {
        store,
        chunks: Arc::new(ChunkStore::open(&cfg.data_dir)?),
        cache,
        below,
        data_dir: cfg.data_dir.clone(),
        log: GroupLog::start(wal),
        direct: DirectWrites::default(),
        syncing: tokio::sync::Mutex::new(()),
        gate: RwLock::new(()),
        checkpoint_bytes: cfg.checkpoint_bytes,
        checkpointing: false.into(),
        reads: AtomicU64::new(0),
        page_reads: AtomicU64::new(0),
        writes: AtomicU64::new(0),
        syncs: AtomicU64::new(0),
        requests: AtomicU64::new(0),
        identity: Mutex::new(identity),
        boot: parcache_proto::boot_id(),
        part_len: Mutex::new(HashMap::new()),
        free: Mutex::new(None),
        incarnation,
        spare_blocks: Mutex::new(Vec::new()),
        landed: AtomicU64::new(0),
    });
    if !replay.entries.is_empty() {
        // Into the write cache (the bytes stay in the log until the next
        // checkpoint), so replay needs no free space on the disk.
        tracing::info!("replaying {} logged writes into the write cache", replay.entries.len());
        for e in replay.entries {
            iod.redo(e).await?;
        }
    }
    if !cfg.lazy_cache {
        // Its first touch of each page costs the kernel a fault: paid
        // here, once, while the server serves, not on the data path.
        let weak = Arc::downgrade(&iod);
        tokio::task::spawn_blocking(move || {
            if let Some(iod) = weak.upgrade() {
                iod.store.take_write_memory();
                iod.take_landing_memory();
            }
            take_ahead("data server cache", |most| {
                weak.upgrade().map(|iod| iod.cache.take_memory(most))
            })
        });
    }
    let listener = TcpListener::bind(cfg.listen).await?;
    let addr = listener.local_addr()?;
    let (stop, rx) = watch::channel(false);
    let stop = Arc::new(stop);
    let handler = Arc::new(IodHandler(iod.clone(), stop.clone()));
    // Bound now (the local socket too), before the address is announced.
    let serving = serve(listener, cfg.secret, handler, rx);
    let served = Box::pin(async move {
        serving.await;
        let r = iod.checkpoint().await;
        // Everything acknowledged is durable: a restart, even after a
        // reboot, lost nothing.
        if r.is_ok() {
            if let Err(e) = crate::incarnation::stopped_gracefully(&iod.data_dir, iod.incarnation.now, &boot) {
                tracing::warn!("{e}: the next start counts this stop as a crash, unless in the same boot");
            }
        }
        drop(lock);
        r
    });
    Ok(crate::Running { addr, stop, served })
}
