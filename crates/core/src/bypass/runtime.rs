//! Runtime bypass (Vilayannur et al. 2003 §5): a counter per segment counts
//! its accesses; when a block must be brought into the global cache, it is
//! placed there only if its segment's counter exceeds the threshold, else
//! the global cache is bypassed. The first access is exempt (the counter
//! reads zero), and once made the decision for a block sticks. The paper
//! found thresholds of 20–50 best.

use super::SegmentKey;
use crate::block::BlockKey;
use std::collections::HashMap;

/// The paper's range of good thresholds starts here (§5).
pub const DEFAULT_THRESHOLD: u32 = 20;

/// Accesses per segment.
#[derive(Clone, Debug)]
pub struct SegmentCounters {
    blocks_per_segment: u64,
    counts: HashMap<SegmentKey, u32>,
}

impl SegmentCounters {
    pub fn new(blocks_per_segment: u64) -> SegmentCounters {
        SegmentCounters {
            blocks_per_segment: blocks_per_segment.max(1),
            counts: HashMap::new(),
        }
    }

    fn seg(&self, block: BlockKey) -> SegmentKey {
        SegmentKey::of(block, self.blocks_per_segment)
    }

    /// Counts an access to `block`; returns the count before it.
    pub fn count(&mut self, block: BlockKey) -> u32 {
        let c = self.counts.entry(self.seg(block)).or_insert(0);
        let before = *c;
        *c = c.saturating_add(1);
        before
    }

    pub fn get(&self, block: BlockKey) -> u32 {
        self.counts.get(&self.seg(block)).copied().unwrap_or(0)
    }

    /// Halves the block's segment counter (the harvester's ageing).
    pub fn age(&mut self, block: BlockKey) {
        let seg = self.seg(block);
        if let Some(c) = self.counts.get_mut(&seg) {
            *c /= 2;
        }
    }

    /// How many segments have a count in each power-of-two bucket:
    /// (lowest count of the bucket, segments), bucket 0 holding count 0.
    pub fn histogram(&self) -> Vec<(u32, u64)> {
        let mut buckets: Vec<u64> = Vec::new();
        for &c in self.counts.values() {
            let i = if c == 0 { 0 } else { 32 - c.leading_zeros() as usize };
            if buckets.len() <= i {
                buckets.resize(i + 1, 0);
            }
            buckets[i] += 1;
        }
        buckets
            .into_iter()
            .enumerate()
            .map(|(i, n)| (if i == 0 { 0 } else { 1u32 << (i - 1) }, n))
            .collect()
    }
}

/// Whether a block enters the global cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    Cache,
    Bypass,
}

/// The runtime's decisions, with the counters they rest on.
#[derive(Clone, Debug)]
pub struct RuntimeBypass {
    threshold: u32,
    pub counters: SegmentCounters,
    decided: HashMap<BlockKey, Admit>,
    /// Blocks kept out of the global cache, counted.
    pub bypasses: u64,
}

impl RuntimeBypass {
    pub fn new(threshold: u32, blocks_per_segment: u64) -> RuntimeBypass {
        RuntimeBypass {
            threshold,
            counters: SegmentCounters::new(blocks_per_segment),
            decided: HashMap::new(),
            bypasses: 0,
        }
    }

    pub fn threshold(&self) -> u32 {
        self.threshold
    }

    /// A program accessed `block` (every access counts, hit or miss).
    pub fn accessed(&mut self, block: BlockKey) {
        self.counters.count(block);
    }

    /// `block` must be brought into the global cache: whether it goes in.
    /// Call after [`RuntimeBypass::accessed`] for the same access.
    pub fn admit(&mut self, block: BlockKey) -> Admit {
        self.admit_at(block, self.threshold)
    }

    /// [`RuntimeBypass::admit`] with the threshold of the block's file (a
    /// cache shared by files with different thresholds); 0 admits all.
    pub fn admit_at(&mut self, block: BlockKey, threshold: u32) -> Admit {
        if threshold == 0 {
            return Admit::Cache;
        }
        if let Some(&d) = self.decided.get(&block) {
            if d == Admit::Bypass {
                self.bypasses += 1;
            }
            return d;
        }
        // The first access finds the counter at zero: no check (§5).
        if self.counters.get(block) <= 1 {
            return Admit::Cache;
        }
        let d = if self.counters.get(block) > threshold {
            Admit::Cache
        } else {
            self.bypasses += 1;
            Admit::Bypass
        };
        self.decided.insert(block, d);
        d
    }

    /// Forgets a file's decisions (it was removed or rewritten).
    pub fn forget_file(&mut self, file: u64) {
        self.decided.retain(|k, _| k.file != file);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(i: u64) -> BlockKey {
        BlockKey::new(1, i)
    }

    #[test]
    fn first_access_is_exempt_then_the_threshold_decides_once() {
        let mut r = RuntimeBypass::new(3, 4);
        r.accessed(b(0));
        assert_eq!(r.admit(b(0)), Admit::Cache, "first access: no check");
        // Block 1 shares block 0's segment: its counter is 2 now.
        r.accessed(b(1));
        assert_eq!(r.admit(b(1)), Admit::Bypass, "2 accesses, threshold 3");
        // The segment gets hot, but block 1's decision sticks.
        for _ in 0..10 {
            r.accessed(b(2));
        }
        assert_eq!(r.admit(b(1)), Admit::Bypass);
        assert_eq!(r.admit(b(2)), Admit::Cache, "12 accesses > 3");
        assert_eq!(r.bypasses, 2);
        // A segment of its own starts anew.
        r.accessed(b(4));
        assert_eq!(r.admit(b(4)), Admit::Cache);
        r.forget_file(1);
        r.accessed(b(1));
        assert_eq!(r.admit(b(1)), Admit::Cache, "decided anew: the segment is hot now");
    }

    #[test]
    fn counters_age_and_histogram() {
        let mut c = SegmentCounters::new(4);
        for _ in 0..5 {
            c.count(b(0));
        }
        c.count(b(8));
        assert_eq!(c.get(b(3)), 5, "same segment");
        c.age(b(0));
        assert_eq!(c.get(b(0)), 2);
        assert_eq!(c.histogram(), vec![(0, 0), (1, 1), (2, 1)]);
    }
}
