//! `lru-interleaved` (Cortes, Girona & Labarta 1996 §3.2): the union of
//! every node's cache is one cache. Block (file, k) lives only in its home
//! node's cache, LRU inside that node; there are no replicas, so no
//! coherence traffic, and the whole cache holds distinct blocks (which is
//! why small caches favour it, §6.4). A request for several blocks is
//! served by their homes in parallel; a write goes to the block's home.
//!
//! The paper places a block on node `hash(file, k) mod N`. We place it on
//! the member with the highest `hash(file, k, node)` (rendezvous hashing):
//! as uniform for a fixed membership, and when a node leaves or dies only
//! its own blocks change home, instead of nearly all of them.

use super::{mix, Members, Source};
use crate::block::BlockKey;
use crate::ids::NodeId;
use std::collections::BTreeMap;

/// The block's home: the one node whose cache may hold it (`None` with no
/// members).
pub fn home(block: BlockKey, members: &Members) -> Option<NodeId> {
    let key = mix(block.file ^ mix(block.index.wrapping_add(0x9e37_79b9_7f4a_7c15)));
    members.nodes().iter().copied().max_by_key(|&n| (mix(key ^ mix(n)), n))
}

/// Where node `me` gets a block it wants: its own cache if it is the
/// block's home, else the home's.
pub fn source(block: BlockKey, me: NodeId, members: &Members) -> Source {
    match home(block, members) {
        None => Source::Servers,
        Some(h) if h == me => Source::Own,
        Some(h) => Source::Peer(h),
    }
}

/// A multi-block request split by home node, so each home serves its part
/// at once (§3.2: "these blocks ... can be sent to the client node in
/// parallel").
pub fn by_home(blocks: impl IntoIterator<Item = BlockKey>, members: &Members) -> BTreeMap<NodeId, Vec<BlockKey>> {
    let mut out: BTreeMap<NodeId, Vec<BlockKey>> = BTreeMap::new();
    for b in blocks {
        if let Some(h) = home(b, members) {
            out.entry(h).or_default().push(b);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(n: u64) -> impl Iterator<Item = BlockKey> {
        (0..n).map(|i| BlockKey::new(i % 37 + 1, i / 37))
    }

    /// Every block has one home among the members, the same each time; 50
    /// nodes each get about a fiftieth of the blocks (the paper's base).
    #[test]
    fn each_block_has_one_home_and_homes_are_even() {
        let m = Members::new(1..=50);
        let mut count = BTreeMap::new();
        for b in blocks(100_000) {
            let h = home(b, &m).unwrap();
            assert!(m.contains(h));
            assert_eq!(home(b, &m), Some(h));
            *count.entry(h).or_insert(0u32) += 1;
        }
        assert_eq!(count.len(), 50);
        let (lo, hi) = (count.values().min().unwrap(), count.values().max().unwrap());
        assert!(
            *lo > 1_600 && *hi < 2_400,
            "homes between {lo} and {hi} blocks of 2,000 each"
        );
    }

    /// A node leaving moves only its own blocks; the others keep theirs.
    #[test]
    fn a_node_leaving_moves_only_its_blocks() {
        let all = Members::new(1..=8);
        let without_3 = Members::new((1..=8).filter(|&n| n != 3));
        for b in blocks(20_000) {
            let before = home(b, &all).unwrap();
            let after = home(b, &without_3).unwrap();
            if before != 3 {
                assert_eq!(before, after, "{b:?} moved though its home stayed");
            } else {
                assert_ne!(after, 3);
            }
        }
    }

    #[test]
    fn a_request_splits_by_home_and_the_home_serves_itself() {
        let m = Members::new([10, 20, 30]);
        let req: Vec<BlockKey> = (0..64).map(|k| BlockKey::new(7, k)).collect();
        let parts = by_home(req.iter().copied(), &m);
        assert_eq!(parts.values().map(Vec::len).sum::<usize>(), 64);
        assert!(parts.len() > 1, "a 64-block request spans several homes");
        for (h, bs) in &parts {
            for b in bs {
                assert_eq!(source(*b, *h, &m), Source::Own);
                let other = if *h == 10 { 20 } else { 10 };
                assert_eq!(source(*b, other, &m), Source::Peer(*h));
            }
        }
        assert_eq!(source(req[0], 10, &Members::default()), Source::Servers);
    }
}
