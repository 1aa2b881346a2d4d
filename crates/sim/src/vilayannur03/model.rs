//! One run of the 2003 model: a program's requests through the local cache
//! and the global cache under one scheme (§4, Fig. 2–4), timed by the
//! paper's own request costs ([`super::costs`]).
//!
//! A read request's blocks each end in one case: a local hit, a global hit,
//! a global miss (fetched from the I/O servers by the global cache), or
//! direct (the global cache bypassed). A request all of whose blocks hit
//! locally costs Table 1's local hit time for its size; otherwise each
//! other case it has costs that case's time for its bytes, and its local
//! hits add the local hit time per KiB. A write is buffered by the local cache
//! (Table 2's "Caching"); its blocks go down in the background when the
//! local cache evicts them, through the global cache or around it.

use super::costs::{Costs, Line};
use super::workload::{Request, Workload, BLOCK};
use parcache_core::bypass::segments::{Hint, SegmentMap};
use parcache_core::bypass::{Level, Op, DEFAULT_SEGMENT_BLOCKS};
use parcache_core::cooperative::global::{GlobalCache, Lookup};
use parcache_core::{
    split_blocks, Access, Begin, BlockKey, ByteRange, Cache, CacheConfig, Effect, PrefetchKind, ReplacementKind, Time,
    WritePolicyKind,
};
use serde::Serialize;
use std::collections::{HashMap, HashSet};

/// Which requests the caches see (the paper's executions (a)–(d) of §4 and
/// the runtime strategy of §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Scheme {
    /// No cache at all (original PVFS).
    NoCache,
    /// Local and global caches, everything through both.
    CacheAll,
    /// The compiler's coarse hints: whole arrays through the global cache
    /// or around it, by their program-wide accesses.
    FileHints,
    /// The compiler's fine hints: per nest, the segments it reuses soonest.
    SegmentHints,
    /// The runtime bypass with this threshold, and `harvest`.
    Runtime(u32),
}

impl std::fmt::Display for Scheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scheme::NoCache => f.write_str("no-cache"),
            Scheme::CacheAll => f.write_str("cache-all"),
            Scheme::FileHints => f.write_str("file-hints"),
            Scheme::SegmentHints => f.write_str("segment-hints"),
            Scheme::Runtime(t) => write!(f, "runtime({t})"),
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Params {
    pub scheme: Scheme,
    /// Local cache, blocks of 4 KiB (Fig. 2: 400 KB).
    pub local_blocks: usize,
    /// Global cache, blocks of 4 KiB (Fig. 2a: 20 MB).
    pub global_blocks: usize,
    pub costs: Costs,
}

/// What a run measured.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Measured {
    /// The program's I/O time, seconds.
    pub seconds: f64,
    /// Read block pieces by case.
    pub local_hits: u64,
    pub global_hits: u64,
    pub global_misses: u64,
    pub direct: u64,
    /// Misses the runtime kept out of the global cache.
    pub kept_out: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Case {
    GlobalHit,
    GlobalMiss,
    Direct,
}

struct Model<'a> {
    p: &'a Params,
    local: Cache,
    global: GlobalCache,
    hints: SegmentMap,
    /// Blocks the runtime kept out: reads of them go around (§5).
    told: HashSet<BlockKey>,
    threshold: u32,
    now: u64,
    m: Measured,
    /// Cases of the fetches of the request in progress.
    fetched: Vec<(BlockKey, Case)>,
}

impl Model<'_> {
    fn through(&self, key: BlockKey, op: Op) -> bool {
        self.hints.through(key, op, Level::Global) && !(op == Op::Read && self.told.contains(&key))
    }

    /// A local miss: where the block comes from.
    fn fetch(&mut self, key: BlockKey) -> Case {
        if !self.through(key, Op::Read) {
            return Case::Direct;
        }
        match self.global.read(key, self.threshold) {
            Lookup::Hit => Case::GlobalHit,
            Lookup::Miss { admit } => {
                if admit {
                    self.global.insert(key, self.threshold);
                } else {
                    self.told.insert(key);
                }
                Case::GlobalMiss
            }
        }
    }

    /// A dirty block the local cache writes down (in the background).
    fn flush(&mut self, key: BlockKey) {
        if self.through(key, Op::Write) {
            if self.global.write(key, self.threshold) && !self.global.contains(key) {
                self.global.insert(key, self.threshold);
            }
        } else {
            self.global.invalidate(key);
        }
    }

    fn drain(&mut self) {
        let now = Time(self.now);
        while let Some(e) = self.local.poll_effect() {
            match e {
                Effect::Fetch { token, key, .. } => {
                    let c = self.fetch(key);
                    self.fetched.push((key, c));
                    self.local.fetch_done(now, token);
                }
                Effect::Write { token, key, .. } => {
                    self.flush(key);
                    self.local.write_done(now, token);
                }
                Effect::Resume { .. } | Effect::Evicted { .. } => {}
            }
        }
    }

    /// One block piece through the local cache; whether it hit.
    fn access(&mut self, key: BlockKey, access: Access) -> bool {
        let now = Time(self.now);
        let mut hit = true;
        loop {
            match self
                .local
                .begin(now, 0, key, access)
                .expect("one process, valid ranges")
            {
                Begin::Ready(b) => {
                    self.local.end(now, 0, b, access).expect("ready access ends");
                    self.drain();
                    return hit;
                }
                Begin::Blocked => {
                    hit = false;
                    self.drain();
                }
            }
        }
    }

    fn request(&mut self, r: &Request) -> f64 {
        let c = self.p.costs;
        if self.p.scheme == Scheme::NoCache {
            return if r.write { c.pvfs_write } else { c.pvfs_read }.ms(r.len);
        }
        if r.write {
            for piece in split_blocks(r.offset, r.len, BLOCK as u32) {
                let range = ByteRange::new(piece.range.start, piece.range.end);
                self.access(BlockKey::new(r.file, piece.index), Access::Write(range));
            }
            return c.cached_write.ms(r.len);
        }
        let mut bytes: HashMap<u8, u64> = HashMap::new();
        let mut local_bytes = 0;
        for piece in split_blocks(r.offset, r.len, BLOCK as u32) {
            let key = BlockKey::new(r.file, piece.index);
            let range = ByteRange::new(piece.range.start, piece.range.end);
            self.fetched.clear();
            let len = piece.range.len() as u64;
            if self.access(key, Access::Read(range)) {
                self.m.local_hits += 1;
                local_bytes += len;
                continue;
            }
            let case = self
                .fetched
                .iter()
                .find(|(k, _)| *k == key)
                .map_or(Case::Direct, |x| x.1);
            let (slot, count) = match case {
                Case::GlobalHit => (0, &mut self.m.global_hits),
                Case::GlobalMiss => (1, &mut self.m.global_misses),
                Case::Direct => (2, &mut self.m.direct),
            };
            *count += 1;
            *bytes.entry(slot).or_default() += len;
        }
        if bytes.is_empty() {
            return c.local_hit.ms(r.len);
        }
        let lines: [Line; 3] = [c.global_hit, c.global_miss, c.local_miss];
        let mut t = c.local_hit.per_kib(r.len) * local_bytes as f64 / 1024.0;
        for (slot, b) in bytes {
            t += lines[slot as usize].ms(b);
        }
        t
    }
}

/// The segments of the global cache's capacity a hint may turn on.
fn segment_budget(p: &Params) -> usize {
    p.global_blocks / DEFAULT_SEGMENT_BLOCKS as usize
}

/// The compiler's fine hints (§4, second strategy): for each nest, of the
/// segments it accesses, those whose blocks are used again within the
/// previous, this and the next nest (short-term reuse), most used first,
/// as many as the global cache holds, go through it; every other segment
/// goes around.
fn segment_hints(w: &Workload, p: &Params) -> Vec<HashSet<(u64, u64)>> {
    let spb = DEFAULT_SEGMENT_BLOCKS;
    let nests = w.nests.len();
    let span = |k: usize| w.nests[k]..w.nests.get(k + 1).copied().unwrap_or(w.requests.len());
    let blocks = |k: usize| {
        w.requests[span(k)]
            .iter()
            .flat_map(|r| split_blocks(r.offset, r.len, BLOCK as u32).map(move |p| BlockKey::new(r.file, p.index)))
    };
    (0..nests)
        .map(|k| {
            let mut count: HashMap<BlockKey, u32> = HashMap::new();
            for j in k.saturating_sub(1)..(k + 2).min(nests) {
                for b in blocks(j) {
                    *count.entry(b).or_default() += 1;
                }
            }
            // A segment of this nest scores the uses of its reused blocks.
            let mut score: HashMap<(u64, u64), (u32, usize)> = HashMap::new();
            for (i, b) in blocks(k).enumerate() {
                let n = count[&b];
                let e = score.entry((b.file, b.index / spb)).or_insert((0, i));
                if n >= 2 {
                    e.0 += n;
                }
            }
            let mut segs: Vec<((u64, u64), (u32, usize))> = score.into_iter().filter(|(_, (n, _))| *n > 0).collect();
            segs.sort_by_key(|(s, (n, first))| (std::cmp::Reverse(*n), *first, *s));
            segs.into_iter().take(segment_budget(p)).map(|(s, _)| s).collect()
        })
        .collect()
}

/// The compiler's coarse hints (§4, first strategy): whole arrays by
/// program-wide accesses per block, as many as fit in the global cache.
fn file_hints(w: &Workload, p: &Params) -> HashSet<u64> {
    let mut per: HashMap<u64, u64> = HashMap::new();
    for r in &w.requests {
        *per.entry(r.file).or_default() += r.len.div_ceil(BLOCK);
    }
    let mut files: Vec<(u64, u64)> = per.into_iter().collect();
    files.sort_by_key(|(f, n)| (std::cmp::Reverse(*n), *f));
    let blocks = w.array_bytes.div_ceil(BLOCK) as usize;
    files
        .into_iter()
        .take(p.global_blocks / blocks.max(1))
        .map(|(f, _)| f)
        .collect()
}

fn hint_file(map: &mut SegmentMap, file: u64, on: bool) {
    for op in [Op::Read, Op::Write] {
        map.hint_file(
            file,
            Hint {
                op,
                local: None,
                global: Some(on),
            },
        );
    }
}

/// Runs the program under `p`.
pub fn run(p: &Params, w: &Workload) -> Measured {
    let local = Cache::new(CacheConfig {
        buffers: p.local_blocks.max(2),
        block_size: BLOCK as u32,
        replacement: ReplacementKind::Lru,
        write: WritePolicyKind::WriteBack,
        prefetch: PrefetchKind::None,
        aux_buffers: 0,
        syncer: None,
        fill_partial_writes: false,
    })
    .expect("a valid local cache");
    let mut m = Model {
        p,
        local,
        global: GlobalCache::new(p.global_blocks, DEFAULT_SEGMENT_BLOCKS),
        hints: SegmentMap::new(DEFAULT_SEGMENT_BLOCKS),
        told: HashSet::new(),
        threshold: match p.scheme {
            Scheme::Runtime(t) => t,
            _ => 0,
        },
        now: 0,
        m: Measured::default(),
        fetched: Vec::new(),
    };
    let fine = (p.scheme == Scheme::SegmentHints).then(|| segment_hints(w, p));
    if p.scheme == Scheme::FileHints {
        let chosen = file_hints(w, p);
        for f in 0..w.arrays {
            hint_file(&mut m.hints, f, chosen.contains(&f));
        }
    }
    let mut nest = 0;
    let mut ms = 0.0;
    for (i, r) in w.requests.iter().enumerate() {
        if let Some(fine) = &fine {
            if nest < w.nests.len() && w.nests[nest] == i {
                for f in 0..w.arrays {
                    m.hints.clear(f);
                    hint_file(&mut m.hints, f, false);
                }
                for &(f, s) in &fine[nest] {
                    let first = s * DEFAULT_SEGMENT_BLOCKS;
                    for op in [Op::Read, Op::Write] {
                        let h = Hint {
                            op,
                            local: None,
                            global: Some(true),
                        };
                        m.hints.hint_blocks(f, first, first, h);
                    }
                }
                nest += 1;
            }
        }
        let t = m.request(r);
        ms += t;
        m.now += (t * 1e6) as u64;
    }
    let mut out = m.m;
    out.seconds = ms / 1e3;
    out.kept_out = m.global.stats.bypassed;
    out
}

#[cfg(test)]
mod tests {
    use super::super::workload::{generate, Kernel, Order};
    use super::*;

    fn params(scheme: Scheme, global_mib: usize) -> Params {
        Params {
            scheme,
            local_blocks: 100,
            global_blocks: global_mib * 256,
            costs: Costs::paper(),
        }
    }

    #[test]
    fn small_problems_hit_the_global_cache_and_runs_repeat() {
        // Rows of 8.6 KB, where a global hit beats no cache (Table 1); all
        // seven arrays fit in 200 MB.
        let w = generate(Kernel::Tomcatv(Order::Row), 1100, 2, 1);
        let all = run(&params(Scheme::CacheAll, 200), &w);
        let none = run(&params(Scheme::NoCache, 200), &w);
        assert!(all.global_hits > all.global_misses, "{all:?}");
        assert!(all.seconds < none.seconds, "{all:?} {none:?}");
        let again = run(&params(Scheme::CacheAll, 200), &w);
        assert_eq!(all.seconds, again.seconds, "deterministic");
        // The runtime keeps some misses out; hints send some around.
        let rt = run(&params(Scheme::Runtime(20), 8), &w);
        assert!(rt.kept_out > 0 && rt.direct > 0, "{rt:?}");
        let seg = run(&params(Scheme::SegmentHints, 8), &w);
        assert!(seg.direct > 0 && seg.global_hits > 0, "{seg:?}");
    }
}
