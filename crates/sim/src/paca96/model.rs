//! One run of the PACA model (Cortes, Girona & Labarta 1996 §6–7) over a
//! read-only block reference stream per client.
//!
//! - 50 nodes with a local cache each (16 MiB of 8 KiB blocks by default);
//!   node 0 runs the file server and has the one disk (8 KiB read 14.7 ms,
//!   FCFS); clients run on nodes 1–48.
//! - Communications are synchronous: a start-up plus size over bandwidth
//!   (§6.1): a port (remote) costs 100 µs + 8 KiB at 155 Mbit/s, a memory
//!   copy (local) 50 µs + 8 KiB at 320 Mbit/s; a request message costs a
//!   port start-up.
//! - Each client issues its references one after another (closed loop);
//!   read times are averaged from the warm-up point on (the paper measured
//!   hours 15 to 48 of 48, §7.1).
//!
//! Where a block is found and what becomes of a block a node evicts are
//! `parcache_core::cooperative`'s decisions. Costs per read (§5):
//! - `none` (private caches): a local hit is a local copy; a miss asks the
//!   server, reads the disk, and copies remote then local.
//! - `greedy`, `n-chance`: every read asks the (central) server first; a
//!   remote hit is a remote copy into the reader's cache and a local copy
//!   to the user; a miss reads the disk. An evicted singlet forwarded
//!   under `n-chance` costs the reader a remote copy unless one of its 16
//!   auxiliary buffers is free (delayed forward, §6.2).
//! - `lru-interleaved`: the block's home serves it: a local copy at home,
//!   else a message and one remote copy; a miss at the home reads the disk
//!   into the home's cache.
//! - `no-cache`: every read goes to the disk.
//!
//! Simplifications: a forward that a peer's insertion causes in turn
//! (cascade) is charged to nobody; a remote hit does not reorder the
//! holder's LRU list; reads only (the trace records no writes).

use crate::kernel::Kernel;
use crate::resource::Fcfs;
use crate::rng::SimRng;
use parcache_core::cooperative::n_chance::{Directory, Evicted};
use parcache_core::cooperative::{lru_interleaved, CooperativeKind, Members, Source};
use parcache_core::ids::NodeId;
use parcache_core::{BlockKey, Span, Time};
use std::collections::{BTreeMap, BinaryHeap, HashMap};

/// The model's single file (the trace names blocks only).
const FILE: u64 = 1;
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
    /// References (by position in the merged trace) before this one warm
    /// the caches and are not measured.
    pub warm_up: usize,
    /// Mean time a client thinks between reads (exponential): Baker et
    /// al. 1991 measured 8 KB/s per active user over 10-minute intervals,
    /// one 8 KiB block a second. Zero: back to back.
    pub think: Span,
    pub seed: u64,
}

impl Params {
    /// The paper's base: 50 nodes, 16 MiB caches of 8 KiB blocks, 16
    /// auxiliary buffers per node.
    pub fn base(algo: Algo, warm_up: usize, seed: u64) -> Params {
        Params {
            nodes: 50,
            cache_blocks: (16 << 20) / (8 << 10),
            aux_buffers: 16,
            algo,
            costs: Costs::default(),
            warm_up,
            think: Span::from_secs(1),
            seed,
        }
    }
}

/// What a run measured (from the warm-up point on).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Measured {
    pub reads: u64,
    pub read_time: Span,
    pub local_hits: u64,
    pub remote_hits: u64,
    pub misses: u64,
    pub forwards: u64,
    /// Forwards no auxiliary buffer could take, paid by the read.
    pub critical_forwards: u64,
}

impl Measured {
    pub fn mean_read_ms(&self) -> f64 {
        if self.reads == 0 {
            0.0
        } else {
            self.read_time.as_millis_f64() / self.reads as f64
        }
    }
}

/// A node's cache: LRU over blocks, each with its forward count.
struct Lru {
    cap: usize,
    at: HashMap<u64, (u64, u8)>,
    order: BTreeMap<u64, u64>,
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
    /// forward count reset.
    fn touch(&mut self, b: u64) -> bool {
        let Some((stamp, _)) = self.at.get(&b).copied() else {
            return false;
        };
        self.order.remove(&stamp);
        self.next += 1;
        self.order.insert(self.next, b);
        self.at.insert(b, (self.next, 0));
        true
    }
    fn contains(&self, b: u64) -> bool {
        self.at.contains_key(&b)
    }
    /// Inserts as most recent; returns the block pushed out, with its count.
    fn insert(&mut self, b: u64, recirculations: u8) -> Option<(u64, u8)> {
        if self.contains(b) {
            self.touch(b);
            return None;
        }
        self.next += 1;
        self.order.insert(self.next, b);
        self.at.insert(b, (self.next, recirculations));
        if self.at.len() <= self.cap {
            return None;
        }
        let (_, victim) = self.order.pop_first().expect("over capacity");
        let (_, r) = self.at.remove(&victim).expect("listed");
        Some((victim, r))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ev {
    Start(usize),
    /// A client's request reaches the disk queue.
    ToDisk(usize),
    Disk,
    Finish(usize),
}

/// One client's read: when it began and what is left after the disk.
struct Pending {
    began: Time,
    measured: bool,
    after_disk: Span,
}

struct Sim<'a> {
    p: Params,
    streams: &'a [Vec<(usize, u32)>],
    pos: Vec<usize>,
    pending: Vec<Option<Pending>>,
    k: Kernel<Ev>,
    disk: Fcfs<usize>,
    caches: Vec<Lru>,
    members: Members,
    directory: Directory,
    /// Per node: when each auxiliary buffer in use frees.
    aux: Vec<BinaryHeap<std::cmp::Reverse<Time>>>,
    rng: SimRng,
    /// The clients' think times, one stream each (independent of the
    /// forwarding picks, so algorithms see the same arrivals).
    thinking: Vec<SimRng>,
    m: Measured,
}

/// Runs the model: `streams[i]` are client i's references (position in the
/// merged trace, block), client i on node i + 1.
pub fn run(p: &Params, streams: &[Vec<(usize, u32)>]) -> Measured {
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
        disk: Fcfs::new(),
        caches: (0..p.nodes).map(|_| Lru::new(p.cache_blocks)).collect(),
        members: Members::new(0..p.nodes as NodeId),
        directory: Directory::new(n_chance),
        aux: (0..p.nodes).map(|_| BinaryHeap::new()).collect(),
        rng: SimRng::new(p.seed),
        thinking: (0..streams.len() as u64)
            .map(|c| SimRng::stream(p.seed, c + 1))
            .collect(),
        m: Measured::default(),
    };
    for c in 0..streams.len() {
        s.k.at(Time::ZERO, Ev::Start(c));
    }
    while let Some((now, ev)) = s.k.pop() {
        match ev {
            Ev::Start(c) => s.start(now, c),
            Ev::ToDisk(c) => {
                if let Some(done) = s.disk.submit(now, c, s.p.costs.disk_read) {
                    s.k.at(done, Ev::Disk);
                }
            }
            Ev::Disk => {
                let (c, next) = s.disk.complete(now);
                if let Some(at) = next {
                    s.k.at(at, Ev::Disk);
                }
                let after = s.pending[c].as_ref().expect("a read at the disk").after_disk;
                s.k.at(now + after, Ev::Finish(c));
            }
            Ev::Finish(c) => {
                let done = s.pending[c].take().expect("a read in progress");
                if done.measured {
                    s.m.reads += 1;
                    s.m.read_time = s.m.read_time + now.since(done.began);
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
    fn start(&mut self, now: Time, c: usize) {
        let Some(&(at, block)) = self.streams[c].get(self.pos[c]) else {
            return;
        };
        let node = c as NodeId + 1;
        let measured = at >= self.p.warm_up;
        let (before, disk, after) = self.read(now, node, block as u64, measured);
        self.pending[c] = Some(Pending {
            began: now,
            measured,
            after_disk: after,
        });
        if disk {
            // The request reaches the disk's queue after `before`.
            self.k.at(now + before, Ev::ToDisk(c));
        } else {
            self.k.at(now + before + after, Ev::Finish(c));
        }
    }

    /// Decides a read of `b` by `node`: the time before the disk, whether
    /// the disk is read, and the time after it.
    fn read(&mut self, now: Time, node: NodeId, b: u64, measured: bool) -> (Span, bool, Span) {
        let c = self.p.costs;
        let (l, r, msg) = (c.local_copy(), c.remote_copy(), c.message());
        let count = |m: &mut Measured, f: fn(&mut Measured)| {
            if measured {
                f(m)
            }
        };
        match self.p.algo {
            Algo::NoCache => {
                count(&mut self.m, |m| m.misses += 1);
                (msg, true, r)
            }
            Algo::Cache(CooperativeKind::None) => {
                if self.caches[node as usize].touch(b) {
                    count(&mut self.m, |m| m.local_hits += 1);
                    return (l, false, Span::ZERO);
                }
                count(&mut self.m, |m| m.misses += 1);
                self.caches[node as usize].insert(b, 0);
                (msg, true, r + l)
            }
            Algo::Cache(CooperativeKind::LruInterleaved) => {
                let key = BlockKey::new(FILE, b);
                let home = lru_interleaved::home(key, &self.members).expect("members");
                let to_user = if home == node { l } else { r };
                let ask = if home == node { Span::ZERO } else { msg };
                if self.caches[home as usize].touch(b) {
                    if home == node {
                        count(&mut self.m, |m| m.local_hits += 1);
                    } else {
                        count(&mut self.m, |m| m.remote_hits += 1);
                    }
                    return (ask + to_user, false, Span::ZERO);
                }
                count(&mut self.m, |m| m.misses += 1);
                self.caches[home as usize].insert(b, 0);
                let to_home = if home == SERVER { l } else { r };
                (ask + msg, true, to_home + to_user)
            }
            Algo::Cache(CooperativeKind::NChance { .. }) => {
                let key = BlockKey::new(FILE, b);
                if self.caches[node as usize].touch(b) {
                    count(&mut self.m, |m| m.local_hits += 1);
                    return (msg + l, false, Span::ZERO);
                }
                let (before, disk, mut after) = match self.directory.lookup(node, key, &self.members) {
                    Source::Peer(_) => {
                        count(&mut self.m, |m| m.remote_hits += 1);
                        (msg + r + l, false, Span::ZERO)
                    }
                    _ => {
                        count(&mut self.m, |m| m.misses += 1);
                        (msg, true, r + l)
                    }
                };
                self.directory.cached(node, key);
                if let Some(victim) = self.caches[node as usize].insert(b, 0) {
                    if !self.evict(now, node, victim, measured) {
                        after = after + r;
                    }
                }
                if disk {
                    (before, true, after)
                } else {
                    (before + after, false, Span::ZERO)
                }
            }
        }
    }

    /// `node` pushed `victim` out. Returns false if a forward had to be
    /// paid in the read's critical path (no auxiliary buffer free).
    fn evict(&mut self, now: Time, node: NodeId, victim: (u64, u8), measured: bool) -> bool {
        let mut delayed = true;
        let mut work = vec![(node, victim, true)];
        while let Some((at, (b, recirc), first)) = work.pop() {
            let key = BlockKey::new(FILE, b);
            let pick = self.rng.below(u64::MAX);
            let Evicted::Forward { to, recirculations, .. } =
                self.directory.evicted(at, key, recirc, false, pick, &self.members)
            else {
                continue;
            };
            if measured {
                self.m.forwards += 1;
            }
            if first && !self.take_aux(now, at) {
                delayed = false;
                if measured {
                    self.m.critical_forwards += 1;
                }
            }
            if let Some(next) = self.caches[to as usize].insert(b, recirculations) {
                work.push((to, next, false));
            }
        }
        delayed
    }

    /// Takes one of `node`'s auxiliary buffers for a delayed forward (busy
    /// for one remote copy); false if all are busy.
    fn take_aux(&mut self, now: Time, node: NodeId) -> bool {
        let heap = &mut self.aux[node as usize];
        while heap.peek().is_some_and(|t| t.0 <= now) {
            heap.pop();
        }
        if heap.len() >= self.p.aux_buffers {
            return false;
        }
        heap.push(std::cmp::Reverse(now + self.p.costs.remote_copy()));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(blocks: &[u32], client: usize) -> Vec<Vec<(usize, u32)>> {
        let mut s = vec![Vec::new(); client + 1];
        s[client] = blocks.iter().copied().enumerate().collect();
        s
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
            let m = run(&Params::base(algo, 0, 1), &stream(&[7, 7], 0));
            assert_eq!(m.reads, 2);
            assert_eq!(m.misses, 1, "{algo}");
            assert_eq!(m.local_hits + m.remote_hits, 1, "{algo}");
            assert!(m.mean_read_ms() > 7.0, "a disk read is in the mean");
        }
        let m = run(&Params::base(Algo::NoCache, 0, 1), &stream(&[7, 7], 0));
        assert_eq!(m.misses, 2);
    }

    /// Another client's block: a remote hit under the cooperative
    /// algorithms, a disk read with private caches.
    #[test]
    fn another_clients_block_is_a_remote_hit() {
        let two = vec![vec![(0, 5)], vec![(1, 5)]];
        let run_ = |algo| {
            let mut p = Params::base(algo, 1, 1);
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
        let mut p = Params::base(Algo::Cache(CooperativeKind::NChance { n: 2 }), 0, 3);
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
        let streams = crate::paca96::trace::by_client(&refs[..20_000], 48, 64);
        let p = Params::base(Algo::Cache(CooperativeKind::NChance { n: 2 }), 5_000, 9);
        assert_eq!(run(&p, &streams), run(&p, &streams));
    }
}
