//! Blocks and byte ranges: how a request on a file's bytes becomes accesses
//! to whole cache blocks (Kotz & Ellis 1992 §3.2: "records … are translated
//! into accesses to logical file blocks").

use serde::{Deserialize, Serialize};

pub use crate::ids::FileId;

/// One logical block of one file: the unit a cache buffer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BlockKey {
    pub file: FileId,
    pub index: u64,
}

impl BlockKey {
    pub fn new(file: FileId, index: u64) -> Self {
        BlockKey { file, index }
    }
    /// The block after this one in the same file.
    pub fn next(self) -> BlockKey {
        BlockKey {
            file: self.file,
            index: self.index + 1,
        }
    }
}

/// A half-open byte range `[start, end)` inside one block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ByteRange {
    pub start: u32,
    pub end: u32,
}

impl ByteRange {
    pub fn new(start: u32, end: u32) -> Self {
        debug_assert!(start <= end, "range [{start},{end}) is reversed");
        ByteRange { start, end }
    }
    pub fn len(&self) -> u32 {
        self.end - self.start
    }
    pub fn is_empty(&self) -> bool {
        self.start >= self.end
    }
}

/// One block's share of a byte-addressed request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockPiece {
    /// Block index within the file.
    pub index: u64,
    /// Bytes of that block the request covers.
    pub range: ByteRange,
    /// Offset of the piece's first byte within the request.
    pub request_offset: u64,
}

/// Splits the file bytes `[offset, offset + len)` into per-block pieces, in
/// file order. `block_size` must be positive.
pub fn split_blocks(offset: u64, len: u64, block_size: u32) -> impl Iterator<Item = BlockPiece> {
    assert!(block_size > 0, "block size must be positive");
    let bs = block_size as u64;
    let end = offset + len;
    let mut pos = offset;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let index = pos / bs;
        let block_start = index * bs;
        let piece_end = end.min(block_start + bs);
        let piece = BlockPiece {
            index,
            range: ByteRange::new((pos - block_start) as u32, (piece_end - block_start) as u32),
            request_offset: pos - offset,
        };
        pos = piece_end;
        Some(piece)
    })
}

/// A set of disjoint byte ranges within one block, kept sorted and merged.
/// Tracks which bytes of a buffer are valid, dirty or written (write-full's
/// "number of bytes written equals the buffer size", 1992 §3.3.2, counted
/// without double-counting overlapping writes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeSet {
    ranges: Vec<ByteRange>,
}

impl RangeSet {
    pub fn new() -> Self {
        RangeSet { ranges: Vec::new() }
    }
    /// The set holding exactly `[0, size)`.
    pub fn full(size: u32) -> Self {
        let mut s = RangeSet::new();
        s.insert(ByteRange::new(0, size));
        s
    }
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
    pub fn clear(&mut self) {
        self.ranges.clear();
    }
    pub fn ranges(&self) -> &[ByteRange] {
        &self.ranges
    }
    /// Number of bytes in the set.
    pub fn bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.len() as u64).sum()
    }
    /// Adds `r`, merging with touching or overlapping ranges.
    pub fn insert(&mut self, r: ByteRange) {
        if r.is_empty() {
            return;
        }
        // Common case: appending at or after the end (sequential writes).
        if let Some(last) = self.ranges.last_mut() {
            if r.start >= last.start && r.start <= last.end {
                last.end = last.end.max(r.end);
                return;
            }
            if r.start > last.end {
                self.ranges.push(r);
                return;
            }
        } else {
            self.ranges.push(r);
            return;
        }
        let mut start = r.start;
        let mut end = r.end;
        let first = self.ranges.partition_point(|x| x.end < start);
        let mut last = first;
        while last < self.ranges.len() && self.ranges[last].start <= end {
            start = start.min(self.ranges[last].start);
            end = end.max(self.ranges[last].end);
            last += 1;
        }
        self.ranges
            .splice(first..last, std::iter::once(ByteRange::new(start, end)));
    }
    /// Whether every byte of `r` is in the set.
    pub fn covers(&self, r: ByteRange) -> bool {
        if r.is_empty() {
            return true;
        }
        let i = self.ranges.partition_point(|x| x.end < r.end);
        i < self.ranges.len() && self.ranges[i].start <= r.start && self.ranges[i].end >= r.end
    }
    /// Whether any byte of `r` is in the set.
    pub fn overlaps(&self, r: ByteRange) -> bool {
        self.ranges.iter().any(|x| x.start < r.end && r.start < x.end)
    }
    /// Whether the set is exactly `[0, size)`.
    pub fn is_full(&self, size: u32) -> bool {
        self.ranges.len() == 1 && self.ranges[0].start == 0 && self.ranges[0].end >= size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn split_covers_request_in_order() {
        let pieces: Vec<_> = split_blocks(1000, 1100, 1024).collect();
        assert_eq!(pieces.len(), 3);
        assert_eq!(pieces[0].index, 0);
        assert_eq!(pieces[0].range, ByteRange::new(1000, 1024));
        assert_eq!(pieces[1].index, 1);
        assert_eq!(pieces[1].range, ByteRange::new(0, 1024));
        assert_eq!(pieces[2].range, ByteRange::new(0, 52));
        assert_eq!(pieces[1].request_offset, 24);
        assert_eq!(split_blocks(5, 0, 1024).count(), 0);
    }

    #[test]
    fn range_set_merges_and_knows_full() {
        let mut s = RangeSet::new();
        s.insert(ByteRange::new(256, 512));
        s.insert(ByteRange::new(768, 1024));
        assert!(!s.is_full(1024));
        s.insert(ByteRange::new(0, 256));
        s.insert(ByteRange::new(512, 768));
        assert!(s.is_full(1024));
        assert_eq!(s.bytes(), 1024);
    }

    proptest! {
        /// The set behaves like a bitmap of bytes.
        #[test]
        fn range_set_matches_bitmap(ops in proptest::collection::vec((0u32..64, 0u32..64), 0..40),
                                    probe in (0u32..64, 0u32..64)) {
            let mut s = RangeSet::new();
            let mut bits = [false; 64];
            for (a, b) in ops {
                let (a, b) = (a.min(b), a.max(b));
                s.insert(ByteRange::new(a, b));
                for bit in bits.iter_mut().take(b as usize).skip(a as usize) { *bit = true; }
            }
            prop_assert_eq!(s.bytes(), bits.iter().filter(|b| **b).count() as u64);
            for w in s.ranges().windows(2) { prop_assert!(w[0].end < w[1].start); }
            let (a, b) = (probe.0.min(probe.1), probe.0.max(probe.1));
            prop_assert_eq!(s.covers(ByteRange::new(a, b)), (a..b).all(|i| bits[i as usize]));
        }

        /// Splitting a request yields contiguous pieces that add up to it.
        #[test]
        fn split_is_exact(offset in 0u64..100_000, len in 0u64..50_000, bs in 1u32..5000) {
            let mut pos = offset;
            for p in split_blocks(offset, len, bs) {
                prop_assert_eq!(p.index * bs as u64 + p.range.start as u64, pos);
                prop_assert!(p.range.end <= bs && !p.range.is_empty());
                prop_assert_eq!(p.request_offset, pos - offset);
                pos += p.range.len() as u64;
            }
            prop_assert_eq!(pos, offset + len);
        }
    }
}
