//! The policy advisor (`parcache advise TRACE`, docs/advisor.md): replays
//! a trace under every combination of node policies its sharing allows,
//! ranks them, and recommends one combination per directory.
//!
//! What a file's sharing allows (DESIGN.md §3's consistency catalogue):
//! - used by one node, or only read by several: any plug-in, `none` too;
//! - written by one node and used by another, never at the same time, or
//!   at the same time on bytes no other node touches: the plug-ins that
//!   revalidate at open or write through (`close-to-open`, `nfs`,
//!   `session`, `sprite`, `posix`, `sync-write`);
//! - bytes one node writes while another node has the file open and uses
//!   them: only the plug-ins that keep concurrent writers coherent
//!   (`sprite`, `posix`, `sync-write`).
//!
//! The sweep covers every write, replacement and prefetch policy, every
//! consistency plug-in the least-shared file allows (a file that allows
//! fewer never gets one it does not allow recommended), and cooperative
//! caching (`none`, `greedy`, `n-chance`) where the cluster has more than
//! one node. `posix` caches nothing, so the other policies cannot change
//! its result: it runs once.

use super::{replay, Choice, ClusterModel, Outcome, ReplayError};
use crate::trace::Trace;
use parcache_core::cooperative::CooperativeKind;
use parcache_core::{ConsistencyKind, PrefetchKind, ReplacementKind, TraceOp, WritePolicyKind};
use std::collections::{BTreeMap, HashMap};

/// How a file is shared in a trace, from least to most demanding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sharing {
    /// One node uses it.
    Private,
    /// Several nodes use it; none writes.
    ReadShared,
    /// Written on one node, used on another, never while both have it open.
    Sequential,
    /// Open on several nodes at once with writes, but no node touches
    /// bytes another writes.
    Disjoint,
    /// A node reads or writes bytes another node writes while both have
    /// the file open.
    Conflicting,
}

impl Sharing {
    pub fn name(self) -> &'static str {
        match self {
            Sharing::Private => "private",
            Sharing::ReadShared => "read-shared",
            Sharing::Sequential => "shared in turn",
            Sharing::Disjoint => "concurrent, disjoint bytes",
            Sharing::Conflicting => "concurrent, same bytes",
        }
    }

    /// Whether a consistency plug-in keeps this sharing correct.
    pub fn allows(self, c: ConsistencyKind) -> bool {
        use ConsistencyKind as C;
        match self {
            Sharing::Private | Sharing::ReadShared => true,
            Sharing::Sequential | Sharing::Disjoint => !matches!(c, C::None | C::Capfs(_)),
            Sharing::Conflicting => matches!(c, C::Sprite | C::Posix | C::SyncWrite),
        }
    }
}

/// Each file's sharing (by file index), from the trace's sessions and the
/// bytes each node touches. Byte conflicts are looked for over the whole
/// trace, not only while sessions overlap, so a file can be judged more
/// shared than it is, never less.
pub fn sharing(trace: &Trace) -> Vec<Sharing> {
    let n = trace.files.len();
    let mut nodes: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut written = vec![false; n];
    // Sessions: (start, end, node, writes) per file.
    let mut sessions: Vec<Vec<(f64, f64, u32, bool)>> = vec![Vec::new(); n];
    let mut open: HashMap<(u32, u64, u32), Vec<usize>> = HashMap::new();
    // Byte ranges: (start, end, node, write) per file.
    let mut ranges: Vec<Vec<(u64, u64, u32, bool)>> = vec![Vec::new(); n];
    for o in &trace.ops {
        let f = o.file as usize;
        let key = (o.node, o.process, o.file);
        match o.kind {
            TraceOp::Open => {
                sessions[f].push((o.time, f64::INFINITY, o.node, false));
                open.entry(key).or_default().push(sessions[f].len() - 1);
            }
            TraceOp::Close => {
                if let Some(i) = open.get_mut(&key).and_then(Vec::pop) {
                    sessions[f][i].1 = o.time + o.duration;
                }
            }
            TraceOp::Read | TraceOp::Write => {
                let w = o.kind == TraceOp::Write;
                if !nodes[f].contains(&o.node) {
                    nodes[f].push(o.node);
                }
                written[f] |= w;
                if let Some(&i) = open.get(&key).and_then(|s| s.last()) {
                    sessions[f][i].3 |= w;
                }
                if o.length > 0 {
                    ranges[f].push((o.offset, o.offset.saturating_add(o.length), o.node, w));
                }
            }
            TraceOp::Fsync => {}
        }
    }
    (0..n)
        .map(|f| {
            if nodes[f].len() <= 1 {
                Sharing::Private
            } else if !written[f] {
                Sharing::ReadShared
            } else if !concurrent_writes(&mut sessions[f]) {
                Sharing::Sequential
            } else if byte_conflict(&mut ranges[f]) {
                Sharing::Conflicting
            } else {
                Sharing::Disjoint
            }
        })
        .collect()
}

/// Whether two nodes' sessions overlap in time while one of them writes.
fn concurrent_writes(s: &mut [(f64, f64, u32, bool)]) -> bool {
    s.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut writes, mut any) = (Latest::default(), Latest::default());
    for &(start, end, node, w) in s.iter() {
        // Overlaps another node's writing session, or writes while
        // another node's session is open.
        if writes.other_than(node) > start || (w && any.other_than(node) > start) {
            return true;
        }
        if w {
            writes.add(end, node);
        }
        any.add(end, node);
    }
    false
}

/// Whether a node touches bytes another node writes.
fn byte_conflict(r: &mut [(u64, u64, u32, bool)]) -> bool {
    r.sort_unstable();
    let (mut writes, mut any) = (LatestU::default(), LatestU::default());
    for &(start, end, node, w) in r.iter() {
        let hit_writer = writes.other_than(node) > start;
        let hit_any = any.other_than(node) > start;
        if hit_writer || (w && hit_any) {
            return true;
        }
        if w {
            writes.add(end, node);
        }
        any.add(end, node);
    }
    false
}

/// The two latest ends seen, from two different nodes: enough to answer
/// "does an interval of a node other than this one reach past here?".
#[derive(Default)]
struct Latest {
    top: Option<(f64, u32)>,
    second: Option<(f64, u32)>,
}

impl Latest {
    fn add(&mut self, end: f64, node: u32) {
        match self.top {
            Some((e, n)) if n == node => self.top = Some((e.max(end), n)),
            Some((e, n)) if end > e => {
                self.second = Some((e, n));
                self.top = Some((end, node));
            }
            Some(_) => match self.second {
                Some((e, n)) if n != node && e >= end => {}
                _ => self.second = Some((end, node)),
            },
            None => self.top = Some((end, node)),
        }
        if let (Some((e1, n1)), Some((e2, n2))) = (self.top, self.second) {
            if n1 == n2 {
                self.top = Some((e1.max(e2), n1));
                self.second = None;
            }
        }
    }

    fn other_than(&self, node: u32) -> f64 {
        [self.top, self.second]
            .into_iter()
            .flatten()
            .find(|&(_, n)| n != node)
            .map_or(f64::NEG_INFINITY, |(e, _)| e)
    }
}

/// [`Latest`] over byte offsets.
#[derive(Default)]
struct LatestU(Latest);

impl LatestU {
    fn add(&mut self, end: u64, node: u32) {
        self.0.add(end as f64, node)
    }
    fn other_than(&self, node: u32) -> u64 {
        let e = self.0.other_than(node);
        if e < 0.0 {
            0
        } else {
            e as u64
        }
    }
}

/// The policies a sweep tries, key by key.
#[derive(Clone, Debug, PartialEq)]
pub struct Space {
    pub write: Vec<WritePolicyKind>,
    pub replacement: Vec<ReplacementKind>,
    pub prefetch: Vec<PrefetchKind>,
    pub consistency: Vec<ConsistencyKind>,
    pub cooperative: Vec<CooperativeKind>,
}

impl Space {
    /// Everything a trace's sharing allows on a cluster of `nodes` nodes:
    /// the consistency plug-ins its least-shared file allows.
    pub fn for_trace(sharing: &[Sharing], nodes: usize) -> Space {
        let least = sharing.iter().copied().min().unwrap_or(Sharing::Private);
        Space {
            write: WritePolicyKind::ALL.to_vec(),
            replacement: ReplacementKind::ALL.to_vec(),
            prefetch: PrefetchKind::ALL.to_vec(),
            consistency: ConsistencyKind::ALL.into_iter().filter(|c| least.allows(*c)).collect(),
            cooperative: if nodes > 1 {
                vec![
                    CooperativeKind::None,
                    CooperativeKind::NChance { n: 0 },
                    CooperativeKind::NChance {
                        n: CooperativeKind::DEFAULT_N,
                    },
                ]
            } else {
                vec![CooperativeKind::None]
            },
        }
    }

    /// Narrows (or sets) one key's values from `key=v1,v2,…`, the values
    /// as `parcache policy set` takes them (commas inside parentheses
    /// belong to a value).
    pub fn only(&mut self, kv: &str) -> Result<(), String> {
        let (k, vs) = kv
            .split_once('=')
            .ok_or_else(|| format!("'{kv}' is not key=value[,value…] (e.g. write=write-back,write-through)"))?;
        let values = split_top_level(vs);
        if values.iter().any(|v| v.trim().is_empty()) {
            return Err(format!("'{kv}': an empty value"));
        }
        let mut c = Choice::default();
        let mut parsed = Vec::new();
        for v in &values {
            c.set(&format!("{k}={}", v.trim()))?;
            parsed.push(c);
        }
        match k.trim() {
            "write" => self.write = parsed.iter().map(|c| c.write).collect(),
            "replacement" => self.replacement = parsed.iter().map(|c| c.replacement).collect(),
            "prefetch" => self.prefetch = parsed.iter().map(|c| c.prefetch).collect(),
            "consistency" => self.consistency = parsed.iter().map(|c| c.consistency).collect(),
            "cooperative" => self.cooperative = parsed.iter().map(|c| c.cooperative).collect(),
            _ => unreachable!("Choice::set accepted only the five keys"),
        }
        Ok(())
    }

    /// Every combination, in a fixed order, `posix` once (it caches
    /// nothing), and parcache's default first (the baseline every row is
    /// compared with) whether or not the space holds it.
    pub fn choices(&self) -> Vec<Choice> {
        let mut out = vec![Choice::default()];
        for &consistency in &self.consistency {
            for &cooperative in &self.cooperative {
                for &write in &self.write {
                    for &replacement in &self.replacement {
                        for &prefetch in &self.prefetch {
                            let c = normal(Choice {
                                write,
                                replacement,
                                prefetch,
                                consistency,
                                cooperative,
                            });
                            if !out.contains(&c) {
                                out.push(c);
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

fn split_top_level(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0i32);
    for ch in s.chars() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    out.push(cur);
    out
}

/// One replay of the sweep.
#[derive(Clone, Debug)]
pub struct Run {
    pub choice: Choice,
    pub outcome: Outcome,
}

/// Replays `trace` under each choice on up to `threads` threads, calling
/// `done` after each; results in the choices' order.
pub fn sweep(
    trace: &Trace,
    cluster: &ClusterModel,
    choices: &[Choice],
    threads: usize,
    done: &(dyn Fn() + Sync),
) -> Result<Vec<Run>, ReplayError> {
    crate::parallel::map(
        choices,
        threads,
        |c| replay(trace, cluster, c).map(|outcome| Run { choice: *c, outcome }),
        done,
    )
    .into_iter()
    .collect()
}

/// How the advisor searches the space of combinations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Search {
    /// Every combination ([`Space::choices`]).
    Full,
    /// Key by key from parcache's default: every value of one policy with
    /// the others at the best found so far, in the order consistency,
    /// cooperative, write, replacement, prefetch; again until a whole pass
    /// changes nothing (at most [`GREEDY_PASSES`]). A few dozen replays
    /// instead of hundreds; it can miss a best that needs two keys changed
    /// together.
    Greedy,
}

/// Passes of the greedy search at most.
pub const GREEDY_PASSES: usize = 3;

/// Above this many block accesses over a whole sweep (the trace's blocks
/// times its combinations, about 15 minutes on two cores of the machine
/// this was written on), `auto` searches greedily.
pub const FULL_SWEEP_LIMIT: u64 = 1 << 30;

/// The 64 KiB blocks the trace's reads and writes touch: the replay's work.
pub fn trace_blocks(trace: &Trace) -> u64 {
    let bs = super::cluster::BLOCK as u64;
    trace
        .ops
        .iter()
        .filter(|o| matches!(o.kind, TraceOp::Read | TraceOp::Write))
        .map(|o| (o.offset + o.length).div_ceil(bs) - o.offset / bs)
        .sum()
}

/// The search `auto` picks: the full sweep unless it would replay more
/// than [`FULL_SWEEP_LIMIT`] block accesses. Depends only on the trace and
/// the space, never on the machine, so the answer is the same everywhere.
pub fn auto_search(trace: &Trace, space: &Space) -> Search {
    if trace_blocks(trace).saturating_mul(space.choices().len() as u64) > FULL_SWEEP_LIMIT {
        Search::Greedy
    } else {
        Search::Full
    }
}

/// Orders two outcomes as [`advise`] ranks them (`step`: the width of an
/// elapsed-time bucket).
fn order(by: RankBy, step: f64, x: &Outcome, y: &Outcome) -> std::cmp::Ordering {
    let bucket = |o: &Outcome| match by {
        RankBy::Elapsed => (o.elapsed / step).round() as u64,
        RankBy::IoTime => 0,
    };
    bucket(x)
        .cmp(&bucket(y))
        .then(x.io_time.total_cmp(&y.io_time))
        .then(x.elapsed.total_cmp(&y.elapsed))
        .then(x.drained.total_cmp(&y.drained))
        .then(x.disk_write_bytes.cmp(&y.disk_write_bytes))
}

fn step_of(runs: &[Run]) -> f64 {
    let best = runs.iter().map(|r| r.outcome.elapsed).fold(f64::INFINITY, f64::min);
    if best.is_finite() && best > 0.0 {
        best * 1e-3
    } else {
        1e-9
    }
}

/// A choice as replayed: `posix` caches nothing, so with it the other
/// keys are parcache's defaults (as [`Space::choices`] lists it).
fn normal(c: Choice) -> Choice {
    if c.consistency == ConsistencyKind::Posix {
        Choice {
            consistency: ConsistencyKind::Posix,
            ..Choice::default()
        }
    } else {
        c
    }
}

/// The greedy search ([`Search::Greedy`]) over `space`; every run made,
/// in the order made (parcache's default first). Deterministic: each
/// step's runs go in parallel, but the next step waits for them all.
pub fn greedy(
    trace: &Trace,
    cluster: &ClusterModel,
    space: &Space,
    threads: usize,
    by: RankBy,
    done: &(dyn Fn() + Sync),
) -> Result<Vec<Run>, ReplayError> {
    let mut runs = sweep(trace, cluster, &[Choice::default()], threads, done)?;
    let mut best = Choice::default();
    type Key = fn(&Space, Choice) -> Vec<Choice>;
    let keys: [Key; 5] = [
        |s, b| s.consistency.iter().map(|&v| Choice { consistency: v, ..b }).collect(),
        |s, b| s.cooperative.iter().map(|&v| Choice { cooperative: v, ..b }).collect(),
        |s, b| s.write.iter().map(|&v| Choice { write: v, ..b }).collect(),
        |s, b| s.replacement.iter().map(|&v| Choice { replacement: v, ..b }).collect(),
        |s, b| s.prefetch.iter().map(|&v| Choice { prefetch: v, ..b }).collect(),
    ];
    for _ in 0..GREEDY_PASSES {
        let before = best;
        for key in keys {
            let mut tries: Vec<Choice> = key(space, best).into_iter().map(normal).collect();
            tries.push(best);
            let mut fresh: Vec<Choice> = Vec::new();
            for c in &tries {
                if !runs.iter().any(|r| r.choice == *c) && !fresh.contains(c) {
                    fresh.push(*c);
                }
            }
            runs.extend(sweep(trace, cluster, &fresh, threads, done)?);
            let step = step_of(&runs);
            best = runs
                .iter()
                .filter(|r| tries.contains(&r.choice))
                .min_by(|a, b| order(by, step, &a.outcome, &b.outcome))
                .map(|r| r.choice)
                .unwrap_or(best);
        }
        if best == before {
            break;
        }
    }
    Ok(runs)
}

/// The advisor's answer.
#[derive(Clone, Debug)]
pub struct Advice {
    /// The runs, best first ([`RankBy`]), then by time until all data is
    /// on disk, bytes to disk, and the sweep's order.
    pub ranked: Vec<Run>,
    /// Index in `ranked` of parcache's default.
    pub default: usize,
    /// Per run in `ranked`: whether its consistency is correct for every
    /// file of the trace (only those may be applied to the whole trace).
    pub safe: Vec<bool>,
    /// Per run in `ranked`: the index of an earlier run with exactly the
    /// same outcome, if any (the policies that differ made no difference).
    pub same_as: Vec<Option<usize>>,
    pub dirs: Vec<DirAdvice>,
    /// Directories no swept run is correct for (their sharing allows none
    /// of the consistency plug-ins the sweep was narrowed to).
    pub unadvised: Vec<(String, Sharing)>,
    /// Files per sharing, for the summary.
    pub sharing: BTreeMap<Sharing, usize>,
}

/// The recommendation for one directory's files.
#[derive(Clone, Debug)]
pub struct DirAdvice {
    pub dir: String,
    pub files: usize,
    /// Its most demanding file's sharing.
    pub sharing: Sharing,
    /// Index in `ranked` of the best run for these files among those their
    /// sharing allows.
    pub best: usize,
    /// Seconds these files' operations took under that run and under the
    /// default.
    pub time: f64,
    pub default_time: f64,
}

/// The directory part of a traced path, `.` and `..` resolved by name
/// (`.` for a bare name).
pub fn dir_of(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for p in path.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    parts.pop();
    match (path.starts_with('/'), parts.is_empty()) {
        (true, _) => format!("/{}", parts.join("/")),
        (false, true) => ".".to_string(),
        (false, false) => parts.join("/"),
    }
}

/// What the ranking puts first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RankBy {
    /// The time the processes spent waiting on the file system, added up:
    /// what the policies change, whatever the program computes between.
    #[default]
    IoTime,
    /// When the last operation finished (the job's time as replayed);
    /// within 0.1 % of the best counts as equal, the I/O time deciding.
    Elapsed,
}

/// Ranks the runs and picks each directory's best (by the time its files'
/// operations took, added up).
pub fn advise(trace: &Trace, runs: Vec<Run>, by: RankBy) -> Advice {
    let share = sharing(trace);
    let mut ranked = runs;
    // A trace's idle time can dwarf what the policies change: by elapsed
    // time, runs within 0.1 % of the best are equals. Stable: equal
    // outcomes keep the sweep's order.
    let step = step_of(&ranked);
    ranked.sort_by(|a, b| order(by, step, &a.outcome, &b.outcome));
    let default = ranked.iter().position(|r| r.choice == Choice::default()).unwrap_or(0);
    let worst = share.iter().copied().max().unwrap_or(Sharing::Private);
    let safe = ranked.iter().map(|r| worst.allows(r.choice.consistency)).collect();
    let same_as = (0..ranked.len())
        .map(|i| (0..i).find(|&j| ranked[j].outcome == ranked[i].outcome))
        .collect();
    let mut by_dir: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (f, name) in trace.files.iter().enumerate() {
        by_dir.entry(dir_of(name)).or_default().push(f);
    }
    let mut unadvised = Vec::new();
    let dirs = by_dir
        .into_iter()
        .filter_map(|(dir, files)| {
            let sharing = files.iter().map(|&f| share[f]).max()?;
            let time = |r: &Run| files.iter().map(|&f| r.outcome.file_time[f]).sum::<f64>();
            let Some(best) = (0..ranked.len())
                .filter(|&i| sharing.allows(ranked[i].choice.consistency))
                .min_by(|&a, &b| time(&ranked[a]).total_cmp(&time(&ranked[b])).then(a.cmp(&b)))
            else {
                unadvised.push((dir, sharing));
                return None;
            };
            Some(DirAdvice {
                dir,
                files: files.len(),
                sharing,
                best,
                time: time(&ranked[best]),
                default_time: time(&ranked[default]),
            })
        })
        .collect();
    let mut counts = BTreeMap::new();
    for s in &share {
        *counts.entry(*s).or_insert(0) += 1;
    }
    Advice {
        ranked,
        default,
        safe,
        same_as,
        dirs,
        unadvised,
        sharing: counts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::records::parse_csv;

    fn trace(csv: &str) -> Trace {
        let mut t = parse_csv(&format!("{}\n{csv}", parcache_core::trace::CSV_HEADER)).unwrap();
        t.finish();
        t
    }

    #[test]
    fn sharing_is_told_from_sessions_and_bytes() {
        let t = trace(
            "0,a,1,/p/private,open,0,1,0\n\
             0.1,a,1,/p/private,write,0,100,0\n\
             0.2,a,1,/p/private,close,0,0,0\n\
             0,a,1,/r/input,read,0,100,0\n\
             0,b,1,/r/input,read,0,100,0\n\
             1,a,1,/s/handoff,open,0,1,0\n\
             1.1,a,1,/s/handoff,write,0,100,0\n\
             1.2,a,1,/s/handoff,close,0,0,0\n\
             2,b,1,/s/handoff,open,0,0,0\n\
             2.1,b,1,/s/handoff,read,0,100,0\n\
             2.2,b,1,/s/handoff,close,0,0,0\n\
             3,a,1,/d/parts,open,0,1,0\n\
             3,b,1,/d/parts,open,0,1,0\n\
             3.1,a,1,/d/parts,write,0,100,0\n\
             3.1,b,1,/d/parts,write,100,100,0\n\
             3.2,a,1,/d/parts,close,0,0,0\n\
             3.2,b,1,/d/parts,close,0,0,0\n\
             4,a,1,/c/same,open,0,1,0\n\
             4,b,1,/c/same,open,0,0,0\n\
             4.1,a,1,/c/same,write,0,100,0\n\
             4.1,b,1,/c/same,read,50,10,0\n\
             4.2,a,1,/c/same,close,0,0,0\n\
             4.2,b,1,/c/same,close,0,0,0\n",
        );
        let s = sharing(&t);
        let of = |name: &str| s[t.files.iter().position(|f| f == name).unwrap()];
        assert_eq!(of("/p/private"), Sharing::Private);
        assert_eq!(of("/r/input"), Sharing::ReadShared);
        assert_eq!(of("/s/handoff"), Sharing::Sequential);
        assert_eq!(of("/d/parts"), Sharing::Disjoint);
        assert_eq!(of("/c/same"), Sharing::Conflicting);
        // Conflicting sharing allows only the coherent plug-ins.
        assert!(!Sharing::Conflicting.allows(ConsistencyKind::CloseToOpen));
        assert!(Sharing::Conflicting.allows(ConsistencyKind::SyncWrite));
        assert!(!Sharing::Sequential.allows(ConsistencyKind::None));
        assert!(Sharing::Private.allows(ConsistencyKind::None));
    }

    #[test]
    fn directories_are_resolved_by_name() {
        assert_eq!(dir_of("/a/build/../bench/f"), "/a/bench");
        assert_eq!(dir_of("/f"), "/");
        assert_eq!(dir_of("f"), ".");
        assert_eq!(dir_of("d/./f"), "d");
    }

    #[test]
    fn latest_answers_for_other_nodes() {
        let mut l = Latest::default();
        l.add(5.0, 1);
        l.add(9.0, 1);
        assert_eq!(l.other_than(1), f64::NEG_INFINITY);
        assert_eq!(l.other_than(2), 9.0);
        l.add(7.0, 2);
        assert_eq!(l.other_than(1), 7.0);
        l.add(3.0, 3);
        assert_eq!(l.other_than(1), 7.0);
        l.add(12.0, 3);
        assert_eq!(l.other_than(3), 9.0);
        assert_eq!(l.other_than(1), 12.0);
    }

    #[test]
    fn space_counts_posix_once_and_narrows_by_name() {
        let one = Space::for_trace(&[Sharing::Private], 1);
        let c = one.choices();
        // 7 write × 2 replacement × 4 prefetch × 6 caching plug-ins, posix once.
        assert_eq!(c.len(), 7 * 2 * 4 * 6 + 1);
        assert_eq!(c[0], Choice::default());
        assert_eq!(c.iter().filter(|c| c.consistency == ConsistencyKind::Posix).count(), 1);
        let shared = Space::for_trace(&[Sharing::Conflicting], 3);
        assert_eq!(
            shared.consistency,
            vec![
                ConsistencyKind::Sprite,
                ConsistencyKind::Posix,
                ConsistencyKind::SyncWrite
            ]
        );
        assert_eq!(shared.cooperative.len(), 3);
        let mut s = one.clone();
        s.only("write=write-back,periodic(interval=5s,age=30s)").unwrap();
        assert_eq!(s.write.len(), 2);
        s.only("cooperative=n-chance(n=1)").unwrap();
        assert_eq!(s.cooperative, vec![CooperativeKind::NChance { n: 1 }]);
        assert!(s.only("write=sometimes").unwrap_err().contains("write"));
        assert!(s.only("colour=red").is_err());
        assert!(s.only("write=a,,b").is_err());
    }

    #[test]
    fn advice_ranks_by_time_and_keeps_each_directory_within_its_sharing() {
        // Two nodes take turns on /s/log; /p/scratch is private to node a
        // and is written again and again (write-back saves its rewrites).
        let mut csv = String::new();
        for i in 0..40 {
            let t = i as f64;
            csv += &format!("{t},a,1,/p/scratch,write,0,65536,0\n");
        }
        csv += "41,a,1,/s/log,open,0,1,0\n41.1,a,1,/s/log,write,0,65536,0\n41.2,a,1,/s/log,close,0,0,0\n";
        csv += "42,b,1,/s/log,open,0,0,0\n42.1,b,1,/s/log,read,0,65536,0\n42.2,b,1,/s/log,close,0,0,0\n";
        let t = trace(&csv);
        let share = sharing(&t);
        let mut space = Space::for_trace(&share, 2);
        space.only("replacement=lru").unwrap();
        space.only("prefetch=none").unwrap();
        space.only("cooperative=none").unwrap();
        space.only("write=write-through,write-back").unwrap();
        // The private file lets `none` into the sweep.
        assert!(space.consistency.contains(&ConsistencyKind::None));
        let choices = space.choices();
        let runs = sweep(&t, &ClusterModel::default(), &choices, 2, &|| {}).unwrap();
        let again = sweep(&t, &ClusterModel::default(), &choices, 1, &|| {}).unwrap();
        assert!(
            runs.iter().zip(&again).all(|(a, b)| a.outcome == b.outcome),
            "same inputs, same runs"
        );
        let by_elapsed = advise(&t, runs.clone(), RankBy::Elapsed);
        let best = by_elapsed.ranked[0].outcome.elapsed;
        for w in by_elapsed.ranked.windows(2) {
            assert!(w[0].outcome.elapsed <= w[1].outcome.elapsed + best * 2e-3);
        }
        let a = advise(&t, runs, RankBy::IoTime);
        for w in a.ranked.windows(2) {
            assert!(w[0].outcome.io_time <= w[1].outcome.io_time);
        }
        assert_eq!(a.ranked[a.default].choice, Choice::default());
        let dir = |d: &str| a.dirs.iter().find(|x| x.dir == d).unwrap();
        let s = dir("/s");
        assert_eq!(s.sharing, Sharing::Sequential);
        assert_ne!(a.ranked[s.best].choice.consistency, ConsistencyKind::None);
        let p = dir("/p");
        assert_eq!(p.sharing, Sharing::Private);
        assert!(p.time <= p.default_time);
        assert!(a.unadvised.is_empty());
        // Narrowed to `none`, a directory written and read at once on two
        // nodes gets no advice (not even the default, close-to-open), and
        // says so.
        let c = trace(
            "0,a,1,/c/same,open,0,1,0\n0,b,1,/c/same,open,0,0,0\n0.1,a,1,/c/same,write,0,100,0\n\
             0.1,b,1,/c/same,read,0,100,0\n0.2,a,1,/c/same,close,0,0,0\n0.2,b,1,/c/same,close,0,0,0\n",
        );
        let mut only_none = Space::for_trace(&sharing(&c), 2);
        only_none.only("consistency=none").unwrap();
        only_none.only("write=write-back").unwrap();
        let runs = sweep(&c, &ClusterModel::default(), &only_none.choices(), 1, &|| {}).unwrap();
        let n = advise(&c, runs, RankBy::IoTime);
        assert_eq!(n.unadvised, vec![("/c".to_string(), Sharing::Conflicting)]);
        assert!(n.dirs.is_empty());
        // Runs that use `none` are not safe for the whole trace.
        for (r, safe) in a.ranked.iter().zip(&a.safe) {
            assert_eq!(*safe, r.choice.consistency != ConsistencyKind::None, "{}", r.choice);
        }
    }

    #[test]
    fn greedy_search_walks_key_by_key_from_the_default() {
        // A private file rewritten in place, then read back twice.
        let mut csv = String::new();
        for i in 0..30 {
            csv += &format!("{},a,1,/p/f,write,{},65536,0\n", i as f64 * 0.01, (i % 10) << 16);
        }
        for i in 0..20 {
            csv += &format!("{},a,1,/p/f,read,{},65536,0\n", 1.0 + i as f64 * 0.01, (i % 10) << 16);
        }
        let t = trace(&csv);
        let space = Space::for_trace(&sharing(&t), 1);
        let full = space.choices();
        let count = std::sync::atomic::AtomicUsize::new(0);
        let runs = greedy(&t, &ClusterModel::default(), &space, 2, RankBy::IoTime, &|| {
            count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        })
        .unwrap();
        assert_eq!(count.into_inner(), runs.len(), "progress once per run");
        assert_eq!(runs[0].choice, Choice::default());
        assert!(runs.len() < full.len() / 3, "{} of {}", runs.len(), full.len());
        for (i, r) in runs.iter().enumerate() {
            assert!(full.contains(&r.choice), "{} is in the space", r.choice);
            assert!(
                runs[..i].iter().all(|o| o.choice != r.choice),
                "{} replayed twice",
                r.choice
            );
        }
        // Every value of every key was tried at least once.
        assert!(space.write.iter().all(|w| runs.iter().any(|r| r.choice.write == *w)));
        assert!(space
            .prefetch
            .iter()
            .all(|p| runs.iter().any(|r| r.choice.prefetch == *p)));
        // The same on one thread; the best is no worse than the default.
        let again = greedy(&t, &ClusterModel::default(), &space, 1, RankBy::IoTime, &|| {}).unwrap();
        assert!(runs
            .iter()
            .zip(&again)
            .all(|(a, b)| a.choice == b.choice && a.outcome == b.outcome));
        assert_eq!(runs.len(), again.len());
        let a = advise(&t, runs, RankBy::IoTime);
        assert!(a.ranked[0].outcome.io_time <= a.ranked[a.default].outcome.io_time);
    }

    #[test]
    fn auto_searches_greedily_only_when_the_sweep_is_too_big() {
        let small = trace("0,a,1,/f,write,0,65536,0\n0.1,a,1,/f,read,0,100,0\n");
        assert_eq!(trace_blocks(&small), 2);
        let space = Space::for_trace(&sharing(&small), 1);
        assert_eq!(auto_search(&small, &space), Search::Full);
        // 16 TiB written: 2^28 blocks, times hundreds of combinations.
        let big = trace("0,a,1,/f,write,0,17592186044416,0\n");
        assert_eq!(trace_blocks(&big), 1 << 28);
        assert_eq!(auto_search(&big, &space), Search::Greedy);
        // Narrowed to 2 combinations, the same trace is swept whole.
        let mut two = space.clone();
        for kv in [
            "write=write-back,write-through",
            "replacement=lru",
            "prefetch=none",
            "consistency=close-to-open",
        ] {
            two.only(kv).unwrap();
        }
        assert!(two.choices().len() <= 3, "{}", two.choices().len());
        assert_eq!(auto_search(&big, &two), Search::Full);
    }
}
