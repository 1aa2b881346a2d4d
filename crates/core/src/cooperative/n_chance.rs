//! `n-chance` forwarding (Dahlin et al. 1994, as Cortes, Girona & Labarta
//! 1996 §4 adapt it): each node caches the blocks its programs read; a
//! remote hit copies the block into the reader's cache. When a node evicts
//! the last cached copy of a block (a singlet), the block is not dropped
//! but forwarded to a random peer, which inserts it as most recently used;
//! after `n` forwards without a reference it is dropped. As in the paper's
//! version a single directory (the metadata server) knows who holds what,
//! so no coherence protocol runs between nodes.
//!
//! A block's forward count travels with it and restarts when a program
//! references it (the node that holds it knows; no message per hit), so
//! [`Directory::evicted`] takes the count from the evicting node. A dirty
//! block is cleaned just before it is forwarded (1996 §6.1, after [5]).

use super::{Members, Source};
use crate::block::BlockKey;
use crate::ids::NodeId;
use std::collections::{BTreeSet, HashMap};

/// What happens to a block a node evicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evicted {
    /// Gone from the cooperative cache (another copy remains, or its
    /// chances are used up, or no peer is left).
    Dropped,
    /// Send it to `to`, which inserts it as most recently used with this
    /// forward count; write it to the data servers first if `clean_first`.
    Forward {
        to: NodeId,
        recirculations: u8,
        clean_first: bool,
    },
}

/// What the directory counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirectoryStats {
    pub remote_hits: u64,
    pub server_reads: u64,
    pub forwards: u64,
    pub drops: u64,
}

/// Who holds which block: the server half of `n-chance`.
#[derive(Clone, Debug)]
pub struct Directory {
    n: u8,
    holders: HashMap<BlockKey, BTreeSet<NodeId>>,
    pub stats: DirectoryStats,
}

impl Directory {
    /// A directory forwarding singlets up to `n` times (`n = 0`: greedy).
    pub fn new(n: u8) -> Directory {
        Directory {
            n,
            holders: HashMap::new(),
            stats: DirectoryStats::default(),
        }
    }

    /// Sets the chances a last copy gets from now on (files carry their
    /// own `n`; the directory is shared).
    pub fn set_chances(&mut self, n: u8) {
        self.n = n;
    }

    /// Node `node` missed `block` in its own cache: a peer that holds it
    /// (the lowest-numbered, so runs repeat), else the data servers.
    pub fn lookup(&mut self, node: NodeId, block: BlockKey, members: &Members) -> Source {
        let peer = self
            .holders
            .get(&block)
            .and_then(|h| h.iter().copied().find(|&p| p != node && members.contains(p)));
        match peer {
            Some(p) => {
                self.stats.remote_hits += 1;
                Source::Peer(p)
            }
            None => {
                self.stats.server_reads += 1;
                Source::Servers
            }
        }
    }

    /// `node` now caches `block` (read from a peer or the servers, or
    /// written there).
    pub fn cached(&mut self, node: NodeId, block: BlockKey) {
        self.holders.entry(block).or_default().insert(node);
    }

    /// `node` evicts `block`, which has been forwarded `recirculations`
    /// times since a program last referenced it. A singlet with chances
    /// left goes to a peer picked by `pick` (a random number the driver
    /// supplies); anything else is dropped.
    pub fn evicted(
        &mut self,
        node: NodeId,
        block: BlockKey,
        recirculations: u8,
        dirty: bool,
        pick: u64,
        members: &Members,
    ) -> Evicted {
        let singlet = match self.holders.get_mut(&block) {
            Some(h) => {
                h.remove(&node);
                h.is_empty()
            }
            None => true,
        };
        let to = if singlet && recirculations < self.n {
            members.other_than(node, pick)
        } else {
            None
        };
        match to {
            Some(to) => {
                self.stats.forwards += 1;
                self.holders.entry(block).or_default().insert(to);
                Evicted::Forward {
                    to,
                    recirculations: recirculations + 1,
                    clean_first: dirty,
                }
            }
            None => {
                self.stats.drops += 1;
                if self.holders.get(&block).is_some_and(BTreeSet::is_empty) {
                    self.holders.remove(&block);
                }
                Evicted::Dropped
            }
        }
    }

    /// `node` wrote `block`: every other copy is stale. Returns the nodes
    /// that must drop theirs; `node` is left the only holder.
    pub fn written(&mut self, node: NodeId, block: BlockKey) -> Vec<NodeId> {
        let h = self.holders.entry(block).or_default();
        let stale = h.iter().copied().filter(|&p| p != node).collect();
        h.clear();
        h.insert(node);
        stale
    }

    /// `node` left the tier or died: it holds nothing now (its blocks are
    /// read from the data servers again).
    pub fn left(&mut self, node: NodeId) {
        self.holders.retain(|_, h| {
            h.remove(&node);
            !h.is_empty()
        });
    }

    /// The nodes holding `block`.
    pub fn holders(&self, block: BlockKey) -> Vec<NodeId> {
        self.holders
            .get(&block)
            .map(|h| h.iter().copied().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn b(k: u64) -> BlockKey {
        BlockKey::new(1, k)
    }

    /// A singlet nobody references is forwarded n times, then dropped; each
    /// forward goes to a peer, counted up from the evicting node's count.
    #[test]
    fn a_singlet_gets_n_chances_then_goes() {
        let m = Members::new(1..=4);
        let mut d = Directory::new(2);
        d.cached(1, b(0));
        let Evicted::Forward { to, recirculations, .. } = d.evicted(1, b(0), 0, false, 7, &m) else {
            panic!("a singlet with chances left is forwarded")
        };
        assert!(to != 1 && recirculations == 1);
        assert_eq!(d.holders(b(0)), vec![to]);
        let Evicted::Forward {
            to: to2,
            recirculations: 2,
            ..
        } = d.evicted(to, b(0), 1, false, 3, &m)
        else {
            panic!("second chance")
        };
        assert_eq!(d.evicted(to2, b(0), 2, false, 1, &m), Evicted::Dropped);
        assert!(d.holders(b(0)).is_empty());
        assert_eq!((d.stats.forwards, d.stats.drops), (2, 1));
    }

    /// A replicated block is dropped, not forwarded; a remote hit names a
    /// holder other than the asker; a write leaves only the writer.
    #[test]
    fn replicas_remote_hits_and_writes() {
        let m = Members::new(1..=3);
        let mut d = Directory::new(2);
        assert_eq!(d.lookup(1, b(5), &m), Source::Servers);
        d.cached(1, b(5));
        assert_eq!(d.lookup(2, b(5), &m), Source::Peer(1));
        d.cached(2, b(5));
        assert_eq!(
            d.evicted(1, b(5), 0, false, 0, &m),
            Evicted::Dropped,
            "node 2 still has it"
        );
        d.cached(3, b(5));
        assert_eq!(d.written(3, b(5)), vec![2]);
        assert_eq!(d.holders(b(5)), vec![3]);
        // A dirty singlet is cleaned before it goes.
        assert!(matches!(
            d.evicted(3, b(5), 0, true, 0, &m),
            Evicted::Forward { clean_first: true, .. }
        ));
        assert_eq!((d.stats.remote_hits, d.stats.server_reads), (1, 1));
    }

    /// A node that leaves is never named again; with no peer left a
    /// singlet is dropped.
    #[test]
    fn a_node_that_left_holds_nothing() {
        let mut d = Directory::new(2);
        d.cached(1, b(0));
        d.cached(2, b(0));
        d.left(1);
        let m = Members::new([2, 3]);
        assert_eq!(d.lookup(3, b(0), &m), Source::Peer(2));
        assert_eq!(d.evicted(2, b(0), 0, false, 0, &Members::new([2])), Evicted::Dropped);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Read(NodeId, u64),
        Evict(NodeId, u64, u8, bool, u64),
        Write(NodeId, u64),
        Leave(NodeId),
    }

    fn op() -> impl Strategy<Value = Op> {
        let node = 1..=5u64;
        let block = 0..8u64;
        prop_oneof![
            (node.clone(), block.clone()).prop_map(|(n, k)| Op::Read(n, k)),
            (node.clone(), block.clone(), 0..4u8, any::<bool>(), any::<u64>())
                .prop_map(|(n, k, r, d, p)| Op::Evict(n, k, r, d, p)),
            (node.clone(), block).prop_map(|(n, k)| Op::Write(n, k)),
            node.prop_map(Op::Leave),
        ]
    }

    proptest! {
        /// Against a model of the node caches: the directory names exactly
        /// the nodes that hold each block; a lookup never names the asker
        /// or a node without the block; a singlet with chances left and a
        /// peer to go to is never dropped; counts stay within n.
        #[test]
        fn the_directory_matches_the_caches(n in 0..4u8, ops in proptest::collection::vec(op(), 1..200)) {
            let mut d = Directory::new(n);
            let mut members: BTreeSet<NodeId> = (1..=5).collect();
            let mut caches: HashMap<NodeId, BTreeSet<u64>> = HashMap::new();
            for op in ops {
                let m = Members::new(members.iter().copied());
                match op {
                    Op::Read(node, k) if members.contains(&node) && !caches.get(&node).is_some_and(|c| c.contains(&k)) => {
                        if let Source::Peer(p) = d.lookup(node, b(k), &m) {
                            prop_assert!(p != node && caches[&p].contains(&k));
                        }
                        d.cached(node, b(k));
                        caches.entry(node).or_default().insert(k);
                    }
                    Op::Evict(node, k, r, dirty, pick) if caches.get(&node).is_some_and(|c| c.contains(&k)) => {
                        caches.get_mut(&node).unwrap().remove(&k);
                        let singlet = !caches.values().any(|c| c.contains(&k));
                        match d.evicted(node, b(k), r, dirty, pick, &m) {
                            Evicted::Forward { to, recirculations, clean_first } => {
                                prop_assert!(singlet && r < n && to != node && members.contains(&to));
                                prop_assert!(recirculations == r + 1 && recirculations <= n);
                                prop_assert_eq!(clean_first, dirty);
                                caches.entry(to).or_default().insert(k);
                            }
                            Evicted::Dropped => {
                                prop_assert!(!singlet || r >= n || members.len() < 2);
                            }
                        }
                    }
                    Op::Write(node, k) if members.contains(&node) => {
                        let stale = d.written(node, b(k));
                        for p in &stale {
                            prop_assert!(caches[p].contains(&k));
                            caches.get_mut(p).unwrap().remove(&k);
                        }
                        caches.entry(node).or_default().insert(k);
                    }
                    Op::Leave(node) if members.len() > 1 => {
                        members.remove(&node);
                        caches.remove(&node);
                        d.left(node);
                    }
                    _ => {}
                }
                for k in 0..8 {
                    let want: Vec<NodeId> = caches.iter().filter(|(_, c)| c.contains(&k)).map(|(&n, _)| n).collect::<BTreeSet<_>>().into_iter().collect();
                    prop_assert_eq!(d.holders(b(k)), want, "block {}", k);
                }
            }
        }
    }
}
