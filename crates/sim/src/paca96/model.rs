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
//! Each node's cache is the core's `Cache` (LRU, write-back, the 30 s
//! syncer, 16 auxiliary buffers for delayed cleans, the prefetch policy)
//! driven through the shared cache driver (`crate::cache_driver`), as the
//! 1992 model's is; the model is its level below, charging §5's costs.
//!
//! Simplifications: a forward that a peer's adoption causes in turn
//! (cascade) is charged to nobody; a remote hit does not reorder the
//! holder's LRU list; an auxiliary buffer taken for a forward is busy for
//! one remote copy; a miss's request message is counted after the disk.

use crate::cache_driver::{Below, CacheDriver};
use crate::kernel::Kernel;
use crate::paca96::workload::{Op, OpKind};
use crate::rng::SimRng;
use parcache_core::cooperative::n_chance::{Directory, Evicted};
use parcache_core::cooperative::{lru_interleaved, CooperativeKind, Members, Source};
use parcache_core::ids::NodeId;
use parcache_core::{
    Access, Begin, BlockKey, ByteRange, Cache, CacheConfig, Effect, IoToken, PrefetchKind, ProcId, ReplacementKind,
    Span, Time, WriteCause, WritePolicyKind,
};
use std::collections::{BinaryHeap, HashMap, VecDeque};

/// The file server's node, which has the disk.
const SERVER: NodeId = 0;

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

/// What the disk does for whom: demand first, then background writes,
/// then prefetches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Job {
    /// `no-cache`: a client's request waits for it.
    Client(usize),
    /// A node cache's fetch (`then`: the copy after the disk read).
    Fetch {
        node: NodeId,
        token: IoToken,
        then: Span,
        prefetch: bool,
    },
    /// A node cache's write of a dirty block that a request waits for.
    Write { node: NodeId, token: IoToken },
    /// A dirty block written in the background (the node's buffer was
    /// freed once the block reached the server).
    Clean,
}

impl Job {
    fn class(&self) -> usize {
        match self {
            Job::Client(_) | Job::Write { .. } => 0,
            Job::Fetch { prefetch: false, .. } => 0,
            Job::Clean => 1,
            Job::Fetch { prefetch: true, .. } => 2,
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
    /// Client `c`'s next access (its delays before it have passed), or a
    /// retry after its cache resumed it.
    Access(usize),
    /// `no-cache`: a client's request reaches the disk queue.
    ToDisk(usize),
    /// The disk finished the job in service.
    Disk(Job),
    /// A fetch's bytes arrived in `node`'s cache.
    Fetched(NodeId, IoToken),
    /// A dirty block left `node`'s cache for the server.
    Written(NodeId, IoToken),
    /// `node`'s cache asked for a timer event.
    Timer(NodeId),
    Finish(usize),
}

/// A step of a request: a delay (copies, messages), an access to a node's
/// cache, or (`no-cache`) a disk access.
#[derive(Clone, Copy, Debug)]
enum Stage {
    Delay(Span),
    Disk(Span),
    Access { node: NodeId, key: BlockKey, write: bool },
}

/// One client's request in progress.
struct Pending {
    began: Time,
    measured: bool,
    write: bool,
    stages: VecDeque<Stage>,
    /// Whether its access has not yet been tried (a hit is a first-try hit).
    first_try: bool,
    /// Forwards it pays for (no auxiliary buffer was free).
    penalty: Span,
}

/// What a node cache asked for while being driven, carried out after.
#[derive(Clone, Copy, Debug)]
enum Act {
    Write {
        token: IoToken,
        detached: bool,
        cause: WriteCause,
    },
    Fetch {
        token: IoToken,
        key: BlockKey,
        prefetch: bool,
    },
    Resume(ProcId),
    Wake(Time),
    Evicted(BlockKey),
}

/// The level below every node cache: records what the cache asks.
struct Collect<'a>(&'a mut Vec<Act>);

impl Below for Collect<'_> {
    fn write(&mut self, _now: Time, token: IoToken, _key: BlockKey, _whole: bool, detached: bool, cause: WriteCause) {
        self.0.push(Act::Write { token, detached, cause });
    }
    fn fetch(&mut self, _now: Time, token: IoToken, key: BlockKey, prefetch: bool) -> bool {
        self.0.push(Act::Fetch { token, key, prefetch });
        true
    }
    fn resume(&mut self, _now: Time, proc: ProcId) {
        self.0.push(Act::Resume(proc));
    }
    fn wake_at(&mut self, at: Time) {
        self.0.push(Act::Wake(at));
    }
    fn evicted(&mut self, _now: Time, key: BlockKey) {
        self.0.push(Act::Evicted(key));
    }
}

struct Sim<'a> {
    p: Params,
    streams: &'a [Vec<Op>],
    pos: Vec<usize>,
    pending: Vec<Option<Pending>>,
    k: Kernel<Ev>,
    disk: Disk,
    /// Each node's cache: the core's, through the shared cache driver.
    caches: Vec<CacheDriver>,
    members: Members,
    directory: Directory,
    /// `n-chance`: how often each block a node holds was forwarded since
    /// it was last read there.
    recirculations: HashMap<(NodeId, BlockKey), u8>,
    /// Per node: when each auxiliary buffer taken for a forward frees.
    aux: Vec<BinaryHeap<std::cmp::Reverse<Time>>>,
    /// The node whose cache the next prefetch poll tries first.
    next_poll: usize,
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
        Algo::Cache(CooperativeKind::NChance { n }) => Some(n),
        _ => None,
    };
    let cfg = CacheConfig {
        buffers: p.cache_blocks.max(1),
        block_size: p.costs.block as u32,
        replacement: ReplacementKind::Lru,
        write: WritePolicyKind::WriteBack,
        // Under lru-interleaved the reader decides and the homes read ahead.
        prefetch: match p.algo {
            Algo::Cache(CooperativeKind::LruInterleaved) => PrefetchKind::None,
            _ => p.prefetch,
        },
        aux_buffers: p.aux_buffers,
        syncer: Some(p.sync_every),
        fill_partial_writes: false,
    };
    let caches = (0..p.nodes)
        .map(|_| {
            let mut c = Cache::new(cfg.clone()).expect("a valid node cache");
            c.report_evictions(n_chance.is_some());
            CacheDriver::new(c)
        })
        .collect();
    let mut s = Sim {
        p: *p,
        streams,
        pos: vec![0; streams.len()],
        pending: (0..streams.len()).map(|_| None).collect(),
        k: Kernel::new(),
        disk: Disk::default(),
        caches,
        members: Members::new(0..p.nodes as NodeId),
        directory: Directory::new(n_chance.unwrap_or(0)),
        recirculations: HashMap::new(),
        aux: (0..p.nodes).map(|_| BinaryHeap::new()).collect(),
        next_poll: 0,
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
            Ev::Access(c) => s.access(now, c),
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
                    Job::Fetch { node, token, then, .. } => s.k.at(now + then, Ev::Fetched(node, token)),
                    Job::Write { node, token } => s.k.at(now, Ev::Written(node, token)),
                    Job::Clean => {}
                }
                s.start_prefetch(now);
            }
            Ev::Fetched(node, token) => {
                s.caches[node as usize].cache_mut().fetch_done(now, token);
                s.drain(now, node, None);
                s.start_prefetch(now);
            }
            Ev::Written(node, token) => {
                s.caches[node as usize].cache_mut().write_done(now, token);
                s.drain(now, node, None);
                s.start_prefetch(now);
            }
            Ev::Timer(node) => {
                // The syncer: stop once every client is done.
                if live > 0 {
                    let mut acts = Vec::new();
                    s.caches[node as usize].timer(now, &mut Collect(&mut acts));
                    s.carry_out(now, node, None, acts);
                }
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
                    self.opened(now, node, op);
                    self.pos[c] += 1;
                }
                OpKind::Close => {
                    if self.p.algo != Algo::NoCache {
                        self.caches[node as usize].cache_mut().close(now, op.file as u64);
                    }
                    self.pos[c] += 1;
                }
                OpKind::Read | OpKind::Write => {
                    let write = op.kind == OpKind::Write;
                    if self.p.algo == Algo::NoCache && !write && op.measured {
                        self.m.misses += 1;
                    }
                    let k = key(op.file, op.block);
                    let stages = if write {
                        self.write_stages(now, node, k)
                    } else {
                        self.read_stages(node, k)
                    };
                    if self.p.prefetch == PrefetchKind::OneBlockAhead
                        && self.p.algo == Algo::Cache(CooperativeKind::LruInterleaved)
                        && op.block + 1 < op.blocks
                    {
                        self.prefetch_at_home(now, key(op.file, op.block + 1));
                    }
                    self.pending[c] = Some(Pending {
                        began: now,
                        measured: op.measured,
                        write,
                        stages,
                        first_try: true,
                        penalty: Span::ZERO,
                    });
                    self.advance(now, c);
                    self.start_prefetch(now);
                    return true;
                }
            }
        }
    }

    /// A client on `node` opened a file: `full-file-on-open` queues it
    /// (at each block's home under `lru-interleaved`).
    fn opened(&mut self, now: Time, node: NodeId, op: Op) {
        match self.p.algo {
            Algo::NoCache => {}
            Algo::Cache(CooperativeKind::LruInterleaved) => {
                if self.p.prefetch == PrefetchKind::FullFileOnOpen {
                    for b in 0..op.blocks {
                        self.prefetch_at_home(now, key(op.file, b));
                    }
                }
            }
            Algo::Cache(_) => {
                self.caches[node as usize]
                    .cache_mut()
                    .open(now, op.file as u64, op.blocks as u64);
                self.drain(now, node, None);
            }
        }
        self.start_prefetch(now);
    }

    fn prefetch_at_home(&mut self, now: Time, k: BlockKey) {
        let home = lru_interleaved::home(k, &self.members).expect("members");
        self.caches[home as usize].cache_mut().prefetch_block(now, k);
    }

    /// The stages of a read of `k` by `node` (§5's costs).
    fn read_stages(&self, node: NodeId, k: BlockKey) -> VecDeque<Stage> {
        let co = self.p.costs;
        let (l, r, msg) = (co.local_copy(), co.remote_copy(), co.message());
        let access = |at: NodeId| Stage::Access {
            node: at,
            key: k,
            write: false,
        };
        match self.p.algo {
            Algo::NoCache => VecDeque::from([Stage::Delay(msg), Stage::Disk(co.disk_read), Stage::Delay(r)]),
            // The 2003 global cache is the vilayannur03 model's; here a
            // node under it is only its private cache.
            Algo::Cache(CooperativeKind::None | CooperativeKind::Global { .. }) => {
                VecDeque::from([access(node), Stage::Delay(l)])
            }
            Algo::Cache(CooperativeKind::LruInterleaved) => {
                let home = lru_interleaved::home(k, &self.members).expect("members");
                if home == node {
                    VecDeque::from([access(home), Stage::Delay(l)])
                } else {
                    VecDeque::from([Stage::Delay(msg), access(home), Stage::Delay(r)])
                }
            }
            // Every request asks the central server first.
            Algo::Cache(CooperativeKind::NChance { .. }) => {
                VecDeque::from([Stage::Delay(msg), access(node), Stage::Delay(l)])
            }
        }
    }

    /// The stages of a write of the whole block `k` by `node`.
    fn write_stages(&mut self, now: Time, node: NodeId, k: BlockKey) -> VecDeque<Stage> {
        let co = self.p.costs;
        let (l, r, msg) = (co.local_copy(), co.remote_copy(), co.message());
        let access = |at: NodeId| Stage::Access {
            node: at,
            key: k,
            write: true,
        };
        match self.p.algo {
            Algo::NoCache => VecDeque::from([Stage::Delay(msg + r), Stage::Disk(co.disk_write)]),
            Algo::Cache(CooperativeKind::None | CooperativeKind::Global { .. }) => {
                VecDeque::from([Stage::Delay(l), access(node)])
            }
            Algo::Cache(CooperativeKind::LruInterleaved) => {
                let home = lru_interleaved::home(k, &self.members).expect("members");
                let cost = if home == node { l } else { msg + r };
                VecDeque::from([Stage::Delay(cost), access(home)])
            }
            Algo::Cache(CooperativeKind::NChance { .. }) => {
                // The central server keeps the copies coherent: every
                // other copy is dropped.
                for other in self.directory.written(node, k) {
                    self.caches[other as usize].cache_mut().discard_block(now, k);
                    self.recirculations.remove(&(other, k));
                    self.drain(now, other, None);
                }
                VecDeque::from([Stage::Delay(msg + l), access(node)])
            }
        }
    }

    /// Runs client `c`'s request on from `now`: its delays up to the next
    /// access (cache or disk), or to its end.
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
                Stage::Access { .. } => {
                    self.k.at(now + delay, Ev::Access(c));
                    return;
                }
            }
        }
        let penalty = std::mem::replace(&mut p.penalty, Span::ZERO);
        self.k.at(now + delay + penalty, Ev::Finish(c));
    }

    /// Client `c` accesses the block of its current stage in that node's
    /// cache: on with its request if the block is there, else it waits to
    /// be resumed (the cache fetches it, or frees a buffer).
    fn access(&mut self, now: Time, c: usize) {
        let p = self.pending[c].as_mut().expect("a request in progress");
        let Some(&Stage::Access { node, key: k, write }) = p.stages.front() else {
            unreachable!("an access without an access stage");
        };
        let first = std::mem::replace(&mut p.first_try, false);
        let measured = p.measured;
        let bs = self.p.costs.block as u32;
        let a = if write {
            Access::Write(ByteRange::new(0, bs))
        } else {
            Access::Read(ByteRange::new(0, bs))
        };
        let cache = self.caches[node as usize].cache_mut();
        let begun = cache.begin(now, c as ProcId, k, a).expect("a whole-block access");
        let ready = match begun {
            Begin::Ready(b) => {
                cache.end(now, c as ProcId, b, a).expect("the access begun");
                true
            }
            Begin::Blocked => false,
        };
        let fetched = self.m.remote_hits + self.m.misses;
        self.drain(now, node, Some(c));
        if !write && first && measured {
            if ready {
                if node == c as NodeId + 1 {
                    self.m.local_hits += 1;
                } else {
                    self.m.remote_hits += 1;
                }
            } else if self.m.remote_hits + self.m.misses == fetched {
                // It waits for a block on its way, or for a buffer.
                self.m.misses += 1;
            }
        }
        if ready {
            if !write {
                self.recirculations.remove(&(node, k));
            }
            self.pending[c].as_mut().expect("in progress").stages.pop_front();
            self.advance(now, c);
        }
    }

    /// Carries out what `node`'s cache asked for; `client` is the request
    /// being served, which pays for forwards no auxiliary buffer takes.
    fn drain(&mut self, now: Time, node: NodeId, client: Option<usize>) {
        let mut acts = Vec::new();
        self.caches[node as usize].drain(now, &mut Collect(&mut acts));
        self.carry_out(now, node, client, acts);
    }

    fn carry_out(&mut self, now: Time, node: NodeId, client: Option<usize>, acts: Vec<Act>) {
        let co = self.p.costs;
        let measured = client.is_some_and(|c| self.pending[c].as_ref().is_some_and(|p| p.measured));
        for act in acts {
            match act {
                Act::Resume(proc) => self.k.at(now, Ev::Access(proc as usize)),
                Act::Wake(at) => self.k.at(at, Ev::Timer(node)),
                Act::Write { token, detached, cause } => {
                    // A clean from an auxiliary buffer or by the syncer
                    // frees the node's buffer once the block reaches the
                    // server, which writes it in the background; a clean
                    // a request needs at once waits for the disk.
                    let to_server = if node == SERVER {
                        co.local_copy()
                    } else {
                        co.remote_copy()
                    };
                    if detached || cause != WriteCause::Need {
                        self.k.at(now + to_server, Ev::Written(node, token));
                        self.submit(now, Job::Clean, co.disk_write);
                    } else {
                        if measured {
                            self.m.critical_cleans += 1;
                        }
                        self.submit(now, Job::Write { node, token }, co.disk_write);
                    }
                }
                Act::Fetch {
                    token,
                    key: k,
                    prefetch,
                } => self.fetch(now, node, token, k, prefetch, client),
                Act::Evicted(k) => self.forward(now, node, k, client),
            }
        }
    }

    /// `node`'s cache fetches `k`: from a peer holding it (`n-chance`),
    /// else from the disk, then copied to the node.
    fn fetch(&mut self, now: Time, node: NodeId, token: IoToken, k: BlockKey, prefetch: bool, client: Option<usize>) {
        let co = self.p.costs;
        let (l, r, msg) = (co.local_copy(), co.remote_copy(), co.message());
        let measured = !prefetch && client.is_some_and(|c| self.pending[c].as_ref().is_some_and(|p| p.measured));
        if prefetch {
            self.m.prefetches += 1;
        }
        let then = if node == SERVER { l } else { r };
        // n-chance asks the directory for a peer holding the block; a
        // home's (or a private cache's) miss goes to the server.
        if let Algo::Cache(CooperativeKind::NChance { .. }) = self.p.algo {
            let from_peer = matches!(self.directory.lookup(node, k, &self.members), Source::Peer(_));
            self.directory.cached(node, k);
            if from_peer {
                if measured {
                    self.m.remote_hits += 1;
                }
                self.k.at(now + r, Ev::Fetched(node, token));
                return;
            }
        }
        if measured {
            self.m.misses += 1;
        }
        // A miss asks the server (n-chance asked it already): the message
        // is added to the copy after the disk, so the total is the same.
        let ask = match self.p.algo {
            Algo::Cache(CooperativeKind::NChance { .. }) => Span::ZERO,
            _ => msg,
        };
        let job = Job::Fetch {
            node,
            token,
            then: then + ask,
            prefetch,
        };
        self.submit(now, job, co.disk_read);
    }

    /// `node` evicted the clean block `k` (`n-chance`): a last copy with
    /// chances left goes to a peer, which adopts it as most recently used.
    /// The request being served pays a remote copy unless an auxiliary
    /// buffer takes the forward (delayed forward, §6.2).
    fn forward(&mut self, now: Time, node: NodeId, k: BlockKey, client: Option<usize>) {
        let recirc = self.recirculations.remove(&(node, k)).unwrap_or(0);
        let pick = self.rng.below(u64::MAX);
        let Evicted::Forward { to, recirculations, .. } =
            self.directory.evicted(node, k, recirc, false, pick, &self.members)
        else {
            return;
        };
        let measured = client.is_some_and(|c| self.pending[c].as_ref().is_some_and(|p| p.measured));
        if measured {
            self.m.forwards += 1;
        }
        if let Some(c) = client {
            if !self.take_aux(now, node, self.p.costs.remote_copy()) {
                if measured {
                    self.m.critical_forwards += 1;
                }
                if let Some(p) = self.pending[c].as_mut() {
                    p.penalty = p.penalty + self.p.costs.remote_copy();
                }
            }
        }
        if self.caches[to as usize].cache_mut().adopt(now, k).is_some() {
            self.recirculations.insert((to, k), recirculations);
        }
        // A block the adoption pushed out is forwarded in turn, by nobody's
        // request.
        self.drain(now, to, None);
    }

    fn submit(&mut self, now: Time, job: Job, service: Span) {
        if let Some((j, s)) = self.disk.submit(job, service) {
            self.k.at(now + s, Ev::Disk(j));
        }
    }

    /// The disk has nothing else to do: the node caches' queued prefetches
    /// go, one node after another.
    fn start_prefetch(&mut self, now: Time) {
        if self.p.algo == Algo::NoCache || self.p.prefetch == PrefetchKind::None {
            return;
        }
        let n = self.caches.len();
        let mut tried = 0;
        while self.disk.idle_for_prefetch() && tried < n {
            let node = self.next_poll as NodeId;
            let got = self.caches[node as usize].cache_mut().poll_prefetch(now, &mut |_| true);
            match got {
                Some(Effect::Fetch { token, key: k, .. }) => {
                    tried = 0;
                    let mut acts = vec![Act::Fetch {
                        token,
                        key: k,
                        prefetch: true,
                    }];
                    self.caches[node as usize].drain(now, &mut Collect(&mut acts));
                    self.carry_out(now, node, None, acts);
                }
                _ => {
                    tried += 1;
                    self.next_poll = (self.next_poll + 1) % n;
                }
            }
        }
    }

    /// Takes one of `node`'s auxiliary buffers for a delayed forward
    /// (busy for one remote copy); false if all are busy.
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
        // Client 1 reads block 9 first (unmeasured), so client 0's read of
        // block 5 has finished when client 1 reads it.
        let two = reads(&[vec![(0, 5)], vec![(1, 9), (2, 5)]], 2);
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
