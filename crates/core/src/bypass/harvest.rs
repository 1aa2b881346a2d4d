//! `harvest`: the global cache's replacement under runtime bypass
//! (Vilayannur et al. 2003 §5): "the harvester on the global cache examines
//! all currently residing blocks to find a candidate for replacement whose
//! counter is below the threshold (and does some aging of counters when
//! doing so)". Here the scan starts at the block that entered longest ago;
//! each block passed over has its segment counter halved and goes to the
//! back; if no block is below the threshold after one full scan, the block
//! at the front (now the least recently scanned) goes.

use super::runtime::SegmentCounters;
use crate::block::BlockKey;
use std::collections::{HashMap, VecDeque};

/// The resident blocks in the order the harvester scans them. A block that
/// leaves stays in the ring until the scan reaches it (its entry no longer
/// matches), so leaving costs O(1) however big the cache.
#[derive(Clone, Debug, Default)]
pub struct Harvest {
    ring: VecDeque<(BlockKey, u64)>,
    resident: HashMap<BlockKey, u64>,
    next: u64,
}

impl Harvest {
    pub fn len(&self) -> usize {
        self.resident.len()
    }

    pub fn is_empty(&self) -> bool {
        self.resident.is_empty()
    }

    pub fn contains(&self, key: BlockKey) -> bool {
        self.resident.contains_key(&key)
    }

    /// `key` entered the global cache.
    pub fn inserted(&mut self, key: BlockKey) {
        if !self.resident.contains_key(&key) {
            self.next += 1;
            self.resident.insert(key, self.next);
            self.ring.push_back((key, self.next));
        }
        // Stale entries would otherwise pile up under churn.
        if self.ring.len() > 2 * self.resident.len() + 64 {
            let live = &self.resident;
            self.ring.retain(|(k, g)| live.get(k) == Some(g));
        }
    }

    /// `key` left the global cache (invalidated, or its file removed).
    pub fn removed(&mut self, key: BlockKey) {
        self.resident.remove(&key);
    }

    fn pop_live(&mut self) -> Option<BlockKey> {
        while let Some((k, g)) = self.ring.pop_front() {
            if self.resident.get(&k) == Some(&g) {
                return Some(k);
            }
        }
        None
    }

    /// Picks and removes the block to replace.
    pub fn victim(&mut self, counters: &mut SegmentCounters, threshold: u32) -> Option<BlockKey> {
        for _ in 0..self.resident.len() {
            let k = self.pop_live()?;
            if counters.get(k) < threshold {
                self.resident.remove(&k);
                return Some(k);
            }
            counters.age(k);
            let g = self.resident[&k];
            self.ring.push_back((k, g));
        }
        let k = self.pop_live()?;
        self.resident.remove(&k);
        Some(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_a_cold_segments_block_and_ages_the_hot_ones() {
        let mut c = SegmentCounters::new(1);
        let k = |i| BlockKey::new(1, i);
        let mut h = Harvest::default();
        for i in 0..3 {
            h.inserted(k(i));
        }
        for _ in 0..40 {
            c.count(k(0));
            c.count(k(1));
        }
        c.count(k(2));
        // Blocks 0 and 1 are hot (40 > 20): the cold block 2 goes, and the
        // hot ones passed over are aged.
        assert_eq!(h.victim(&mut c, 20), Some(k(2)));
        assert_eq!((c.get(k(0)), c.get(k(1))), (20, 20));
        assert_eq!(h.len(), 2);
        // Nothing below 5: a full scan ages all, then the front goes.
        assert_eq!(h.victim(&mut c, 5), Some(k(0)));
        assert_eq!(c.get(k(1)), 10);
        h.removed(k(1));
        assert!(h.is_empty());
        assert_eq!(h.victim(&mut c, 5), None);
    }
}
