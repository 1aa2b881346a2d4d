//! One replay of a trace on a modelled cluster under one [`Choice`] of
//! policies: every node runs the core's cache and the file's consistency
//! plug-in (the code the real node client runs), every data server runs
//! the core's cache over a disk, and the metadata server runs `sprite`'s
//! server half. Virtual time, no I/O: the same trace, cluster and choice
//! give the same result, bit for bit.
//!
//! How a trace becomes work:
//! - Each traced process runs its operations one after another (closed
//!   loop), pausing between two as long as the trace shows it idle (the
//!   gap between one's end and the next one's start).
//! - An operation costs `op_us` at its node, then goes through the
//!   consistency plug-in's hooks (`pre_open`, `post_open`, `pre_read`,
//!   `post_write`, `flush`, `release`): a metadata request is a round
//!   trip to the metadata server (FCFS, `meta_us` each); pushing, dropping
//!   and invalidating act on the node caches. The hooks are evaluated when
//!   the operation starts; their requests and pushes then run in order.
//! - Reads and writes go block by block (64 KiB) through the node's
//!   cache, a hit costing a copy at `memcpy_gbps`. A miss or a write-down
//!   is a message to the block's data server (`latency_us` each way, the
//!   bytes over the server's link at `link_mbps`, FCFS), which looks in
//!   its own cache (a miss reads its disk); a write is acknowledged after
//!   the server's durable log takes it (`log_write_us` plus the bytes at
//!   `disk_mbps`, on the same disk). Files the plug-in does not let the
//!   node cache (`posix`, `sprite` while write-shared) go to the servers
//!   directly.
//! - Cooperative caching (`greedy`, `n-chance`): a node's miss is served
//!   from a peer that holds the block when the directory (the core's
//!   `n_chance::Directory`) knows one: a round trip and the block over the
//!   network, no server involved; `n-chance` forwards evicted last copies.
//! - At the end every cache is flushed to the disks: `elapsed` is when
//!   the last operation finished, `drained` when the last byte was down.
//!
//! Simplifications: one message's bytes occupy only the server's link
//! (nodes' links and peers' links are not queues); the disk serves in
//! arrival order; a server's log and its block store share one disk;
//! metadata requests carry no data.

use super::choice::Choice;
use super::cluster::{ClusterModel, BLOCK};
use crate::kernel::Kernel;
use crate::resource::Fcfs;
use crate::trace::{Op, Trace};
use parcache_core::consistency::sprite::SpriteServer;
use parcache_core::consistency::{Action, Consistency, NodeFile, ServerView};
use parcache_core::cooperative::n_chance::{Directory, Evicted};
use parcache_core::cooperative::{CooperativeKind, Members, Source};
use parcache_core::{
    split_blocks, Access, Begin, BlockKey, ByteRange, Cache, CacheConfig, CacheStats, Effect, IoToken, PrefetchKind,
    ProcId, ReplacementKind, Span, Time, TraceOp,
};
use serde::Serialize;
use std::collections::{HashMap, HashSet, VecDeque};

/// What a replay measured.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Outcome {
    /// Seconds until the last operation finished.
    pub elapsed: f64,
    /// Seconds until the last dirty byte reached a disk (after a final flush).
    pub drained: f64,
    /// Seconds the operations took, added up (what the processes waited).
    pub io_time: f64,
    pub ops: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Bytes the data servers' disks wrote (their logs not counted).
    pub disk_write_bytes: u64,
    pub disk_read_bytes: u64,
    /// Block writes to a disk of a block it had already written: each
    /// earlier write was wasted (a "rewrite mistake").
    pub rewrite_mistakes: u64,
    /// Reads found in the node's own cache, of reads that reached it.
    pub node_hit_ratio: f64,
    /// Misses served from a peer's cache (cooperative caching).
    pub remote_hits: u64,
    /// Requests found in a data server's cache.
    pub server_hit_ratio: f64,
    /// Messages between nodes, servers and the metadata server.
    pub messages: u64,
    pub metadata_requests: u64,
    pub node_stats: CacheStats,
    pub server_stats: CacheStats,
    /// Seconds each file's operations took, added up, by file index.
    pub file_time: Vec<f64>,
}

/// Why a replay cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("cluster: {0}")]
    Cluster(String),
    #[error("policies: {0}")]
    Choice(String),
}

/// Replays `trace` on `cluster` under `choice`.
pub fn replay(trace: &Trace, cluster: &ClusterModel, choice: &Choice) -> Result<Outcome, ReplayError> {
    cluster.check().map_err(ReplayError::Cluster)?;
    match choice.cooperative {
        CooperativeKind::None | CooperativeKind::NChance { .. } => {}
        c => {
            return Err(ReplayError::Choice(format!(
                "cooperative={c} is not modelled by replay (none, greedy and n-chance are)"
            )))
        }
    }
    if choice.consistency.needs_cas() {
        return Err(ReplayError::Choice(format!(
            "consistency={}: CAPFS plug-ins need the content-addressed store; replay models the block store",
            choice.consistency
        )));
    }
    let mut m = Model::new(trace, cluster, choice).map_err(ReplayError::Choice)?;
    m.run();
    Ok(m.outcome())
}

type Pid = usize;

#[derive(Clone, Copy, Debug)]
enum Step {
    /// The per-operation cost at the node, or a copy.
    Cost(Span),
    /// A round trip to the metadata server.
    Meta,
    /// Part of a block through the node's cache.
    Cached { key: BlockKey, access: Access },
    /// Part of a block straight to its data server.
    Direct { key: BlockKey, access: Access },
    /// Start writing a file's dirty blocks down on a node; wait until done.
    Push { node: usize, file: u64 },
    /// Forget a file's cached blocks on a node.
    Drop { node: usize, file: u64 },
    /// Forget some cached blocks on a node.
    DropBlocks {
        node: usize,
        file: u64,
        first: u64,
        last: u64,
    },
}

#[derive(Clone, Copy, Debug)]
enum Origin {
    NodeWrite { node: usize, token: IoToken },
    NodeFetch { node: usize, token: IoToken },
    Direct { pid: Pid },
}

#[derive(Clone, Copy, Debug)]
struct Req {
    server: usize,
    key: BlockKey,
    access: Access,
    origin: Origin,
}

#[derive(Clone, Copy, Debug)]
enum LinkJob {
    /// A request's bytes arriving at the server.
    In(usize),
    /// A reply's bytes leaving it.
    Out(usize),
}

#[derive(Clone, Copy, Debug)]
enum DiskJob {
    /// Append a request's write to the server's log, then acknowledge it.
    Log(usize),
    Down {
        token: IoToken,
        key: BlockKey,
        bytes: u64,
    },
    Fetch {
        token: IoToken,
        key: BlockKey,
    },
}

#[derive(Clone, Copy, Debug)]
enum Ev {
    Issue(Pid),
    StepDone(Pid),
    Resume(Pid),
    NodeTimer(usize),
    ServerTimer(usize),
    Arrive(usize),
    LinkDone(usize),
    DiskDone(usize),
    Serve(usize),
    Reply(usize),
    MetaArrive(Pid),
    MetaDone,
    PeerReply { node: usize, token: IoToken },
}

/// A cache with its pending timer.
struct Level {
    cache: Cache,
    timer_at: Option<Time>,
}

impl Level {
    /// A timer event at `now`: the cache's deadline passes if it is the
    /// one last asked for (earlier ones were superseded). True if it did.
    fn fire(&mut self, now: Time) -> bool {
        if self.timer_at != Some(now) {
            return false;
        }
        self.timer_at = None;
        self.cache.handle_timeout(now);
        true
    }

    /// The time of a timer event to raise, if the cache's next deadline is
    /// earlier than the one already asked for.
    fn arm(&mut self, now: Time) -> Option<Time> {
        let t = self.cache.poll_timeout()?.max(now);
        if self.timer_at.is_none_or(|at| t < at) {
            self.timer_at = Some(t);
            Some(t)
        } else {
            None
        }
    }
}

struct Server {
    level: Level,
    link: Fcfs<LinkJob>,
    disk: Fcfs<DiskJob>,
    /// Where the disk's head is: (file, byte) after the last request.
    head: Option<(u64, u64)>,
    /// Blocks the disk has written, for rewrites.
    written: HashSet<BlockKey>,
}

struct Node {
    level: Level,
    files: HashMap<u64, NodeFile>,
    prefetching: HashSet<IoToken>,
    /// Processes waiting for a file to be clean on this node.
    clean_waiters: Vec<(Pid, u64)>,
}

struct Proc {
    node: usize,
    ops: Vec<u32>,
    next: usize,
    steps: VecDeque<Step>,
    started: Time,
    /// Whether each file is open for writing by this process.
    writing: HashMap<u64, bool>,
    done_at: Time,
}

struct Model<'a> {
    trace: &'a Trace,
    c: &'a ClusterModel,
    plugin: Box<dyn Consistency>,
    k: Kernel<Ev>,
    nodes: Vec<Node>,
    servers: Vec<Server>,
    procs: Vec<Proc>,
    reqs: Vec<Option<Req>>,
    free_reqs: Vec<usize>,
    meta: Fcfs<Pid>,
    sprite: SpriteServer,
    views: HashMap<u64, ServerView>,
    directory: Option<Directory>,
    members: Members,
    forwards: u64,
    /// Forwards of each unreferenced last copy so far (`n-chance`).
    recirculations: HashMap<BlockKey, u8>,
    /// Nodes that adopted a forwarded block and have effects to drain: a
    /// forward can evict at the peer and forward again, so the chain is
    /// followed in a loop, not by recursion (64 nodes overflowed the stack).
    drain_later: Vec<usize>,
    out: Outcome,
    last_op_end: Time,
}

fn secs(s: f64) -> Span {
    Span((s.max(0.0) * 1e9) as u64)
}
fn micros(us: f64) -> Span {
    Span((us * 1e3) as u64)
}

impl<'a> Model<'a> {
    fn new(trace: &'a Trace, c: &'a ClusterModel, choice: &Choice) -> Result<Model<'a>, String> {
        let n_nodes = if c.nodes == 0 {
            trace.nodes.len().max(1)
        } else {
            c.nodes
        };
        let node_cfg = CacheConfig {
            buffers: ClusterModel::buffers(c.node_cache_mib),
            block_size: BLOCK,
            replacement: choice.replacement,
            write: choice.write,
            prefetch: choice.prefetch,
            aux_buffers: 16,
            syncer: Some(Span::from_secs(30)),
            fill_partial_writes: false,
        };
        let server_cfg = CacheConfig {
            buffers: ClusterModel::buffers(c.server_cache_mib),
            block_size: BLOCK,
            replacement: ReplacementKind::Lru,
            write: c.server_write_policy()?,
            prefetch: PrefetchKind::None,
            aux_buffers: 0,
            syncer: None,
            fill_partial_writes: false,
        };
        let mut nodes = Vec::new();
        for _ in 0..n_nodes {
            let mut cache = Cache::new(node_cfg.clone()).map_err(|e| e.to_string())?;
            cache.report_evictions(matches!(choice.cooperative, CooperativeKind::NChance { .. }));
            nodes.push(Node {
                level: Level { cache, timer_at: None },
                files: HashMap::new(),
                prefetching: HashSet::new(),
                clean_waiters: Vec::new(),
            });
        }
        let mut servers = Vec::new();
        for _ in 0..c.servers {
            servers.push(Server {
                level: Level {
                    cache: Cache::new(server_cfg.clone()).map_err(|e| e.to_string())?,
                    timer_at: None,
                },
                link: Fcfs::new(),
                disk: Fcfs::new(),
                head: None,
                written: HashSet::new(),
            });
        }
        // Processes: one per traced (node, process), in order of first op.
        let mut index: HashMap<(u32, u64), usize> = HashMap::new();
        let mut procs: Vec<Proc> = Vec::new();
        let mut views: HashMap<u64, ServerView> = HashMap::new();
        let mut written = HashSet::new();
        for (i, o) in trace.ops.iter().enumerate() {
            let pid = *index.entry((o.node, o.process)).or_insert_with(|| {
                procs.push(Proc {
                    node: o.node as usize % n_nodes,
                    ops: Vec::new(),
                    next: 0,
                    steps: VecDeque::new(),
                    started: Time::ZERO,
                    writing: HashMap::new(),
                    done_at: Time::ZERO,
                });
                procs.len() - 1
            });
            procs[pid].ops.push(i as u32);
            // A file's size at the servers when the trace starts: as far as
            // it is read before its first write (a file the trace writes
            // first is taken to be new).
            let file = u64::from(o.file);
            let v = views.entry(file).or_insert(ServerView { size: 0, version: 1 });
            if o.kind == TraceOp::Write {
                written.insert(file);
            } else if o.kind == TraceOp::Read && !written.contains(&file) {
                v.size = v.size.max(o.offset + o.length);
            }
        }
        let directory = match choice.cooperative {
            CooperativeKind::NChance { n } => Some(Directory::new(n)),
            _ => None,
        };
        let mut out = Outcome {
            file_time: vec![0.0; trace.files.len()],
            ..Outcome::default()
        };
        out.ops = trace.ops.len() as u64;
        Ok(Model {
            trace,
            c,
            plugin: choice.consistency.build(),
            k: Kernel::new(),
            members: Members::new(0..n_nodes as u64),
            nodes,
            servers,
            procs,
            reqs: Vec::new(),
            free_reqs: Vec::new(),
            meta: Fcfs::new(),
            sprite: SpriteServer::new(),
            views,
            directory,
            forwards: 0,
            recirculations: HashMap::new(),
            drain_later: Vec::new(),
            out,
            last_op_end: Time::ZERO,
        })
    }

    fn run(&mut self) {
        for pid in 0..self.procs.len() {
            let first = self.trace.ops[self.procs[pid].ops[0] as usize].time;
            self.k.at(Time::ZERO + secs(first), Ev::Issue(pid));
        }
        let mut flushed = false;
        loop {
            while let Some((now, ev)) = self.k.pop() {
                self.handle(now, ev);
            }
            if flushed {
                break;
            }
            // Every operation is done: unmount (flush the nodes), then the
            // servers write back what they hold.
            flushed = true;
            let now = self.k.now();
            self.last_op_end = self.procs.iter().map(|p| p.done_at).max().unwrap_or(Time::ZERO);
            for n in 0..self.nodes.len() {
                self.nodes[n].level.cache.flush(now);
                self.drain_node(now, n);
            }
            while let Some((now, ev)) = self.k.pop() {
                self.handle(now, ev);
            }
            let now = self.k.now();
            for s in 0..self.servers.len() {
                self.servers[s].level.cache.flush(now);
                self.drain_server(now, s);
            }
        }
    }

    fn handle(&mut self, now: Time, ev: Ev) {
        match ev {
            Ev::Issue(pid) => self.issue(now, pid),
            Ev::StepDone(pid) | Ev::Resume(pid) => self.advance(now, pid),
            Ev::NodeTimer(n) => {
                if self.nodes[n].level.fire(now) {
                    self.drain_node(now, n);
                }
            }
            Ev::ServerTimer(s) => {
                if self.servers[s].level.fire(now) {
                    self.drain_server(now, s);
                }
            }
            Ev::Arrive(r) => {
                let req = self.req(r);
                match req.access {
                    Access::Write(range) => self.link(now, req.server, LinkJob::In(r), range.len() as u64),
                    Access::Read(_) => self.serve(now, r),
                }
            }
            Ev::LinkDone(s) => {
                let (job, next) = self.servers[s].link.complete(now);
                if let Some(t) = next {
                    self.k.at(t, Ev::LinkDone(s));
                }
                match job {
                    LinkJob::In(r) => self.serve(now, r),
                    LinkJob::Out(r) => self.k.after(micros(self.c.latency_us), Ev::Reply(r)),
                }
            }
            Ev::Serve(r) => self.serve(now, r),
            Ev::DiskDone(s) => {
                let (job, next) = self.servers[s].disk.complete(now);
                if let Some(t) = next {
                    self.k.at(t, Ev::DiskDone(s));
                }
                match job {
                    DiskJob::Log(r) => self.k.after(micros(self.c.latency_us), Ev::Reply(r)),
                    DiskJob::Down { token, .. } => {
                        self.servers[s].level.cache.write_done(now, token);
                        self.drain_server(now, s);
                    }
                    DiskJob::Fetch { token, .. } => {
                        self.servers[s].level.cache.fetch_done(now, token);
                        self.drain_server(now, s);
                    }
                }
            }
            Ev::Reply(r) => self.reply(now, r),
            Ev::MetaArrive(pid) => {
                if let Some(t) = self.meta.submit(now, pid, micros(self.c.meta_us)) {
                    self.k.at(t, Ev::MetaDone);
                }
            }
            Ev::MetaDone => {
                let (pid, next) = self.meta.complete(now);
                if let Some(t) = next {
                    self.k.at(t, Ev::MetaDone);
                }
                self.k.after(micros(self.c.latency_us), Ev::StepDone(pid));
            }
            Ev::PeerReply { node, token } => self.fetched(now, node, token),
        }
    }

    // ---- processes ----

    fn issue(&mut self, now: Time, pid: Pid) {
        let p = &self.procs[pid];
        let op = self.trace.ops[p.ops[p.next] as usize];
        self.procs[pid].started = now;
        let steps = self.steps_of(now, pid, &op);
        let p = &mut self.procs[pid];
        p.steps.push_back(Step::Cost(micros(self.c.op_us)));
        p.steps.extend(steps);
        self.advance(now, pid);
    }

    /// Runs a process's steps until one must wait; at the end of an
    /// operation, schedules the next.
    fn advance(&mut self, now: Time, pid: Pid) {
        while let Some(step) = self.procs[pid].steps.pop_front() {
            let node = self.procs[pid].node;
            match step {
                Step::Cost(span) => {
                    self.k.after(span, Ev::StepDone(pid));
                    return;
                }
                Step::Meta => {
                    self.out.metadata_requests += 1;
                    self.out.messages += 2;
                    self.k.after(micros(self.c.latency_us), Ev::MetaArrive(pid));
                    return;
                }
                Step::Cached { key, access } => {
                    let begun = self.nodes[node].level.cache.begin(now, pid as ProcId, key, access);
                    match begun {
                        Ok(Begin::Ready(buf)) => {
                            let cache = &mut self.nodes[node].level.cache;
                            cache.end(now, pid as ProcId, buf, access).expect("the access begun");
                            self.cached_block(node, key);
                            self.drain_node(now, node);
                            let bytes = access.range().len() as f64;
                            self.k
                                .after(Span((bytes / self.c.memcpy_gbps) as u64), Ev::StepDone(pid));
                        }
                        Ok(Begin::Blocked) => {
                            self.procs[pid].steps.push_front(step);
                            self.drain_node(now, node);
                        }
                        Err(e) => panic!("replay's access was refused by the cache: {e}"),
                    }
                    return;
                }
                Step::Direct { key, access } => {
                    self.send(now, key, access, Origin::Direct { pid });
                    return;
                }
                Step::Push { node: n, file } => {
                    self.nodes[n].level.cache.flush_file(now, file);
                    self.drain_node(now, n);
                    if !self.nodes[n].level.cache.file_is_clean(file) {
                        self.nodes[n].clean_waiters.push((pid, file));
                        return;
                    }
                }
                Step::Drop { node: n, file } => {
                    self.nodes[n].level.cache.discard_file(now, file, 0);
                    self.drain_node(now, n);
                }
                Step::DropBlocks {
                    node: n,
                    file,
                    first,
                    last,
                } => {
                    for b in first..=last.min(first + (1 << 16)) {
                        self.nodes[n].level.cache.discard_block(now, BlockKey::new(file, b));
                    }
                    self.drain_node(now, n);
                }
            }
        }
        // The operation is over.
        let p = &mut self.procs[pid];
        let op = self.trace.ops[p.ops[p.next] as usize];
        let took = now.since(p.started).as_secs_f64();
        self.out.io_time += took;
        self.out.file_time[op.file as usize] += took;
        p.next += 1;
        p.done_at = now;
        if let Some(&i) = p.ops.get(p.next) {
            let next = self.trace.ops[i as usize];
            let think = next.time - (op.time + op.duration);
            self.k.after(secs(think), Ev::Issue(pid));
        }
    }

    /// The steps of one operation, from the consistency plug-in's hooks.
    fn steps_of(&mut self, now: Time, pid: Pid, op: &Op) -> Vec<Step> {
        let node = self.procs[pid].node;
        let file = u64::from(op.file);
        let view = self.views[&file];
        let mut steps = Vec::new();
        let nf = self.nodes[node]
            .files
            .entry(file)
            .or_insert_with(|| NodeFile::new(view, now))
            .clone();
        let mut nf = nf;
        match op.kind {
            TraceOp::Open => {
                let write = op.length > 0;
                self.procs[pid].writing.insert(file, write);
                let mut cacheable = true;
                for a in self.plugin.pre_open(&nf, now, write) {
                    match a {
                        Action::FetchAttr => steps.push(Step::Meta),
                        Action::OpenAtServer { write } => {
                            steps.push(Step::Meta);
                            let grant = self.sprite.open(node as u64, file, write);
                            cacheable = grant.cacheable;
                            for (n, cb) in grant.callbacks {
                                let n = n as usize;
                                let mut other = self.nodes[n]
                                    .files
                                    .get(&file)
                                    .cloned()
                                    .unwrap_or_else(|| NodeFile::new(view, now));
                                let acts = self.plugin.called_back(&mut other, cb);
                                self.nodes[n].files.insert(file, other);
                                self.actions(now, n, file, acts, &mut steps);
                            }
                        }
                        a => self.action(now, node, file, &mut nf, a, &mut steps),
                    }
                }
                let view = self.views[&file];
                let acts = self.plugin.post_open(&mut nf, now, view, cacheable);
                self.run_actions(now, node, file, &mut nf, acts, &mut steps);
                let blocks = view.size.max(nf.size).div_ceil(BLOCK as u64);
                self.nodes[node].level.cache.open(now, file, blocks);
            }
            TraceOp::Read | TraceOp::Write => {
                let write = op.kind == TraceOp::Write;
                if write {
                    self.out.bytes_written += op.length;
                    let end = op.offset + op.length;
                    let grew = end > nf.size;
                    nf.wrote(end);
                    nf.written_blocks = Some((op.offset / BLOCK as u64, end.saturating_sub(1) / BLOCK as u64));
                    self.pieces(op, nf.cached, &mut steps);
                    let acts = self.plugin.post_write(&mut nf, now, grew);
                    self.run_actions(now, node, file, &mut nf, acts, &mut steps);
                    // Another node's cached copies of these blocks are stale
                    // (the cooperative directory's coherence, 1996 §4).
                    if let Some(d) = self.directory.as_mut() {
                        for piece in split_blocks(op.offset, op.length, BLOCK) {
                            for other in d.written(node as u64, BlockKey::new(file, piece.index)) {
                                steps.push(Step::DropBlocks {
                                    node: other as usize,
                                    file,
                                    first: piece.index,
                                    last: piece.index,
                                });
                            }
                        }
                    }
                } else {
                    self.out.bytes_read += op.length;
                    let acts = self.plugin.pre_read(&nf, now);
                    self.run_actions(now, node, file, &mut nf, acts, &mut steps);
                    self.pieces(op, nf.cached, &mut steps);
                }
            }
            TraceOp::Fsync => steps.push(Step::Push { node, file }),
            TraceOp::Close => {
                let write = self.procs[pid].writing.remove(&file).unwrap_or(false);
                let acts = self.plugin.flush(&mut nf, now);
                self.run_actions(now, node, file, &mut nf, acts, &mut steps);
                let acts = self.plugin.release(&mut nf, now, write);
                self.run_actions(now, node, file, &mut nf, acts, &mut steps);
                self.nodes[node].level.cache.close(now, file);
            }
        }
        self.nodes[node].files.insert(file, nf);
        steps
    }

    fn pieces(&self, op: &Op, cached: bool, steps: &mut Vec<Step>) {
        let file = u64::from(op.file);
        for p in split_blocks(op.offset, op.length, BLOCK) {
            let range = p.range;
            let key = BlockKey::new(file, p.index);
            let access = if op.kind == TraceOp::Write {
                Access::Write(range)
            } else {
                Access::Read(range)
            };
            steps.push(if cached {
                Step::Cached { key, access }
            } else {
                Step::Direct { key, access }
            });
        }
    }

    fn run_actions(
        &mut self,
        now: Time,
        node: usize,
        file: u64,
        nf: &mut NodeFile,
        acts: Vec<Action>,
        steps: &mut Vec<Step>,
    ) {
        for a in acts {
            self.action(now, node, file, nf, a, steps);
        }
    }

    /// Actions for another node's copy of the file (a callback).
    fn actions(&mut self, now: Time, node: usize, file: u64, acts: Vec<Action>, steps: &mut Vec<Step>) {
        let mut nf = self.nodes[node]
            .files
            .get(&file)
            .cloned()
            .unwrap_or_else(|| NodeFile::new(self.views[&file], now));
        self.run_actions(now, node, file, &mut nf, acts, steps);
        self.nodes[node].files.insert(file, nf);
    }

    fn action(&mut self, now: Time, node: usize, file: u64, nf: &mut NodeFile, a: Action, steps: &mut Vec<Step>) {
        match a {
            Action::FetchAttr => {
                steps.push(Step::Meta);
                let view = self.views[&file];
                let acts = self.plugin.revalidated(nf, now, view);
                self.run_actions(now, node, file, nf, acts, steps);
            }
            Action::OpenAtServer { .. } => steps.push(Step::Meta),
            Action::CloseAtServer { write } => {
                steps.push(Step::Meta);
                self.sprite.close(node as u64, file, write);
            }
            Action::PushDirty => steps.push(Step::Push { node, file }),
            Action::ReportSize => {
                if nf.unreported() {
                    steps.push(Step::Meta);
                    let v = self.views.get_mut(&file).expect("every file has a view");
                    v.size = v.size.max(nf.size);
                    v.version += 1;
                    let after = *v;
                    nf.reported(nf.writes, after);
                }
            }
            Action::DropCached => steps.push(Step::Drop { node, file }),
            Action::Adopt => nf.adopt(self.views[&file], now),
            Action::FetchWhole => {
                // As far as the node cache holds, as the client's
                // `fetch_whole`: more would only evict what it fetched.
                let room = ClusterModel::buffers(self.c.node_cache_mib) as u64 * BLOCK as u64;
                let size = nf.size.max(self.views[&file].size).min(room);
                for b in 0..size.div_ceil(BLOCK as u64) {
                    let end = (size - b * BLOCK as u64).min(BLOCK as u64) as u32;
                    steps.push(Step::Cached {
                        key: BlockKey::new(file, b),
                        access: Access::Read(ByteRange::new(0, end)),
                    });
                }
            }
            Action::InvalidateOthers { first, last } => {
                steps.push(Step::Meta);
                for n in 0..self.nodes.len() {
                    if n != node {
                        steps.push(Step::DropBlocks {
                            node: n,
                            file,
                            first,
                            last,
                        });
                    }
                }
            }
            Action::DropBlocks { first, last } => steps.push(Step::DropBlocks {
                node,
                file,
                first,
                last,
            }),
            Action::DropHashes | Action::CommitDelayed => {}
        }
    }

    // ---- node caches ----

    /// A program referenced `key` on `node`: the directory knows the node
    /// holds it, and it is no longer an unreferenced forwarded copy.
    fn cached_block(&mut self, node: usize, key: BlockKey) {
        if let Some(d) = self.directory.as_mut() {
            d.cached(node as u64, key);
            self.recirculations.remove(&key);
        }
    }

    fn drain_node(&mut self, now: Time, n: usize) {
        self.drain_one(now, n);
        while let Some(m) = self.drain_later.pop() {
            self.drain_one(now, m);
        }
    }

    fn drain_one(&mut self, now: Time, n: usize) {
        loop {
            while let Some(e) = self.nodes[n].level.cache.poll_effect() {
                self.node_effect(now, n, e);
            }
            // Prefetches, while the node has room for more in flight.
            if self.nodes[n].prefetching.len() >= self.c.prefetch_depth {
                break;
            }
            match self.nodes[n].level.cache.poll_prefetch(now, &mut |_| true) {
                Some(e @ Effect::Fetch { token, .. }) => {
                    self.nodes[n].prefetching.insert(token);
                    self.node_effect(now, n, e);
                }
                Some(e) => self.node_effect(now, n, e),
                None => break,
            }
        }
        if let Some(t) = self.nodes[n].level.arm(now) {
            self.k.at(t, Ev::NodeTimer(n));
        }
    }

    fn node_effect(&mut self, now: Time, n: usize, e: Effect) {
        match e {
            Effect::Write {
                token,
                key,
                dirty,
                whole,
                ..
            } => {
                let range = if whole {
                    ByteRange::new(0, BLOCK)
                } else {
                    let r = dirty.ranges();
                    ByteRange::new(r.first().map_or(0, |r| r.start), r.last().map_or(0, |r| r.end))
                };
                self.send(now, key, Access::Write(range), Origin::NodeWrite { node: n, token });
            }
            Effect::Fetch { token, key, .. } => {
                let source = match self.directory.as_mut() {
                    Some(d) => d.lookup(n as u64, key, &self.members),
                    None => Source::Servers,
                };
                match source {
                    Source::Peer(p) if self.nodes[p as usize].level.cache.contains(key) => {
                        self.out.remote_hits += 1;
                        self.out.messages += 2;
                        let transfer = Span((BLOCK as f64 / self.c.link_mbps * 1e3) as u64);
                        self.k.after(
                            micros(2.0 * self.c.latency_us) + transfer,
                            Ev::PeerReply { node: n, token },
                        );
                    }
                    _ => self.send(
                        now,
                        key,
                        Access::Read(ByteRange::new(0, BLOCK)),
                        Origin::NodeFetch { node: n, token },
                    ),
                }
                if let Some(d) = self.directory.as_mut() {
                    d.cached(n as u64, key);
                }
            }
            Effect::Resume { proc } => self.k.at(now, Ev::Resume(proc as usize)),
            Effect::Evicted { key, .. } => {
                let Some(d) = self.directory.as_mut() else { return };
                self.forwards += 1;
                let r = self.recirculations.remove(&key).unwrap_or(0);
                if let Evicted::Forward { to, recirculations, .. } =
                    d.evicted(n as u64, key, r, false, self.forwards, &self.members)
                {
                    self.recirculations.insert(key, recirculations);
                    // The peer takes it as its most recent block; a peer
                    // with no free buffer drops it (charged to nobody).
                    let to = to as usize;
                    if self.nodes[to].level.cache.adopt(now, key).is_none() {
                        d.evicted(to as u64, key, u8::MAX, false, 0, &self.members);
                    }
                    self.out.messages += 1;
                    self.drain_later.push(to);
                }
            }
        }
    }

    fn fetched(&mut self, now: Time, n: usize, token: IoToken) {
        self.nodes[n].prefetching.remove(&token);
        self.nodes[n].level.cache.fetch_done(now, token);
        self.drain_node(now, n);
    }

    fn written(&mut self, now: Time, n: usize, token: IoToken) {
        self.nodes[n].level.cache.write_done(now, token);
        self.drain_node(now, n);
        // Processes waiting for a file to be clean on this node.
        let mut i = 0;
        while i < self.nodes[n].clean_waiters.len() {
            let (pid, file) = self.nodes[n].clean_waiters[i];
            if self.nodes[n].level.cache.file_is_clean(file) {
                self.nodes[n].clean_waiters.swap_remove(i);
                self.k.at(now, Ev::StepDone(pid));
            } else {
                i += 1;
            }
        }
    }

    // ---- messages and data servers ----

    fn server_of(&self, key: BlockKey) -> usize {
        let unit = key.index * BLOCK as u64 / self.c.stripe_unit;
        ((unit + key.file) % self.c.servers as u64) as usize
    }

    fn req(&self, r: usize) -> Req {
        self.reqs[r].expect("a live request")
    }

    fn send(&mut self, _now: Time, key: BlockKey, access: Access, origin: Origin) {
        let req = Req {
            server: self.server_of(key),
            key,
            access,
            origin,
        };
        let r = match self.free_reqs.pop() {
            Some(r) => {
                self.reqs[r] = Some(req);
                r
            }
            None => {
                self.reqs.push(Some(req));
                self.reqs.len() - 1
            }
        };
        self.out.messages += 2;
        self.k.after(micros(self.c.latency_us), Ev::Arrive(r));
    }

    fn link(&mut self, now: Time, s: usize, job: LinkJob, bytes: u64) {
        let service = Span((bytes as f64 / self.c.link_mbps * 1e3) as u64);
        if let Some(t) = self.servers[s].link.submit(now, job, service) {
            self.k.at(t, Ev::LinkDone(s));
        }
    }

    fn disk(&mut self, now: Time, s: usize, job: DiskJob) {
        let bw = |bytes: u64| Span((bytes as f64 / self.c.disk_mbps * 1e3) as u64);
        let server = &mut self.servers[s];
        let service = match job {
            DiskJob::Log(r) => {
                let bytes = self.reqs[r].expect("a live request").access.range().len() as u64;
                micros(self.c.log_write_us) + bw(bytes)
            }
            DiskJob::Down { key, .. } | DiskJob::Fetch { key, .. } => {
                let at = (key.file, key.index * BLOCK as u64);
                let seek = if server.head == Some(at) {
                    Span::ZERO
                } else {
                    micros(self.c.disk_seek_us)
                };
                let bytes = if let DiskJob::Down { bytes, .. } = job {
                    self.out.disk_write_bytes += bytes;
                    if !server.written.insert(key) {
                        self.out.rewrite_mistakes += 1;
                    }
                    bytes
                } else {
                    self.out.disk_read_bytes += BLOCK as u64;
                    BLOCK as u64
                };
                server.head = Some((key.file, at.1 + BLOCK as u64));
                seek + bw(bytes)
            }
        };
        if let Some(t) = server.disk.submit(now, job, service) {
            self.k.at(t, Ev::DiskDone(s));
        }
    }

    /// A request reaches its server's cache.
    fn serve(&mut self, now: Time, r: usize) {
        let req = self.req(r);
        let s = req.server;
        // Server-side "processes" are requests.
        let cache = &mut self.servers[s].level.cache;
        match cache.begin(now, r as ProcId, req.key, req.access) {
            Ok(Begin::Ready(buf)) => {
                cache.end(now, r as ProcId, buf, req.access).expect("the access begun");
                self.drain_server(now, s);
                match req.access {
                    Access::Write(_) => self.disk(now, s, DiskJob::Log(r)),
                    Access::Read(range) => self.link(now, s, LinkJob::Out(r), range.len() as u64),
                }
            }
            Ok(Begin::Blocked) => self.drain_server(now, s),
            Err(e) => panic!("replay's request was refused by a server cache: {e}"),
        }
    }

    fn drain_server(&mut self, now: Time, s: usize) {
        while let Some(e) = self.servers[s].level.cache.poll_effect() {
            match e {
                Effect::Write {
                    token,
                    key,
                    dirty,
                    whole,
                    ..
                } => {
                    let bytes = if whole { BLOCK as u64 } else { dirty.bytes() };
                    self.disk(now, s, DiskJob::Down { token, key, bytes });
                }
                Effect::Fetch { token, key, .. } => self.disk(now, s, DiskJob::Fetch { token, key }),
                Effect::Resume { proc } => self.k.at(now, Ev::Serve(proc as usize)),
                Effect::Evicted { .. } => {}
            }
        }
        if let Some(t) = self.servers[s].level.arm(now) {
            self.k.at(t, Ev::ServerTimer(s));
        }
    }

    fn reply(&mut self, now: Time, r: usize) {
        let req = self.reqs[r].take().expect("a live request");
        self.free_reqs.push(r);
        match req.origin {
            Origin::NodeWrite { node, token } => self.written(now, node, token),
            Origin::NodeFetch { node, token } => self.fetched(now, node, token),
            Origin::Direct { pid } => self.advance(now, pid),
        }
    }

    fn outcome(mut self) -> Outcome {
        let mut node = CacheStats::default();
        for n in &self.nodes {
            node += n.level.cache.stats();
        }
        let mut server = CacheStats::default();
        for s in &self.servers {
            server += s.level.cache.stats();
        }
        let ratio = |hits: u64, misses: u64| {
            if hits + misses == 0 {
                0.0
            } else {
                hits as f64 / (hits + misses) as f64
            }
        };
        self.out.node_hit_ratio = ratio(node.read_hits, node.read_misses);
        self.out.server_hit_ratio = ratio(server.read_hits + server.write_hits, server.read_misses);
        self.out.node_stats = node;
        self.out.server_stats = server;
        self.out.elapsed = self.last_op_end.since(Time::ZERO).as_secs_f64();
        self.out.drained = self.k.now().since(Time::ZERO).as_secs_f64();
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::records::parse_csv;

    /// One process writes 4 MiB in 64 KiB writes, closes, opens again and
    /// reads it back twice.
    fn write_then_read(nodes: &[&str]) -> Trace {
        let mut csv = String::from("time,node,process,file,op,offset,length,duration\n");
        let mut t = 0.0;
        let mut line = |node: &str, op: &str, off: u64, len: u64| {
            csv.push_str(&format!("{t},{node},1,/f,{op},{off},{len},0\n"));
            t += 0.001;
        };
        line(nodes[0], "open", 0, 1);
        for i in 0..64 {
            line(nodes[0], "write", i << 16, 1 << 16);
        }
        line(nodes[0], "close", 0, 0);
        for &n in nodes.iter().chain(nodes.iter()) {
            line(n, "open", 0, 0);
            for i in 0..64 {
                line(n, "read", i << 16, 1 << 16);
            }
            line(n, "close", 0, 0);
        }
        let mut tr = parse_csv(&csv).unwrap();
        tr.files = vec!["/f".into()];
        tr
    }

    fn run(trace: &Trace, set: &[&str]) -> Outcome {
        let mut c = Choice::default();
        for kv in set {
            c.set(kv).unwrap();
        }
        replay(trace, &ClusterModel::default(), &c).unwrap()
    }

    #[test]
    fn every_written_byte_reaches_a_disk_and_rereads_hit() {
        let t = write_then_read(&["a"]);
        for w in [
            "write-through",
            "write-back",
            "write-full",
            "threshold",
            "lru-writeback",
        ] {
            let o = run(&t, &[&format!("write={w}")]);
            assert_eq!(o.bytes_written, 4 << 20, "{w}");
            assert!(
                o.disk_write_bytes >= 4 << 20,
                "{w}: {} bytes reached the disks",
                o.disk_write_bytes
            );
            // Written, then read twice on the same node: every read hits.
            assert_eq!(o.node_stats.read_misses, 0, "{w}: {:?}", o.node_stats);
            // Nothing was read from a disk: whole blocks were written.
            assert_eq!(o.disk_read_bytes, 0, "{w}: {:?}", o.server_stats);
            assert!(o.elapsed > 0.0 && o.drained >= o.elapsed, "{w}: {o:?}");
        }
    }

    #[test]
    fn the_same_inputs_give_the_same_outcome() {
        let t = write_then_read(&["a", "b"]);
        let a = run(&t, &["cooperative=greedy"]);
        let b = run(&t, &["cooperative=greedy"]);
        assert_eq!(a, b);
    }

    #[test]
    fn another_node_reads_through_its_own_cache_or_a_peer() {
        let t = write_then_read(&["a", "b"]);
        let private = run(&t, &["prefetch=none"]);
        // Node b misses its 64 blocks once, then hits.
        assert_eq!(private.node_stats.read_misses, 64, "{:?}", private.node_stats);
        let greedy = run(&t, &["prefetch=none", "cooperative=greedy"]);
        assert_eq!(greedy.remote_hits, 64, "{greedy:?}");
        // Prefetching one block ahead, b misses only its first block.
        let ahead = run(&t, &["prefetch=one-block-ahead"]);
        assert_eq!(ahead.node_stats.read_misses, 1, "{:?}", ahead.node_stats);
        assert_eq!(ahead.node_stats.prefetch_hits, 63, "{:?}", ahead.node_stats);
    }

    #[test]
    fn posix_caches_nothing_and_costs_time() {
        let t = write_then_read(&["a"]);
        let posix = run(&t, &["consistency=posix"]);
        assert_eq!(
            posix.node_stats.read_hits + posix.node_stats.read_misses,
            0,
            "{:?}",
            posix.node_stats
        );
        let cto = run(&t, &[]);
        assert!(
            posix.elapsed > cto.elapsed,
            "posix {} s, close-to-open {} s",
            posix.elapsed,
            cto.elapsed
        );
    }

    /// Under n-chance an evicted block goes to a peer, whose adoption can
    /// evict and forward another: with 64 nodes all evicting, the chain
    /// once grew deep enough to overflow the stack (drishti's trace).
    #[test]
    fn n_chance_forwards_in_long_chains_without_recursion() {
        let mut csv = String::from("time,node,process,file,op,offset,length,duration\n");
        let mut t = 0.0;
        for pass in 0..2 {
            for i in 0..48u64 {
                for n in 0..64 {
                    let op = if pass == 0 { "write" } else { "read" };
                    csv.push_str(&format!("{t},n{n},1,/f{n},{op},{},65536,0\n", i << 16));
                    t += 0.0001;
                }
            }
        }
        let mut tr = parse_csv(&csv).unwrap();
        tr.files = (0..64).map(|n| format!("/f{n}")).collect();
        let cluster = ClusterModel {
            node_cache_mib: 1,
            ..ClusterModel::default()
        };
        let mut c = Choice::default();
        c.set("cooperative=n-chance").unwrap();
        // A small stack, as a test thread or a sweep's worker has.
        let o = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || replay(&tr, &cluster, &c).unwrap())
            .unwrap()
            .join()
            .expect("the replay finished");
        assert_eq!(o.bytes_written, (64 * 48) << 16);
        // Forwarded blocks were adopted and evicted again.
        assert!(o.node_stats.evictions > 2 * 64 * 48, "{:?}", o.node_stats);
    }

    /// A session's open reads the whole file, but no more of it than the
    /// node cache holds, as the client's `fetch_whole` does: a 1 GiB file
    /// (the Tencent sample's volumes are larger) once filled the replay's
    /// memory with a step per block.
    #[test]
    fn a_session_fetches_no_more_than_the_node_cache_holds() {
        let csv = "time,node,process,file,op,offset,length,duration\n\
                   0,a,1,/big,open,0,0,0\n\
                   0.001,a,1,/big,read,1073741824,65536,0\n\
                   0.002,a,1,/big,close,0,0,0\n";
        let mut tr = parse_csv(csv).unwrap();
        tr.files = vec!["/big".into()];
        let cluster = ClusterModel {
            node_cache_mib: 1,
            ..ClusterModel::default()
        };
        let mut c = Choice::default();
        c.set("consistency=session").unwrap();
        c.set("prefetch=none").unwrap();
        let o = replay(&tr, &cluster, &c).unwrap();
        let fetched = o.disk_read_bytes;
        assert!(fetched >= 1 << 20, "the open fetched {fetched} bytes");
        assert!(fetched <= (1 << 20) + (1 << 16), "the open fetched {fetched} bytes");
    }

    #[test]
    fn unmodelled_choices_are_refused_by_name() {
        let t = write_then_read(&["a"]);
        let mut c = Choice::default();
        c.set("cooperative=lru-interleaved").unwrap();
        let e = replay(&t, &ClusterModel::default(), &c).unwrap_err().to_string();
        assert!(e.contains("lru-interleaved"), "{e}");
    }
}
