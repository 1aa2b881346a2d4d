//! parcache-driver: runs the core's sans-IO [`Cache`] against real I/O with
//! tokio (DESIGN.md §1, "the real driver"). The node client drives its local
//! cache with it and each data server its read and write cache; the level
//! below is whatever implements [`Below`] (the data servers, or a block
//! store on disk).
//!
//! The driver owns the buffers' bytes, a clock (nanoseconds since it was
//! built) and a timer task. Callers read and write byte ranges of files; the
//! driver splits them into block accesses that run concurrently, each on a
//! *lane* (the core's process id): at most `lanes` block accesses are in
//! progress at once, which also bounds what `toss-immediately` must keep.

mod below;
pub mod handover;
mod join;
pub mod take_ahead;

pub use below::{copied, Below, BelowError};
pub use join::join_all;

use bytes::Bytes;
use parcache_core::{
    split_blocks, Access, AccessError, Begin, BlockKey, BufId, ByteRange, Cache, CacheConfig, CacheStats, Effect,
    FileId, PolicyError, Time, WritePolicyKind,
};
pub use parcache_mem::Block;
use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use thiserror::Error;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;

/// Prefetches in flight at once, per cache: demand fetches always go first
/// (DESIGN.md §3). Enough for read-ahead's largest window to be on its way
/// (a data server's store reads of a run of them are merged).
const PREFETCH_DEPTH: usize = 64;

/// Prefetches start in groups: only once no more than this many are in
/// flight, then up to [`PREFETCH_DEPTH`] at once. Refilled a slot at a time
/// as each ended, a read-ahead's run reached a data server's store queue a
/// block at a time and was read in pieces (issue 14).
const PREFETCH_REFILL_AT: usize = PREFETCH_DEPTH / 2;

/// What [`Driver::place_clean`] did with a block written around the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placed {
    /// The cache holds it now, clean.
    Cached,
    /// No buffer was free or clean: the cache holds nothing of it.
    NoRoom,
    /// The cache has dirty bytes of it, or I/O or an access in progress on
    /// it, so the write must go through the cache after all.
    Busy,
}

#[derive(Debug, Error)]
pub enum DriverError {
    #[error(transparent)]
    Below(#[from] BelowError),
    #[error(transparent)]
    Access(#[from] AccessError),
}

struct State {
    cache: Cache,
    /// Each buffer's bytes, allocated on first use. Reference-counted, so
    /// an answer, a write-back or an eviction can send a block's bytes
    /// without copying them; a change to a block still being sent copies
    /// it first.
    mem: Vec<Option<Arc<Block>>>,
    /// Bytes of evicted blocks (by buffer and block) kept when their
    /// buffer was filled anew before the eviction was carried out
    /// ([`Cache::evictions_of`]).
    evicting: HashMap<(usize, BlockKey), Arc<Block>>,
    /// Blocks whose last fetch failed, with why (told to its waiters).
    failed_fetch: HashMap<BlockKey, BelowError>,
    /// Files whose dirty data failed to go down, with why (told to the next
    /// flush of the file, as a kernel reports a write-back error at fsync).
    file_errors: HashMap<FileId, BelowError>,
    prefetching: usize,
    /// The I/O of effects decided under the lock, started once it is
    /// released ([`Locked`]).
    deferred: Vec<handover::Work>,
    /// Prefetches decided meanwhile: started together on the runtime when
    /// it is unlocked ([`Locked`]).
    prefetches: Vec<handover::Work>,
    /// When the timer task wakes next (`None`: it waits to be told).
    timer_at: Option<Time>,
    /// Every buffer before this one has memory ([`Driver::take_memory`]
    /// starts looking here).
    memory_from: usize,
}

impl State {
    /// Buffer `b`'s bytes: a prefix of its block, every byte past it zero
    /// (none before its first use). A small file's block holds the page
    /// or two it needs, not the whole block: a fresh 64 KiB buffer's
    /// allocation and page faults were a sixth of a data server's work on
    /// a new 4 KiB file (issue 14).
    fn held(&mut self, b: BufId) -> &mut Arc<Block> {
        self.mem[b.index()].get_or_insert_with(Default::default)
    }

    /// Keeps the bytes of blocks whose eviction from buffer `b` is decided
    /// and not yet carried out, before `b` changes: otherwise an evicted
    /// last copy went to a peer with the bytes of the block that took
    /// its buffer (three `n-chance` mounts read blocks of other files).
    fn keep_evicted(&mut self, b: BufId) {
        let keys: Vec<BlockKey> = self.cache.evictions_of(b).collect();
        for key in keys {
            if let Some(Some(bytes)) = self.mem.get(b.index()) {
                let bytes = Arc::clone(bytes);
                self.evicting.entry((b.index(), key)).or_insert(bytes);
            }
        }
    }

    /// Buffer `b`'s bytes, to change: copied first where something being
    /// sent still holds them.
    fn unique(&mut self, b: BufId) -> &mut Block {
        self.keep_evicted(b);
        let slot = self.held(b);
        if Arc::get_mut(slot).is_none() {
            *slot = Arc::new(Block::from_slice(slot));
        }
        Arc::get_mut(slot).expect("just made unique")
    }

    /// Buffer `b`'s bytes, emptied, to fill anew (a buffer being sent is
    /// left to its sender).
    fn emptied(&mut self, b: BufId) -> &mut Block {
        self.keep_evicted(b);
        let slot = self.held(b);
        if Arc::get_mut(slot).is_none() {
            *slot = Arc::default();
        }
        let v = Arc::get_mut(slot).expect("just made unique");
        v.clear();
        v
    }

    /// Buffer `b`'s bytes, at least `..end` of them, to change.
    fn mem(&mut self, b: BufId, block_size: u32, end: u32) -> &mut Block {
        let v = self.unique(b);
        room(v, end as usize, block_size as usize);
        if v.len() < end as usize {
            v.resize_zeroed(end as usize);
        }
        v
    }

    /// Puts `src` at byte `at` of buffer `b` (appended where it goes past
    /// the bytes held, without zeroing them first).
    fn put(&mut self, b: BufId, block_size: u32, at: u32, src: &[u8]) {
        let at = at as usize;
        let v = self.unique(b);
        room(v, at + src.len(), block_size as usize);
        if v.len() < at {
            v.resize_zeroed(at);
        }
        let inside = (v.len() - at).min(src.len());
        v[at..at + inside].copy_from_slice(&src[..inside]);
        v.extend_from_slice(&src[inside..]);
    }

    /// Makes buffer `b` a copy of `data` (at most a block of it).
    fn replace(&mut self, b: BufId, block_size: u32, data: &[u8]) {
        let bs = block_size as usize;
        let v = self.emptied(b);
        let n = data.len().min(bs);
        room(v, n, bs);
        v.extend_from_slice(&data[..n]);
    }

    /// Buffer `b`'s memory, lent to a fetch that fills it anew
    /// ([`Below::fetch_into`]): taken out of the buffer unless something
    /// being sent still holds it (then new memory).
    fn lend(&mut self, b: BufId) -> Block {
        self.keep_evicted(b);
        Arc::get_mut(self.held(b)).map(std::mem::take).unwrap_or_default()
    }

    /// Makes buffer `b` hold the first `n` bytes of `v` (at most a block),
    /// the memory [`State::lend`] lent coming back.
    fn give_back(&mut self, b: BufId, block_size: u32, mut v: Block, n: usize) {
        self.keep_evicted(b);
        v.truncate(n.min(block_size as usize));
        let slot = self.held(b);
        match Arc::get_mut(slot) {
            Some(mem) => *mem = v,
            None => *slot = Arc::new(v),
        }
    }

    /// Copies bytes `start..end` of buffer `b` into `out`.
    fn copy_out(&mut self, b: BufId, start: u32, end: u32, out: &mut [u8]) {
        let v = self.held(b);
        let (start, end) = (start as usize, end as usize);
        let n = v.len().saturating_sub(start).min(end - start);
        if n > 0 {
            out[..n].copy_from_slice(&v[start..start + n]);
        }
        out[n..].fill(0);
    }

    /// Bytes `start..end` of buffer `b`, sharing its memory (a buffer
    /// holding fewer bytes grows to hold them first).
    fn share(&mut self, b: BufId, block_size: u32, start: u32, end: u32) -> Bytes {
        if self.held(b).len() < end as usize {
            self.mem(b, block_size, end);
        }
        Bytes::from_owner(Held(Arc::clone(self.held(b)))).slice(start as usize..end as usize)
    }
}

/// Bytes a buffer takes at first: whole pages, as many as its first use
/// needs. A buffer that grows past them takes the whole block at once.
const PAGE: usize = 4096;

/// Makes room in `v` for `end` bytes.
fn room(v: &mut Block, end: usize, block_size: usize) {
    if v.capacity() < end {
        let cap = if v.is_empty() {
            end.next_multiple_of(PAGE).min(block_size)
        } else {
            block_size
        };
        v.reserve_total(cap.max(end));
    }
}

/// A buffer's bytes held by what is sending them.
struct Held(Arc<Block>);

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

struct Shared<B> {
    state: Mutex<State>,
    below: B,
    block_size: u32,
    epoch: Instant,
    lanes: Vec<Notify>,
    lane_permits: Semaphore,
    free_lanes: Mutex<Vec<u32>>,
    /// Signalled after every completed write (flushes wait on it).
    io_done: Notify,
    /// Signalled when the cache's next timeout moved.
    timer: Notify,
    closed: AtomicBool,
}

/// A cache with its driver. Dropping it stops the timer task; dirty data
/// still in it is lost, so owners call [`Driver::flush_all`] first.
pub struct Driver<B: Below> {
    shared: Arc<Shared<B>>,
}

impl<B: Below> Drop for Driver<B> {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.timer.notify_one();
    }
}

struct Lane<'a, B> {
    id: u32,
    shared: &'a Shared<B>,
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl<B> Drop for Lane<'_, B> {
    fn drop(&mut self) {
        self.shared.free_lanes.lock().push(self.id);
    }
}

impl<B: Below> Driver<B> {
    /// Builds the cache and starts its timer task (needs a tokio runtime).
    /// `lanes` bounds the block accesses in progress at once.
    pub fn new(cfg: CacheConfig, lanes: usize, below: B) -> Result<Self, PolicyError> {
        // Lanes are the core's processes: no more than the policy admits.
        let lanes = lanes.clamp(1, cfg.replacement.max_processes(cfg.buffers).max(1));
        let n = cfg.buffers;
        let block_size = cfg.block_size;
        let mut cache = Cache::new(cfg)?;
        cache.report_evictions(below.wants_evictions());
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                cache,
                mem: (0..n).map(|_| None).collect(),
                evicting: HashMap::new(),
                failed_fetch: HashMap::new(),
                file_errors: HashMap::new(),
                prefetching: 0,
                timer_at: None,
                memory_from: 0,
                deferred: Vec::new(),
                prefetches: Vec::new(),
            }),
            below,
            block_size,
            epoch: Instant::now(),
            lanes: (0..lanes).map(|_| Notify::new()).collect(),
            lane_permits: Semaphore::new(lanes),
            free_lanes: Mutex::new((0..lanes as u32).rev().collect()),
            io_done: Notify::new(),
            timer: Notify::new(),
            closed: AtomicBool::new(false),
        });
        tokio::spawn(timer_task(shared.clone()));
        Ok(Driver { shared })
    }

    pub fn block_size(&self) -> u32 {
        self.shared.block_size
    }

    /// The level below.
    pub fn below(&self) -> &B {
        &self.shared.below
    }

    pub fn stats(&self) -> CacheStats {
        self.shared.lock().cache.stats().clone()
    }

    pub fn config(&self) -> CacheConfig {
        self.shared.lock().cache.config().clone()
    }

    /// Buffers holding bytes not yet written down.
    pub fn dirty_buffers(&self) -> usize {
        self.shared.lock().cache.dirty_buffers()
    }

    /// Changes the write policy while the cache runs (dirty data stays).
    pub fn set_write_policy(&self, kind: WritePolicyKind) {
        let sh = &self.shared;
        let mut st = sh.lock();
        st.cache.set_write_policy(kind);
        Shared::drive(&self.shared, &mut st);
    }

    /// The block `key` if the cache holds all of it, without fetching it or
    /// counting a hit (a peer asks: 1996 §4's remote hit).
    pub fn peek(&self, key: BlockKey) -> Option<Bytes> {
        let sh = &*self.shared;
        let mut st = sh.lock();
        let b = st.cache.resident(key)?;
        Some(st.share(b, sh.block_size, 0, sh.block_size))
    }

    /// Bytes `0..len` of block `key` if the cache holds them clean, without
    /// fetching or counting a hit (a small file's content for its size
    /// report).
    pub fn peek_prefix(&self, key: BlockKey, len: u32) -> Option<Bytes> {
        let sh = &*self.shared;
        let mut st = sh.lock();
        let b = st.cache.clean_prefix(key, len)?;
        Some(st.share(b, sh.block_size, 0, len))
    }

    /// Bytes `0..len` of block `key` if the cache holds them (clean or
    /// dirty) with no I/O under way, without fetching or counting a hit.
    pub fn peek_held_prefix(&self, key: BlockKey, len: u32) -> Option<Bytes> {
        let sh = &*self.shared;
        let mut st = sh.lock();
        let b = st.cache.held_prefix(key, len)?;
        Some(st.share(b, sh.block_size, 0, len))
    }

    /// Whether the cache holds any of block `key` (clean or dirty, whole or
    /// not) or is still writing its last copy down: a request that would go
    /// around the cache must go through it then, or it would miss (or be
    /// overtaken by) bytes only the cache has.
    pub fn holds(&self, key: BlockKey) -> bool {
        self.shared.lock().cache.has_say(key)
    }

    /// Whether a write of the whole block `key` may go around the cache:
    /// the cache has no dirty byte of it and nothing in progress on it.
    pub fn clean_or_absent(&self, key: BlockKey) -> bool {
        self.shared.lock().cache.clean_or_absent(key)
    }

    /// Puts `data`, the whole block `key` just written around the cache,
    /// here as its clean copy: over a clean idle copy, or in a free or
    /// clean buffer. See [`Placed`].
    pub fn place_clean(&self, key: BlockKey, data: &[u8]) -> Placed {
        let bs = self.shared.block_size;
        match self.place(key, |st, b| st.replace(b, bs, data)) {
            Ok(()) => Placed::Cached,
            Err(p) => p,
        }
    }

    /// As [`Driver::place_clean`], for a block in memory of its own (a
    /// write's payload that landed in it): the buffer takes that memory
    /// rather than a copy of its bytes, and the memory it held before is
    /// returned, for the next payload to land in (empty if it had none of
    /// its own, being sent meanwhile). Not placed, `data` comes back with
    /// why.
    pub fn place_clean_block(&self, key: BlockKey, data: Block) -> Result<Block, (Placed, Block)> {
        let bs = self.shared.block_size;
        let mut data = Some(data);
        self.place(key, |st, b| {
            let old = st.lend(b);
            let data = data.take().expect("placed once");
            let n = data.len();
            st.give_back(b, bs, data, n);
            old
        })
        .map_err(|p| (p, data.take().expect("not placed")))
    }

    /// Gives block `key`, written around the cache, a clean buffer of its
    /// own (over a clean idle copy, or a free or clean buffer) and fills
    /// it with `fill`.
    fn place<R>(&self, key: BlockKey, fill: impl FnOnce(&mut State, BufId) -> R) -> Result<R, Placed> {
        let sh = &*self.shared;
        let mut st = sh.lock();
        let now = sh.now();
        if !st.cache.clean_or_absent(key) {
            return Err(Placed::Busy);
        }
        // A clean idle copy, whole or not, gives way to the new one.
        if st.cache.contains(key) && !st.cache.discard_clean_block(now, key) {
            return Err(Placed::Busy);
        }
        let Some(b) = st.cache.adopt(now, key) else {
            Shared::drive(&self.shared, &mut st);
            return Err(Placed::NoRoom);
        };
        let r = fill(&mut st, b);
        Shared::drive(&self.shared, &mut st);
        Ok(r)
    }

    /// Takes in a whole, clean block from outside (a peer's forwarded last
    /// copy) as most recently used; `false` if there was no room or the
    /// cache holds it already.
    pub fn adopt(&self, key: BlockKey, data: &[u8]) -> bool {
        let sh = &*self.shared;
        let mut st = sh.lock();
        let now = sh.now();
        let Some(b) = st.cache.adopt(now, key) else {
            return false;
        };
        st.replace(b, sh.block_size, data);
        Shared::drive(&self.shared, &mut st);
        true
    }

    /// A file of `size` bytes was opened: prefetch policies start here.
    pub fn open(&self, file: FileId, size: u64) {
        let sh = &self.shared;
        let mut st = sh.lock();
        let now = sh.now();
        st.cache.open(now, file, size.div_ceil(sh.block_size as u64));
        Shared::drive(&self.shared, &mut st);
    }

    pub fn close(&self, file: FileId) {
        let sh = &self.shared;
        let mut st = sh.lock();
        let now = sh.now();
        st.cache.close(now, file);
    }

    /// Writes `data` at byte `offset` of `file` into the cache; the write
    /// policy decides when it goes down. Under `write-through` this returns
    /// only when it is down (and reports a failure to put it there).
    pub async fn write(&self, file: FileId, offset: u64, data: &[u8]) -> Result<(), DriverError> {
        let bs = self.shared.block_size;
        let accesses = split_blocks(offset, data.len() as u64, bs).map(|p| {
            let src = &data[p.request_offset as usize..][..p.range.len() as usize];
            self.access(BlockKey::new(file, p.index), Access::Write(p.range), move |st, b, r| {
                st.put(b, bs, r.start, src)
            })
        });
        for r in join_all(accesses).await {
            r?;
        }
        let waits = self.shared.lock().cache.config().write.write_waits();
        if waits {
            self.flush_file(file).await?;
        }
        Ok(())
    }

    /// Reads `out.len()` bytes at `offset` of `file` (bytes never written
    /// read as the level below has them: zeros past its end).
    pub async fn read(&self, file: FileId, offset: u64, out: &mut [u8]) -> Result<(), DriverError> {
        let bs = self.shared.block_size;
        let mut rest = out;
        let mut accesses = Vec::new();
        for p in split_blocks(offset, rest.len() as u64, bs) {
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(p.range.len() as usize);
            rest = tail;
            accesses.push(
                self.access(BlockKey::new(file, p.index), Access::Read(p.range), move |st, b, r| {
                    st.copy_out(b, r.start, r.end, mine)
                }),
            );
        }
        for r in join_all(accesses).await {
            r?;
        }
        Ok(())
    }

    /// Reads `len` bytes at `offset` of `file` as [`Driver::read`] does,
    /// as one piece per block that shares the cache's buffer: nothing is
    /// copied (a data server's answer to a node; a later change to a block
    /// still being sent copies the block instead).
    pub async fn read_pieces(&self, file: FileId, offset: u64, len: usize) -> Result<Vec<Bytes>, DriverError> {
        let bs = self.shared.block_size;
        let parts: Vec<_> = split_blocks(offset, len as u64, bs).collect();
        let mut pieces = vec![Bytes::new(); parts.len()];
        let accesses = parts.iter().zip(pieces.iter_mut()).map(|(p, piece)| {
            self.access(BlockKey::new(file, p.index), Access::Read(p.range), move |st, b, r| {
                *piece = st.share(b, bs, r.start, r.end)
            })
        });
        for r in join_all(accesses).await {
            r?;
        }
        Ok(pieces)
    }

    /// One block access on a lane: begin, wait while blocked, copy (given
    /// the buffer and the access's range of it), end.
    async fn access(
        &self,
        key: BlockKey,
        access: Access,
        copy: impl FnOnce(&mut State, BufId, ByteRange),
    ) -> Result<(), DriverError> {
        let sh = &*self.shared;
        let _permit = sh.lane_permits.acquire().await.expect("never closed");
        let id = sh.free_lanes.lock().pop().expect("a permit means a free lane");
        let lane = Lane {
            id,
            shared: sh,
            _permit,
        };
        let r: ByteRange = access.range();
        let mut copy = Some(copy);
        let mut waited = false;
        loop {
            {
                let mut st = sh.lock();
                if waited {
                    if let Some(e) = st.failed_fetch.get(&key) {
                        return Err(e.clone().into());
                    }
                }
                let now = sh.now();
                let begun = st.cache.begin(now, lane.id, key, access);
                // Effects first: a detached write copies its buffer out here.
                Shared::drive(&self.shared, &mut st);
                match begun? {
                    Begin::Ready(b) => {
                        (copy.take().expect("copied once"))(&mut st, b, r);
                        let ended = st.cache.end(now, lane.id, b, access);
                        Shared::drive(&self.shared, &mut st);
                        return Ok(ended?);
                    }
                    Begin::Blocked => {}
                }
            }
            sh.lanes[lane.id as usize].notified().await;
            waited = true;
        }
    }

    /// Starts writing down every dirty block of `file` and waits until none
    /// is left; reports a failure to write any of them since the last flush.
    pub async fn flush_file(&self, file: FileId) -> Result<(), BelowError> {
        self.flush_where(Some(file)).await
    }

    /// Writes down everything dirty and waits for it (fsync of all, unmount,
    /// shutdown, a checkpoint); reports the first failure of any file.
    pub async fn flush_all(&self) -> Result<(), BelowError> {
        self.flush_where(None).await
    }

    async fn flush_where(&self, file: Option<FileId>) -> Result<(), BelowError> {
        let sh = &*self.shared;
        loop {
            let mut done = pin!(sh.io_done.notified());
            done.as_mut().enable();
            {
                let mut st = sh.lock();
                let now = sh.now();
                let clean = match file {
                    Some(f) => {
                        st.cache.flush_file(now, f);
                        st.cache.file_is_clean(f)
                    }
                    None => {
                        st.cache.flush(now);
                        st.cache.is_clean()
                    }
                };
                Shared::drive(&self.shared, &mut st);
                if clean {
                    let err = match file {
                        Some(f) => st.file_errors.remove(&f),
                        None => {
                            let first = st.file_errors.keys().next().copied();
                            let e = first.and_then(|f| st.file_errors.remove(&f));
                            st.file_errors.clear();
                            e
                        }
                    };
                    return err.map_or(Ok(()), Err);
                }
            }
            done.await;
        }
    }

    /// Forgets block `key` if its copy is clean, once no access or I/O is
    /// in progress on it (a fetch that began before a write went around
    /// the cache would otherwise leave the old bytes here).
    pub async fn discard_clean_block(&self, key: BlockKey) {
        self.shared.below.discarded(key.file);
        self.retry_until_idle(|st, now| st.cache.discard_clean_block(now, key))
            .await
    }

    /// Gives up to `most` buffers that have no memory yet a whole block of
    /// it, every page touched, so that filling them later costs no page
    /// fault: a fresh page cost 1.8 µs here (the kernel's fault, its
    /// zeroing and its accounting), about a quarter of a new data
    /// server's work on a stream of writes it caches (issue 14). Blocking
    /// (about 0.1 s for 256 MiB here): call it from a thread of its own,
    /// a batch at a time. The memory is made without the lock, which is
    /// taken only to install it, so the cache serves meanwhile; a buffer
    /// the cache gave memory first keeps its own. Returns the bytes
    /// taken: 0 once every buffer has memory.
    pub fn take_memory(&self, most: usize) -> u64 {
        let sh = &*self.shared;
        let bs = sh.block_size as usize;
        let empty = {
            let st = sh.state.lock();
            st.mem[st.memory_from..]
                .iter()
                .filter(|m| m.is_none())
                .take(most)
                .count()
        };
        // Every page written now (a zeroed allocation may be untouched
        // pages); the buffer holds no bytes yet, only their room.
        let mut fresh: Vec<Block> = (0..empty).map(|_| Block::with_pages_touched(bs)).collect();
        let mut taken = 0;
        let mut st = sh.state.lock();
        let from = st.memory_from;
        let mut upto = from;
        for (i, slot) in st.mem.iter_mut().enumerate().skip(from) {
            upto = i;
            if slot.is_none() {
                let Some(v) = fresh.pop() else { break };
                taken += v.capacity() as u64;
                *slot = Some(Arc::new(v));
            }
        }
        // Every buffer before here has memory (a buffer never loses it).
        st.memory_from = if taken == 0 { st.mem.len() } else { upto };
        taken
    }

    /// Bytes of memory the cache's buffers hold now (whatever their
    /// blocks use of it).
    pub fn memory_bytes(&self) -> u64 {
        let st = self.shared.state.lock();
        st.mem.iter().flatten().map(|v| v.capacity() as u64).sum()
    }

    /// Forgets every clean block not in use (see [`Cache::discard_clean`]);
    /// returns how many. The buffers keep their memory.
    pub fn drop_clean(&self) -> usize {
        let sh = &*self.shared;
        let mut st = sh.lock();
        let now = sh.now();
        let n = st.cache.discard_clean(now);
        Shared::drive(&self.shared, &mut st);
        n
    }

    /// Forgets the blocks of `file` from block `from_block` on, dirty ones
    /// unwritten (the file was removed or cut). Waits for accesses and I/O
    /// in progress on them to end first.
    pub async fn discard_file(&self, file: FileId, from_block: u64) {
        self.shared.below.discarded(file);
        self.retry_until_idle(|st, now| {
            let busy = st.cache.discard_file(now, file, from_block);
            if from_block == 0 {
                st.file_errors.remove(&file);
            }
            busy == 0
        })
        .await
    }

    /// Runs `attempt` until it says it is done, waiting between tries for
    /// an I/O to end (busy buffers finish an access or an I/O soon; a
    /// gentle poll covers an access that ends without I/O).
    async fn retry_until_idle(&self, mut attempt: impl FnMut(&mut State, Time) -> bool) {
        let sh = &*self.shared;
        loop {
            let mut done = pin!(sh.io_done.notified());
            done.as_mut().enable();
            {
                let mut st = sh.lock();
                let now = sh.now();
                let ok = attempt(&mut st, now);
                Shared::drive(&self.shared, &mut st);
                if ok {
                    return;
                }
            }
            tokio::select! {
                _ = done => {}
                _ = tokio::time::sleep(std::time::Duration::from_millis(1)) => {}
            }
        }
    }
}

impl<B: Below> Shared<B> {
    fn lock(&self) -> Locked<'_> {
        Locked(Some(self.state.lock()))
    }

    fn now(&self) -> Time {
        Time(self.epoch.elapsed().as_nanos() as u64)
    }

    /// Carries out every effect the cache has decided. Called with the
    /// state locked after each call into the cache; I/O runs in tasks.
    fn drive(me: &Arc<Shared<B>>, st: &mut State) {
        while let Some(e) = st.cache.poll_effect() {
            Shared::effect(me, st, e);
        }
        if st.prefetching <= PREFETCH_REFILL_AT {
            while st.prefetching < PREFETCH_DEPTH {
                let now = me.now();
                match st.cache.poll_prefetch(now, &mut |_| true) {
                    Some(e) => {
                        st.prefetching += 1;
                        Shared::effect(me, st, e);
                    }
                    None => break,
                }
            }
        }
        // The timer task is woken only to wake sooner than it would: a
        // later or no timeout waits for its wake-up, which asks the cache
        // again (an early `handle_timeout` does nothing that is not due).
        // Waking it at every change cost a mount a thread switch per
        // write (issue 14).
        if let Some(at) = st.cache.poll_timeout() {
            if st.timer_at.is_none_or(|armed| at < armed) {
                st.timer_at = Some(at);
                me.timer.notify_one();
            }
        }
    }

    fn effect(me: &Arc<Shared<B>>, st: &mut State, e: Effect) {
        match e {
            Effect::Resume { proc } => me.lanes[proc as usize].notify_one(),
            Effect::Evicted { key, buf } => {
                let bs = me.block_size as usize;
                let data = match st.evicting.remove(&(buf.index(), key)) {
                    Some(kept) if kept.len() >= bs => Bytes::from_owner(Held(kept)).slice(0..bs),
                    Some(kept) => {
                        let mut whole = kept.to_vec();
                        whole.resize(bs, 0);
                        Bytes::from(whole)
                    }
                    None => st.share(buf, me.block_size, 0, me.block_size),
                };
                me.below.evicted(key, data);
            }
            Effect::Write {
                token, key, buf, dirty, ..
            } => {
                let bs = me.block_size;
                let pieces: Vec<(u32, Bytes)> = dirty
                    .ranges()
                    .iter()
                    .map(|r| (r.start, st.share(buf, bs, r.start, r.end)))
                    .collect();
                let me = Arc::clone(me);
                st.deferred.push(Box::pin(async move {
                    let res = me.below.write(key, pieces).await;
                    {
                        let mut st = me.lock();
                        if let Err(e) = res {
                            tracing::warn!("writing block {} of file {} down: {e}", key.index, key.file);
                            st.file_errors.entry(key.file).or_insert(e);
                        }
                        let now = me.now();
                        st.cache.write_done(now, token);
                        Shared::drive(&me, &mut st);
                    }
                    me.io_done.notify_waiters();
                }));
            }
            Effect::Fetch {
                token,
                key,
                buf,
                keep,
                prefetch,
            } => {
                st.failed_fetch.remove(&key);
                let me = Arc::clone(me);
                // Nothing of the block to keep: the fetch fills the
                // buffer's own memory ([`Below::fetch_into`]).
                let lent = keep.ranges().is_empty().then(|| st.lend(buf));
                let io: handover::Work = Box::pin(async move {
                    let (mem, res) = match lent {
                        Some(lent) => {
                            let (mem, res) = me.below.fetch_into(key, lent, prefetch).await;
                            (Some(mem), res.map(Fetched::Into))
                        }
                        None if prefetch => (None, me.below.prefetch(key).await.map(Fetched::Bytes)),
                        None => (None, me.below.fetch(key).await.map(Fetched::Bytes)),
                    };
                    let mut st = me.lock();
                    let now = me.now();
                    let bs = me.block_size;
                    if prefetch {
                        st.prefetching -= 1;
                    }
                    match res {
                        Ok(Fetched::Into(n)) => {
                            st.give_back(buf, bs, mem.unwrap_or_default(), n);
                            st.cache.fetch_done(now, token);
                        }
                        Ok(Fetched::Bytes(data)) => {
                            // Fill every byte the buffer does not already
                            // hold, up to the end of the fetched bytes or of
                            // the kept ones; past it the block is zeros.
                            let kept = keep.ranges().iter().map(|r| r.end).max().unwrap_or(0);
                            let end = (data.len().min(bs as usize) as u32).max(kept);
                            let mem = st.mem(buf, bs, end);
                            mem.truncate(end as usize);
                            let mut pos = 0u32;
                            let holes = keep
                                .ranges()
                                .iter()
                                .map(|r| (r.start, r.end))
                                .chain(std::iter::once((end, end)));
                            for (a, b) in holes {
                                fill(&mut mem[pos as usize..a as usize], &data, pos as usize);
                                pos = b;
                            }
                            st.cache.fetch_done(now, token);
                        }
                        Err(e) => {
                            if let Some(mem) = mem {
                                st.give_back(buf, bs, mem, 0);
                            }
                            if !prefetch {
                                tracing::warn!("fetching block {} of file {}: {e}", key.index, key.file);
                                st.failed_fetch.insert(key, e);
                            }
                            st.cache.fetch_failed(now, token);
                        }
                    }
                    Shared::drive(&me, &mut st);
                });
                // A prefetch is no one's wait: it goes to the runtime, and
                // the request that decided it is answered first.
                if prefetch {
                    st.prefetches.push(io);
                } else {
                    st.deferred.push(io);
                }
            }
        }
    }
}

/// What a fetch brought: the block's length in the memory it was lent, or
/// its bytes (to merge with the bytes of it the cache keeps).
enum Fetched {
    Into(usize),
    Bytes(Bytes),
}

/// The cache's state, locked. Effects' I/O decided meanwhile starts when
/// it is unlocked, on this thread: each is polled here first, so its
/// request goes out without waking a runtime worker to send it (a mount's
/// close, a random read's miss: two thread switches less; issue 14), and
/// is spawned on the runtime only when its answer wakes it
/// ([`handover::run_all_here`]).
struct Locked<'a>(Option<MutexGuard<'a, State>>);

impl std::ops::Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        self.0.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.0.as_mut().expect("held until dropped")
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        let Some(mut st) = self.0.take() else {
            return;
        };
        if st.deferred.is_empty() && st.prefetches.is_empty() {
            return;
        }
        let work = std::mem::take(&mut st.deferred);
        let prefetches = std::mem::take(&mut st.prefetches);
        drop(st);
        // The prefetches decided together start together, one after the
        // other on one runtime thread: a data server's store queue then
        // finds a read-ahead's run of blocks waiting as one read. Spawned
        // one by one, each could reach the queue after a reader had taken
        // the one before (issue 14).
        if !prefetches.is_empty() {
            tokio::spawn(async move { start(prefetches) });
        }
        if !work.is_empty() {
            start(work);
        }
    }
}

thread_local! {
    /// Work decided while this thread is starting other work (an I/O that
    /// ended at once and decided more): the outer [`start`] takes it, so
    /// starts never nest.
    static STARTING: std::cell::RefCell<Option<Vec<handover::Work>>> = const { std::cell::RefCell::new(None) };
}

/// Starts effects' I/O on this thread (see [`Locked`]).
fn start(work: Vec<handover::Work>) {
    let mut work = Some(work);
    STARTING.with(|s| {
        if let Some(q) = s.borrow_mut().as_mut() {
            q.extend(work.take().expect("not taken yet"));
        }
    });
    let Some(mut batch) = work else {
        return;
    };
    /// Ends this thread's start, even if a poll panics.
    struct Started;
    impl Drop for Started {
        fn drop(&mut self) {
            STARTING.with(|s| *s.borrow_mut() = None);
        }
    }
    STARTING.with(|s| *s.borrow_mut() = Some(Vec::new()));
    let _started = Started;
    let rt = tokio::runtime::Handle::current();
    while !batch.is_empty() {
        handover::run_all_here(&rt, batch);
        batch = STARTING.with(|s| s.borrow_mut().as_mut().map(std::mem::take).unwrap_or_default());
    }
}

/// Copies `data[from..]` into `dst`, zeros where `data` ends.
fn fill(dst: &mut [u8], data: &[u8], from: usize) {
    let have = data.len().saturating_sub(from).min(dst.len());
    if have > 0 {
        dst[..have].copy_from_slice(&data[from..from + have]);
    }
    dst[have..].fill(0);
}

/// Fires the cache's timers (write-policy ages, thresholds, the syncer).
async fn timer_task<B: Below>(sh: Arc<Shared<B>>) {
    loop {
        if sh.closed.load(Ordering::SeqCst) {
            return;
        }
        let changed = sh.timer.notified();
        let at = sh.lock().timer_at;
        match at {
            Some(t) => {
                let when = sh.epoch + std::time::Duration::from_nanos(t.0);
                tokio::select! {
                    _ = changed => {}
                    _ = tokio::time::sleep_until(when) => {
                        let mut st = sh.lock();
                        let now = sh.now();
                        st.cache.handle_timeout(now);
                        st.timer_at = None;
                        Shared::drive(&sh, &mut st);
                    }
                }
            }
            None => changed.await,
        }
    }
}

#[cfg(test)]
mod tests;
