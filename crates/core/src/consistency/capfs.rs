//! CAPFS's consistency machinery (Vilayannur et al. 2005 §3.4–3.6): a file
//! is a *recipe*, the list of the hashes of its chunks; chunks live on
//! content-addressed servers by hash; writers store new chunks first and
//! then *commit* `(chunk index, old hash, new hash)` at the metadata server,
//! which serialises commits, rejects one whose old hashes no longer match
//! (unless it is forced), and keeps the nodes' hash caches (H-caches)
//! coherent when asked. The five presets of Table 1 (`seq_1.rs` …
//! `rel_1.rs`) are settings of the parameters here.
//!
//! Both halves are pure: [`RecipeServer`] is the metadata server's,
//! [`HCache`] the node's cache of hashes. The simulator drives them
//! (`parcache sim run capfs05-…`).

use super::{Action, Callback, Consistency, ConsistencyKind, KernelCache, NodeFile, ServerView};
use crate::ids::{FileId, NodeId};
use crate::time::Time;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

/// A chunk's name: its content hash (blake3 or SHA-256 in a real store).
pub type ChunkHash = [u8; 32];

/// The hash of a chunk never written: it reads as zeros.
pub const HOLE: ChunkHash = [0; 32];

/// The parameters a CAPFS plug-in sets at open (2005 §3.6, "Setting
/// Parameters at Open").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct CapfsParams {
    /// Keep hashes in the node's H-cache (reads need no hash fetch when
    /// they hit; writes know their old hashes).
    pub use_hcache: bool,
    /// The metadata server invalidates other nodes' H-cache entries before
    /// a commit completes.
    pub hcache_coherence: bool,
    /// Commits replace the hashes whatever the server has (no conflict
    /// check, no retry).
    pub force_commit: bool,
    /// Commits wait at the node until close (or an fsync).
    pub delay_commit: bool,
    /// Hashes fetched from the metadata server in one request.
    pub num_hashes: u32,
}

impl CapfsParams {
    /// A row of Table 1: the three parameters that define the presets,
    /// `delay_commit` off and `num_hashes` the default.
    pub const fn table_1(use_hcache: bool, hcache_coherence: bool, force_commit: bool) -> CapfsParams {
        CapfsParams {
            use_hcache,
            hcache_coherence,
            force_commit,
            delay_commit: false,
            num_hashes: Self::DEFAULT_NUM_HASHES,
        }
    }

    /// Hashes per fetch when not set: a 16 KiB chunk's worth of 64-byte
    /// entries, a few RPCs for a gigabyte file of 16 KiB chunks.
    pub const DEFAULT_NUM_HASHES: u32 = 256;

    /// Whether the metadata server should remember that `node` holds
    /// hashes of a file (to invalidate them at another node's commit).
    pub fn registers_holders(&self) -> bool {
        self.use_hcache && self.hcache_coherence
    }

    /// Whether the preset gives sequential consistency (every read returns
    /// the last committed write): conflicts are checked, and cached hashes
    /// are either not used or kept coherent.
    pub fn sequential(&self) -> bool {
        !self.force_commit && (!self.use_hcache || self.hcache_coherence)
    }
}

impl CapfsParams {
    /// The presets of Table 1, by name.
    pub const PRESETS: [(&'static str, CapfsParams); 5] = [
        ("seq-1", super::seq_1::PARAMS),
        ("seq-2", super::seq_2::PARAMS),
        ("for-1", super::for_1::PARAMS),
        ("for-2", super::for_2::PARAMS),
        ("rel-1", super::rel_1::PARAMS),
    ];

    /// The preset these parameters are, if any.
    pub fn preset(&self) -> Option<&'static str> {
        Self::PRESETS.iter().find(|(_, p)| p == self).map(|(n, _)| *n)
    }
}

/// The node's half of a CAPFS plug-in. Its files are content-addressed:
/// nothing goes through the node's block cache (the driver reads and writes
/// chunks through the H-cache and D-cache), the kernel's page cache is
/// bypassed, and the metadata server's invalidations drop cached hashes.
#[derive(Clone, Copy, Debug)]
pub struct Capfs(pub CapfsParams);

impl Consistency for Capfs {
    fn kind(&self) -> ConsistencyKind {
        ConsistencyKind::Capfs(self.0)
    }

    /// Nothing is cached but hashes. An H-cache that no callback keeps
    /// coherent (`rel-1`) is checked at open instead: the file's hashes are
    /// dropped when another commit moved its version since this node saw
    /// it, so stale hashes live at most until the file is opened again
    /// (the paper leaves their lifetime open, 2005 §4 Table 1).
    fn post_open(&self, file: &mut NodeFile, _now: Time, server: ServerView, _cacheable: bool) -> Vec<Action> {
        file.opens += 1;
        file.cached = false;
        let moved = file.version != server.version;
        file.version = server.version;
        if self.0.use_hcache && !self.0.hcache_coherence && moved {
            vec![Action::DropHashes]
        } else {
            vec![]
        }
    }

    /// With `delay_commit`, a close (each descriptor's flush, and the
    /// release) commits what the node's writes held back: the changes
    /// reach the file together, forced (2005 §3.6: "delay the commits till
    /// the time of a close, set the force_commit flag").
    fn flush(&self, _file: &mut NodeFile, _now: Time) -> Vec<Action> {
        self.commit_delayed()
    }

    fn release(&self, file: &mut NodeFile, _now: Time, _write: bool) -> Vec<Action> {
        file.opens = file.opens.saturating_sub(1);
        self.commit_delayed()
    }

    fn called_back(&self, _file: &mut NodeFile, cb: Callback) -> Vec<Action> {
        match cb {
            Callback::Invalidate => vec![Action::DropHashes],
            _ => vec![Action::PushDirty, Action::ReportSize],
        }
    }

    fn kernel_cache(&self) -> KernelCache {
        KernelCache::Bypass
    }

    fn capfs(&self) -> Option<CapfsParams> {
        Some(self.0)
    }

    /// A content-addressed file's writes commit whole at the metadata
    /// server against the hashes the writer read (§3.2); an append is
    /// placed at the end the node knows, as any write.
    fn appends_at_server(&self) -> bool {
        false
    }
}

impl Capfs {
    fn commit_delayed(&self) -> Vec<Action> {
        if self.0.delay_commit {
            vec![Action::CommitDelayed]
        } else {
            vec![]
        }
    }
}

/// A commit's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Commit {
    /// The recipe now has the new hashes. Before the commit is complete,
    /// `invalidate` (nodes holding hashes of the file) drop them; chunks in
    /// `released` are named by no recipe any more and may be collected.
    Done {
        invalidate: Vec<(NodeId, Vec<u64>)>,
        released: Vec<ChunkHash>,
    },
    /// An old hash did not match: another commit came first. The writer
    /// fetches these current hashes, redoes its write on the current
    /// chunks and commits again (its stored chunks are orphans now).
    Conflict { current: Vec<(u64, ChunkHash)> },
}

/// The changes of a commit whose old hash is no longer the recipe's, with
/// the recipe's current hash (2005 §3.4.4): empty when the commit may apply.
pub fn stale(recipe: &[ChunkHash], changes: &[(u64, ChunkHash, ChunkHash)]) -> Vec<(u64, ChunkHash)> {
    let current: Vec<ChunkHash> = changes
        .iter()
        .map(|(i, _, _)| recipe.get(*i as usize).copied().unwrap_or(HOLE))
        .collect();
    stale_at(&current, changes)
}

/// As [`stale`], given only the recipe's hash at each change's chunk
/// (`current[k]` for `changes[k]`, as a store that keeps recipes in pages
/// reads them); a chunk changed twice is checked against the first new hash.
pub fn stale_at(current: &[ChunkHash], changes: &[(u64, ChunkHash, ChunkHash)]) -> Vec<(u64, ChunkHash)> {
    let mut now: HashMap<u64, ChunkHash> = HashMap::new();
    let mut out = Vec::new();
    for (&(i, old, new), &cur) in changes.iter().zip(current) {
        let cur = *now.get(&i).unwrap_or(&cur);
        if cur != old {
            out.push((i, cur));
        }
        now.insert(i, new);
    }
    out
}

/// What a commit does to chunk references, given the recipe's hash at each
/// change's chunk: the hashes it names and those it no longer names (holes
/// left out), as [`apply`] returns them.
pub fn references(current: &[ChunkHash], changes: &[(u64, ChunkHash, ChunkHash)]) -> (Vec<ChunkHash>, Vec<ChunkHash>) {
    let mut now: HashMap<u64, ChunkHash> = HashMap::new();
    let (mut named, mut unnamed) = (Vec::new(), Vec::new());
    for (&(i, _, new), &cur) in changes.iter().zip(current) {
        let old = now.insert(i, new).unwrap_or(cur);
        if new != HOLE {
            named.push(new);
        }
        if old != HOLE {
            unnamed.push(old);
        }
    }
    (named, unnamed)
}

/// Applies a commit's changes to a recipe (growing it with holes as
/// needed); returns the hashes it now names and those it no longer names
/// (one per change, holes left out), for the references to follow.
pub fn apply(recipe: &mut Vec<ChunkHash>, changes: &[(u64, ChunkHash, ChunkHash)]) -> (Vec<ChunkHash>, Vec<ChunkHash>) {
    let (mut named, mut unnamed) = (Vec::new(), Vec::new());
    for &(i, _, new) in changes {
        let i = i as usize;
        if recipe.len() <= i {
            recipe.resize(i + 1, HOLE);
        }
        let old = std::mem::replace(&mut recipe[i], new);
        if new != HOLE {
            named.push(new);
        }
        if old != HOLE {
            unnamed.push(old);
        }
    }
    (named, unnamed)
}

/// The metadata server's half: recipes, chunk references and the nodes
/// holding hashes of each file.
#[derive(Debug, Default)]
pub struct RecipeServer {
    recipes: HashMap<FileId, Vec<ChunkHash>>,
    refs: HashMap<ChunkHash, u64>,
    /// Per file and chunk, the nodes that fetched its hash to keep.
    holders: HashMap<FileId, HashMap<u64, BTreeSet<NodeId>>>,
    /// Commits done and conflicts found, for counters.
    pub commits: u64,
    pub conflicts: u64,
}

impl RecipeServer {
    pub fn new() -> Self {
        Self::default()
    }

    /// The file's length in chunks.
    pub fn chunks(&self, file: FileId) -> u64 {
        self.recipes.get(&file).map_or(0, |r| r.len() as u64)
    }

    /// Hashes of chunks `from..from + count` (holes past the end), for
    /// `node`; `register` remembers the node as a holder (coherent H-cache).
    pub fn hashes(&mut self, node: NodeId, file: FileId, from: u64, count: u64, register: bool) -> Vec<ChunkHash> {
        if register {
            let h = self.holders.entry(file).or_default();
            for i in from..from + count {
                h.entry(i).or_default().insert(node);
            }
        }
        let r = self.recipes.get(&file);
        (from..from + count)
            .map(|i| r.and_then(|r| r.get(i as usize)).copied().unwrap_or(HOLE))
            .collect()
    }

    /// `node` commits `changes` (chunk index, the hash it read, the new
    /// hash) to `file`. Unless `force`, every old hash must still be the
    /// recipe's; all changes apply or none. With `coherence`, every other
    /// holder of the file's hashes is to be invalidated.
    pub fn commit(
        &mut self,
        node: NodeId,
        file: FileId,
        changes: &[(u64, ChunkHash, ChunkHash)],
        force: bool,
        coherence: bool,
    ) -> Commit {
        let recipe = self.recipes.entry(file).or_default();
        if !force {
            let current = stale(recipe, changes);
            if !current.is_empty() {
                self.conflicts += 1;
                return Commit::Conflict { current };
            }
        }
        let (named, unnamed) = apply(recipe, changes);
        for h in named {
            *self.refs.entry(h).or_default() += 1;
        }
        let mut released = Vec::new();
        for old in unnamed {
            let n = self.refs.get_mut(&old).expect("a recipe's chunk is referenced");
            *n -= 1;
            if *n == 0 {
                self.refs.remove(&old);
                released.push(old);
            }
        }
        self.commits += 1;
        // The other holders of the changed chunks' hashes drop them (and
        // register again when they fetch them again).
        let mut invalidate: BTreeMap<NodeId, Vec<u64>> = BTreeMap::new();
        if coherence {
            if let Some(h) = self.holders.get_mut(&file) {
                for &(i, _, _) in changes {
                    if let Some(nodes) = h.get_mut(&i) {
                        for &n in nodes.iter().filter(|&&n| n != node) {
                            invalidate.entry(n).or_default().push(i);
                        }
                        nodes.retain(|&n| n == node);
                    }
                }
            }
        }
        Commit::Done {
            invalidate: invalidate.into_iter().collect(),
            released,
        }
    }

    /// The file was removed: its chunks no recipe names any more.
    pub fn remove(&mut self, file: FileId) -> Vec<ChunkHash> {
        self.holders.remove(&file);
        let mut released = Vec::new();
        for h in self.recipes.remove(&file).unwrap_or_default() {
            if h == HOLE {
                continue;
            }
            let n = self.refs.get_mut(&h).expect("referenced");
            *n -= 1;
            if *n == 0 {
                self.refs.remove(&h);
                released.push(h);
            }
        }
        released
    }

    /// Whether any recipe names `hash` (a chunk store's collection asks).
    pub fn is_referenced(&self, hash: &ChunkHash) -> bool {
        self.refs.contains_key(hash)
    }

    /// Distinct chunks named by all recipes, and chunk slots in all
    /// recipes: physical against logical size, in chunks.
    pub fn chunk_counts(&self) -> (u64, u64) {
        let logical = self.recipes.values().flatten().filter(|h| **h != HOLE).count() as u64;
        (self.refs.len() as u64, logical)
    }
}

/// The node's H-cache: hashes of files' chunks, least recently used out
/// first, bounded (2005 §3.3; the paper's cap on hashes per file is what
/// made its read bandwidth drop past 4 GB).
#[derive(Debug)]
pub struct HCache {
    capacity: usize,
    entries: HashMap<(FileId, u64), (ChunkHash, u64)>,
    order: BTreeMap<u64, (FileId, u64)>,
    tick: u64,
    pub hits: u64,
    pub misses: u64,
}

impl HCache {
    pub fn new(capacity: usize) -> Self {
        HCache {
            capacity: capacity.max(1),
            entries: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
            hits: 0,
            misses: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The cached hash of chunk `index` of `file`.
    pub fn get(&mut self, file: FileId, index: u64) -> Option<ChunkHash> {
        self.tick += 1;
        let tick = self.tick;
        match self.entries.get_mut(&(file, index)) {
            Some((h, t)) => {
                self.order.remove(t);
                *t = tick;
                self.order.insert(tick, (file, index));
                self.hits += 1;
                Some(*h)
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Which of chunks `from..to` of `file` are not cached, as runs of at
    /// most `batch` (each one fetch from the metadata server).
    pub fn missing(&mut self, file: FileId, from: u64, to: u64, batch: u32) -> VecDeque<(u64, u64)> {
        let mut runs = VecDeque::new();
        let mut run: Option<(u64, u64)> = None;
        for i in from..to {
            if self.get(file, i).is_some() {
                if let Some(r) = run.take() {
                    runs.push_back(r);
                }
                continue;
            }
            match &mut run {
                Some((_, n)) if *n < batch as u64 => *n += 1,
                _ => {
                    if let Some(r) = run.take() {
                        runs.push_back(r);
                    }
                    run = Some((i, 1));
                }
            }
        }
        runs.extend(run);
        runs
    }

    pub fn put(&mut self, file: FileId, index: u64, hash: ChunkHash) {
        self.tick += 1;
        if let Some((_, t)) = self.entries.insert((file, index), (hash, self.tick)) {
            self.order.remove(&t);
        }
        self.order.insert(self.tick, (file, index));
        while self.entries.len() > self.capacity {
            let (_, key) = self.order.pop_first().expect("non-empty");
            self.entries.remove(&key);
        }
    }

    /// Drops the hashes of chunks `chunks` of `file` (an invalidation from
    /// the server).
    pub fn invalidate_chunks(&mut self, file: FileId, chunks: &[u64]) {
        for &i in chunks {
            if let Some((_, t)) = self.entries.remove(&(file, i)) {
                self.order.remove(&t);
            }
        }
    }

    /// Drops every hash of `file`.
    pub fn invalidate(&mut self, file: FileId) {
        let keys: Vec<(FileId, u64)> = self.entries.keys().filter(|(f, _)| *f == file).copied().collect();
        for k in keys {
            if let Some((_, t)) = self.entries.remove(&k) {
                self.order.remove(&t);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(n: u8) -> ChunkHash {
        [n; 32]
    }

    /// A non-coherent H-cache is dropped at an open after another commit;
    /// a coherent one (callbacks keep it) and no H-cache never are.
    #[test]
    fn a_non_coherent_h_cache_is_revalidated_at_open() {
        let at = |version| ServerView { size: 0, version };
        for (params, drops) in [
            (CapfsParams::table_1(true, false, true), true),
            (CapfsParams::table_1(true, true, false), false),
            (CapfsParams::table_1(false, false, false), false),
        ] {
            let p = Capfs(params);
            let mut f = NodeFile::new(at(3), Time::ZERO);
            assert!(
                p.post_open(&mut f, Time::ZERO, at(3), true).is_empty(),
                "unchanged: kept"
            );
            let acts = p.post_open(&mut f, Time::ZERO, at(4), true);
            assert_eq!(acts.contains(&Action::DropHashes), drops, "{params:?}");
            assert!(p.post_open(&mut f, Time::ZERO, at(4), true).is_empty());
        }
    }

    /// The page-wise forms agree with the whole-recipe ones, a chunk
    /// changed twice in one commit included.
    #[test]
    fn page_wise_checks_agree_with_whole_recipes() {
        let recipe = vec![h(1), HOLE, h(3)];
        let changes = [(0, h(1), h(7)), (2, h(9), h(8)), (0, h(7), h(6)), (5, HOLE, h(4))];
        let current: Vec<ChunkHash> = changes
            .iter()
            .map(|(i, _, _)| recipe.get(*i as usize).copied().unwrap_or(HOLE))
            .collect();
        assert_eq!(stale(&recipe, &changes), vec![(2, h(3))]);
        assert_eq!(stale_at(&current, &changes), vec![(2, h(3))]);
        let mut whole = recipe.clone();
        assert_eq!(references(&current, &changes), apply(&mut whole, &changes));
    }

    /// Delayed commits go at a close (flush or release), and only then.
    #[test]
    fn delayed_commits_go_at_close() {
        let delayed = CapfsParams {
            delay_commit: true,
            ..CapfsParams::table_1(false, false, true)
        };
        let mut f = NodeFile::new(ServerView { size: 0, version: 1 }, Time::ZERO);
        for (params, want) in [
            (delayed, vec![Action::CommitDelayed]),
            (CapfsParams::table_1(false, false, true), vec![]),
        ] {
            let p = Capfs(params);
            p.post_open(&mut f, Time::ZERO, ServerView { size: 0, version: 1 }, true);
            assert!(p
                .post_write(&mut f, Time::ZERO, true)
                .iter()
                .all(|a| *a != Action::CommitDelayed));
            assert_eq!(p.flush(&mut f, Time::ZERO), want);
            assert_eq!(p.release(&mut f, Time::ZERO, true), want);
            assert_eq!(f.opens, 0);
        }
    }

    #[test]
    fn a_commit_with_stale_old_hashes_is_refused_unless_forced() {
        let mut s = RecipeServer::new();
        assert!(matches!(
            s.commit(1, 7, &[(0, HOLE, h(1)), (1, HOLE, h(2))], false, false),
            Commit::Done { .. }
        ));
        // Node 2 read chunk 0 before node 1's commit: conflict, nothing applied.
        let c = s.commit(2, 7, &[(0, HOLE, h(3)), (1, h(2), h(4))], false, false);
        assert_eq!(
            c,
            Commit::Conflict {
                current: vec![(0, h(1))]
            }
        );
        assert_eq!(s.hashes(2, 7, 0, 3, false), vec![h(1), h(2), HOLE]);
        // Retried on the current hashes, it goes through and frees h(1).
        let c = s.commit(2, 7, &[(0, h(1), h(3))], false, false);
        assert_eq!(
            c,
            Commit::Done {
                invalidate: vec![],
                released: vec![h(1)]
            }
        );
        // Forced, the stale old hash does not matter.
        assert!(matches!(
            s.commit(3, 7, &[(1, HOLE, h(5))], true, false),
            Commit::Done { .. }
        ));
        assert_eq!((s.commits, s.conflicts), (3, 1));
    }

    #[test]
    fn identical_chunks_are_referenced_once_and_collected_when_unnamed() {
        let mut s = RecipeServer::new();
        for f in 1..=4 {
            s.commit(1, f, &[(0, HOLE, h(9)), (1, HOLE, h(8))], false, false);
        }
        assert_eq!(s.chunk_counts(), (2, 8), "four copies stored once");
        for f in 1..=3 {
            assert!(s.remove(f).is_empty());
        }
        let mut freed = s.remove(4);
        freed.sort();
        assert_eq!(freed, vec![h(8), h(9)]);
        assert!(!s.is_referenced(&h(9)));
    }

    #[test]
    fn coherent_commits_invalidate_the_other_holders() {
        let mut s = RecipeServer::new();
        s.hashes(1, 7, 0, 4, true);
        s.hashes(2, 7, 0, 4, true);
        s.hashes(3, 7, 0, 4, false);
        let Commit::Done { invalidate, .. } = s.commit(1, 7, &[(0, HOLE, h(1))], false, true) else {
            panic!()
        };
        assert_eq!(
            invalidate,
            vec![(2, vec![0])],
            "node 3 did not register; node 1 is the writer"
        );
        // Node 2 was dropped from the holders until it fetches again.
        let Commit::Done { invalidate, .. } = s.commit(1, 7, &[(0, h(1), h(2))], false, true) else {
            panic!()
        };
        assert!(invalidate.is_empty());
    }

    #[test]
    fn the_hcache_finds_runs_to_fetch_and_evicts_the_least_recent() {
        let mut c = HCache::new(4);
        for i in [0, 1, 5] {
            c.put(7, i, h(i as u8));
        }
        assert_eq!(c.missing(7, 0, 8, 2), VecDeque::from(vec![(2, 2), (4, 1), (6, 2)]));
        c.put(7, 9, h(9));
        c.put(7, 10, h(10));
        assert_eq!(c.len(), 4);
        assert_eq!(c.get(7, 0), None, "the least recently used went");
        c.invalidate(7);
        assert!(c.is_empty());
    }
}
