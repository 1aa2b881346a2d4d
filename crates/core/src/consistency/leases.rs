//! Leases on what a mount's kernel keeps of a file: its attributes and the
//! names it was reached by (Gray & Cheriton 1989, "Leases: an efficient
//! fault-tolerant mechanism for distributed file cache consistency").
//!
//! A file's attributes given to a node come with a lease of [`LEASE`]; the
//! node's kernel keeps them (and the name they were looked up by) that
//! long without asking the metadata server. Before the server answers a
//! change to the file by anyone else, every other node whose lease still
//! runs is called back (`Forget`) and the change waits for its answer, or
//! for the lease to run out if it does not answer: a `stat` anywhere after
//! a change has returned sees it, as with no caching at all. The node that
//! made the change keeps its lease (its kernel saw the change go by).
//! Directories' attributes are not leased (a mount keeps theirs for a
//! second); their names are (`WatchDir`), and one node may hold a
//! directory alone (`super::dir_hold`).
//!
//! This is the server's half, sans-IO: who holds which lease until when.
//! The metadata server drives it; the callbacks travel as `sprite`'s do
//! ([`super::sprite::SpriteServer::forget_at`]).

use super::dir_hold::DirHolds;
use crate::ids::{FileId, NodeId};
use crate::time::{Span, Time};
use std::collections::HashMap;

/// How long a lease lasts: the longest a change waits for a node that does
/// not answer its callback (a node killed without unmounting).
pub const LEASE: Span = Span(10_000_000_000);

/// Expired leases are swept out once this many more were granted.
const SWEEP_EVERY: u64 = 4096;

/// The leases held, by file: each holder with the end of its lease.
#[derive(Debug, Default)]
pub struct Leases {
    held: HashMap<FileId, Vec<(NodeId, Time)>>,
    granted: u64,
    /// Directories held by one node alone (write leases, for its
    /// write-behind unlinks).
    pub holds: DirHolds,
}

impl Leases {
    pub fn new() -> Self {
        Self::default()
    }

    /// `node` was given `file`'s attributes at `now`: its lease runs until
    /// the time returned (a lease it held is extended).
    pub fn grant(&mut self, now: Time, node: NodeId, file: FileId) -> Time {
        let until = now + LEASE;
        let holders = self.held.entry(file).or_default();
        match holders.iter_mut().find(|(n, _)| *n == node) {
            Some(h) => h.1 = until,
            None => holders.push((node, until)),
        }
        self.granted += 1;
        if self.granted.is_multiple_of(SWEEP_EVERY) {
            self.sweep(now);
        }
        until
    }

    /// `by` changed `file` at `now` (`None`: a client that holds no
    /// leases): the other nodes whose leases still run, each with the end
    /// of its lease (the longest the change waits for its answer). Their
    /// leases end here; `by`'s stays.
    pub fn changed(&mut self, now: Time, by: Option<NodeId>, file: FileId) -> Vec<(NodeId, Time)> {
        let Some(holders) = self.held.get_mut(&file) else {
            return vec![];
        };
        let mut call = Vec::new();
        holders.retain(|&(n, until)| {
            if Some(n) == by {
                return true;
            }
            if until > now {
                call.push((n, until));
            }
            false
        });
        if holders.is_empty() {
            self.held.remove(&file);
        }
        call
    }

    /// `node` left (unmounted): it holds nothing any more.
    pub fn node_gone(&mut self, node: NodeId) {
        self.holds.node_gone(node);
        self.held.retain(|_, h| {
            h.retain(|(n, _)| *n != node);
            !h.is_empty()
        });
    }

    /// Whether `node` holds a running lease on `file` at `now`.
    pub fn holds(&self, now: Time, node: NodeId, file: FileId) -> bool {
        self.held
            .get(&file)
            .is_some_and(|h| h.iter().any(|&(n, until)| n == node && until > now))
    }

    /// Leases recorded (running or not yet swept).
    pub fn len(&self) -> usize {
        self.held.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    fn sweep(&mut self, now: Time) {
        self.held.retain(|_, h| {
            h.retain(|&(_, until)| until > now);
            !h.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(s: u64) -> Time {
        Time(s * 1_000_000_000)
    }

    #[test]
    fn another_nodes_change_calls_the_holder_back_and_ends_its_lease() {
        let mut l = Leases::new();
        let until = l.grant(t(1), 7, 100);
        assert_eq!(until, t(11));
        assert_eq!(l.changed(t(2), Some(8), 100), vec![(7, t(11))]);
        assert!(!l.holds(t(2), 7, 100));
        assert_eq!(l.changed(t(3), Some(8), 100), vec![], "called back once");
        assert!(l.is_empty());
    }

    #[test]
    fn the_changer_keeps_its_lease_and_is_not_called_back() {
        let mut l = Leases::new();
        l.grant(t(1), 7, 100);
        l.grant(t(1), 8, 100);
        assert_eq!(l.changed(t(2), Some(7), 100), vec![(8, t(11))]);
        assert!(l.holds(t(2), 7, 100));
        // A client without leases changes it: every holder is called back.
        assert_eq!(l.changed(t(3), None, 100), vec![(7, t(11))]);
    }

    #[test]
    fn an_expired_lease_needs_no_callback() {
        let mut l = Leases::new();
        l.grant(t(1), 7, 100);
        assert_eq!(l.changed(t(11), Some(8), 100), vec![]);
        l.grant(t(20), 7, 100);
        l.grant(t(25), 7, 100);
        assert_eq!(
            l.changed(t(31), Some(8), 100),
            vec![(7, t(35))],
            "a new grant extends the lease"
        );
    }

    #[test]
    fn a_node_that_leaves_holds_nothing() {
        let mut l = Leases::new();
        l.grant(t(1), 7, 100);
        l.grant(t(1), 7, 101);
        l.grant(t(1), 8, 101);
        l.node_gone(7);
        assert_eq!(l.changed(t(2), None, 100), vec![]);
        assert_eq!(l.changed(t(2), None, 101), vec![(8, t(11))]);
    }

    #[test]
    fn expired_leases_are_swept() {
        let mut l = Leases::new();
        for f in 1..SWEEP_EVERY {
            l.grant(t(1), 7, f);
        }
        assert_eq!(l.len() as u64, SWEEP_EVERY - 1);
        l.grant(t(20), 7, 0);
        assert_eq!(l.len(), 1, "the sweep at that grant kept only the running lease");
    }

    proptest! {
        /// However grants and changes interleave, after a change by `by`
        /// no other node holds a running lease on the file, and every node
        /// that did is among those called back.
        #[test]
        fn no_other_node_keeps_a_running_lease_through_a_change(
            ops in prop::collection::vec((0u64..4, 0u64..3, any::<bool>(), 0u64..30), 1..200)
        ) {
            let mut l = Leases::new();
            let mut now = Time(0);
            for (node, file, change, dt) in ops {
                now = now + Span(dt * 500_000_000);
                if change {
                    let before: Vec<NodeId> = (0..4).filter(|&n| n != node && l.holds(now, n, file)).collect();
                    let called: Vec<NodeId> = l.changed(now, Some(node), file).into_iter().map(|(n, _)| n).collect();
                    for n in 0..4 {
                        if n != node {
                            prop_assert!(!l.holds(now, n, file));
                        }
                    }
                    for n in before {
                        prop_assert!(called.contains(&n));
                    }
                } else {
                    l.grant(now, node, file);
                    prop_assert!(l.holds(now, node, file));
                }
            }
        }
    }
}
