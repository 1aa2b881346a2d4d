//! The CAPFS cluster model (Vilayannur et al. 2005 §3–4): clients, one
//! metadata (hash) server and content-addressed data servers, with the
//! core's [`RecipeServer`] deciding commits and each client's [`HCache`]
//! holding hashes. PVFS, the paper's baseline, is the same cluster with no
//! hashes and no commits.
//!
//! Servers, the metadata server's processor and each client's network link
//! and processor are first-come-first-served lines; a request reserves each
//! line it passes in the order the requests reach it, so queueing arises
//! where the paper's does (a busy metadata server, a hot data server).
//! Requests that read or change shared state (hash fetches, commits) are
//! events at the metadata server in time order, so conflicts and
//! invalidations happen as the interleaving makes them.

use crate::kernel::Kernel;
use parcache_core::consistency::capfs::{CapfsParams, ChunkHash, Commit, HCache, RecipeServer, HOLE};
use parcache_core::{Span, Time};
use std::collections::{HashMap, HashSet, VecDeque};

/// The cluster's costs. Every value is stated with where it comes from in
/// `docs/reproduction/capfs05.md`.
#[derive(Clone, Copy, Debug)]
pub struct Costs {
    pub servers: usize,
    pub chunk: u64,
    /// One-way network latency (Myrinet with GM: about 10 µs).
    pub latency: Span,
    /// A client's link, bytes per second (LANai 9 Myrinet: about 230 MB/s).
    pub client_link: f64,
    /// A data server: per request, and bytes per second through it.
    pub server_request: Span,
    pub server_bw: f64,
    /// Chunks a data server holds in memory; past that, its disk.
    pub server_mem_chunks: u64,
    pub disk_bw: f64,
    /// The metadata server: per request, per hash fetched, per commit
    /// change, per invalidation sent.
    pub mds_request: Span,
    pub mds_per_hash: Span,
    pub mds_per_change: Span,
    pub mds_per_invalidation: Span,
    /// A client's hashing speed (SHA-1 on a 2.8 GHz Xeon), bytes per second.
    pub hash_bw: f64,
    /// What a client's file-system daemon moves per second between the
    /// application and the network (user-level, 2005).
    pub client_bw: f64,
    /// A client's cost per H-cache lookup or insert.
    pub hcache_entry: Span,
    /// Hashes an H-cache holds (the paper capped hashes per file).
    pub hcache_cap: usize,
}

impl Default for Costs {
    fn default() -> Self {
        Costs {
            servers: 16,
            chunk: 16 << 10,
            latency: Span::from_millis_f64(0.010),
            client_link: 230e6,
            server_request: Span::from_millis_f64(0.100),
            server_bw: 25e6,
            server_mem_chunks: (128 << 20) / (16 << 10),
            disk_bw: 12e6,
            mds_request: Span::from_millis_f64(0.100),
            mds_per_hash: Span::from_millis_f64(0.050),
            mds_per_change: Span::from_millis_f64(0.004),
            mds_per_invalidation: Span::from_millis_f64(0.030),
            hash_bw: 120e6,
            client_bw: 30e6,
            hcache_entry: Span::from_millis_f64(0.008),
            hcache_cap: 16 << 10,
        }
    }
}

/// Which file system a run models.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum System {
    Pvfs,
    Capfs(CapfsParams),
}

/// One request of a client.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// Write `len` bytes at `offset` of `file`; chunk `i`'s content is
    /// named `content(i)` (same name, same bytes).
    Write {
        file: u64,
        offset: u64,
        len: u64,
        pattern: Pattern,
    },
    Read {
        file: u64,
        offset: u64,
        len: u64,
    },
    /// Everything after this is timed.
    StartClock,
}

/// What a written chunk contains.
#[derive(Clone, Copy, Debug)]
pub enum Pattern {
    /// Chunk `i` of every file holds pattern `i % period` (the paper's
    /// benchmark "writes data initialized to a repeated sequence of known
    /// patterns").
    Repeating { period: u64 },
    /// Every write makes new bytes.
    Unique,
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct Measured {
    /// From the clock's start to the last client's end.
    pub elapsed: Span,
    pub bytes: u64,
    pub commits: u64,
    pub conflicts: u64,
    pub invalidations: u64,
    pub hash_fetches: u64,
    /// Distinct chunks stored, and chunk slots of all recipes.
    pub physical_chunks: u64,
    pub logical_chunks: u64,
}

impl Measured {
    /// Aggregate bandwidth over the timed part, MB/s (10^6 bytes).
    pub fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-12) / 1e6
    }
}

/// A first-come-first-served line.
#[derive(Clone, Copy, Default)]
struct Line {
    free: Time,
}

impl Line {
    fn reserve(&mut self, at: Time, service: Span) -> Time {
        let start = at.max(self.free);
        self.free = start + service;
        self.free
    }
}

fn secs(bytes: u64, per_s: f64) -> Span {
    Span::from_millis_f64(bytes as f64 / per_s * 1e3)
}

fn hash_of(content: u64) -> ChunkHash {
    let mut h = [0u8; 32];
    h[..8].copy_from_slice(&(content + 1).to_le_bytes());
    h[8] = 0xca;
    h
}

enum Ev {
    /// The client goes on with its current request.
    Client(usize),
    /// A hash fetch reaches the metadata server.
    Fetch { c: usize, file: u64, from: u64, count: u64 },
    /// A commit reaches the metadata server.
    Commit {
        c: usize,
        file: u64,
        changes: Vec<(u64, ChunkHash, ChunkHash)>,
    },
    /// An invalidation reaches a client.
    Invalidate { c: usize, file: u64, chunks: Vec<u64> },
}

/// Where a client is in its current request.
#[derive(Default)]
struct Doing {
    /// Hashes this request knows (index → hash).
    known: HashMap<u64, ChunkHash>,
    /// Hash runs still to fetch.
    fetch: VecDeque<(u64, u64)>,
    stage: u8,
    retries: u32,
}

struct Client {
    ops: VecDeque<Op>,
    op: Option<Op>,
    doing: Doing,
    link: Line,
    cpu: Line,
    hcache: HCache,
    dcache: HashSet<ChunkHash>,
    next_unique: u64,
}

struct Server {
    line: Line,
    disk: Line,
    /// Chunks stored (CAPFS) or blocks stored (PVFS), and which of them
    /// are in memory.
    stored: HashMap<ChunkHash, bool>,
}

/// Runs the clients' requests on `system`; returns what the timed part took.
pub fn run(system: System, costs: &Costs, clients: Vec<Vec<Op>>) -> Measured {
    Model::new(system, costs, clients).run()
}

struct Model {
    sys: System,
    c: Costs,
    k: Kernel<Ev>,
    clients: Vec<Client>,
    servers: Vec<Server>,
    mds: Line,
    recipes: RecipeServer,
    m: Measured,
    clock_from: Option<Time>,
    counting: bool,
    /// Clients at the clock's barrier.
    waiting: Vec<usize>,
    /// When each file's last commit is complete.
    file_locks: HashMap<u64, Time>,
}

impl Model {
    fn new(sys: System, c: &Costs, ops: Vec<Vec<Op>>) -> Self {
        let clients = ops
            .into_iter()
            .enumerate()
            .map(|(i, ops)| Client {
                ops: ops.into(),
                op: None,
                doing: Doing::default(),
                link: Line::default(),
                cpu: Line::default(),
                hcache: HCache::new(c.hcache_cap),
                dcache: HashSet::new(),
                next_unique: (i as u64 + 1) << 40,
            })
            .collect();
        Model {
            sys,
            c: *c,
            k: Kernel::new(),
            clients,
            servers: (0..c.servers)
                .map(|_| Server {
                    line: Line::default(),
                    disk: Line::default(),
                    stored: HashMap::new(),
                })
                .collect(),
            mds: Line::default(),
            recipes: RecipeServer::new(),
            m: Measured::default(),
            clock_from: None,
            counting: false,
            waiting: Vec::new(),
            file_locks: HashMap::new(),
        }
    }

    fn params(&self) -> Option<CapfsParams> {
        match self.sys {
            System::Pvfs => None,
            System::Capfs(p) => Some(p),
        }
    }

    fn run(mut self) -> Measured {
        for i in 0..self.clients.len() {
            self.k.at(Time::ZERO, Ev::Client(i));
        }
        let mut end = Time::ZERO;
        while let Some((now, ev)) = self.k.pop() {
            end = now;
            match ev {
                Ev::Client(c) => self.advance(c),
                Ev::Fetch { c, file, from, count } => self.fetch_at_mds(c, file, from, count),
                Ev::Commit { c, file, changes } => self.commit_at_mds(c, file, changes),
                Ev::Invalidate { c, file, chunks } => self.clients[c].hcache.invalidate_chunks(file, &chunks),
            }
        }
        self.m.elapsed = end.since(self.clock_from.unwrap_or(Time::ZERO));
        let (physical, logical) = self.recipes.chunk_counts();
        self.m.physical_chunks = physical;
        self.m.logical_chunks = logical;
        self.m.commits = self.recipes.commits;
        self.m.conflicts = self.recipes.conflicts;
        self.m
    }

    /// The client's next step.
    fn advance(&mut self, c: usize) {
        let now = self.k.now();
        let op = match self.clients[c].op {
            Some(op) => op,
            None => match self.clients[c].ops.pop_front() {
                None => return,
                Some(Op::StartClock) => {
                    // A barrier: the clock starts when every client has
                    // reached it, and they all go on from there. The timed
                    // part starts with data caches cold (the memory went to
                    // the data written); hashes stay in the H-cache, as far
                    // as it holds them.
                    self.clients[c].dcache.clear();
                    self.waiting.push(c);
                    if self.waiting.len() == self.clients.len() {
                        self.clock_from = Some(now);
                        self.counting = true;
                        for w in std::mem::take(&mut self.waiting) {
                            self.k.at(now, Ev::Client(w));
                        }
                    }
                    return;
                }
                Some(op) => {
                    self.clients[c].op = Some(op);
                    self.clients[c].doing = Doing::default();
                    op
                }
            },
        };
        let done = match (self.sys, op) {
            (System::Pvfs, Op::Write { offset, len, .. }) => Some(self.pvfs_io(c, offset, len, true)),
            (System::Pvfs, Op::Read { offset, len, .. }) => Some(self.pvfs_io(c, offset, len, false)),
            (
                System::Capfs(p),
                Op::Write {
                    file,
                    offset,
                    len,
                    pattern,
                },
            ) => self.capfs_write(c, p, file, offset, len, pattern),
            (System::Capfs(p), Op::Read { file, offset, len }) => self.capfs_read(c, p, file, offset, len),
            (_, Op::StartClock) => unreachable!("handled above"),
        };
        if let Some(at) = done {
            let len = match op {
                Op::Write { len, .. } | Op::Read { len, .. } => len,
                Op::StartClock => 0,
            };
            if self.counting {
                self.m.bytes += len;
            }
            self.clients[c].op = None;
            self.k.at(at, Ev::Client(c));
        }
    }

    fn chunks(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        offset / self.c.chunk..(offset + len).div_ceil(self.c.chunk)
    }

    /// A data server stores or serves one chunk or block; returns when. A
    /// chunk already stored is not stored again (content addressing; a
    /// PVFS block's name is its place, so PVFS rewrites it, see `pvfs_io`).
    fn serve_chunk(&mut self, at: Time, key: ChunkHash, write: bool) -> Time {
        let c = self.c;
        let s = &mut self.servers[(u64::from_le_bytes(key[..8].try_into().expect("8 bytes")) as usize) % c.servers];
        let mut done = s.line.reserve(at, c.server_request + secs(c.chunk, c.server_bw));
        let in_memory = (s.stored.len() as u64) < c.server_mem_chunks;
        if write {
            if let std::collections::hash_map::Entry::Vacant(e) = s.stored.entry(key) {
                e.insert(in_memory);
                if !in_memory {
                    done = s.disk.reserve(done, secs(c.chunk, c.disk_bw));
                }
            }
        } else if s.stored.get(&key) == Some(&false) {
            done = s.disk.reserve(done, secs(c.chunk, c.disk_bw));
        }
        done
    }

    /// PVFS: the bytes go to or come from the servers by stripe, no more.
    fn pvfs_io(&mut self, c: usize, offset: u64, len: u64, write: bool) -> Time {
        let now = self.k.now();
        let lat = self.c.latency;
        let handled = self.clients[c].cpu.reserve(now, secs(len, self.c.client_bw));
        let sent = self.clients[c].link.reserve(handled, secs(len, self.c.client_link));
        let mut done = sent;
        for i in self.chunks(offset, len) {
            // A block's name: its place in the file (striped round-robin).
            let mut key = [0u8; 32];
            key[..8].copy_from_slice(&i.to_le_bytes());
            let mut at = self.serve_chunk(now + lat, key, write);
            let s = &mut self.servers[(i as usize) % self.c.servers];
            if write && s.stored.len() as u64 >= self.c.server_mem_chunks {
                // More data than memory: every block written goes to disk.
                at = s.disk.reserve(at, secs(self.c.chunk, self.c.disk_bw));
            }
            done = done.max(at);
        }
        done + lat
    }

    fn capfs_write(
        &mut self,
        c: usize,
        p: CapfsParams,
        file: u64,
        offset: u64,
        len: u64,
        pattern: Pattern,
    ) -> Option<Time> {
        let now = self.k.now();
        let cs = self.c.chunk;
        let range = self.chunks(offset, len);
        let partial = |i: u64| offset > i * cs || offset + len < (i + 1) * cs;
        if self.clients[c].doing.stage == 0 {
            // Old hashes: needed to check a commit, and to read a partly
            // written chunk's old bytes.
            let need: Vec<u64> = range.clone().filter(|&i| !p.force_commit || partial(i)).collect();
            let cl = &mut self.clients[c];
            let mut lookups = 0;
            for &i in &need {
                if p.use_hcache {
                    lookups += 1;
                    if let Some(h) = cl.hcache.get(file, i) {
                        cl.doing.known.insert(i, h);
                    }
                }
            }
            let missing: Vec<u64> = need
                .iter()
                .copied()
                .filter(|i| !cl.doing.known.contains_key(i))
                .collect();
            cl.doing.fetch = runs(&missing, p.num_hashes as u64);
            cl.doing.stage = 1;
            let t = cl.cpu.reserve(now, self.c.hcache_entry * lookups);
            self.k.at(t, Ev::Client(c));
            return None;
        }
        if self.clients[c].doing.stage == 1 {
            if let Some((from, count)) = self.clients[c].doing.fetch.pop_front() {
                self.k.at(now + self.c.latency, Ev::Fetch { c, file, from, count });
                return None;
            }
            self.clients[c].doing.stage = 2;
        }
        if self.clients[c].doing.stage == 2 {
            // Old bytes of partly written chunks (D-cache, else the server),
            // hashing, then the new chunks stored: all before the commit.
            let mut t = now;
            let partly: Vec<ChunkHash> = range
                .clone()
                .filter(|&i| partial(i))
                .filter_map(|i| self.clients[c].doing.known.get(&i).copied())
                .filter(|h| *h != HOLE && !self.clients[c].dcache.contains(h))
                .collect();
            for h in partly {
                let at = self.serve_chunk(now + self.c.latency, h, false);
                t = t.max(at + self.c.latency);
                self.clients[c].dcache.insert(h);
            }
            let cl = &mut self.clients[c];
            let entries = if p.use_hcache { range.end - range.start } else { 0 };
            t = cl.cpu.reserve(
                t,
                secs(len, self.c.client_bw) + secs(len, self.c.hash_bw) + self.c.hcache_entry * entries,
            );
            let sent = cl
                .link
                .reserve(t, secs((range.end - range.start) * cs, self.c.client_link));
            let mut changes = Vec::new();
            let mut stored = t;
            for i in range.clone() {
                let content = match pattern {
                    Pattern::Repeating { period } => i % period,
                    Pattern::Unique => {
                        self.clients[c].next_unique += 1;
                        self.clients[c].next_unique
                    }
                };
                let new = hash_of(content);
                let old = self.clients[c].doing.known.get(&i).copied().unwrap_or(HOLE);
                stored = stored.max(self.serve_chunk(t + self.c.latency, new, true));
                changes.push((i, old, new));
                self.clients[c].dcache.insert(new);
            }
            let at = stored.max(sent) + self.c.latency + self.c.latency;
            self.clients[c].doing.stage = 3;
            self.k.at(at, Ev::Commit { c, file, changes });
            return None;
        }
        // Stage 3: the commit was answered (see `commit_at_mds`).
        Some(now)
    }

    fn capfs_read(&mut self, c: usize, p: CapfsParams, file: u64, offset: u64, len: u64) -> Option<Time> {
        let now = self.k.now();
        let range = self.chunks(offset, len);
        if self.clients[c].doing.stage == 0 {
            let cl = &mut self.clients[c];
            let mut lookups = 0;
            if p.use_hcache {
                for i in range.clone() {
                    lookups += 1;
                    if let Some(h) = cl.hcache.get(file, i) {
                        cl.doing.known.insert(i, h);
                    }
                }
            }
            let missing: Vec<u64> = range.clone().filter(|i| !cl.doing.known.contains_key(i)).collect();
            cl.doing.fetch = runs(&missing, p.num_hashes as u64);
            cl.doing.stage = 1;
            let t = cl.cpu.reserve(now, self.c.hcache_entry * lookups);
            self.k.at(t, Ev::Client(c));
            return None;
        }
        if let Some((from, count)) = self.clients[c].doing.fetch.pop_front() {
            self.k.at(now + self.c.latency, Ev::Fetch { c, file, from, count });
            return None;
        }
        // The chunks: D-cache hits cost nothing more; misses come from the
        // servers in parallel through the client's link.
        let want: Vec<ChunkHash> = range
            .filter_map(|i| self.clients[c].doing.known.get(&i).copied())
            .filter(|h| *h != HOLE && !self.clients[c].dcache.contains(h))
            .collect();
        let mut done = now;
        for h in &want {
            done = done.max(self.serve_chunk(now + self.c.latency, *h, false));
            self.clients[c].dcache.insert(*h);
        }
        let got = self.clients[c]
            .link
            .reserve(done, secs(want.len() as u64 * self.c.chunk, self.c.client_link));
        let handled = self.clients[c]
            .cpu
            .reserve(got + self.c.latency, secs(len, self.c.client_bw));
        Some(handled)
    }

    fn fetch_at_mds(&mut self, c: usize, file: u64, from: u64, count: u64) {
        let p = self.params().expect("only CAPFS fetches hashes");
        let now = self.k.now();
        let hashes = self.recipes.hashes(c as u64, file, from, count, p.registers_holders());
        let done = self.mds.reserve(now, self.c.mds_request + self.c.mds_per_hash * count);
        self.m.hash_fetches += 1;
        let cl = &mut self.clients[c];
        for (k, h) in hashes.into_iter().enumerate() {
            let i = from + k as u64;
            cl.doing.known.insert(i, h);
            if p.use_hcache {
                cl.hcache.put(file, i, h);
            }
        }
        self.k.at(done + self.c.latency, Ev::Client(c));
    }

    /// A commit at the metadata server. Commits to one file are serialised
    /// (2005 §4.2: "commits to a file are serialized by the meta-data
    /// server"), and a coherent commit is complete only when every holder's
    /// daemon has dropped the hashes and answered, so a busy holder holds
    /// up every writer of the file.
    fn commit_at_mds(&mut self, c: usize, file: u64, changes: Vec<(u64, ChunkHash, ChunkHash)>) {
        let p = self.params().expect("only CAPFS commits");
        let now = self.k.now();
        let start = now.max(self.file_locks.get(&file).copied().unwrap_or(Time::ZERO));
        let mut done = self
            .mds
            .reserve(start, self.c.mds_request + self.c.mds_per_change * changes.len() as u64);
        match self
            .recipes
            .commit(c as u64, file, &changes, p.force_commit, p.hcache_coherence)
        {
            Commit::Done { invalidate, .. } => {
                if !invalidate.is_empty() {
                    let sent = self
                        .mds
                        .reserve(done, self.c.mds_per_invalidation * invalidate.len() as u64);
                    let mut acked = sent;
                    for (n, chunks) in invalidate.iter() {
                        let n = *n as usize;
                        let at = sent + self.c.latency;
                        let handled = self.clients[n]
                            .cpu
                            .reserve(at, self.c.hcache_entry * chunks.len() as u64);
                        acked = acked.max(handled + self.c.latency);
                        let ev = Ev::Invalidate {
                            c: n,
                            file,
                            chunks: chunks.clone(),
                        };
                        self.k.at(at, ev);
                    }
                    done = self
                        .mds
                        .reserve(acked, self.c.mds_per_invalidation * invalidate.len() as u64);
                    self.m.invalidations += invalidate.len() as u64;
                }
                if p.use_hcache {
                    for (i, _, new) in &changes {
                        self.clients[c].hcache.put(file, *i, *new);
                    }
                }
                self.file_locks.insert(file, done);
                self.k.at(done + self.c.latency, Ev::Client(c));
            }
            Commit::Conflict { current } => {
                // Retry on the current hashes: the write is redone.
                self.file_locks.insert(file, done);
                let cl = &mut self.clients[c];
                cl.hcache.invalidate(file);
                cl.doing.retries += 1;
                cl.doing.known.clear();
                for (i, h) in current {
                    cl.doing.known.insert(i, h);
                }
                cl.doing.stage = 0;
                self.k.at(done + self.c.latency, Ev::Client(c));
            }
        }
    }
}

/// Consecutive indices grouped into runs of at most `batch`.
fn runs(idx: &[u64], batch: u64) -> VecDeque<(u64, u64)> {
    let mut out: VecDeque<(u64, u64)> = VecDeque::new();
    for &i in idx {
        match out.back_mut() {
            Some((from, n)) if *from + *n == i && *n < batch => *n += 1,
            _ => out.push_back((i, 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use parcache_core::consistency::{rel_1, seq_1, seq_2};

    fn stream(clients: u64, per_client: u64, req: u64, write: bool) -> Vec<Vec<Op>> {
        (0..clients)
            .map(|c| {
                let mut ops = vec![Op::StartClock];
                let mut at = c * per_client;
                while at < (c + 1) * per_client {
                    ops.push(if write {
                        Op::Write {
                            file: 1,
                            offset: at,
                            len: req,
                            pattern: Pattern::Unique,
                        }
                    } else {
                        Op::Read {
                            file: 1,
                            offset: at,
                            len: req,
                        }
                    });
                    at += req;
                }
                ops
            })
            .collect()
    }

    #[test]
    fn runs_group_consecutive_indices() {
        assert_eq!(runs(&[1, 2, 3, 5, 6], 2), VecDeque::from(vec![(1, 2), (3, 1), (5, 2)]));
    }

    #[test]
    fn writes_then_reads_return_every_byte_once_and_the_same_seedless_run_repeats() {
        let c = Costs::default();
        for sys in [System::Pvfs, System::Capfs(seq_1::PARAMS), System::Capfs(rel_1::PARAMS)] {
            let a = run(sys, &c, stream(4, 8 << 20, 1 << 20, true));
            let b = run(sys, &c, stream(4, 8 << 20, 1 << 20, true));
            assert_eq!(a.bytes, 32 << 20);
            assert_eq!(a.elapsed, b.elapsed, "{sys:?} is deterministic");
            assert!(
                a.mb_per_s() > 10.0 && a.mb_per_s() < 2_000.0,
                "{sys:?}: {}",
                a.mb_per_s()
            );
        }
    }

    #[test]
    fn overlapping_small_writes_conflict_unless_forced_and_coherence_invalidates() {
        let c = Costs::default();
        // Four clients writing interleaved 4 KiB pieces of the same chunks.
        let ops: Vec<Vec<Op>> = (0..4u64)
            .map(|k| {
                let mut v = vec![Op::StartClock];
                for piece in 0..64u64 {
                    v.push(Op::Write {
                        file: 1,
                        offset: (piece * 4 + k) * 4096,
                        len: 4096,
                        pattern: Pattern::Unique,
                    });
                }
                v
            })
            .collect();
        let seq = run(System::Capfs(seq_2::PARAMS), &c, ops.clone());
        let rel = run(System::Capfs(rel_1::PARAMS), &c, ops);
        assert!(seq.conflicts > 0, "seq-2 retries conflicting commits");
        assert!(seq.invalidations > 0, "seq-2 keeps H-caches coherent");
        assert_eq!((rel.conflicts, rel.invalidations), (0, 0));
    }
}
