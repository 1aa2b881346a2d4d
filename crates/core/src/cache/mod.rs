//! A block cache as a sans-IO state machine (DESIGN.md §1).
//!
//! The driver calls [`Cache::begin`] when a process starts to read or write
//! part of a block and [`Cache::end`] when the bytes have been copied; it
//! reports I/O completions with [`Cache::write_done`] and
//! [`Cache::fetch_done`] and fires timers it learns from
//! [`Cache::poll_timeout`]. The cache answers with [`Effect`]s pulled with
//! [`Cache::poll_effect`]: write a block down, fetch a block, resume a
//! blocked process. It never performs I/O and never reads a clock.
//!
//! The driver carries out the effects after every call, before it touches a
//! buffer that [`Cache::begin`] returned: a detached write names a buffer
//! whose bytes must be copied out before the buffer takes its new block.
//! A process that receives [`Effect::Resume`] must call [`Cache::begin`]
//! again: a freed buffer wakes one waiter at a time, and the wake-up passes
//! to the next waiter only through that call.
//!
//! Policies plug in at three places: [`Replacement`] chooses victims,
//! [`WritePolicy`] decides when dirty data goes down, [`Prefetch`] proposes
//! blocks to read ahead. Buffers being copied into (pinned) or busy with I/O
//! are never replaced and never modified: a process that wants such a
//! buffer waits ("the buffer is not usable until the write completes",
//! Kotz & Ellis 1992 §3.3.2).

mod stats;

pub use stats::{CacheStats, WriteCause};

use crate::block::{BlockKey, ByteRange, FileId, RangeSet};
use crate::error::{AccessError, PolicyError};
use crate::prefetch::{Prefetch, PrefetchKind};
use crate::replacement::{RecencyList, Replacement, ReplacementKind};
use crate::time::{Span, Time};
use crate::write::{BufView, WritePolicy, WritePolicyKind};
use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

pub use crate::ids::{BufId, IoToken, ProcId};

/// How a cache is built. Every field has a default a user would expect.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheConfig {
    pub buffers: usize,
    pub block_size: u32,
    pub replacement: ReplacementKind,
    pub write: WritePolicyKind,
    pub prefetch: PrefetchKind,
    /// Auxiliary buffers for delayed clean (Cortes et al. 1996 §3): a dirty
    /// block that must leave to free a buffer is copied to one and written
    /// from there, so the requester need not wait for the disk. 0 turns it off.
    pub aux_buffers: usize,
    /// The syncer: every interval, write down every dirty block (Unix's
    /// update daemon, 30 s). `None` turns it off.
    pub syncer: Option<Span>,
    /// Blocks go down whole (a block device): a write that does not cover a
    /// whole block first fetches the block, as a read-modify-write. The
    /// driver completes such a fetch at once when the block does not exist
    /// below yet. Off for byte-addressed levels below.
    pub fill_partial_writes: bool,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            buffers: 1024,
            block_size: 64 * 1024,
            replacement: ReplacementKind::Lru,
            write: WritePolicyKind::WriteBack,
            prefetch: PrefetchKind::None,
            aux_buffers: 0,
            syncer: Some(Span::from_secs(30)),
            fill_partial_writes: false,
        }
    }
}

/// One access to part of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read(ByteRange),
    Write(ByteRange),
}

impl Access {
    pub fn range(self) -> ByteRange {
        match self {
            Access::Read(r) | Access::Write(r) => r,
        }
    }
}

/// The answer to [`Cache::begin`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Begin {
    /// The buffer is pinned for this access: copy, then call [`Cache::end`].
    Ready(BufId),
    /// The access must wait; the cache will emit [`Effect::Resume`] for this
    /// process when it is worth calling [`Cache::begin`] again.
    Blocked,
}

/// What the cache asks its driver to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Write the `dirty` bytes of buffer `buf` (holding `key`) one level down,
    /// then call [`Cache::write_done`]. `whole` says the buffer holds every
    /// byte of the block. If `detached`, copy the bytes out now: the buffer
    /// may be reused at once (delayed clean through an auxiliary buffer).
    Write {
        token: IoToken,
        key: BlockKey,
        buf: BufId,
        dirty: RangeSet,
        whole: bool,
        detached: bool,
        cause: WriteCause,
    },
    /// Read `key` into buffer `buf`, keeping the bytes in `keep` that the
    /// buffer already holds (they may be dirty), then call [`Cache::fetch_done`].
    Fetch {
        token: IoToken,
        key: BlockKey,
        buf: BufId,
        keep: RangeSet,
        prefetch: bool,
    },
    /// A process blocked in [`Cache::begin`] should try again.
    Resume { proc: ProcId },
    /// The clean, whole block `key` in `buf` is being replaced: copy it out
    /// now if it should live on elsewhere (a cooperative tier's forward,
    /// 1996 §4); the buffer is reused at once. Only with
    /// [`Cache::report_evictions`].
    Evicted { key: BlockKey, buf: BufId },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Io {
    Idle,
    Writing,
    Fetching { prefetch: bool },
}

#[derive(Clone, Copy, Debug)]
enum InFlight {
    Buffer(BufId),
    Detached(BlockKey),
}

struct Buffer {
    key: Option<BlockKey>,
    /// Bytes holding the block's current content.
    valid: RangeSet,
    /// Bytes not yet written down.
    dirty: RangeSet,
    /// Bytes written by requests since the block entered the buffer.
    written: RangeSet,
    dirty_since: Option<Time>,
    io: Io,
    pins: u32,
    /// A write was decided while the buffer was pinned or busy.
    want_write: Option<WriteCause>,
    /// Filled by a prefetch and not yet used.
    prefetched: bool,
    /// One of `pins` is held by a demand fetch for the processes waiting on
    /// it; the next access to the block takes it over. Without the hold, a
    /// freshly filled buffer could be taken for another block before its
    /// waiter returns, and waiters could take each other's buffers forever.
    held: bool,
}

impl Buffer {
    fn empty() -> Self {
        Buffer {
            key: None,
            valid: RangeSet::new(),
            dirty: RangeSet::new(),
            written: RangeSet::new(),
            dirty_since: None,
            io: Io::Idle,
            pins: 0,
            want_write: None,
            prefetched: false,
            held: false,
        }
    }
    fn idle(&self) -> bool {
        self.pins == 0 && self.io == Io::Idle
    }
    /// Being written down with no access holding it: free once it lands.
    fn relief(&self) -> bool {
        self.pins == 0 && self.io == Io::Writing
    }
}

/// Walks `repl`'s candidates for `proc`: the first clean idle buffer, the
/// idle dirty ones before it (into `dirty`), and the unpinned buffers being
/// written. With `idle` given, stops after that many idle buffers.
fn walk(
    repl: &dyn Replacement,
    bufs: &[Buffer],
    proc: Option<ProcId>,
    dirty: &mut Vec<BufId>,
    idle: Option<usize>,
) -> (Option<BufId>, usize) {
    let (mut clean, mut relief, mut seen) = (None, 0usize, 0usize);
    repl.candidates(proc, &mut |c| {
        let buf = &bufs[c.index()];
        if buf.idle() {
            if buf.dirty.is_empty() {
                clean = Some(c);
                return false;
            }
            dirty.push(c);
            seen += 1;
            return idle != Some(seen);
        } else if buf.relief() {
            relief += 1;
        }
        true
    });
    (clean, relief)
}

/// The cache state machine. See the module documentation for the protocol.
pub struct Cache {
    cfg: CacheConfig,
    bufs: Vec<Buffer>,
    table: FxHashMap<BlockKey, BufId>,
    /// The buffers holding each file's blocks, so that a file's flush,
    /// clean check and discard visit only them, in buffer order, not
    /// every buffer of a large cache (a mount's close of a small file
    /// spent more time in those walks than in the write itself).
    by_file: FxHashMap<FileId, BTreeSet<BufId>>,
    free: Vec<BufId>,
    repl: Box<dyn Replacement>,
    write: Box<dyn WritePolicy>,
    prefetch: Box<dyn Prefetch>,
    /// Every buffer holding a block, least recently used first (for
    /// threshold's "least recently used dirty blocks" and age sweeps).
    recency: RecencyList,
    /// Buffers with unwritten bytes that are not being written.
    dirty: usize,
    /// Buffers being written down.
    writing: usize,
    /// Buffers pinned or with I/O in flight (not `idle`). When every buffer
    /// is busy, `allocate` has nothing to offer and answers at once instead
    /// of walking the replacement order once per waiter.
    busy: usize,
    /// Buffers being written down that no access pins: each will be free
    /// once its write lands (the `relief` of `allocate`).
    unpinned_writing: usize,
    /// When each buffer was last touched (the recency order, as a number).
    stamp: Vec<u64>,
    clock: u64,
    /// In a large cache whose policy offers every block (LRU), the idle
    /// buffers holding a block by `stamp`, clean ones (`[0]`) apart from
    /// dirty ones (`[1]`): `allocate` takes the first clean one, or visits
    /// the dirty ones, in the order the policy would offer them, instead
    /// of walking past thousands of busy or dirty buffers.
    idle_index: Option<[BTreeMap<u64, BufId>; 2]>,
    aux_in_use: usize,
    /// Blocks with a detached write on its way down. A newer copy of such a
    /// block is not written until it lands: two writes of one block in
    /// flight at once could land in either order and lose the newer bytes.
    detached_keys: FxHashSet<BlockKey>,
    inflight: FxHashMap<u64, InFlight>,
    next_token: u64,
    effects: VecDeque<Effect>,
    waiting_on: Vec<(ProcId, BufId)>,
    /// Processes waiting for any buffer, first come first served.
    waiting_any: VecDeque<ProcId>,
    /// Waiters resumed to try a freed buffer, with how many other waiters
    /// may still be tried after them if they fail. A freed buffer wakes one
    /// waiter at a time, not all of them (no thundering herd); a woken
    /// waiter that cannot use it passes the wake-up on, so none is lost.
    /// A map: a driver that begins a resumed access under a new process id
    /// (the 1993 model does) leaves its entry behind, and a list of those
    /// scanned at every access took over half of a long simulation's time.
    woken: FxHashMap<ProcId, usize>,
    prefetch_queue: VecDeque<BlockKey>,
    prefetch_queued: FxHashSet<BlockKey>,
    proposals: Vec<BlockKey>,
    scratch: Vec<BufId>,
    sync_due: Option<Time>,
    now: Time,
    stats: CacheStats,
    report_evictions: bool,
}

impl Cache {
    pub fn new(cfg: CacheConfig) -> Result<Cache, PolicyError> {
        if cfg.buffers == 0 {
            return Err(PolicyError::NoBuffers);
        }
        if cfg.block_size == 0 {
            return Err(PolicyError::ZeroBlockSize);
        }
        if matches!(cfg.syncer, Some(s) if s.0 == 0) {
            return Err(PolicyError::BadParameter {
                policy: "syncer".into(),
                detail: "interval must be positive".into(),
            });
        }
        let n = cfg.buffers;
        let repl = cfg.replacement.build(n);
        let idle_index = (repl.offers_every_block() && n >= Self::INDEX_FROM).then(Default::default);
        Ok(Cache {
            bufs: (0..n).map(|_| Buffer::empty()).collect(),
            table: FxHashMap::default(),
            by_file: FxHashMap::default(),
            free: (0..n as u32).rev().map(BufId).collect(),
            repl,
            write: cfg.write.build(),
            prefetch: cfg.prefetch.build(cfg.buffers),
            recency: RecencyList::new(n),
            dirty: 0,
            writing: 0,
            busy: 0,
            unpinned_writing: 0,
            stamp: vec![0; n],
            clock: 0,
            idle_index,
            aux_in_use: 0,
            detached_keys: FxHashSet::default(),
            inflight: FxHashMap::default(),
            next_token: 0,
            effects: VecDeque::new(),
            waiting_on: Vec::new(),
            waiting_any: VecDeque::new(),
            woken: FxHashMap::default(),
            prefetch_queue: VecDeque::new(),
            prefetch_queued: FxHashSet::default(),
            proposals: Vec::new(),
            scratch: Vec::new(),
            sync_due: None,
            now: Time::ZERO,
            stats: CacheStats::default(),
            report_evictions: false,
            cfg,
        })
    }

    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }
    pub fn stats(&self) -> &CacheStats {
        &self.stats
    }
    /// Buffers holding bytes not yet written down (including those on their way).
    pub fn dirty_buffers(&self) -> usize {
        self.dirty + self.writing
    }
    /// Whether every byte written has reached the level below.
    pub fn is_clean(&self) -> bool {
        self.dirty == 0 && self.writing == 0 && self.aux_in_use == 0
    }
    /// The block a buffer holds.
    pub fn key_of(&self, buf: BufId) -> Option<BlockKey> {
        self.bufs[buf.index()].key
    }
    pub fn contains(&self, key: BlockKey) -> bool {
        self.table.contains_key(&key)
    }

    /// Whether the cache has any say over `key`'s bytes: it holds the block,
    /// or its last copy is still on its way down from an auxiliary buffer.
    /// A request that goes around the cache must not overtake either.
    pub fn has_say(&self, key: BlockKey) -> bool {
        self.table.contains_key(&key) || self.detached_keys.contains(&key)
    }
    /// Whether the cache has no dirty byte of `key` and nothing in progress
    /// on it: a write of the whole block around the cache (a data server's
    /// direct write) then leaves no newer byte behind here.
    pub fn clean_or_absent(&self, key: BlockKey) -> bool {
        if self.detached_keys.contains(&key) {
            return false;
        }
        self.table.get(&key).is_none_or(|&b| {
            let buf = &self.bufs[b.index()];
            buf.idle() && buf.dirty.is_empty()
        })
    }

    /// The buffer holding every byte of `key`, clean and idle (what a
    /// peer may be given: bytes the data servers have too).
    pub fn resident(&self, key: BlockKey) -> Option<BufId> {
        let &b = self.table.get(&key)?;
        let buf = &self.bufs[b.index()];
        let whole = buf.valid.is_full(self.cfg.block_size);
        (buf.io == Io::Idle && whole && buf.dirty.is_empty()).then_some(b)
    }

    /// The buffer holding bytes `0..len` of `key`, clean and idle (a small
    /// file's whole content, which its size report may carry to the
    /// metadata server).
    pub fn clean_prefix(&self, key: BlockKey, len: u32) -> Option<BufId> {
        let &b = self.table.get(&key)?;
        let buf = &self.bufs[b.index()];
        let held = len <= self.cfg.block_size && buf.valid.covers(ByteRange::new(0, len));
        (buf.io == Io::Idle && held && buf.dirty.is_empty()).then_some(b)
    }

    /// The buffer holding bytes `0..len` of `key`, clean or dirty, with no
    /// I/O on it (a small file's whole content as this node has it, which
    /// a close may report to the metadata server instead of pushing it).
    pub fn held_prefix(&self, key: BlockKey, len: u32) -> Option<BufId> {
        let &b = self.table.get(&key)?;
        let buf = &self.bufs[b.index()];
        let held = len <= self.cfg.block_size && buf.valid.covers(ByteRange::new(0, len));
        (buf.io == Io::Idle && held).then_some(b)
    }

    /// Whether a clean, whole block replaced by a new one is reported
    /// ([`Effect::Evicted`]) before its buffer is reused.
    pub fn report_evictions(&mut self, on: bool) {
        self.report_evictions = on;
    }

    /// Takes in a whole, clean block from outside (a peer forwarded the
    /// last copy it evicted, 1996 §4) as the most recently used, in a free
    /// or clean buffer; returns the buffer to copy its bytes into, or
    /// `None` if the block is here already or no buffer is clean and idle.
    pub fn adopt(&mut self, now: Time, key: BlockKey) -> Option<BufId> {
        self.now = now;
        if self.table.contains_key(&key) {
            return None;
        }
        let b = self.allocate(None, false)?;
        self.install(b, key);
        let bs = self.cfg.block_size;
        self.bufs[b.index()].valid.insert(ByteRange::new(0, bs));
        Some(b)
    }

    /// Changes the write policy of a running cache; dirty data stays and is
    /// handled by the new policy from now on.
    pub fn set_write_policy(&mut self, kind: WritePolicyKind) {
        self.write = kind.build();
        self.cfg.write = kind;
        self.check_dirty_level();
    }

    /// The blocks whose eviction from buffer `buf` is decided and not yet
    /// taken by the driver ([`Effect::Evicted`] still queued). A driver
    /// that fills the buffer anew before it takes them keeps their bytes
    /// first: the effect names the buffer, and its bytes are the new
    /// block's by then. None where evictions are not reported (no scan).
    pub fn evictions_of(&self, buf: BufId) -> impl Iterator<Item = BlockKey> + '_ {
        let (front, back) = if self.report_evictions {
            self.effects.as_slices()
        } else {
            (&[][..], &[][..])
        };
        front.iter().chain(back).filter_map(move |e| match e {
            Effect::Evicted { key, buf: b } if *b == buf => Some(*key),
            _ => None,
        })
    }

    /// The next effect for the driver, in the order the cache decided them.
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// `proc` starts to access `key`. See [`Begin`].
    pub fn begin(&mut self, now: Time, proc: ProcId, key: BlockKey, access: Access) -> Result<Begin, AccessError> {
        self.now = now;
        let r = access.range();
        if r.start > r.end || r.end > self.cfg.block_size {
            return Err(AccessError::OutOfBlock {
                start: r.start,
                end: r.end,
                block_size: self.cfg.block_size,
            });
        }
        self.repl.admit(proc)?;
        let probe = self.woken.remove(&proc);
        let begun = self.begin_inner(proc, key, access);
        if let (Ok(Begin::Blocked), Some(left)) = (&begun, probe) {
            // This waiter could not use what was freed: let the next one try,
            // unless another access took it and no buffer is idle. Then none
            // could, and the next buffer to become idle wakes a waiter again
            // (without this, one stolen buffer costs a try per waiter).
            if left > 0 && (self.busy < self.bufs.len() || !self.repl.offers_every_block()) {
                if let Some(q) = self
                    .waiting_any
                    .iter()
                    .position(|&q| q != proc)
                    .and_then(|i| self.waiting_any.remove(i))
                {
                    self.woken.insert(q, left - 1);
                    self.effects.push_back(Effect::Resume { proc: q });
                }
            }
        }
        begun
    }

    fn begin_inner(&mut self, proc: ProcId, key: BlockKey, access: Access) -> Result<Begin, AccessError> {
        if let Some(&b) = self.table.get(&key) {
            let buf = &mut self.bufs[b.index()];
            let bs = self.cfg.block_size;
            let needs_fetch = match access {
                Access::Read(r) => !buf.valid.covers(r),
                Access::Write(r) => {
                    self.cfg.fill_partial_writes && !buf.valid.is_full(bs) && !(r.start == 0 && r.end == bs)
                }
            };
            // A busy buffer, or one that must be filled while another access
            // is still copying into it, makes the access wait.
            if buf.io != Io::Idle || (needs_fetch && buf.pins > 0) {
                self.waiting_on.push((proc, b));
                return Ok(Begin::Blocked);
            }
            // An older copy is on its way down from an auxiliary buffer: a
            // fetch now could read the bytes from before it.
            if needs_fetch && self.detached_keys.contains(&key) {
                self.waiting_any.push_back(proc);
                return Ok(Begin::Blocked);
            }
            let buf = &mut self.bufs[b.index()];
            match access {
                Access::Read(r) if !buf.valid.covers(r) => {
                    self.stats.read_misses += 1;
                    self.start_fetch(b, false);
                    self.waiting_on.push((proc, b));
                    return Ok(Begin::Blocked);
                }
                // The read a demand fetch was made for (it takes over the
                // fetch's hold) was counted as a miss: not a hit as well.
                Access::Read(_) if buf.held => {}
                Access::Read(_) => {
                    self.stats.read_hits += 1;
                    if buf.prefetched {
                        self.stats.prefetch_hits += 1;
                    }
                }
                Access::Write(_) if needs_fetch => {
                    self.stats.fill_fetches += 1;
                    self.start_fetch(b, false);
                    self.waiting_on.push((proc, b));
                    return Ok(Begin::Blocked);
                }
                Access::Write(r) => {
                    self.stats.write_hits += 1;
                    if buf.dirty.overlaps(r) {
                        // Bytes not yet down are written again: one write
                        // below absorbed (Biswas et al. 1993 §6.1).
                        self.stats.overwrites += 1;
                    }
                }
            }
            buf.prefetched = false;
            if buf.held {
                buf.held = false; // take over the fetch's pin
            } else {
                self.pin(b);
            }
            return Ok(Begin::Ready(b));
        }
        let fills = match access {
            Access::Read(_) => true,
            Access::Write(r) => self.cfg.fill_partial_writes && !(r.start == 0 && r.end == self.cfg.block_size),
        };
        if fills && self.detached_keys.contains(&key) {
            // Its last copy is still on its way down (delayed clean): fetched
            // now, the level below could answer with the bytes before it.
            self.waiting_any.push_back(proc);
            return Ok(Begin::Blocked);
        }
        let Some(b) = self.allocate(Some(proc), true) else {
            self.stats.stalls += 1;
            self.waiting_any.push_back(proc);
            return Ok(Begin::Blocked);
        };
        self.install(b, key);
        match access {
            Access::Read(_) => {
                self.stats.read_misses += 1;
                self.start_fetch(b, false);
                self.waiting_on.push((proc, b));
                Ok(Begin::Blocked)
            }
            Access::Write(r) if self.cfg.fill_partial_writes && !(r.start == 0 && r.end == self.cfg.block_size) => {
                self.stats.write_allocs += 1;
                self.stats.fill_fetches += 1;
                self.start_fetch(b, false);
                self.waiting_on.push((proc, b));
                Ok(Begin::Blocked)
            }
            Access::Write(_) => {
                self.stats.write_allocs += 1;
                self.pin(b);
                Ok(Begin::Ready(b))
            }
        }
    }

    /// `proc` finished the access it began on `buf`: for a write, the bytes
    /// of the range are now in the buffer.
    pub fn end(&mut self, now: Time, proc: ProcId, buf: BufId, access: Access) -> Result<(), AccessError> {
        self.now = now;
        let b = &mut self.bufs[buf.index()];
        if b.pins == 0 || b.key.is_none() {
            return Err(AccessError::NotPinned(buf.0));
        }
        let key = b.key.expect("checked");
        let mut wrote = false;
        if let Access::Write(r) = access {
            if !r.is_empty() {
                wrote = true;
                b.valid.insert(r);
                b.written.insert(r);
                if b.dirty.is_empty() {
                    b.dirty_since = Some(now);
                    self.dirty += 1;
                    if self.sync_due.is_none() {
                        if let Some(iv) = self.cfg.syncer {
                            self.sync_due = Some(Time((now.0 / iv.0 + 1) * iv.0));
                        }
                    }
                }
                b.dirty.insert(r);
            }
        }
        self.unpin(buf);
        self.recency.touch(buf);
        self.restamp(buf);
        let became = self.repl.on_access(proc, buf);
        if wrote {
            let view = self.view(buf);
            if self.write.after_write(now, &view) {
                self.request_write(buf, WriteCause::Policy);
            }
        }
        if self.bufs[buf.index()].pins == 0 {
            self.resume_on(buf);
            if let Some(cause) = self.bufs[buf.index()].want_write.take() {
                self.request_write(buf, cause);
            }
        }
        if let Some(old) = became {
            self.became_replaceable(old);
        }
        if wrote {
            self.check_dirty_level();
        }
        if let Access::Write(_) = access {
            self.prefetch.on_write(key, &mut self.proposals);
        } else {
            self.prefetch.on_access(key, &mut self.proposals);
        }
        self.queue_proposals();
        Ok(())
    }

    /// The write named by `token` reached the level below.
    pub fn write_done(&mut self, now: Time, token: IoToken) {
        self.now = now;
        match self.inflight.remove(&token.0) {
            Some(InFlight::Detached(key)) => {
                self.aux_in_use -= 1;
                self.detached_keys.remove(&key);
                // A newer copy of the block waited for this write to land first.
                if let Some(&b) = self.table.get(&key) {
                    if self.bufs[b.index()].idle() {
                        if let Some(cause) = self.bufs[b.index()].want_write.take() {
                            self.request_write(b, cause);
                        }
                    }
                }
                self.resume_any();
            }
            Some(InFlight::Buffer(b)) => {
                debug_assert_eq!(self.bufs[b.index()].io, Io::Writing);
                self.set_io(b, Io::Idle);
                self.writing -= 1;
                self.resume_on(b);
                if let Some(cause) = self.bufs[b.index()].want_write.take() {
                    self.request_write(b, cause);
                }
                // A clean idle buffer may serve a waiter, even one that is
                // replaceable only for that waiter (its own MRU buffer).
                if self.bufs[b.index()].idle() {
                    self.resume_any();
                }
            }
            None => debug_assert!(false, "unknown write token {token:?}"),
        }
    }

    /// The fetch named by `token` filled its buffer.
    pub fn fetch_done(&mut self, now: Time, token: IoToken) {
        self.now = now;
        let Some(InFlight::Buffer(b)) = self.inflight.remove(&token.0) else {
            debug_assert!(false, "unknown fetch token {token:?}");
            return;
        };
        let bs = self.cfg.block_size;
        let prefetched = matches!(self.bufs[b.index()].io, Io::Fetching { prefetch: true });
        self.set_io(b, Io::Idle);
        let buf = &mut self.bufs[b.index()];
        buf.prefetched = prefetched;
        buf.valid = RangeSet::full(bs);
        if buf.prefetched {
            // Nobody waits for a prefetch: the buffer is free to go.
            if self.repl.is_replaceable(b) {
                self.resume_any();
            }
        } else if !self.waiting_on.iter().any(|&(_, w)| w == b) {
            // The waiter went away: release the hold.
            buf.held = false;
            self.unpin(b);
        }
        self.resume_on(b);
    }

    /// The fetch named by `token` failed below. The buffer keeps the bytes
    /// it held; a buffer that held nothing is freed. Waiters are resumed and
    /// learn of the failure from the driver, which reported it.
    pub fn fetch_failed(&mut self, now: Time, token: IoToken) {
        self.now = now;
        let Some(InFlight::Buffer(b)) = self.inflight.remove(&token.0) else {
            debug_assert!(false, "unknown fetch token {token:?}");
            return;
        };
        self.set_io(b, Io::Idle);
        let buf = &mut self.bufs[b.index()];
        buf.prefetched = false;
        if buf.held {
            buf.held = false;
            self.unpin(b);
        }
        self.stats.fetch_failures += 1;
        self.resume_on(b);
        let buf = &self.bufs[b.index()];
        if buf.idle() && buf.dirty.is_empty() && buf.valid.is_empty() {
            self.evict(b);
            self.free.push(b);
        }
        self.resume_any();
    }

    /// Forgets every block of `file` at or after block `from` (the file was
    /// removed or cut): dirty bytes are dropped, not written. Buffers in use
    /// are left alone; returns how many were, so the driver can retry once
    /// their accesses and I/O are over.
    pub fn discard_file(&mut self, now: Time, file: FileId, from: u64) -> usize {
        self.now = now;
        let mut busy = 0;
        let mut held = std::mem::take(&mut self.scratch);
        held.clear();
        held.extend(self.file_bufs(file));
        for &b in &held {
            let buf = &mut self.bufs[b.index()];
            if !buf.key.is_some_and(|k| k.file == file && k.index >= from) {
                continue;
            }
            if !buf.idle() {
                busy += 1;
                continue;
            }
            self.forget(b);
        }
        self.scratch = held;
        self.prefetch_queue.retain(|k| k.file != file || k.index < from);
        self.prefetch_queued.retain(|k| k.file != file || k.index < from);
        if busy < self.bufs.len() {
            self.resume_any();
        }
        busy
    }

    /// Forgets block `key` if the cache's copy is clean (a write that went
    /// around the cache made it stale, 2003 §3); a dirty copy holds newer
    /// bytes and stays. Returns false if its buffer is in use (ask again).
    pub fn discard_clean_block(&mut self, now: Time, key: BlockKey) -> bool {
        match self.table.get(&key) {
            Some(&b) if !self.bufs[b.index()].idle() => false,
            Some(&b) if !self.bufs[b.index()].dirty.is_empty() => true,
            _ => self.discard_block(now, key),
        }
    }

    /// Forgets every clean block not in use, as the kernel's `drop_caches`
    /// does its clean pages: a cold start for the next reader, with the
    /// buffers' memory kept for use again. Dirty blocks, and blocks with an
    /// access or I/O in progress, stay; returns how many were dropped.
    pub fn discard_clean(&mut self, now: Time) -> usize {
        self.now = now;
        let keys: Vec<BlockKey> = self
            .bufs
            .iter()
            .filter(|b| b.idle() && b.dirty.is_empty())
            .filter_map(|b| b.key)
            .collect();
        keys.into_iter().filter(|&k| self.discard_block(now, k)).count()
    }

    /// Forgets block `key` (another node's write made it stale, 1996 §4's
    /// coherence): a dirty copy is dropped unwritten. Returns false if its
    /// buffer is in use (left alone).
    pub fn discard_block(&mut self, now: Time, key: BlockKey) -> bool {
        self.now = now;
        self.prefetch_queue.retain(|k| *k != key);
        self.prefetch_queued.remove(&key);
        let Some(&b) = self.table.get(&key) else {
            return true;
        };
        if !self.bufs[b.index()].idle() {
            return false;
        }
        self.forget(b);
        self.resume_any();
        true
    }

    /// Frees an idle buffer, its dirty bytes (if any) dropped unwritten.
    fn forget(&mut self, b: BufId) {
        let buf = &mut self.bufs[b.index()];
        if !buf.dirty.is_empty() {
            buf.dirty.clear();
            self.dirty -= 1;
            self.stats.discarded += 1;
        }
        self.evict(b);
        self.free.push(b);
    }

    /// Queues block `key` for prefetching as the prefetch policies' own
    /// proposals are (a prefetch decided elsewhere: under
    /// `lru-interleaved` the reading node decides, and the block's home
    /// reads it ahead, 1996 §3.3).
    pub fn prefetch_block(&mut self, now: Time, key: BlockKey) {
        self.now = now;
        self.proposals.push(key);
        self.queue_proposals();
    }

    /// A file of `blocks` blocks was opened (prefetch policies start here).
    /// `full-file-on-open` sees at most as many blocks as the cache has
    /// buffers (more would only evict the first it fetched); the others
    /// see the whole file, and read ahead up to its end.
    pub fn open(&mut self, now: Time, file: FileId, blocks: u64) {
        self.now = now;
        let blocks = match self.prefetch.kind() {
            PrefetchKind::FullFileOnOpen => blocks.min(self.cfg.buffers as u64),
            _ => blocks,
        };
        self.prefetch.on_open(file, blocks, &mut self.proposals);
        self.queue_proposals();
    }

    /// A file was closed.
    pub fn close(&mut self, now: Time, file: FileId) {
        self.now = now;
        self.prefetch.on_close(file);
    }

    /// Hands out the next queued prefetch whose device `idle` says is free,
    /// if a clean buffer can be had without writing or waiting.
    pub fn poll_prefetch(&mut self, now: Time, idle: &mut dyn FnMut(BlockKey) -> bool) -> Option<Effect> {
        self.now = now;
        let mut i = 0;
        while i < self.prefetch_queue.len() {
            let key = self.prefetch_queue[i];
            if self.table.contains_key(&key) {
                self.prefetch_queue.remove(i);
                self.prefetch_queued.remove(&key);
                continue;
            }
            if !idle(key) || self.detached_keys.contains(&key) {
                i += 1;
                continue;
            }
            let b = self.allocate(None, false)?;
            self.prefetch_queue.remove(i);
            self.prefetch_queued.remove(&key);
            self.install(b, key);
            self.stats.prefetches += 1;
            let token = self.start_fetch(b, true);
            // Hand the fetch back directly rather than through the queue.
            let pos = self
                .effects
                .iter()
                .rposition(|e| matches!(e, Effect::Fetch { token: t, .. } if *t == token));
            return pos.and_then(|p| self.effects.remove(p));
        }
        None
    }

    /// Starts writing down every dirty block (close, fsync, unmount, end of a
    /// run). Pinned buffers are written as soon as their accesses end.
    pub fn flush(&mut self, now: Time) {
        self.now = now;
        for i in 0..self.bufs.len() {
            let b = &self.bufs[i];
            if b.key.is_some() && !b.dirty.is_empty() {
                self.request_write(BufId(i as u32), WriteCause::Flush);
            }
        }
    }

    /// Starts writing down every dirty block of one file.
    pub fn flush_file(&mut self, now: Time, file: FileId) {
        self.now = now;
        let mut held = std::mem::take(&mut self.scratch);
        held.clear();
        held.extend(self.file_bufs(file));
        for &b in &held {
            if !self.bufs[b.index()].dirty.is_empty() {
                self.request_write(b, WriteCause::Flush);
            }
        }
        self.scratch = held;
    }

    /// Whether any block of `file` still holds bytes not written down.
    pub fn file_is_clean(&self, file: FileId) -> bool {
        self.file_bufs(file).all(|b| {
            let b = &self.bufs[b.index()];
            b.dirty.is_empty() && b.io != Io::Writing
        }) && self.aux_in_use == 0
    }

    /// Whether the per-file index holds exactly the buffers whose blocks
    /// are each file's (checked by the property tests).
    #[cfg(test)]
    pub(crate) fn file_index_is_exact(&self) -> bool {
        let mut want: FxHashMap<FileId, BTreeSet<BufId>> = FxHashMap::default();
        for (i, b) in self.bufs.iter().enumerate() {
            if let Some(k) = b.key {
                want.entry(k.file).or_default().insert(BufId(i as u32));
            }
        }
        want == self.by_file
    }

    /// The buffers holding blocks of `file`, in buffer order.
    fn file_bufs(&self, file: FileId) -> impl Iterator<Item = BufId> + '_ {
        self.by_file.get(&file).into_iter().flatten().copied()
    }

    /// When the cache next wants [`Cache::handle_timeout`] called.
    pub fn poll_timeout(&self) -> Option<Time> {
        let dirty = self.dirty_buffers();
        let policy = self.write.next_wake(self.now, dirty);
        let sync = if self.dirty > 0 { self.sync_due } else { None };
        match (policy, sync) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A timer the driver set from [`Cache::poll_timeout`] fired.
    pub fn handle_timeout(&mut self, now: Time) {
        self.now = now;
        if let Some(cutoff) = self.write.on_timer(now) {
            self.sweep(cutoff, WriteCause::Age);
        }
        if let (Some(due), Some(iv)) = (self.sync_due, self.cfg.syncer) {
            if now >= due {
                self.sweep(now, WriteCause::Sync);
                self.sync_due = Some(Time((now.0 / iv.0 + 1) * iv.0));
            }
        }
    }

    fn sweep(&mut self, cutoff: Time, cause: WriteCause) {
        let old: Vec<BufId> = self
            .recency
            .iter()
            .filter(|b| {
                let buf = &self.bufs[b.index()];
                !buf.dirty.is_empty() && buf.dirty_since.is_some_and(|t| t <= cutoff)
            })
            .collect();
        for b in old {
            self.request_write(b, cause);
        }
    }

    fn view(&self, b: BufId) -> BufView {
        let buf = &self.bufs[b.index()];
        BufView {
            key: buf.key.expect("view of an empty buffer"),
            dirty: !buf.dirty.is_empty(),
            written_full: buf.written.is_full(self.cfg.block_size),
            dirty_since: buf.dirty_since,
        }
    }

    fn install(&mut self, b: BufId, key: BlockKey) {
        let buf = &mut self.bufs[b.index()];
        debug_assert!(buf.key.is_none());
        buf.key = Some(key);
        self.table.insert(key, b);
        self.by_file.entry(key.file).or_default().insert(b);
        self.repl.on_insert(b);
        self.recency.touch(b);
        self.restamp(b);
    }

    /// Caches of at least this many buffers keep `idle_index`; below it a
    /// walk is as cheap as keeping the index.
    /// (The core's own tests use it from 4, so that both ways are checked
    /// against each other on their small caches.)
    #[cfg(not(test))]
    const INDEX_FROM: usize = 256;
    #[cfg(test)]
    const INDEX_FROM: usize = 4;

    /// `b` was touched: it moves to the most recent end of the order.
    fn restamp(&mut self, b: BufId) {
        self.unindex(b);
        self.clock += 1;
        self.stamp[b.index()] = self.clock;
        self.reindex(b);
    }

    /// Takes `b` out of `idle_index`.
    fn unindex(&mut self, b: BufId) {
        if let Some(ix) = &mut self.idle_index {
            let at = self.stamp[b.index()];
            if ix[0].remove(&at).is_none() {
                ix[1].remove(&at);
            }
        }
    }

    /// Puts `b` where it belongs in `idle_index` after a change.
    fn reindex(&mut self, b: BufId) {
        if let Some(ix) = &mut self.idle_index {
            let at = self.stamp[b.index()];
            ix[0].remove(&at);
            ix[1].remove(&at);
            let buf = &self.bufs[b.index()];
            if buf.key.is_some() && buf.idle() {
                ix[usize::from(!buf.dirty.is_empty())].insert(at, b);
            }
        }
    }

    fn evict(&mut self, b: BufId) {
        self.unindex(b);
        let buf = &mut self.bufs[b.index()];
        debug_assert!(buf.dirty.is_empty() && buf.idle(), "evicting a busy or dirty buffer");
        if let Some(k) = buf.key.take() {
            self.table.remove(&k);
            if let Some(set) = self.by_file.get_mut(&k.file) {
                set.remove(&b);
                if set.is_empty() {
                    self.by_file.remove(&k.file);
                }
            }
        }
        buf.valid.clear();
        buf.written.clear();
        buf.dirty_since = None;
        buf.want_write = None;
        buf.prefetched = false;
        debug_assert!(!buf.held);
        self.repl.on_evict(b);
        self.recency.remove(b);
        self.stats.evictions += 1;
    }

    /// Finds a buffer for a new block: the first clean candidate in the
    /// replacement order. If none is clean and `may_write`, dirty candidates
    /// are started down (the shared fallback of every policy): with an
    /// auxiliary buffer free, one is copied aside and its buffer taken at
    /// once (delayed clean); otherwise as many as the policy's
    /// `writes_per_need` allows. When that is unbounded, every complete
    /// dirty candidate goes down, but a block not yet completely written
    /// goes down only if the writes already on their way will not free a
    /// candidate for every waiting process and this one: writing an
    /// unfinished block early is a rewrite mistake (1992 §3.3.2).
    fn allocate(&mut self, proc: Option<ProcId>, may_write: bool) -> Option<BufId> {
        if let Some(b) = self.free.pop() {
            return Some(b);
        }
        debug_assert_eq!(self.busy, self.bufs.iter().filter(|b| !b.idle()).count());
        debug_assert_eq!(self.unpinned_writing, self.bufs.iter().filter(|b| b.relief()).count());
        if self.busy == self.bufs.len() {
            // No buffer is idle: no candidate is clean or could be written.
            return None;
        }
        let mut dirty = std::mem::take(&mut self.scratch);
        dirty.clear();
        // With every block offered, the walk ends at the last idle buffer
        // and the writes on their way are the cache's own count.
        let every = self.repl.offers_every_block();
        let idle = self.bufs.len() - self.busy;
        let (clean, relief) = match &self.idle_index {
            Some(ix) => {
                debug_assert_eq!(ix[0].len() + ix[1].len(), idle);
                let clean = ix[0].values().next().copied();
                if clean.is_none() {
                    dirty.extend(ix[1].values().copied());
                }
                (clean, self.unpinned_writing)
            }
            None => {
                let (clean, relief) = walk(&*self.repl, &self.bufs, proc, &mut dirty, every.then_some(idle));
                (clean, if every { self.unpinned_writing } else { relief })
            }
        };
        #[cfg(debug_assertions)]
        {
            let mut all = Vec::new();
            let full = walk(&*self.repl, &self.bufs, proc, &mut all, None);
            // (`relief` and `dirty` count only when no clean buffer is found.)
            if clean.is_some() {
                debug_assert_eq!(clean, full.0, "the shortened walk differs");
            } else {
                debug_assert_eq!(
                    (clean, relief, &dirty),
                    (full.0, full.1, &all),
                    "the shortened walk differs"
                );
            }
        }
        if let Some(c) = clean {
            self.scratch = dirty;
            let buf = &self.bufs[c.index()];
            if self.report_evictions && buf.valid.is_full(self.cfg.block_size) {
                if let Some(key) = buf.key {
                    self.effects.push_back(Effect::Evicted { key, buf: c });
                }
            }
            self.evict(c);
            return Some(c);
        }
        let mut taken = None;
        if may_write && !dirty.is_empty() {
            let aside = dirty.iter().copied().find(|c| {
                !self.bufs[c.index()]
                    .key
                    .is_some_and(|k| self.detached_keys.contains(&k))
            });
            if let (true, Some(c)) = (self.aux_in_use < self.cfg.aux_buffers, aside) {
                self.issue_write(c, WriteCause::Need, true);
                self.evict(c);
                taken = Some(c);
            } else {
                match self.write.writes_per_need() {
                    Some(n) => {
                        for &c in dirty.iter().take(n) {
                            self.issue_write(c, WriteCause::Need, false);
                        }
                    }
                    None => {
                        // A complete block is never a mistake to write; an
                        // unfinished one waits while buffers are on their way.
                        let bs = self.cfg.block_size;
                        let patient = relief > self.waiting_any.len();
                        for &c in dirty.iter() {
                            if !patient || self.bufs[c.index()].written.is_full(bs) {
                                self.issue_write(c, WriteCause::Need, false);
                            }
                        }
                    }
                }
            }
        }
        self.scratch = dirty;
        taken
    }

    /// Adds an access's pin to `b`.
    fn pin(&mut self, b: BufId) {
        self.change(b, |buf| buf.pins += 1);
    }

    /// Removes an access's pin from `b`.
    fn unpin(&mut self, b: BufId) {
        self.change(b, |buf| buf.pins -= 1);
    }

    /// Sets `b`'s I/O state.
    fn set_io(&mut self, b: BufId, io: Io) {
        self.change(b, |buf| buf.io = io);
    }

    /// Changes `b`'s pins or I/O state, keeping the counts `allocate` reads.
    fn change(&mut self, b: BufId, f: impl FnOnce(&mut Buffer)) {
        let buf = &mut self.bufs[b.index()];
        let (was_idle, was_relief) = (buf.idle(), buf.relief());
        f(buf);
        let (idle, relief) = (buf.idle(), buf.relief());
        if was_idle != idle {
            self.reindex(b);
        }
        self.busy = self.busy + usize::from(was_idle) - usize::from(idle);
        self.unpinned_writing = self.unpinned_writing + usize::from(relief) - usize::from(was_relief);
    }

    fn start_fetch(&mut self, b: BufId, prefetch: bool) -> IoToken {
        let token = self.token();
        self.set_io(b, Io::Fetching { prefetch });
        if !prefetch {
            debug_assert!(!self.bufs[b.index()].held);
            self.bufs[b.index()].held = true;
            self.pin(b);
        }
        let buf = &self.bufs[b.index()];
        self.inflight.insert(token.0, InFlight::Buffer(b));
        self.stats.fetches += 1;
        let keep = buf.valid.clone();
        self.effects.push_back(Effect::Fetch {
            token,
            key: buf.key.expect("fetch into empty buffer"),
            buf: b,
            keep,
            prefetch,
        });
        token
    }

    fn token(&mut self) -> IoToken {
        self.next_token += 1;
        IoToken(self.next_token)
    }

    /// Writes `b` down now if it is idle, or as soon as it becomes idle.
    fn request_write(&mut self, b: BufId, cause: WriteCause) {
        let buf = &mut self.bufs[b.index()];
        if buf.dirty.is_empty() {
            return;
        }
        if !buf.idle() {
            buf.want_write.get_or_insert(cause);
            return;
        }
        self.issue_write(b, cause, false);
    }

    /// Starts writing buffer `b` down, unless an older copy of its block is
    /// still on its way (then the write waits for it, see `detached_keys`).
    fn issue_write(&mut self, b: BufId, cause: WriteCause, detached: bool) {
        let bs = self.cfg.block_size;
        if self.bufs[b.index()]
            .key
            .is_some_and(|k| self.detached_keys.contains(&k))
        {
            debug_assert!(!detached, "allocate sets aside only blocks with no write in flight");
            self.bufs[b.index()].want_write.get_or_insert(cause);
            return;
        }
        let token = self.token();
        let buf = &mut self.bufs[b.index()];
        debug_assert!(buf.idle() && !buf.dirty.is_empty());
        let dirty = std::mem::take(&mut buf.dirty);
        buf.dirty_since = None;
        buf.want_write = None;
        let whole = buf.valid.is_full(bs);
        let key = buf.key.expect("write of an empty buffer");
        self.dirty -= 1;
        self.reindex(b);
        if detached {
            self.aux_in_use += 1;
            self.detached_keys.insert(key);
            self.inflight.insert(token.0, InFlight::Detached(key));
            self.stats.detached_writes += 1;
        } else {
            self.set_io(b, Io::Writing);
            self.writing += 1;
            self.inflight.insert(token.0, InFlight::Buffer(b));
        }
        self.stats.count_write(cause);
        self.effects.push_back(Effect::Write {
            token,
            key,
            buf: b,
            dirty,
            whole,
            detached,
            cause,
        });
    }

    fn became_replaceable(&mut self, b: BufId) {
        let buf = &self.bufs[b.index()];
        if buf.key.is_none() || !buf.idle() || !self.repl.is_replaceable(b) {
            return;
        }
        let view = self.view(b);
        if self.write.on_replaceable(self.now, &view) {
            self.request_write(b, WriteCause::Policy);
        }
        self.resume_any();
    }

    fn check_dirty_level(&mut self) {
        let n = self
            .write
            .on_dirty_level(self.dirty + self.writing, self.writing, self.cfg.buffers);
        if n == 0 {
            return;
        }
        let victims: Vec<BufId> = self
            .recency
            .iter()
            .filter(|b| {
                let buf = &self.bufs[b.index()];
                !buf.dirty.is_empty() && buf.idle()
            })
            .take(n)
            .collect();
        for b in victims {
            self.issue_write(b, WriteCause::Threshold, false);
        }
    }

    fn resume_on(&mut self, b: BufId) {
        let effects = &mut self.effects;
        self.waiting_on.retain(|&(p, w)| {
            if w == b {
                effects.push_back(Effect::Resume { proc: p });
                false
            } else {
                true
            }
        });
    }

    /// Something that may serve a waiter was freed: wake the first waiter.
    fn resume_any(&mut self) {
        if let Some(p) = self.waiting_any.pop_front() {
            let others = self.waiting_any.len();
            self.woken.insert(p, others);
            self.effects.push_back(Effect::Resume { proc: p });
        }
    }

    fn queue_proposals(&mut self) {
        for k in self.proposals.drain(..) {
            if !self.table.contains_key(&k) && self.prefetch_queued.insert(k) {
                self.prefetch_queue.push_back(k);
            }
        }
    }
}

#[cfg(test)]
mod tests;
