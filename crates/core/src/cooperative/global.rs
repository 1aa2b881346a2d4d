//! `global` (Vilayannur et al. 2003 §3.2.2): a second cache level below
//! each node's own cache, made of the node memories and shared by every
//! program. A node's miss goes to the block's home (hash placement, as
//! [`super::lru_interleaved::home`]), whose global cache returns the block
//! or fetches it from the data servers and keeps it. The paper ran one
//! global cache per file on one node; placing blocks by hash spreads it
//! over the tier as the 1996 paper's global memory did.
//!
//! This is the bookkeeping of one node's share: which blocks it holds,
//! hits and misses, and, for a file with a threshold, the runtime bypass
//! of §5 (a block enters only when its segment is hot, the decision
//! sticks) with [`Harvest`] as replacement. Without a threshold every block
//! enters and the least recently used leaves. Each request carries its
//! file's threshold, so files with different ones share the cache. The
//! bytes are the driver's.

use crate::block::BlockKey;
use crate::bypass::harvest::Harvest;
use crate::bypass::runtime::{Admit, RuntimeBypass};
use std::collections::{BTreeMap, HashMap};

/// What a node's global cache share counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GlobalStats {
    pub hits: u64,
    pub misses: u64,
    /// Blocks that entered.
    pub inserted: u64,
    pub evicted: u64,
    /// Misses the runtime kept out (counted once per access).
    pub bypassed: u64,
}

/// A request's outcome at the global cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    Hit,
    /// Not held; `admit`: whether the block enters once fetched (false:
    /// the runtime bypasses it, and the asking node should stop coming
    /// here for it, §5).
    Miss {
        admit: bool,
    },
}

/// One node's share of the global cache.
#[derive(Clone, Debug)]
pub struct GlobalCache {
    capacity: usize,
    clock: u64,
    stamps: HashMap<BlockKey, u64>,
    lru: BTreeMap<u64, BlockKey>,
    runtime: RuntimeBypass,
    harvest: Harvest,
    pub stats: GlobalStats,
}

impl GlobalCache {
    /// A share of `capacity` blocks, counting accesses per segment of
    /// `blocks_per_segment` blocks.
    pub fn new(capacity: usize, blocks_per_segment: u64) -> GlobalCache {
        GlobalCache {
            capacity,
            clock: 0,
            stamps: HashMap::new(),
            lru: BTreeMap::new(),
            runtime: RuntimeBypass::new(0, blocks_per_segment),
            harvest: Harvest::default(),
            stats: GlobalStats::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.stamps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stamps.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn contains(&self, key: BlockKey) -> bool {
        self.stamps.contains_key(&key)
    }

    fn touch(&mut self, key: BlockKey) {
        self.clock += 1;
        if let Some(old) = self.stamps.insert(key, self.clock) {
            self.lru.remove(&old);
        }
        self.lru.insert(self.clock, key);
    }

    fn admit(&mut self, key: BlockKey, threshold: u32) -> bool {
        if self.capacity == 0 {
            return false;
        }
        let a = self.runtime.admit_at(key, threshold) == Admit::Cache;
        if !a {
            self.stats.bypassed += 1;
        }
        a
    }

    /// A node reads `key` (of a file with runtime `threshold`, 0: off)
    /// through this cache.
    pub fn read(&mut self, key: BlockKey, threshold: u32) -> Lookup {
        self.runtime.accessed(key);
        if self.contains(key) {
            self.stats.hits += 1;
            self.touch(key);
            return Lookup::Hit;
        }
        self.stats.misses += 1;
        Lookup::Miss {
            admit: self.admit(key, threshold),
        }
    }

    /// A node writes `key` through this cache: whether the cache keeps the
    /// new bytes (a held block always does).
    pub fn write(&mut self, key: BlockKey, threshold: u32) -> bool {
        self.runtime.accessed(key);
        if self.contains(key) {
            self.touch(key);
            return true;
        }
        self.admit(key, threshold)
    }

    /// `key` enters (after [`Lookup::Miss`] with `admit`, or a kept
    /// write); returns the blocks that leave to make room: under a
    /// threshold, by [`Harvest`], else the least recently used.
    pub fn insert(&mut self, key: BlockKey, threshold: u32) -> Vec<BlockKey> {
        let mut out = Vec::new();
        if self.capacity == 0 {
            return out;
        }
        if !self.contains(key) {
            while self.len() >= self.capacity {
                let Some(v) = self.victim(threshold) else { break };
                self.drop_key(v);
                self.stats.evicted += 1;
                out.push(v);
            }
            self.stats.inserted += 1;
            self.harvest.inserted(key);
        }
        self.touch(key);
        out
    }

    fn victim(&mut self, threshold: u32) -> Option<BlockKey> {
        if threshold > 0 {
            self.harvest.victim(&mut self.runtime.counters, threshold)
        } else {
            self.lru.values().next().copied()
        }
    }

    fn drop_key(&mut self, key: BlockKey) {
        if let Some(s) = self.stamps.remove(&key) {
            self.lru.remove(&s);
        }
        self.harvest.removed(key);
    }

    /// `key` is stale (written around this cache): it leaves.
    pub fn invalidate(&mut self, key: BlockKey) {
        self.drop_key(key);
    }

    /// Every block of `file` leaves (a newer version, or removed); the
    /// runtime's decisions about it are forgotten. Returns what left.
    pub fn forget_file(&mut self, file: u64) -> Vec<BlockKey> {
        let gone: Vec<BlockKey> = self.stamps.keys().filter(|k| k.file == file).copied().collect();
        for k in &gone {
            self.drop_key(*k);
        }
        self.runtime.forget_file(file);
        gone
    }

    /// The segment counter histogram: (lower bound, segments), powers of
    /// two.
    pub fn histogram(&self) -> Vec<(u32, u64)> {
        self.runtime.counters.histogram()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(i: u64) -> BlockKey {
        BlockKey::new(3, i)
    }

    #[test]
    fn without_a_threshold_everything_enters_and_lru_leaves() {
        let mut g = GlobalCache::new(2, 4);
        assert_eq!(g.read(k(0), 0), Lookup::Miss { admit: true });
        assert!(g.insert(k(0), 0).is_empty());
        g.read(k(1), 0);
        g.insert(k(1), 0);
        assert_eq!(g.read(k(0), 0), Lookup::Hit);
        g.read(k(2), 0);
        assert_eq!(g.insert(k(2), 0), vec![k(1)], "1 is least recently used");
        assert_eq!(g.stats.hits, 1);
        assert_eq!(g.stats.misses, 3);
        g.invalidate(k(0));
        assert!(!g.contains(k(0)));
        assert_eq!(g.forget_file(3), vec![k(2)]);
        assert!(g.is_empty());
    }

    #[test]
    fn runtime_bypass_keeps_cold_segments_out_and_harvest_evicts_cold_first() {
        // Threshold 3, segments of 4 blocks: blocks 0..=3 share a counter.
        let mut g = GlobalCache::new(2, 4);
        assert_eq!(g.read(k(0), 3), Lookup::Miss { admit: true }, "first access: no check");
        g.insert(k(0), 3);
        // The segment's second access: 2 <= 3, block 1 is bypassed.
        assert_eq!(g.read(k(1), 3), Lookup::Miss { admit: false });
        assert_eq!(g.stats.bypassed, 1);
        assert_eq!(g.read(k(0), 3), Lookup::Hit);
        assert_eq!(g.read(k(0), 3), Lookup::Hit);
        // Five accesses now: block 2 enters.
        assert_eq!(g.read(k(2), 3), Lookup::Miss { admit: true });
        g.insert(k(2), 3);
        // A new segment's first block needs room: harvest passes over
        // block 0 (counter 5, halved to 2), then takes block 2, now cold.
        assert_eq!(g.read(k(4), 3), Lookup::Miss { admit: true });
        assert_eq!(g.insert(k(4), 3), vec![k(2)]);
        assert!(g.contains(k(0)));
        // Block 1's decision sticks though its segment got hot.
        for _ in 0..10 {
            g.read(k(0), 3);
        }
        assert_eq!(g.read(k(1), 3), Lookup::Miss { admit: false });
        assert_eq!(g.stats.bypassed, 2);
        assert_eq!(
            g.histogram().iter().map(|(_, n)| n).sum::<u64>(),
            2,
            "two segments counted"
        );
        // Forgetting the file forgets the decision.
        g.forget_file(3);
        assert_eq!(
            g.read(k(1), 3),
            Lookup::Miss { admit: true },
            "decided anew: the segment is hot"
        );
    }

    #[test]
    fn a_held_block_takes_writes_and_zero_capacity_holds_nothing() {
        let mut g = GlobalCache::new(1, 4);
        assert!(g.write(k(0), 0));
        g.insert(k(0), 0);
        assert!(g.write(k(0), 0));
        let mut z = GlobalCache::new(0, 4);
        assert_eq!(z.read(k(0), 0), Lookup::Miss { admit: false });
        assert!(z.insert(k(0), 0).is_empty());
        assert!(z.is_empty());
    }
}
