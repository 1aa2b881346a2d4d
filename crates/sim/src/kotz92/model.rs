//! One run of the 1992 model: processes, a shared cache driven by
//! `parcache-core`, and FCFS disks, in virtual time.
//!
//! A process repeats: take a record; spend the per-call overhead; for each
//! block the record touches, get its buffer from the cache (waiting if the
//! cache says so), spend the per-buffer overhead copying, hand the bytes to
//! the cache; then compute. Without a cache, a call sends each block piece
//! straight to its disk and waits for all of them. Disks are whole-block
//! devices: a piece that does not cover its block, of a block that already
//! exists on disk, costs a read before the write (read-modify-write); with a
//! cache the core asks for that read itself (`fill_partial_writes`).
//!
//! The run ends when every process is done and every dirty block is on disk.

use super::params::{KotzParams, OverheadDist, ParamError, Pattern};
use crate::cache_driver::{Below, CacheDriver};
use crate::disk::{ConstantDisk, DiskModel, DiskOp};
use crate::kernel::Kernel;
use crate::resource::Fcfs;
use crate::rng::SimRng;
use parcache_core::{
    split_blocks, Access, Begin, BlockKey, BufId, ByteRange, Cache, CacheConfig, CacheStats, IoToken, PrefetchKind,
    ProcId, Span, StripeLayout, Time, WriteCause,
};
use serde::{Deserialize, Serialize};

const FILE: u64 = 1;

/// What one run measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KotzResult {
    /// Total execution time, from the first request until the last byte is on disk.
    pub seconds: f64,
    pub ideal_seconds: f64,
    pub disk_writes: u64,
    pub disk_reads: u64,
    /// Disk writes of a block beyond its first (1992 §3.3.2).
    pub rewrite_mistakes: u64,
    /// Distinct blocks that reached disk.
    pub blocks_written: u64,
    /// Busy time over total time, per disk.
    pub disk_utilisation: Vec<f64>,
    pub mean_utilisation: f64,
    /// Times a request waited for a clean buffer.
    pub stalls: u64,
    /// Process-seconds spent waiting on the cache (for buffers, fills, writes in progress).
    pub wait_seconds: f64,
    pub events: u64,
    pub cache: Option<CacheStats>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ev {
    Proc(u32),
    Disk(u32),
    Timer,
}

#[derive(Clone, Copy, Debug)]
enum Owner {
    Proc(u32),
    Cache(IoToken),
}

#[derive(Clone, Copy, Debug)]
struct Job {
    owner: Owner,
    op: DiskOp,
    block: u64,
    /// A read that is the first half of a read-modify-write.
    then_write: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// About to take the next record.
    Next,
    /// Working through the current record's block pieces.
    Pieces,
    /// Copying into a pinned buffer.
    Copy(BufId, ByteRange),
    /// Waiting for direct disk writes (no cache).
    Disk,
    Done,
}

struct Proc {
    phase: Phase,
    /// Own records: [cursor, end) of the file (lw1, seg).
    cursor: u64,
    end: u64,
    /// The record being written: [pos, rec_end).
    pos: u64,
    rec_end: u64,
    pending: u32,
    rng: SimRng,
    waiting_since: Option<Time>,
}

struct Sim<'a> {
    p: &'a KotzParams,
    k: Kernel<Ev>,
    cache: Option<CacheDriver>,
    disks: Vec<Fcfs<Job>>,
    disk: ConstantDisk,
    layout: StripeLayout,
    procs: Vec<Proc>,
    /// gw's shared record counter.
    next_record: u64,
    record_bytes: u64,
    total: u64,
    /// Per block: a write has been issued, so the block exists on disk.
    on_disk: Vec<bool>,
    writes_of: Vec<u32>,
    disk_writes: u64,
    disk_reads: u64,
    done: u32,
    flushed: bool,
    wait: Span,
    request_overhead: Span,
    buffer_overhead: Span,
}

/// Runs the model once.
pub fn run(p: &KotzParams) -> Result<KotzResult, ParamError> {
    p.validate()?;
    let mut sim = Sim::new(p)?;
    sim.start();
    sim.run();
    let stuck: Vec<u32> = sim
        .procs
        .iter()
        .enumerate()
        .filter(|(_, pr)| pr.phase != Phase::Done)
        .map(|(i, _)| i as u32)
        .collect();
    if !stuck.is_empty() {
        return Err(ParamError::Deadlock {
            processes: stuck.len(),
            at: sim.k.now().as_secs_f64(),
        });
    }
    Ok(sim.result())
}

impl<'a> Sim<'a> {
    fn new(p: &'a KotzParams) -> Result<Self, ParamError> {
        let total = p.total_bytes();
        let active = p.active_procs();
        let seg = total / active as u64;
        let procs = (0..active)
            .map(|i| {
                let (cursor, end) = match p.pattern {
                    Pattern::Lw1 => (0, total),
                    Pattern::Seg => (
                        i as u64 * seg,
                        if i + 1 == active { total } else { (i as u64 + 1) * seg },
                    ),
                    Pattern::Gw => (0, 0),
                };
                Proc {
                    phase: Phase::Next,
                    cursor,
                    end,
                    pos: 0,
                    rec_end: 0,
                    pending: 0,
                    rng: SimRng::stream(p.seed, i as u64),
                    waiting_since: None,
                }
            })
            .collect();
        let cache = if p.buffers > 0 {
            let cfg = CacheConfig {
                buffers: p.buffers,
                block_size: p.block_size,
                replacement: p.replacement,
                write: p.policy,
                prefetch: PrefetchKind::None,
                aux_buffers: 0,
                syncer: None,
                fill_partial_writes: true,
            };
            Some(CacheDriver::new(Cache::new(cfg).map_err(|reason| {
                ParamError::Policy {
                    buffers: p.buffers,
                    reason,
                }
            })?))
        } else {
            None
        };
        Ok(Sim {
            p,
            k: Kernel::new(),
            cache,
            disks: (0..p.disks).map(|_| Fcfs::new()).collect(),
            disk: ConstantDisk {
                service: Span::from_millis_f64(p.disk_ms),
            },
            layout: StripeLayout::new(p.block_size as u64, p.disks),
            procs,
            next_record: 0,
            record_bytes: p.record_bytes(),
            total,
            on_disk: vec![false; p.blocks as usize],
            writes_of: vec![0; p.blocks as usize],
            disk_writes: 0,
            disk_reads: 0,
            done: 0,
            flushed: false,
            wait: Span::ZERO,
            request_overhead: Span::from_millis_f64(p.overheads.request_ms),
            buffer_overhead: Span::from_millis_f64(p.overheads.buffer_ms),
        })
    }

    fn start(&mut self) {
        for i in 0..self.procs.len() as u32 {
            self.k.at(Time::ZERO, Ev::Proc(i));
        }
    }

    fn run(&mut self) {
        while let Some((now, ev)) = self.k.pop() {
            match ev {
                Ev::Proc(i) => self.step(now, i),
                Ev::Disk(d) => self.disk_done(now, d),
                Ev::Timer => {
                    let (cache, mut below) = self.split();
                    if let Some(c) = cache {
                        c.timer(now, &mut below);
                    }
                }
            }
        }
        debug_assert!(
            self.cache.as_ref().is_none_or(|c| c.cache().is_clean()),
            "dirty data left at the end"
        );
    }

    /// Takes the next record for process `i`, if any: [start, end) of the file.
    fn next_record(&mut self, i: u32) -> Option<(u64, u64)> {
        let r = self.record_bytes;
        match self.p.pattern {
            Pattern::Gw => {
                let start = self.next_record.checked_mul(r)?;
                if start >= self.total {
                    return None;
                }
                self.next_record += 1;
                Some((start, (start + r).min(self.total)))
            }
            Pattern::Lw1 | Pattern::Seg => {
                let pr = &mut self.procs[i as usize];
                if pr.cursor >= pr.end {
                    return None;
                }
                let start = pr.cursor;
                pr.cursor = (start + r).min(pr.end);
                Some((start, pr.cursor))
            }
        }
    }

    /// Advances process `i` as far as it can go at time `now`.
    fn step(&mut self, now: Time, i: u32) {
        let iu = i as usize;
        if let Some(since) = self.procs[iu].waiting_since.take() {
            self.wait = self.wait + now.since(since);
        }
        loop {
            match self.procs[iu].phase {
                Phase::Next => match self.next_record(i) {
                    None => {
                        self.procs[iu].phase = Phase::Done;
                        self.proc_done(now);
                        return;
                    }
                    Some((s, e)) => {
                        let pr = &mut self.procs[iu];
                        pr.pos = s;
                        pr.rec_end = e;
                        pr.phase = Phase::Pieces;
                        if self.request_overhead.0 > 0 {
                            let d = overhead(&mut pr.rng, self.p.overhead_dist, self.request_overhead);
                            self.k.after(d, Ev::Proc(i));
                            return;
                        }
                    }
                },
                Phase::Pieces => {
                    let (pos, end) = (self.procs[iu].pos, self.procs[iu].rec_end);
                    if pos >= end {
                        if self.after_record(i) {
                            continue;
                        }
                        return;
                    }
                    if self.cache.is_none() {
                        self.write_direct(now, i, pos, end);
                        return;
                    }
                    let piece = split_blocks(pos, end - pos, self.p.block_size)
                        .next()
                        .expect("non-empty");
                    let key = BlockKey::new(FILE, piece.index);
                    let cache = self.cache.as_mut().expect("cache path").cache_mut();
                    let begun = cache
                        .begin(now, i, key, Access::Write(piece.range))
                        .expect("validated parameters");
                    match begun {
                        Begin::Ready(b) => {
                            self.procs[iu].phase = Phase::Copy(b, piece.range);
                            self.drain(now);
                            let d = overhead(&mut self.procs[iu].rng, self.p.overhead_dist, self.buffer_overhead);
                            self.k.after(d, Ev::Proc(i));
                        }
                        Begin::Blocked => {
                            self.procs[iu].waiting_since = Some(now);
                            self.drain(now);
                        }
                    }
                    return;
                }
                Phase::Copy(b, range) => {
                    let cache = self.cache.as_mut().expect("cache path").cache_mut();
                    cache
                        .end(now, i, b, Access::Write(range))
                        .expect("pinned by this process");
                    self.procs[iu].pos += range.len() as u64;
                    self.procs[iu].phase = Phase::Pieces;
                    self.drain(now);
                }
                Phase::Disk => {
                    if self.procs[iu].pending > 0 {
                        return;
                    }
                    self.procs[iu].pos = self.procs[iu].rec_end;
                    self.procs[iu].phase = Phase::Pieces;
                }
                Phase::Done => return,
            }
        }
    }

    /// The record is written: compute, then take the next. Returns whether
    /// to continue at once.
    fn after_record(&mut self, i: u32) -> bool {
        let pr = &mut self.procs[i as usize];
        pr.phase = Phase::Next;
        if let Some(c) = self.p.compute {
            if c.mean_ms > 0.0 {
                let d = pr.rng.exp_truncated(c.mean_ms, c.max_ms);
                let span = Span::from_millis_f64(d);
                if span.0 > 0 {
                    self.k.after(span, Ev::Proc(i));
                    return false;
                }
            }
        }
        true
    }

    /// No cache: every block piece of the record goes to its disk at once.
    fn write_direct(&mut self, now: Time, i: u32, pos: u64, end: u64) {
        let bs = self.p.block_size;
        let mut n = 0;
        for piece in split_blocks(pos, end - pos, bs) {
            let whole = piece.range.start == 0 && piece.range.end == bs;
            let rmw = !whole && self.on_disk[piece.index as usize];
            let op = if rmw { DiskOp::Read } else { DiskOp::Write };
            self.submit(
                now,
                Job {
                    owner: Owner::Proc(i),
                    op,
                    block: piece.index,
                    then_write: rmw,
                },
            );
            n += 1;
        }
        let pr = &mut self.procs[i as usize];
        pr.pending = n;
        pr.phase = Phase::Disk;
    }

    fn submit(&mut self, now: Time, job: Job) {
        if job.op == DiskOp::Write || job.then_write {
            self.on_disk[job.block as usize] = true;
        }
        self.split().1.submit(now, job);
    }

    fn disk_done(&mut self, now: Time, d: u32) {
        let (job, next) = self.disks[d as usize].complete(now);
        if let Some(at) = next {
            self.k.at(at, Ev::Disk(d));
        }
        match job.op {
            DiskOp::Write => {
                self.disk_writes += 1;
                self.writes_of[job.block as usize] += 1;
            }
            DiskOp::Read => self.disk_reads += 1,
        }
        if job.then_write {
            // Read-modify-write: the write goes to the back of the same queue.
            self.submit(
                now,
                Job {
                    op: DiskOp::Write,
                    then_write: false,
                    ..job
                },
            );
            return;
        }
        match job.owner {
            Owner::Proc(i) => {
                self.procs[i as usize].pending -= 1;
                if self.procs[i as usize].pending == 0 {
                    self.step(now, i);
                }
            }
            Owner::Cache(token) => {
                let c = self.cache.as_mut().expect("cache job").cache_mut();
                match job.op {
                    DiskOp::Write => c.write_done(now, token),
                    DiskOp::Read => c.fetch_done(now, token),
                }
                self.drain(now);
            }
        }
    }

    /// Carries out the cache's effects against the disks.
    fn drain(&mut self, now: Time) {
        let (cache, mut below) = self.split();
        if let Some(c) = cache {
            c.drain(now, &mut below);
        }
    }

    /// The cache, and the disks below it.
    fn split(&mut self) -> (Option<&mut CacheDriver>, Disks<'_>) {
        let below = Disks {
            k: &mut self.k,
            disks: &mut self.disks,
            disk: &self.disk,
            layout: &self.layout,
            on_disk: &mut self.on_disk,
            block_size: self.p.block_size as u64,
        };
        (self.cache.as_mut(), below)
    }

    fn proc_done(&mut self, now: Time) {
        self.done += 1;
        if self.done as usize == self.procs.len() && !self.flushed {
            self.flushed = true;
            if let Some(c) = self.cache.as_mut() {
                c.cache_mut().flush(now);
            }
            self.drain(now);
        }
    }

    fn result(&self) -> KotzResult {
        let total = self.k.now();
        let secs = total.as_secs_f64();
        let util: Vec<f64> = self
            .disks
            .iter()
            .map(|d| {
                if total.0 == 0 {
                    0.0
                } else {
                    d.busy().0 as f64 / total.0 as f64
                }
            })
            .collect();
        let mean = util.iter().sum::<f64>() / util.len() as f64;
        KotzResult {
            seconds: secs,
            ideal_seconds: self.p.ideal_seconds(),
            disk_writes: self.disk_writes,
            disk_reads: self.disk_reads,
            rewrite_mistakes: self.writes_of.iter().map(|&w| w.saturating_sub(1) as u64).sum(),
            blocks_written: self.writes_of.iter().filter(|&&w| w > 0).count() as u64,
            disk_utilisation: util,
            mean_utilisation: mean,
            stalls: self.cache.as_ref().map_or(0, |c| c.cache().stats().stalls),
            wait_seconds: self.wait.as_secs_f64(),
            events: self.k.handled(),
            cache: self.cache.as_ref().map(|c| c.cache().stats().clone()),
        }
    }
}

/// One draw of a per-call CPU cost with mean `mean`.
fn overhead(rng: &mut SimRng, dist: OverheadDist, mean: Span) -> Span {
    match dist {
        OverheadDist::Constant => mean,
        OverheadDist::Exponential => Span::from_millis_f64(-mean.as_millis_f64() * (1.0 - rng.uniform()).ln()),
    }
}

/// The disks below the 1992 model's cache: a write of part of a block
/// already on disk reads it first (read-modify-write in the disk's queue);
/// a block never written is not fetched (the cache zero-fills it).
struct Disks<'s> {
    k: &'s mut Kernel<Ev>,
    disks: &'s mut [Fcfs<Job>],
    disk: &'s ConstantDisk,
    layout: &'s StripeLayout,
    on_disk: &'s mut [bool],
    block_size: u64,
}

impl Disks<'_> {
    fn submit(&mut self, now: Time, job: Job) {
        let d = self.layout.server_of_unit(job.block);
        let service = self.disk.service(job.op, self.block_size);
        if let Some(at) = self.disks[d as usize].submit(now, job, service) {
            self.k.at(at, Ev::Disk(d));
        }
    }
}

impl Below for Disks<'_> {
    fn write(&mut self, now: Time, token: IoToken, key: BlockKey, whole: bool, _detached: bool, _cause: WriteCause) {
        let rmw = !whole && self.on_disk[key.index as usize];
        let op = if rmw { DiskOp::Read } else { DiskOp::Write };
        self.on_disk[key.index as usize] = true;
        let job = Job {
            owner: Owner::Cache(token),
            op,
            block: key.index,
            then_write: rmw,
        };
        self.submit(now, job);
    }

    fn fetch(&mut self, now: Time, token: IoToken, key: BlockKey, _prefetch: bool) -> bool {
        if !self.on_disk[key.index as usize] {
            return false;
        }
        let job = Job {
            owner: Owner::Cache(token),
            op: DiskOp::Read,
            block: key.index,
            then_write: false,
        };
        self.submit(now, job);
        true
    }

    fn resume(&mut self, now: Time, proc: ProcId) {
        self.k.at(now, Ev::Proc(proc));
    }

    fn wake_at(&mut self, at: Time) {
        self.k.at(at, Ev::Timer);
    }
}
