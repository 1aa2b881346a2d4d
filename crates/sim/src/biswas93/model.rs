//! The 1993 distributed file system (Biswas et al. 1993 §5): one server
//! with a CPU, five disks, a volatile read cache and an optional NV write
//! cache; clients with a volatile read cache and an optional NV write
//! cache; one FCFS Ethernet. Every cache is a `parcache_core::Cache` driven
//! by the shared [`CacheDriver`]: the NV caches run the catalogue's
//! `periodic`, `threshold` and `lru-writeback` policies, and a full one
//! makes its writer wait for an "immediate" write. Opens and closes go to
//! the core's `sprite` server half, whose recalls and disables flush the
//! clients' NV caches.
//!
//! Service times are Table 5.1's. The client CPU is a pure delay (one user
//! per client keeps it nearly idle); the server CPU, each disk and the
//! network are FCFS queues.

use super::workload::{population, session, Population, Session, WorkloadParams};
use crate::cache_driver::{Below, CacheDriver};
use crate::kernel::Kernel;
use crate::resource::Fcfs;
use crate::rng::SimRng;
use parcache_core::consistency::sprite::SpriteServer;
use parcache_core::consistency::Callback;
use parcache_core::{
    Access, Begin, BlockKey, ByteRange, Cache, CacheConfig, CacheStats, IoToken, PrefetchKind, ProcId, ReplacementKind,
    Span, Time, WriteCause, WritePolicyKind,
};
use serde::Serialize;
use std::collections::{HashMap, HashSet, VecDeque};

/// Table 5.1, in milliseconds.
mod cost {
    pub const OPEN: f64 = 3.0;
    pub const CLOSE: f64 = 1.0;
    pub const READ_WRITE: f64 = 2.0;
    pub const DISK_READ_CPU: f64 = 1.0;
    pub const DISK_WRITE_CPU: f64 = 1.5;
    pub const NET_SMALL_CPU: f64 = 0.4;
    pub const NET_BLOCK_CPU: f64 = 1.5;
    /// Seek 16 + rotation 8 + transfer 2.5.
    pub const DISK: f64 = 26.5;
    pub const WIRE_SMALL: f64 = 0.05;
    pub const WIRE_BLOCK: f64 = 3.28;
}

const BLOCK: u32 = 4096;
const DISKS: usize = 5;

fn ms(x: f64) -> Span {
    Span::from_millis_f64(x)
}

/// Disk accesses per open, fitted to Table 6.6 (see [`Config`]).
pub const OPEN_DISK_ACCESSES: f64 = 1.5;

/// One run's configuration.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub clients: usize,
    /// Volatile caches, in 4 KiB blocks (8 MiB and 32 MiB in the paper).
    pub client_cache_blocks: usize,
    pub server_cache_blocks: usize,
    /// NV write caches, in blocks; 0: none (that level writes through).
    pub client_nv_blocks: usize,
    pub server_nv_blocks: usize,
    pub client_policy: WritePolicyKind,
    pub server_policy: WritePolicyKind,
    /// Disk accesses of an open at the server. §5.3 names 20 % of lookups
    /// and 20 % of opens (0.4); the default, 1.5, is the model's one
    /// fitted constant: it makes the open at 100 clients without client NV
    /// take Table 6.6's 51 ms.
    pub open_disk_accesses: f64,
    pub warmup: Span,
    pub measure: Span,
    pub workload: WorkloadParams,
    pub seed: u64,
}

impl Config {
    /// The paper's base system for `clients` clients: no NV anywhere.
    pub fn base(clients: usize) -> Config {
        Config {
            clients,
            client_cache_blocks: 2048,
            server_cache_blocks: 8192,
            client_nv_blocks: 0,
            server_nv_blocks: 0,
            client_policy: WritePolicyKind::THRESHOLD_DEFAULT,
            server_policy: WritePolicyKind::THRESHOLD_DEFAULT,
            open_disk_accesses: OPEN_DISK_ACCESSES,
            warmup: Span::from_secs(600),
            measure: Span::from_secs(1800),
            workload: WorkloadParams::default(),
            seed: 1993,
        }
    }
}

/// What a run measured (means over the operations started in the
/// measured window; utilisations and counts over that window).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Measured {
    pub read_ms: f64,
    pub write_ms: f64,
    pub open_ms: f64,
    pub reads: u64,
    pub writes: u64,
    pub opens: u64,
    pub server_cpu_util: f64,
    pub disk_util: f64,
    /// Writes the clients sent the server, and why: written through, a
    /// consistency recall, the NV cache's policy, or a full NV cache.
    pub to_server: u64,
    pub to_server_through: u64,
    pub to_server_consistency: u64,
    pub to_server_policy: u64,
    pub to_server_immediate: u64,
    /// Writes the server took, the ones it wrote to disk, and of those the
    /// immediate ones (its NV cache was full of dirty blocks).
    pub server_writes: u64,
    pub disk_writes: u64,
    pub disk_immediate: u64,
    /// Overwrites the NV caches absorbed (write hits on dirty blocks).
    pub client_overwrites: u64,
    pub server_overwrites: u64,
    pub client_read_hits: u64,
    pub server_read_hits: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Res {
    Cpu,
    Net,
    Disk(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CacheId {
    ClientRead(usize),
    ClientNv(usize),
    ServerRead,
    ServerNv,
}

#[derive(Clone, Copy, Debug)]
enum Step {
    // A session's operations.
    OpenAtServer,
    Opened { cacheable: bool },
    ClientRead { block: u64 },
    ClientWrite { block: u64 },
    WroteThrough { block: u64 },
    CloseAtServer,
    OpDone,
    // At the server, for any request that carries a block.
    ServerRead { key: BlockKey },
    ServerWrite { key: BlockKey },
    ServerAdopt { key: BlockKey },
    // Completions of the caches' I/O.
    FetchArrived,
    WriteDownDone,
    DiskFetched,
    DiskWritten,
    // Callbacks.
    CallbackAtClient,
    CallbackDone,
}

#[derive(Clone, Copy, Debug)]
enum Stage {
    Use(Res, Span),
    Delay(Span),
    Do(Step),
}

#[derive(Clone, Copy, Debug)]
enum Ctx {
    /// An operation of session `s` (its kind is in its steps).
    Op {
        s: usize,
        kind: OpKind,
    },
    ClientFetch {
        c: usize,
        token: IoToken,
    },
    ClientWriteDown {
        c: usize,
        token: IoToken,
        background: bool,
    },
    DiskRead {
        token: IoToken,
    },
    DiskWrite {
        token: IoToken,
        disk: usize,
        background: bool,
    },
    Callback {
        parent: usize,
        target: usize,
        file: u64,
        cb: Callback,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpKind {
    Open,
    Read,
    Write,
    Close,
}

struct Task {
    stages: VecDeque<Stage>,
    ctx: Ctx,
    started: Time,
    /// Callbacks still to finish before an open goes on.
    waiting_for: usize,
    /// Waiting for a `Wake` (a delay, a cache's resume, callbacks).
    asleep: bool,
}

struct Sess {
    client: usize,
    plan: Session,
    next: usize,
}

struct Client {
    read: CacheDriver,
    nv: Option<CacheDriver>,
    rng: SimRng,
    /// The file version each cached file's blocks are of.
    versions: HashMap<u64, u64>,
    /// Files the server told this client not to cache (write-shared).
    uncached: HashSet<u64>,
    /// Callbacks waiting for a file's NV blocks to be written down.
    flushing: Vec<(u64, usize)>,
    /// The NV cache's own write-backs (threshold, periodic) go one at a
    /// time; these wait their turn.
    queued: VecDeque<(IoToken, BlockKey)>,
    writing_back: bool,
}

enum Ev {
    NextSession(usize),
    Done(Res),
    Wake(usize),
    Close(usize),
    Timer(CacheId),
    Snapshot,
}

/// The effects of one drain of a cache.
#[derive(Default)]
struct Collected {
    writes: Vec<(IoToken, BlockKey, WriteCause)>,
    fetches: Vec<(IoToken, BlockKey)>,
    resumes: Vec<ProcId>,
    wake: Option<Time>,
}

impl Below for Collected {
    fn write(&mut self, _: Time, token: IoToken, key: BlockKey, _: bool, _: bool, cause: WriteCause) {
        self.writes.push((token, key, cause));
    }
    fn fetch(&mut self, _: Time, token: IoToken, key: BlockKey, _: bool) -> bool {
        self.fetches.push((token, key));
        true
    }
    fn resume(&mut self, _: Time, proc: ProcId) {
        self.resumes.push(proc);
    }
    fn wake_at(&mut self, at: Time) {
        self.wake = Some(at);
    }
}

#[derive(Default, Clone)]
struct Counts {
    read_ms: f64,
    write_ms: f64,
    open_ms: f64,
    reads: u64,
    writes: u64,
    opens: u64,
    to_server_through: u64,
    to_server_consistency: u64,
    to_server_policy: u64,
    to_server_immediate: u64,
    server_writes: u64,
    disk_writes_through: u64,
    cpu_busy: Span,
    disk_busy: Span,
    client: CacheStats,
    server_nv: CacheStats,
    server_read: CacheStats,
}

struct Model<'a> {
    cfg: Config,
    pop: &'a Population,
    k: Kernel<Ev>,
    cpu: Fcfs<usize>,
    net: Fcfs<usize>,
    disks: Vec<Fcfs<usize>>,
    clients: Vec<Client>,
    server_read: CacheDriver,
    server_nv: Option<CacheDriver>,
    sprite: SpriteServer,
    /// The server NV cache's own write-backs go one at a time per disk (a
    /// disk's queue holds at most one of them): these wait their turn.
    disk_queued: Vec<VecDeque<(IoToken, BlockKey)>>,
    disk_writing_back: Vec<bool>,
    version: HashMap<u64, u64>,
    tasks: Vec<Option<Task>>,
    free_tasks: Vec<usize>,
    sessions: Vec<Option<Sess>>,
    free_sessions: Vec<usize>,
    rng: SimRng,
    /// Processes blocked in a cache, by the task they belong to.
    procs: HashMap<u32, usize>,
    next_proc: u32,
    counts: Counts,
    at_warmup: Option<Counts>,
}

fn cache(blocks: usize, write: WritePolicyKind) -> CacheDriver {
    CacheDriver::new(
        Cache::new(CacheConfig {
            buffers: blocks.max(1),
            block_size: BLOCK,
            replacement: ReplacementKind::Lru,
            write,
            prefetch: PrefetchKind::None,
            aux_buffers: 0,
            syncer: None,
            fill_partial_writes: false,
        })
        .expect("valid cache configuration"),
    )
}

/// Puts `x` in a free slot of `v` (or a new one); returns its index.
fn put<T>(v: &mut Vec<Option<T>>, free: &mut Vec<usize>, x: T) -> usize {
    match free.pop() {
        Some(i) => {
            v[i] = Some(x);
            i
        }
        None => {
            v.push(Some(x));
            v.len() - 1
        }
    }
}

fn whole() -> ByteRange {
    ByteRange::new(0, BLOCK)
}

fn add(a: &mut CacheStats, b: &CacheStats) {
    a.read_hits += b.read_hits;
    a.writes += b.writes;
    a.immediate_writes += b.immediate_writes;
    a.overwrites += b.overwrites;
    a.flush_writes += b.flush_writes;
    a.threshold_writes += b.threshold_writes;
    a.age_writes += b.age_writes;
}

impl<'a> Model<'a> {
    fn new(cfg: Config, pop: &'a Population) -> Model<'a> {
        let clients = (0..cfg.clients)
            .map(|c| Client {
                read: cache(cfg.client_cache_blocks, WritePolicyKind::WriteBack),
                nv: (cfg.client_nv_blocks > 0).then(|| cache(cfg.client_nv_blocks, cfg.client_policy)),
                rng: SimRng::stream(cfg.seed, c as u64),
                versions: HashMap::new(),
                uncached: HashSet::new(),
                flushing: Vec::new(),
                queued: VecDeque::new(),
                writing_back: false,
            })
            .collect();
        Model {
            pop,
            k: Kernel::new(),
            cpu: Fcfs::new(),
            net: Fcfs::new(),
            disks: (0..DISKS).map(|_| Fcfs::new()).collect(),
            clients,
            server_read: cache(cfg.server_cache_blocks, WritePolicyKind::WriteBack),
            server_nv: (cfg.server_nv_blocks > 0).then(|| cache(cfg.server_nv_blocks, cfg.server_policy)),
            sprite: SpriteServer::new(),
            disk_queued: (0..DISKS).map(|_| VecDeque::new()).collect(),
            disk_writing_back: vec![false; DISKS],
            version: HashMap::new(),
            tasks: Vec::new(),
            free_tasks: Vec::new(),
            sessions: Vec::new(),
            free_sessions: Vec::new(),
            rng: SimRng::stream(cfg.seed, 1 << 50),
            procs: HashMap::new(),
            next_proc: 0,
            counts: Counts::default(),
            at_warmup: None,
            cfg,
        }
    }

    fn now(&self) -> Time {
        self.k.now()
    }

    fn driver(&mut self, id: CacheId) -> &mut CacheDriver {
        match id {
            CacheId::ClientRead(c) => &mut self.clients[c].read,
            CacheId::ClientNv(c) => self.clients[c].nv.as_mut().expect("client NV cache"),
            CacheId::ServerRead => &mut self.server_read,
            CacheId::ServerNv => self.server_nv.as_mut().expect("server NV cache"),
        }
    }

    fn spawn(&mut self, ctx: Ctx, stages: Vec<Stage>) -> usize {
        let t = Task {
            stages: stages.into(),
            ctx,
            started: self.now(),
            waiting_for: 0,
            asleep: false,
        };
        let id = put(&mut self.tasks, &mut self.free_tasks, t);
        self.advance(id);
        id
    }

    fn task(&mut self, id: usize) -> &mut Task {
        self.tasks[id].as_mut().expect("live task")
    }

    fn push_front(&mut self, id: usize, stages: &[Stage]) {
        let t = self.task(id);
        for s in stages.iter().rev() {
            t.stages.push_front(*s);
        }
    }

    /// Runs a task's stages until one takes time or waits.
    fn advance(&mut self, id: usize) {
        loop {
            let Some(stage) = self.task(id).stages.pop_front() else {
                self.tasks[id] = None;
                self.free_tasks.push(id);
                return;
            };
            match stage {
                Stage::Use(r, s) => {
                    let now = self.now();
                    let q = match r {
                        Res::Cpu => &mut self.cpu,
                        Res::Net => &mut self.net,
                        Res::Disk(d) => &mut self.disks[d],
                    };
                    if let Some(at) = q.submit(now, id, s) {
                        self.k.at(at, Ev::Done(r));
                    }
                    return;
                }
                Stage::Delay(s) => {
                    self.task(id).asleep = true;
                    self.k.after(s, Ev::Wake(id));
                    return;
                }
                Stage::Do(step) => {
                    if !self.step(id, step) {
                        return;
                    }
                }
            }
        }
    }

    fn drain(&mut self, id: CacheId) {
        let now = self.now();
        let mut col = Collected::default();
        self.driver(id).drain(now, &mut col);
        self.handle(id, col);
    }

    fn handle(&mut self, id: CacheId, col: Collected) {
        for (token, key, cause) in col.writes {
            // Consistency flushes and immediate writes have a waiter: at
            // once. The policy's own write-backs queue.
            let background = matches!(cause, WriteCause::Threshold | WriteCause::Age);
            match id {
                CacheId::ClientNv(c) => {
                    match cause {
                        WriteCause::Flush | WriteCause::Sync => self.counts.to_server_consistency += 1,
                        WriteCause::Need => self.counts.to_server_immediate += 1,
                        _ => self.counts.to_server_policy += 1,
                    }
                    if background {
                        self.clients[c].queued.push_back((token, key));
                        self.pump_client(c);
                    } else {
                        self.write_down(c, token, key, false);
                    }
                }
                CacheId::ServerNv => {
                    let d = self.pop.files[key.file as usize].disk;
                    if background {
                        self.disk_queued[d].push_back((token, key));
                        self.pump_disk(d);
                    } else {
                        self.disk_write(d, token, false);
                    }
                }
                _ => unreachable!("volatile read caches hold no dirty blocks"),
            }
        }
        for (token, key) in col.fetches {
            match id {
                CacheId::ClientRead(c) => {
                    let stages = vec![
                        Stage::Delay(ms(cost::NET_SMALL_CPU)),
                        Stage::Use(Res::Net, ms(cost::WIRE_SMALL)),
                        Stage::Use(Res::Cpu, ms(cost::NET_SMALL_CPU + cost::READ_WRITE)),
                        Stage::Do(Step::ServerRead { key }),
                        Stage::Do(Step::FetchArrived),
                    ];
                    self.spawn(Ctx::ClientFetch { c, token }, stages);
                }
                CacheId::ServerRead => {
                    let d = self.pop.files[key.file as usize].disk;
                    let stages = vec![
                        Stage::Use(Res::Cpu, ms(cost::DISK_READ_CPU)),
                        Stage::Use(Res::Disk(d), ms(cost::DISK)),
                        Stage::Do(Step::DiskFetched),
                    ];
                    self.spawn(Ctx::DiskRead { token }, stages);
                }
                _ => unreachable!("NV caches take whole blocks and never fetch"),
            }
        }
        for p in col.resumes {
            if let Some(t) = self.procs.remove(&p) {
                self.k.after(Span::ZERO, Ev::Wake(t));
            }
        }
        if let Some(at) = col.wake {
            self.k.at(at.max(self.now()), Ev::Timer(id));
        }
    }

    /// Begins an access of task `id` to `key` in a cache: `Some(())` when
    /// it is done (begun and ended), `None` when the task waits (its step
    /// is put back and runs again on resume).
    fn access(&mut self, id: usize, step: Step, cache: CacheId, key: BlockKey, access: Access) -> bool {
        let now = self.now();
        // A fresh process id per attempt: a resume meant for an earlier
        // attempt finds nobody.
        self.next_proc = self.next_proc.wrapping_add(1);
        let proc: ProcId = self.next_proc;
        let c = self.driver(cache).cache_mut();
        let r = c.begin(now, proc, key, access).expect("whole-block access");
        let done = match r {
            Begin::Ready(b) => {
                c.end(now, proc, b, access).expect("pinned");
                true
            }
            Begin::Blocked => false,
        };
        if !done {
            self.procs.insert(proc, id);
            let t = self.task(id);
            t.stages.push_front(Stage::Do(step));
            t.asleep = true;
        }
        self.drain(cache);
        if !done {
            self.promote(cache, key);
        }
        done
    }

    fn session_of(&self, id: usize) -> usize {
        match self.tasks[id].as_ref().expect("live").ctx {
            Ctx::Op { s, .. } => s,
            other => panic!("not a session operation: {other:?}"),
        }
    }

    /// The session an operation belongs to, its client and its file.
    fn op_file(&self, id: usize) -> (usize, usize, u64) {
        let s = self.session_of(id);
        let x = self.sess(s);
        (s, x.client, x.plan.file as u64)
    }

    fn sess(&self, s: usize) -> &Sess {
        self.sessions[s].as_ref().expect("live session")
    }

    /// Runs one step; `false` when the task waits.
    fn step(&mut self, id: usize, step: Step) -> bool {
        let now = self.now();
        match step {
            Step::OpenAtServer => {
                let s = self.session_of(id);
                let (c, file, write) = {
                    let x = self.sess(s);
                    (x.client, x.plan.file as u64, x.plan.write)
                };
                let grant = self.sprite.open(c as u64, file, write);
                if write && grant.cacheable {
                    *self.version.entry(file).or_default() += 1;
                }
                let reply = [
                    Stage::Use(Res::Cpu, ms(cost::NET_SMALL_CPU)),
                    Stage::Use(Res::Net, ms(cost::WIRE_SMALL)),
                    Stage::Delay(ms(cost::NET_SMALL_CPU)),
                    Stage::Do(Step::Opened {
                        cacheable: grant.cacheable,
                    }),
                ];
                self.push_front(id, &reply);
                let n = grant.callbacks.len();
                if n == 0 {
                    return true;
                }
                self.task(id).waiting_for = n;
                self.task(id).asleep = true;
                for (target, cb) in grant.callbacks {
                    let stages = vec![
                        Stage::Use(Res::Cpu, ms(cost::NET_SMALL_CPU)),
                        Stage::Use(Res::Net, ms(cost::WIRE_SMALL)),
                        Stage::Delay(ms(cost::NET_SMALL_CPU)),
                        Stage::Do(Step::CallbackAtClient),
                    ];
                    let ctx = Ctx::Callback {
                        parent: id,
                        target: target as usize,
                        file,
                        cb,
                    };
                    self.spawn(ctx, stages);
                }
                false
            }
            Step::CallbackAtClient => {
                let Ctx::Callback { target, file, cb, .. } = self.task(id).ctx else {
                    unreachable!()
                };
                if cb == Callback::Disable {
                    self.clients[target].uncached.insert(file);
                }
                if self.clients[target].nv.is_some() {
                    let nv = self.clients[target].nv.as_mut().expect("checked");
                    nv.cache_mut().flush_file(now, file);
                    let clean = nv.cache().file_is_clean(file);
                    self.drain(CacheId::ClientNv(target));
                    if !clean {
                        // Again once the file's blocks are down.
                        self.clients[target].flushing.push((file, id));
                        let t = self.task(id);
                        t.stages.push_front(Stage::Do(step));
                        t.asleep = true;
                        return false;
                    }
                }
                self.push_front(
                    id,
                    &[
                        Stage::Delay(ms(cost::NET_SMALL_CPU)),
                        Stage::Use(Res::Net, ms(cost::WIRE_SMALL)),
                        Stage::Use(Res::Cpu, ms(cost::NET_SMALL_CPU)),
                        Stage::Do(Step::CallbackDone),
                    ],
                );
                if cb == Callback::Disable {
                    self.clients[target].read.cache_mut().discard_file(now, file, 0);
                    if let Some(nv) = self.clients[target].nv.as_mut() {
                        nv.cache_mut().discard_file(now, file, 0);
                    }
                }
                true
            }
            Step::CallbackDone => {
                let Ctx::Callback { parent, .. } = self.task(id).ctx else {
                    unreachable!()
                };
                let p = self.task(parent);
                p.waiting_for -= 1;
                if p.waiting_for == 0 {
                    self.k.after(Span::ZERO, Ev::Wake(parent));
                }
                true
            }
            Step::Opened { cacheable } => {
                let (s, c, file) = self.op_file(id);
                let v = self.version.get(&file).copied().unwrap_or(0);
                let cl = &mut self.clients[c];
                if cacheable {
                    cl.uncached.remove(&file);
                } else {
                    cl.uncached.insert(file);
                }
                if cl.versions.get(&file).is_some_and(|&have| have != v) {
                    cl.read.cache_mut().discard_file(now, file, 0);
                    if let Some(nv) = cl.nv.as_mut() {
                        if nv.cache().file_is_clean(file) {
                            nv.cache_mut().discard_file(now, file, 0);
                        }
                    }
                }
                cl.versions.insert(file, v);
                self.op_done(id, s);
                true
            }
            Step::ClientRead { block } => {
                let (s, c, file) = self.op_file(id);
                let key = BlockKey::new(file, block);
                if self.clients[c].uncached.contains(&file) {
                    self.push_front(
                        id,
                        &[
                            Stage::Delay(ms(cost::NET_SMALL_CPU)),
                            Stage::Use(Res::Net, ms(cost::WIRE_SMALL)),
                            Stage::Use(Res::Cpu, ms(cost::NET_SMALL_CPU + cost::READ_WRITE)),
                            Stage::Do(Step::ServerRead { key }),
                            Stage::Do(Step::OpDone),
                        ],
                    );
                    return true;
                }
                let in_nv = self.clients[c].nv.as_ref().is_some_and(|n| n.cache().contains(key));
                let cache = if !self.clients[c].read.cache().contains(key) && in_nv {
                    CacheId::ClientNv(c)
                } else {
                    CacheId::ClientRead(c)
                };
                if !self.access(id, step, cache, key, Access::Read(whole())) {
                    return false;
                }
                self.op_done(id, s);
                true
            }
            Step::ClientWrite { block } => {
                let (s, c, file) = self.op_file(id);
                let key = BlockKey::new(file, block);
                self.clients[c].read.cache_mut().discard_clean_block(now, key);
                if self.clients[c].nv.is_none() || self.clients[c].uncached.contains(&file) {
                    self.counts.to_server_through += 1;
                    self.push_front(
                        id,
                        &[
                            Stage::Delay(ms(cost::NET_BLOCK_CPU)),
                            Stage::Use(Res::Net, ms(cost::WIRE_BLOCK)),
                            Stage::Use(Res::Cpu, ms(cost::NET_BLOCK_CPU + cost::READ_WRITE)),
                            Stage::Do(Step::ServerWrite { key }),
                            Stage::Do(Step::WroteThrough { block }),
                        ],
                    );
                    return true;
                }
                if !self.access(id, step, CacheId::ClientNv(c), key, Access::Write(whole())) {
                    return false;
                }
                self.op_done(id, s);
                true
            }
            Step::WroteThrough { block } => {
                let (s, c, file) = self.op_file(id);
                if !self.clients[c].uncached.contains(&file) {
                    self.clients[c].read.cache_mut().adopt(now, BlockKey::new(file, block));
                    self.drain(CacheId::ClientRead(c));
                }
                self.op_done(id, s);
                true
            }
            Step::CloseAtServer => {
                let s = self.session_of(id);
                let (c, file, write) = {
                    let x = self.sess(s);
                    (x.client, x.plan.file as u64, x.plan.write)
                };
                self.sprite.close(c as u64, file, write);
                self.push_front(
                    id,
                    &[
                        Stage::Use(Res::Cpu, ms(cost::NET_SMALL_CPU)),
                        Stage::Use(Res::Net, ms(cost::WIRE_SMALL)),
                        Stage::Delay(ms(cost::NET_SMALL_CPU)),
                        Stage::Do(Step::OpDone),
                    ],
                );
                true
            }
            Step::OpDone => {
                let s = self.session_of(id);
                self.op_done(id, s);
                true
            }
            Step::ServerRead { key } => {
                let in_nv = self.server_nv.as_ref().is_some_and(|n| n.cache().contains(key));
                let cache = if !self.server_read.cache().contains(key) && in_nv {
                    CacheId::ServerNv
                } else {
                    CacheId::ServerRead
                };
                if !self.access(id, step, cache, key, Access::Read(whole())) {
                    return false;
                }
                self.push_front(
                    id,
                    &[
                        Stage::Use(Res::Cpu, ms(cost::NET_BLOCK_CPU)),
                        Stage::Use(Res::Net, ms(cost::WIRE_BLOCK)),
                        Stage::Delay(ms(cost::NET_BLOCK_CPU)),
                    ],
                );
                true
            }
            Step::ServerWrite { key } => {
                self.counts.server_writes += 1;
                self.server_read.cache_mut().discard_clean_block(now, key);
                if self.server_nv.is_some() {
                    if !self.access(id, step, CacheId::ServerNv, key, Access::Write(whole())) {
                        self.counts.server_writes -= 1; // counted when it goes through
                        return false;
                    }
                    self.push_reply_small(id);
                } else {
                    self.counts.disk_writes_through += 1;
                    let d = self.pop.files[key.file as usize].disk;
                    self.push_front(
                        id,
                        &[
                            Stage::Use(Res::Cpu, ms(cost::DISK_WRITE_CPU)),
                            Stage::Use(Res::Disk(d), ms(cost::DISK)),
                            Stage::Do(Step::ServerAdopt { key }),
                        ],
                    );
                }
                true
            }
            Step::ServerAdopt { key } => {
                self.server_read.cache_mut().adopt(now, key);
                self.drain(CacheId::ServerRead);
                self.push_reply_small(id);
                true
            }
            Step::FetchArrived => {
                let Ctx::ClientFetch { c, token } = self.task(id).ctx else {
                    unreachable!()
                };
                self.clients[c].read.cache_mut().fetch_done(now, token);
                self.drain(CacheId::ClientRead(c));
                true
            }
            Step::WriteDownDone => {
                let Ctx::ClientWriteDown { c, token, background } = self.task(id).ctx else {
                    unreachable!()
                };
                if background {
                    self.clients[c].writing_back = false;
                    self.pump_client(c);
                }
                let nv = self.clients[c].nv.as_mut().expect("client NV");
                nv.cache_mut().write_done(now, token);
                self.drain(CacheId::ClientNv(c));
                // Callbacks waiting for a file of this client to be clean.
                let cl = &mut self.clients[c];
                let nv = cl.nv.as_ref().expect("client NV").cache();
                let (ready, wait): (Vec<_>, Vec<_>) = std::mem::take(&mut cl.flushing)
                    .into_iter()
                    .partition(|(f, _)| nv.file_is_clean(*f));
                cl.flushing = wait;
                for (_, t) in ready {
                    self.k.after(Span::ZERO, Ev::Wake(t));
                }
                true
            }
            Step::DiskFetched => {
                let Ctx::DiskRead { token } = self.task(id).ctx else {
                    unreachable!()
                };
                self.server_read.cache_mut().fetch_done(now, token);
                self.drain(CacheId::ServerRead);
                true
            }
            Step::DiskWritten => {
                let Ctx::DiskWrite {
                    token,
                    disk,
                    background,
                } = self.task(id).ctx
                else {
                    unreachable!()
                };
                if background {
                    self.disk_writing_back[disk] = false;
                    self.pump_disk(disk);
                }
                self.server_nv
                    .as_mut()
                    .expect("server NV")
                    .cache_mut()
                    .write_done(now, token);
                self.drain(CacheId::ServerNv);
                true
            }
        }
    }

    fn write_down(&mut self, c: usize, token: IoToken, key: BlockKey, background: bool) {
        let stages = vec![
            Stage::Delay(ms(cost::NET_BLOCK_CPU)),
            Stage::Use(Res::Net, ms(cost::WIRE_BLOCK)),
            Stage::Use(Res::Cpu, ms(cost::NET_BLOCK_CPU + cost::READ_WRITE)),
            Stage::Do(Step::ServerWrite { key }),
            Stage::Do(Step::WriteDownDone),
        ];
        self.spawn(Ctx::ClientWriteDown { c, token, background }, stages);
    }

    /// An access waits on a block whose write-back is still queued: that
    /// write goes now, ahead of the queue (a waiter needs it).
    fn promote(&mut self, cache: CacheId, key: BlockKey) {
        match cache {
            CacheId::ServerNv => {
                let d = self.pop.files[key.file as usize].disk;
                if let Some(i) = self.disk_queued[d].iter().position(|(_, k)| *k == key) {
                    let (token, _) = self.disk_queued[d].remove(i).expect("found");
                    self.disk_write(d, token, false);
                }
            }
            CacheId::ClientNv(c) => {
                if let Some(i) = self.clients[c].queued.iter().position(|(_, k)| *k == key) {
                    let (token, _) = self.clients[c].queued.remove(i).expect("found");
                    self.write_down(c, token, key, false);
                }
            }
            _ => {}
        }
    }

    fn pump_client(&mut self, c: usize) {
        if self.clients[c].writing_back {
            return;
        }
        if let Some((token, key)) = self.clients[c].queued.pop_front() {
            self.clients[c].writing_back = true;
            self.write_down(c, token, key, true);
        }
    }

    fn disk_write(&mut self, d: usize, token: IoToken, background: bool) {
        let stages = vec![
            Stage::Use(Res::Cpu, ms(cost::DISK_WRITE_CPU)),
            Stage::Use(Res::Disk(d), ms(cost::DISK)),
            Stage::Do(Step::DiskWritten),
        ];
        self.spawn(
            Ctx::DiskWrite {
                token,
                disk: d,
                background,
            },
            stages,
        );
    }

    fn pump_disk(&mut self, d: usize) {
        if self.disk_writing_back[d] {
            return;
        }
        if let Some((token, _)) = self.disk_queued[d].pop_front() {
            self.disk_writing_back[d] = true;
            self.disk_write(d, token, true);
        }
    }

    fn push_reply_small(&mut self, id: usize) {
        self.push_front(
            id,
            &[
                Stage::Use(Res::Cpu, ms(cost::NET_SMALL_CPU)),
                Stage::Use(Res::Net, ms(cost::WIRE_SMALL)),
                Stage::Delay(ms(cost::NET_SMALL_CPU)),
            ],
        );
    }

    /// An operation of session `s` finished: counted, and the session goes
    /// on with its next one.
    fn op_done(&mut self, id: usize, s: usize) {
        let now = self.now();
        let (kind, started) = match self.task(id).ctx {
            Ctx::Op { kind, .. } => (kind, self.task(id).started),
            _ => unreachable!(),
        };
        // The operation's task ends here (remaining stages dropped).
        self.task(id).stages.clear();
        if started >= Time::ZERO + self.cfg.warmup {
            let t = now.since(started).as_millis_f64();
            match kind {
                OpKind::Read => {
                    self.counts.read_ms += t;
                    self.counts.reads += 1;
                }
                OpKind::Write => {
                    self.counts.write_ms += t;
                    self.counts.writes += 1;
                }
                OpKind::Open => {
                    self.counts.open_ms += t;
                    self.counts.opens += 1;
                }
                OpKind::Close => {}
            }
        }
        if kind == OpKind::Close {
            self.sessions[s] = None;
            self.free_sessions.push(s);
            return;
        }
        self.next_op(s);
    }

    /// Starts session `s`'s next operation (or its think time and close).
    fn next_op(&mut self, s: usize) {
        let (c, write, next, len) = {
            let x = self.sess(s);
            (x.client, x.plan.write, x.next, x.plan.blocks.len())
        };
        if next < len {
            let block = self.sess(s).plan.blocks[next];
            self.sessions[s].as_mut().expect("live").next += 1;
            let (kind, step) = if write {
                (OpKind::Write, Step::ClientWrite { block })
            } else {
                (OpKind::Read, Step::ClientRead { block })
            };
            let stages = vec![Stage::Delay(ms(cost::READ_WRITE)), Stage::Do(step)];
            self.spawn(Ctx::Op { s, kind }, stages);
        } else {
            let mean = self.cfg.workload.last_access_to_close_s;
            let think = self.clients[c].rng.exp_truncated(mean, mean * 50.0);
            self.k.after(Span::from_millis_f64(think * 1e3), Ev::Close(s));
        }
    }

    fn start_session(&mut self, c: usize) {
        let plan = session(&mut self.clients[c].rng, self.pop, c);
        let sess = Sess {
            client: c,
            plan,
            next: 0,
        };
        let s = put(&mut self.sessions, &mut self.free_sessions, sess);
        let file = self.sess(s).plan.file as usize;
        let mut stages = vec![
            Stage::Delay(ms(cost::OPEN + cost::NET_SMALL_CPU)),
            Stage::Use(Res::Net, ms(cost::WIRE_SMALL)),
            Stage::Use(Res::Cpu, ms(cost::NET_SMALL_CPU + cost::OPEN)),
        ];
        // Name lookup and metadata on the disk (a whole number of accesses
        // with the configured mean).
        let mean = self.cfg.open_disk_accesses;
        let mut n = mean.floor() as usize;
        if self.rng.uniform() < mean - mean.floor() {
            n += 1;
        }
        let d = self.pop.files[file].disk;
        for _ in 0..n {
            stages.push(Stage::Use(Res::Cpu, ms(cost::DISK_READ_CPU)));
            stages.push(Stage::Use(Res::Disk(d), ms(cost::DISK)));
        }
        stages.push(Stage::Do(Step::OpenAtServer));
        self.spawn(Ctx::Op { s, kind: OpKind::Open }, stages);
    }

    fn close(&mut self, s: usize) {
        let stages = vec![
            Stage::Delay(ms(cost::CLOSE + cost::NET_SMALL_CPU)),
            Stage::Use(Res::Net, ms(cost::WIRE_SMALL)),
            Stage::Use(Res::Cpu, ms(cost::NET_SMALL_CPU + cost::CLOSE)),
            Stage::Do(Step::CloseAtServer),
        ];
        self.spawn(Ctx::Op { s, kind: OpKind::Close }, stages);
    }

    fn snapshot(&self) -> Counts {
        let mut c = self.counts.clone();
        c.cpu_busy = self.cpu.busy();
        c.disk_busy = self.disks.iter().fold(Span::ZERO, |a, d| a + d.busy());
        let mut cl = CacheStats::default();
        for x in &self.clients {
            if let Some(nv) = &x.nv {
                add(&mut cl, nv.cache().stats());
            }
            let r = x.read.cache().stats();
            cl.read_hits += r.read_hits;
        }
        c.client = cl;
        if let Some(nv) = &self.server_nv {
            c.server_nv = nv.cache().stats().clone();
        }
        c.server_read = self.server_read.cache().stats().clone();
        c
    }

    fn run(mut self) -> Measured {
        for c in 0..self.cfg.clients {
            let first = self.clients[c].rng.uniform() * self.cfg.workload.inter_open_s;
            self.k
                .at(Time::ZERO + Span::from_millis_f64(first * 1e3), Ev::NextSession(c));
        }
        let warm = Time::ZERO + self.cfg.warmup;
        let end = warm + self.cfg.measure;
        self.k.at(warm, Ev::Snapshot);
        while let Some((t, ev)) = self.k.pop() {
            if t >= end {
                break;
            }
            match ev {
                Ev::NextSession(c) => {
                    self.start_session(c);
                    let mean = self.cfg.workload.inter_open_s;
                    let gap = self.clients[c].rng.exp_truncated(mean, mean * 50.0);
                    self.k.after(Span::from_millis_f64(gap * 1e3), Ev::NextSession(c));
                }
                Ev::Done(r) => {
                    let q = match r {
                        Res::Cpu => &mut self.cpu,
                        Res::Net => &mut self.net,
                        Res::Disk(d) => &mut self.disks[d],
                    };
                    let (id, next) = q.complete(t);
                    if let Some(at) = next {
                        self.k.at(at, Ev::Done(r));
                    }
                    self.advance(id);
                }
                Ev::Wake(id) => {
                    if let Some(Some(task)) = self.tasks.get_mut(id) {
                        if task.asleep {
                            task.asleep = false;
                            self.advance(id);
                        }
                    }
                }
                Ev::Close(s) => self.close(s),
                Ev::Timer(id) => {
                    let mut col = Collected::default();
                    self.driver(id).timer(t, &mut col);
                    self.handle(id, col);
                }
                Ev::Snapshot => self.at_warmup = Some(self.snapshot()),
            }
        }
        let a = self.at_warmup.clone().unwrap_or_default();
        let b = self.snapshot();
        let span = self.cfg.measure.as_millis_f64();
        let mean = |sum: f64, n: u64| if n == 0 { 0.0 } else { sum / n as f64 };
        let d = |x: u64, y: u64| x - y;
        let server_disk = d(b.server_nv.writes, a.server_nv.writes) + d(b.disk_writes_through, a.disk_writes_through);
        let through = d(b.to_server_through, a.to_server_through);
        let cons = d(b.to_server_consistency, a.to_server_consistency);
        let pol = d(b.to_server_policy, a.to_server_policy);
        let imm = d(b.to_server_immediate, a.to_server_immediate);
        Measured {
            read_ms: mean(b.read_ms, b.reads),
            write_ms: mean(b.write_ms, b.writes),
            open_ms: mean(b.open_ms, b.opens),
            reads: b.reads,
            writes: b.writes,
            opens: b.opens,
            server_cpu_util: (b.cpu_busy.as_millis_f64() - a.cpu_busy.as_millis_f64()) / span,
            disk_util: (b.disk_busy.as_millis_f64() - a.disk_busy.as_millis_f64()) / span / DISKS as f64,
            to_server: through + cons + pol + imm,
            to_server_through: through,
            to_server_consistency: cons,
            to_server_policy: pol,
            to_server_immediate: imm,
            server_writes: d(b.server_writes, a.server_writes),
            disk_writes: server_disk,
            disk_immediate: d(b.server_nv.immediate_writes, a.server_nv.immediate_writes),
            client_overwrites: d(b.client.overwrites, a.client.overwrites),
            server_overwrites: d(b.server_nv.overwrites, a.server_nv.overwrites),
            client_read_hits: d(b.client.read_hits, a.client.read_hits),
            server_read_hits: d(b.server_read.read_hits, a.server_read.read_hits),
        }
    }
}

/// Runs the model once.
pub fn run(cfg: &Config) -> Measured {
    let pop = population(cfg.clients, &cfg.workload, cfg.seed);
    Model::new(*cfg, &pop).run()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(clients: usize) -> Config {
        let mut c = Config::base(clients);
        c.warmup = Span::from_secs(100);
        c.measure = Span::from_secs(300);
        c
    }

    #[test]
    fn a_light_write_through_system_answers_in_about_the_service_times() {
        let mut c = small(20);
        c.server_nv_blocks = 1024;
        let m = run(&c);
        // Written through to the server's NV cache: client CPU 2 + 1.5,
        // wire 3.28, server 1.5 + 2 + 0.4, wire 0.05, client 0.4 = 11.13 ms.
        assert!((11.0..12.5).contains(&m.write_ms), "{m:?}");
        assert!(m.read_ms >= 2.0 && m.read_ms < 40.0, "{m:?}");
        assert!(m.opens > 100 && m.writes > 100, "{m:?}");
    }

    #[test]
    fn same_seed_same_result() {
        let mut c = small(10);
        c.client_nv_blocks = 128;
        c.server_nv_blocks = 1024;
        let (a, b) = (run(&c), run(&c));
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }
}
