//! One run of the PACA model (Cortes, Girona & Labarta 1996 §6–7) over a
//! stream of operations per client: open, read or write one block, close.
//!
//! - 50 nodes with a local cache each (16 MiB of 8 KiB blocks by default);
//!   node 0 runs the file server and has the one disk (8 KiB read 14.7 ms,
//!   write 18.3 ms); clients run on nodes 1–48. The disk serves demand
//!   requests first, then background writes (the syncer, delayed cleans),
//!   then prefetches (§6.2: "we give them higher priority over prefetching
//!   operations"); a request in service is not preempted.
//! - Communications are synchronous: a start-up plus size over bandwidth
//!   (§6.1): a port (remote) costs 100 µs + 8 KiB at 155 Mbit/s, a memory
//!   copy (local) 50 µs + 8 KiB at 320 Mbit/s; a request message costs a
//!   port start-up.
//! - Each client issues its operations one after another (closed loop),
//!   thinking between block operations; times are averaged over the
//!   measured operations (the paper measured hours 15 to 48 of 48, §7.1).
//!
//! Where a block is found and what becomes of a block a node evicts are
//! `parcache_core::cooperative`'s decisions. Costs per read (§5):
//! - `none` (private caches): a local hit is a local copy; a miss asks the
//!   server, reads the disk, and copies remote then local.
//! - `greedy`, `n-chance`: every request asks the (central) server first;
//!   a remote hit is a remote copy into the reader's cache and a local copy
//!   to the user; a miss reads the disk. An evicted singlet forwarded
//!   under `n-chance` costs the reader a remote copy unless one of its 16
//!   auxiliary buffers is free (delayed forward, §6.2).
//! - `lru-interleaved`: the block's home serves it: a local copy at home,
//!   else a message and one remote copy; a miss at the home reads the disk
//!   into the home's cache.
//! - `no-cache`: every read goes to the disk.
//!
//! Writes (whole blocks) go into the writer's cache (`none`, `greedy`,
//! `n-chance`: after asking the central server, which drops every other
//! copy) or the home's (`lru-interleaved`), dirty; `no-cache` writes
//! through to the disk. A dirty block leaves by the 30 s syncer (every
//! dirty block, in the background) or when its buffer is needed: copied to
//! an auxiliary buffer and written in the background if one is free
//! (delayed clean, §6.2), else written to the disk while the request
//! waits. A dirty last copy that `n-chance` forwards is cleaned first.
//! Prefetching (§3.3): `one-block-ahead` queues the next block after each
//! read or write, `full-file-on-open` every block of a file at its open;
//! the disk takes the queue's first block whenever it has nothing else.
//!
//! Simplifications: a forward that a peer's insertion causes in turn
//! (cascade) is charged to nobody; a remote hit does not reorder the
//! holder's LRU list; an auxiliary buffer is busy for one copy (forward)
//! or one disk write (clean) from when it is taken, ignoring the disk's
//! queue.

use crate::kernel::Kernel;
use crate::paca96::workload::{Op, OpKind};
use crate::rng::SimRng;
use parcache_core::cooperative::n_chance::{Directory, Evicted};
use parcache_core::cooperative::{lru_interleaved, CooperativeKind, Members, Source};
use parcache_core::ids::NodeId;
use parcache_core::{BlockKey, PrefetchKind, Span, Time};
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};

/// The file server's node, which has the disk.
const SERVER: NodeId = 0;
/// Prefetches queued at most (the oldest wait; more are not queued).
const PREFETCH_QUEUE: usize = 65_536;

/// The caching a run models.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algo {
    /// No file cache: every read goes to the disk.
    NoCache,
    /// A cooperative algorithm (`none`: each node's cache is private).
    Cache(CooperativeKind),
}

impl std::fmt::Display for Algo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Algo::NoCache => f.write_str("no-cache"),
            Algo::Cache(k) => write!(f, "{k}"),
        }
    }
}

/// The paper's machine (§7.2).
#[derive(Clone, Copy, Debug)]
pub struct Costs {
    pub block: u64,
    pub disk_read: Span,
    pub disk_write: Span,
    pub port_startup: Span,
    pub copy_startup: Span,
    /// Bits per second between nodes.
    pub remote_bps: f64,
    /// Bits per second of a copy inside a node.
    pub local_bps: f64,
}

impl Default for Costs {
    fn default() -> Self {
        Costs {
            block: 8 << 10,
            disk_read: Span::from_millis_f64(14.7),
            disk_write: Span::from_millis_f64(18.3),
            port_startup: Span::from_millis_f64(0.1),
            copy_startup: Span::from_millis_f64(0.05),
            remote_bps: 155e6,
            local_bps: 320e6,
        }
    }
}

impl Costs {
    fn transfer(&self, bps: f64) -> Span {
        Span::from_millis_f64(self.block as f64 * 8.0 / bps * 1e3)
    }
    /// A block copied inside a node.
    pub fn local_copy(&self) -> Span {
        self.copy_startup + self.transfer(self.local_bps)
    }
    /// A block sent to another node.
    pub fn remote_copy(&self) -> Span {
        self.port_startup + self.transfer(self.remote_bps)
    }
    /// A request message.
    pub fn message(&self) -> Span {
        self.port_startup
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Params {
    pub nodes: u32,
    /// Blocks each node's cache holds.
    pub cache_blocks: usize,
    pub aux_buffers: usize,
    pub algo: Algo,
    pub costs: Costs,
    /// Mean time a client thinks between block operations (exponential):
    /// Baker et al. 1991 measured 8 KB/s per active user over 10-minute
    /// intervals, one 8 KiB block a second. Zero: back to back.
    pub think: Span,
    pub prefetch: PrefetchKind,
    /// The syncer's period: every dirty block goes down (§7.2: 30 s).
    pub sync_every: Span,
    pub seed: u64,
}

impl Params {
    /// The paper's base: 50 nodes, 16 MiB caches of 8 KiB blocks, 16
    /// auxiliary buffers per node, no prefetching, a 30 s sync.
    pub fn base(algo: Algo, seed: u64) -> Params {
        Params {
            nodes: 50,
            cache_blocks: (16 << 20) / (8 << 10),
            aux_buffers: 16,
            algo,
            costs: Costs::default(),
            think: Span::from_secs(1),
            prefetch: PrefetchKind::None,
            sync_every: Span::from_secs(30),
            seed,
        }
    }
}

/// What a run measured (the measured operations).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Measured {
    pub reads: u64,
    pub read_time: Span,
    pub writes: u64,
    pub write_time: Span,
    pub local_hits: u64,
    pub remote_hits: u64,
    pub misses: u64,
    pub forwards: u64,
    /// Forwards no auxiliary buffer could take, paid by the request.
    pub critical_forwards: u64,
    /// Dirty blocks written to the disk while a request waited (no
    /// auxiliary buffer free for a delayed clean).
    pub critical_cleans: u64,
    /// Blocks read ahead from the disk.
    pub prefetches: u64,
}

impl Measured {
    pub fn mean_read_ms(&self) -> f64 {
        if self.reads == 0 {
            0.0
        } else {
            self.read_time.as_millis_f64() / self.reads as f64
        }
    }
    pub fn mean_write_ms(&self) -> f64 {
        if self.writes == 0 {
            0.0
        } else {
            self.write_time.as_millis_f64() / self.writes as f64
        }
    }
}

/// A block of the model: (file, index).
fn key(file: u32, block: u32) -> BlockKey {
    BlockKey::new(file as u64, block as u64)
}

/// A block a node's cache pushed out: its forward count and whether dirty.
#[derive(Clone, Copy, Debug)]
struct Victim {
    key: BlockKey,
    recirculations: u8,
    dirty: bool,
}

/// A node's cache: LRU over blocks, each with its forward count and dirty bit.
struct Lru {
    cap: usize,
    at: HashMap<BlockKey, (u64, u8, bool)>,
    order: BTreeMap<u64, BlockKey>,
    next: u64,
}

impl Lru {
    fn new(cap: usize) -> Lru {
        Lru {
            cap,
            at: HashMap::new(),
            order: BTreeMap::new(),
            next: 0,
        }
    }
    /// A reference: true on a hit, which becomes most recent with its
    /// forward count reset (and dirty if `write`).
    fn touch(&mut self, b: BlockKey, write: bool) -> bool {
        let Some((stamp, _, dirty)) = self.at.get(&b).copied() else {
            return false;
        };
        self.order.remove(&stamp);
        self.next += 1;
        self.order.insert(self.next, b);
        self.at.insert(b, (self.next, 0, dirty || write));
        true
    }
    fn contains(&self, b: BlockKey) -> bool {
        self.at.contains_key(&b)
    }
    /// Inserts as most recent; returns the block pushed out.
    fn insert(&mut self, b: BlockKey, recirculations: u8, dirty: bool) -> Option<Victim> {
        if self.contains(b) {
            self.touch(b, dirty);
            return None;
        }
        self.next += 1;
        self.order.insert(self.next, b);
        self.at.insert(b, (self.next, recirculations, dirty));
        if self.at.len() <= self.cap {
            return None;
        }
        let (_, victim) = self.order.pop_first().expect("over capacity");
        let (_, r, d) = self.at.remove(&victim).expect("listed");
        Some(Victim {
            key: victim,
            recirculations: r,
            dirty: d,
        })
    }
    fn remove(&mut self, b: BlockKey) {
        if let Some((stamp, _, _)) = self.at.remove(&b) {
            self.order.remove(&stamp);
        }
    }
    /// Marks every dirty block clean; returns how many there were.
    fn clean_all(&mut self) -> usize {
        let mut n = 0;
        for v in self.at.values_mut() {
            if v.2 {
                v.2 = false;
                n += 1;
            }
        }
        n
    }
}

/// What the disk does for whom; served demand first, then background,
/// then prefetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Job {
    /// A client's request waits for it.
    Client(usize),
    /// A dirty block written in the background.
    Clean,
    /// A block read ahead into `node`'s cache.
    Prefetch { node: NodeId, key: BlockKey },
}

impl Job {
    fn class(&self) -> usize {
        match self {
            Job::Client(_) => 0,
            Job::Clean => 1,
            Job::Prefetch { .. } => 2,
        }
    }
}

/// The server's disk: one request in service, the rest queued by class.
#[derive(Default)]
struct Disk {
    queues: [VecDeque<(Job, Span)>; 3],
    busy: bool,
}

impl Disk {
    /// Queues a job; if the disk was idle it starts now: its service time.
    fn submit(&mut self, job: Job, service: Span) -> Option<(Job, Span)> {
        self.queues[job.class()].push_back((job, service));
        if self.busy {
            return None;
        }
        self.next()
    }
    /// The job to start next, if any.
    fn next(&mut self) -> Option<(Job, Span)> {
        let j = self.queues.iter_mut().find_map(|q| q.pop_front());
        self.busy = j.is_some();
        j
    }
    /// Whether only prefetches (or nothing) wait.
    fn idle_for_prefetch(&self) -> bool {
        !self.busy && self.queues[0].is_empty() && self.queues[1].is_empty()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ev {
    Start(usize),
    /// A client's request reaches the disk queue.
    ToDisk(usize),
    /// The disk finished the job in service.
    Disk(Job),
    Finish(usize),
    Sync,
}

/// A step of a request: a delay (copies, messages) or a disk access.
#[derive(Clone, Copy, Debug)]
enum Stage {
    Delay(Span),
    Disk(Span),
}

/// One client's request in progress.
struct Pending {
    began: Time,
    measured: bool,
    write: bool,
    stages: VecDeque<Stage>,
}

struct Sim<'a> {
    p: Params,
    streams: &'a [Vec<Op>],
    pos: Vec<usize>,
    pending: Vec<Option<Pending>>,
    k: Kernel<Ev>,
    disk: Disk,
    caches: Vec<Lru>,
    members: Members,
    directory: Directory,
    /// Per node: when each auxiliary buffer in use frees.
    aux: Vec<BinaryHeap<std::cmp::Reverse<Time>>>,
    prefetch: VecDeque<(NodeId, BlockKey)>,
    /// Blocks being read ahead, with the clients waiting for them.
    prefetching: HashMap<(NodeId, BlockKey), Vec<usize>>,
    sync_started: bool,
    rng: SimRng,
    /// The clients' think times, one stream each (independent of the
    /// forwarding picks, so algorithms see the same arrivals).
    thinking: Vec<SimRng>,
    m: Measured,
}

/// Client `c`'s references of a merged trace as reads of one file, each
/// measured from position `warm_up` of the trace on.
pub fn reads(streams: &[Vec<(usize, u32)>], warm_up: usize) -> Vec<Vec<Op>> {
    streams
        .iter()
        .map(|s| {
            s.iter()
                .map(|&(at, block)| Op {
                    kind: OpKind::Read,
                    file: 1,
                    block,
                    blocks: u32::MAX,
                    measured: at >= warm_up,
                })
                .collect()
        })
        .collect()
}

/// Runs the model: `streams[i]` are client i's operations, client i on
/// node i + 1.
pub fn run(p: &Params, streams: &[Vec<Op>]) -> Measured {
    assert!(
        streams.len() < p.nodes as usize,
        "a node per client and one for the server"
    );
    let n_chance = match p.algo {
        Algo::Cache(CooperativeKind::NChance { n }) => n,
        _ => 0,
    };
    let mut s = Sim {
        p: *p,
        streams,
        pos: vec![0; streams.len()],
        pending: (0..streams.len()).map(|_| None).collect(),
        k: Kernel::new(),
        disk: Disk::default(),
        caches: (0..p.nodes).map(|_| Lru::new(p.cache_blocks)).collect(),
        members: Members::new(0..p.nodes as NodeId),
        directory: Directory::new(n_chance),
        aux: (0..p.nodes).map(|_| BinaryHeap::new()).collect(),
        prefetch: VecDeque::new(),
        prefetching: HashMap::new(),
        sync_started: false,
        rng: SimRng::new(p.seed),
        thinking: (0..streams.len() as u64)
            .map(|c| SimRng::stream(p.seed, c + 1))
            .collect(),
        m: Measured::default(),
    };
    for c in 0..streams.len() {
        s.k.at(Time::ZERO, Ev::Start(c));
    }
    let mut live = streams.len();
    while let Some((now, ev)) = s.k.pop() {
        match ev {
            Ev::Start(c) => {
                if !s.start(now, c) {
                    live -= 1;
                }
            }
            Ev::ToDisk(c) => {
                let service = match s.pending[c].as_mut().and_then(|p| p.stages.pop_front()) {
                    Some(Stage::Disk(d)) => d,
                    other => unreachable!("a client at the disk has a disk stage: {other:?}"),
                };
                s.submit(now, Job::Client(c), service);
            }
            Ev::Disk(job) => {
                if let Some((next, service)) = s.disk.next() {
                    s.k.at(now + service, Ev::Disk(next));
                }
                match job {
                    Job::Client(c) => s.advance(now, c),
                    Job::Clean => {}
                    Job::Prefetch { node, key } => s.prefetched(now, node, key),
                }
                s.start_prefetch(now);
            }
            Ev::Finish(c) => {
                let done = s.pending[c].take().expect("a request in progress");
                if done.measured {
                    if done.write {
                        s.m.writes += 1;
                        s.m.write_time = s.m.write_time + now.since(done.began);
                    } else {
                        s.m.reads += 1;
                        s.m.read_time = s.m.read_time + now.since(done.began);
                    }
                }
                s.pos[c] += 1;
                let think = s.p.think.as_millis_f64();
                let t = if think > 0.0 {
                    Span::from_millis_f64(s.thinking[c].exp_truncated(think, think * 20.0))
                } else {
                    Span::ZERO
                };
                s.k.at(now + t, Ev::Start(c));
            }
            Ev::Sync => {
                for node in 0..s.caches.len() {
                    for _ in 0..s.caches[node].clean_all() {
                        s.submit(now, Job::Clean, s.p.costs.disk_write);
                    }
                }
                if live > 0 {
                    s.k.at(now + s.p.sync_every, Ev::Sync);
                }
            }
        }
    }
    s.m
}

impl Sim<'_> {
    /// Starts client `c`'s next block operation (doing its opens and
    /// closes on the way); false when its stream is done.
    fn start(&mut self, now: Time, c: usize) -> bool {
        let node = c as NodeId + 1;
        loop {
            let Some(&op) = self.streams[c].get(self.pos[c]) else {
                return false;
            };
            match op.kind {
                OpKind::Open => {
                    if self.p.prefetch == PrefetchKind::FullFileOnOpen {
                        for b in 0..op.blocks {
                            self.queue_prefetch(node, key(op.file, b));
                        }
                        self.start_prefetch(now);
                    }
                    self.pos[c] += 1;
                }
                OpKind::Close => self.pos[c] += 1,
                OpKind::Read | OpKind::Write => {
                    let write = op.kind == OpKind::Write;
                    let k = key(op.file, op.block);
                    let stages = if write {
                        self.write(now, node, k, op.measured)
                    } else {
                        self.read(now, c, node, k, op.measured)
                    };
                    if self.p.prefetch == PrefetchKind::OneBlockAhead && op.block + 1 < op.blocks {
                        self.queue_prefetch(node, key(op.file, op.block + 1));
                    }
                    let Some(stages) = stages else {
                        // Waiting for a block being read ahead.
                        self.start_prefetch(now);
                        return true;
                    };
                    self.pending[c] = Some(Pending {
                        began: now,
                        measured: op.measured,
                        write,
                        stages,
                    });
                    self.advance(now, c);
                    self.start_prefetch(now);
                    return true;
                }
            }
        }
    }

    /// Runs client `c`'s request on from `now`: its delays up to the next
    /// disk access (which it queues for), or to its end.
    fn advance(&mut self, now: Time, c: usize) {
        let p = self.pending[c].as_mut().expect("a request in progress");
        let mut delay = Span::ZERO;
        while let Some(&st) = p.stages.front() {
            match st {
                Stage::Delay(d) => {
                    delay = delay + d;
                    p.stages.pop_front();
                }
                Stage::Disk(_) => {
                    self.k.at(now + delay, Ev::ToDisk(c));
                    return;
                }
            }
        }
        self.k.at(now + delay, Ev::Finish(c));
    }

    fn submit(&mut self, now: Time, job: Job, service: Span) {
        if let Some((j, s)) = self.disk.submit(job, service) {
            self.k.at(now + s, Ev::Disk(j));
        }
    }

    fn queue_prefetch(&mut self, node: NodeId, k: BlockKey) {
        if self.p.algo == Algo::NoCache || self.prefetch.len() >= PREFETCH_QUEUE {
            return;
        }
        let target = self.place(node, k);
        self.prefetch.push_back((target, k));
    }

    /// Where a block of `node`'s is cached: its home under lru-interleaved,
    /// else the node itself.
    fn place(&self, node: NodeId, k: BlockKey) -> NodeId {
        match self.p.algo {
            Algo::Cache(CooperativeKind::LruInterleaved) => lru_interleaved::home(k, &self.members).expect("members"),
            _ => node,
        }
    }

    /// The disk has nothing else to do: it reads ahead the first queued
    /// block that is not already cached (or held by a peer).
    fn start_prefetch(&mut self, now: Time) {
        while self.disk.idle_for_prefetch() {
            let Some((node, k)) = self.prefetch.pop_front() else {
                return;
            };
            let held = self.caches[node as usize].contains(k)
                || self.prefetching.contains_key(&(node, k))
                || (matches!(self.p.algo, Algo::Cache(CooperativeKind::NChance { .. }))
                    && !self.directory.holders(k).is_empty());
            if held {
                continue;
            }
            self.prefetching.insert((node, k), Vec::new());
            self.m.prefetches += 1;
            self.submit(now, Job::Prefetch { node, key: k }, self.p.costs.disk_read);
        }
    }

    /// A block read ahead arrived in `node`'s cache; clients waiting for it
    /// go on.
    fn prefetched(&mut self, now: Time, node: NodeId, k: BlockKey) {
        let waiting = self.prefetching.remove(&(node, k)).unwrap_or_default();
        if !self.caches[node as usize].contains(k) {
            if matches!(self.p.algo, Algo::Cache(CooperativeKind::NChance { .. })) {
                self.directory.cached(node, k);
            }
            if let Some(v) = self.caches[node as usize].insert(k, 0, false) {
                // Nobody waits for a read-ahead: its victim goes down (if
                // dirty) and on (n-chance) in the background.
                if v.dirty {
                    self.submit(now, Job::Clean, self.p.costs.disk_write);
                }
                if matches!(self.p.algo, Algo::Cache(CooperativeKind::NChance { .. })) {
                    self.forward(now, node, (v.key, v.recirculations), false);
                }
            }
        }
        for c in waiting {
            self.advance(now, c);
        }
    }

    /// `c` (on `node`) wants a block being read ahead into `target`: it
    /// waits for it, then pays `after`. Returns whether it waits.
    fn wait_for_prefetch(
        &mut self,
        now: Time,
        c: usize,
        target: NodeId,
        k: BlockKey,
        after: Span,
        measured: bool,
    ) -> bool {
        let Some(w) = self.prefetching.get_mut(&(target, k)) else {
            return false;
        };
        w.push(c);
        self.pending[c] = Some(Pending {
            began: now,
            measured,
            write: false,
            stages: VecDeque::from([Stage::Delay(after)]),
        });
        true
    }

    /// Decides a read of `k` by client `c` on `node`: the stages of the
    /// request, or `None` if it waits for a block being read ahead.
    fn read(&mut self, now: Time, c: usize, node: NodeId, k: BlockKey, measured: bool) -> Option<VecDeque<Stage>> {
        let co = self.p.costs;
        let (l, r, msg) = (co.local_copy(), co.remote_copy(), co.message());
        let count = |m: &mut Measured, f: fn(&mut Measured)| {
            if measured {
                f(m)
            }
        };
        let stages = |v: &[Stage]| Some(v.iter().copied().collect::<VecDeque<_>>());
        match self.p.algo {
            Algo::NoCache => {
                count(&mut self.m, |m| m.misses += 1);
                stages(&[Stage::Delay(msg), Stage::Disk(co.disk_read), Stage::Delay(r)])
            }
            Algo::Cache(CooperativeKind::None) => {
                if self.caches[node as usize].touch(k, false) {
                    count(&mut self.m, |m| m.local_hits += 1);
                    return stages(&[Stage::Delay(l)]);
                }
                count(&mut self.m, |m| m.misses += 1);
                if self.wait_for_prefetch(now, c, node, k, l, measured) {
                    return None;
                }
                let mut s = VecDeque::from([Stage::Delay(msg), Stage::Disk(co.disk_read), Stage::Delay(r + l)]);
                if let Some(v) = self.caches[node as usize].insert(k, 0, false) {
                    s.extend(self.evicted(now, node, v, measured));
                }
                Some(s)
            }
            Algo::Cache(CooperativeKind::LruInterleaved) => {
                let home = lru_interleaved::home(k, &self.members).expect("members");
                let to_user = if home == node { l } else { r };
                let ask = if home == node { Span::ZERO } else { msg };
                if self.caches[home as usize].touch(k, false) {
                    if home == node {
                        count(&mut self.m, |m| m.local_hits += 1);
                    } else {
                        count(&mut self.m, |m| m.remote_hits += 1);
                    }
                    return stages(&[Stage::Delay(ask + to_user)]);
                }
                count(&mut self.m, |m| m.misses += 1);
                if self.wait_for_prefetch(now, c, home, k, to_user, measured) {
                    return None;
                }
                let to_home = if home == SERVER { l } else { r };
                let mut s = VecDeque::from([
                    Stage::Delay(ask + msg),
                    Stage::Disk(co.disk_read),
                    Stage::Delay(to_home + to_user),
                ]);
                if let Some(v) = self.caches[home as usize].insert(k, 0, false) {
                    s.extend(self.evicted(now, home, v, measured));
                }
                Some(s)
            }
            Algo::Cache(CooperativeKind::NChance { .. }) => {
                if self.caches[node as usize].touch(k, false) {
                    count(&mut self.m, |m| m.local_hits += 1);
                    return stages(&[Stage::Delay(msg + l)]);
                }
                if self.prefetching.contains_key(&(node, k)) {
                    count(&mut self.m, |m| m.misses += 1);
                    self.wait_for_prefetch(now, c, node, k, msg + l, measured);
                    return None;
                }
                let mut s = match self.directory.lookup(node, k, &self.members) {
                    Source::Peer(_) => {
                        count(&mut self.m, |m| m.remote_hits += 1);
                        VecDeque::from([Stage::Delay(msg + r + l)])
                    }
                    _ => {
                        count(&mut self.m, |m| m.misses += 1);
                        VecDeque::from([Stage::Delay(msg), Stage::Disk(co.disk_read), Stage::Delay(r + l)])
                    }
                };
                self.directory.cached(node, k);
                if let Some(v) = self.caches[node as usize].insert(k, 0, false) {
                    s.extend(self.evicted(now, node, v, measured));
                }
                Some(s)
            }
        }
    }

    /// Decides a write of the whole block `k` by `node`: its stages.
    fn write(&mut self, now: Time, node: NodeId, k: BlockKey, measured: bool) -> Option<VecDeque<Stage>> {
        let co = self.p.costs;
        let (l, r, msg) = (co.local_copy(), co.remote_copy(), co.message());
        let (target, mut s) = match self.p.algo {
            Algo::NoCache => {
                return Some(VecDeque::from([Stage::Delay(msg + r), Stage::Disk(co.disk_write)]));
            }
            Algo::Cache(CooperativeKind::None) => (node, VecDeque::from([Stage::Delay(l)])),
            Algo::Cache(CooperativeKind::LruInterleaved) => {
                let home = lru_interleaved::home(k, &self.members).expect("members");
                let cost = if home == node { l } else { msg + r };
                (home, VecDeque::from([Stage::Delay(cost)]))
            }
            Algo::Cache(CooperativeKind::NChance { .. }) => {
                // The central server keeps the copies coherent: every
                // other copy is dropped.
                for other in self.directory.written(node, k) {
                    self.caches[other as usize].remove(k);
                }
                (node, VecDeque::from([Stage::Delay(msg + l)]))
            }
        };
        if !self.caches[target as usize].touch(k, true) {
            if let Some(v) = self.caches[target as usize].insert(k, 0, true) {
                s.extend(self.evicted(now, target, v, measured));
            }
        }
        if !self.sync_started {
            // The syncer runs from the first dirty block on.
            self.sync_started = true;
            self.k.at(now + self.p.sync_every, Ev::Sync);
        }
        Some(s)
    }

    /// `node`'s cache pushed `v` out to make room for a request: a dirty
    /// block is cleaned (delayed through an auxiliary buffer if one is
    /// free, else while the request waits), and under `n-chance` a last
    /// copy is forwarded. Returns the stages the request pays.
    fn evicted(&mut self, now: Time, node: NodeId, v: Victim, measured: bool) -> Vec<Stage> {
        let mut paid = Vec::new();
        if v.dirty {
            if self.take_aux(now, node, self.p.costs.disk_write) {
                paid.push(Stage::Delay(self.p.costs.local_copy()));
                self.submit(now, Job::Clean, self.p.costs.disk_write);
            } else {
                if measured {
                    self.m.critical_cleans += 1;
                }
                paid.push(Stage::Disk(self.p.costs.disk_write));
            }
        }
        if matches!(self.p.algo, Algo::Cache(CooperativeKind::NChance { .. }))
            && !self.forward(now, node, (v.key, v.recirculations), measured)
        {
            paid.push(Stage::Delay(self.p.costs.remote_copy()));
        }
        paid
    }

    /// `node` pushed `victim` out (clean now). Returns false if a forward
    /// had to be paid in the request's critical path (no auxiliary buffer
    /// free).
    fn forward(&mut self, now: Time, node: NodeId, victim: (BlockKey, u8), measured: bool) -> bool {
        let mut delayed = true;
        let mut work = vec![(node, victim, true)];
        while let Some((at, (k, recirc), first)) = work.pop() {
            let pick = self.rng.below(u64::MAX);
            let Evicted::Forward { to, recirculations, .. } =
                self.directory.evicted(at, k, recirc, false, pick, &self.members)
            else {
                continue;
            };
            if measured {
                self.m.forwards += 1;
            }
            if first && !self.take_aux(now, at, self.p.costs.remote_copy()) {
                delayed = false;
                if measured {
                    self.m.critical_forwards += 1;
                }
            }
            if let Some(next) = self.caches[to as usize].insert(k, recirculations, false) {
                if next.dirty {
                    // The peer's own dirty block goes down in the background.
                    self.submit(now, Job::Clean, self.p.costs.disk_write);
                }
                work.push((to, (next.key, next.recirculations), false));
            }
        }
        delayed
    }

    /// Takes one of `node`'s auxiliary buffers for `busy` (a delayed
    /// forward or clean); false if all are busy.
    fn take_aux(&mut self, now: Time, node: NodeId, busy: Span) -> bool {
        let heap = &mut self.aux[node as usize];
        while heap.peek().is_some_and(|t| t.0 <= now) {
            heap.pop();
        }
        if heap.len() >= self.p.aux_buffers {
            return false;
        }
        heap.push(std::cmp::Reverse(now + busy));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(blocks: &[u32], client: usize) -> Vec<Vec<Op>> {
        let mut s = vec![Vec::new(); client + 1];
        s[client] = blocks.iter().copied().enumerate().collect();
        reads(&s, 0)
    }

    /// Costs as §7.2 gives them: a local copy 50 µs + 204.8 µs, a remote
    /// one 100 µs + 422.8 µs.
    #[test]
    fn the_papers_costs() {
        let c = Costs::default();
        assert!((c.local_copy().as_millis_f64() - 0.2548).abs() < 1e-6);
        assert!((c.remote_copy().as_millis_f64() - 0.52284).abs() < 1e-4);
    }

    /// A block read twice by one client: a miss then a hit, under each
    /// algorithm; no-cache reads the disk both times.
    #[test]
    fn a_second_read_hits() {
        for algo in [
            Algo::Cache(CooperativeKind::None),
            Algo::Cache(CooperativeKind::LruInterleaved),
            Algo::Cache(CooperativeKind::NChance { n: 2 }),
        ] {
            let m = run(&Params::base(algo, 1), &stream(&[7, 7], 0));
            assert_eq!(m.reads, 2);
            assert_eq!(m.misses, 1, "{algo}");
            assert_eq!(m.local_hits + m.remote_hits, 1, "{algo}");
            assert!(m.mean_read_ms() > 7.0, "a disk read is in the mean");
        }
        let m = run(&Params::base(Algo::NoCache, 1), &stream(&[7, 7], 0));
        assert_eq!(m.misses, 2);
    }

    /// Another client's block: a remote hit under the cooperative
    /// algorithms, a disk read with private caches.
    #[test]
    fn another_clients_block_is_a_remote_hit() {
        let two = reads(&[vec![(0, 5)], vec![(1, 5)]], 1);
        let run_ = |algo| {
            let mut p = Params::base(algo, 1);
            p.nodes = 4;
            run(&p, &two)
        };
        assert_eq!(run_(Algo::Cache(CooperativeKind::None)).misses, 1);
        let nc = run_(Algo::Cache(CooperativeKind::NChance { n: 2 }));
        assert_eq!((nc.remote_hits, nc.misses), (1, 0));
        let li = run_(Algo::Cache(CooperativeKind::LruInterleaved));
        assert_eq!(li.misses, 0, "the block's home has it");
    }

    /// A small cache under n-chance forwards singlets; greedy never does.
    #[test]
    fn small_caches_forward_under_n_chance_only() {
        let blocks: Vec<u32> = (0..200).chain(0..200).collect();
        let mut p = Params::base(Algo::Cache(CooperativeKind::NChance { n: 2 }), 3);
        p.cache_blocks = 50;
        let nc = run(&p, &stream(&blocks, 0));
        assert!(nc.forwards > 0 && nc.remote_hits > 0, "{nc:?}");
        p.algo = Algo::Cache(CooperativeKind::NChance { n: 0 });
        let greedy = run(&p, &stream(&blocks, 0));
        assert_eq!(greedy.forwards, 0);
        assert!(greedy.misses > nc.misses, "forwarded blocks come back as remote hits");
    }

    #[test]
    fn same_seed_same_result() {
        let refs = crate::paca96::trace::sprite();
        let streams = reads(&crate::paca96::trace::by_client(&refs[..20_000], 48, 64), 5_000);
        let p = Params::base(Algo::Cache(CooperativeKind::NChance { n: 2 }), 9);
        assert_eq!(run(&p, &streams), run(&p, &streams));
    }
}
