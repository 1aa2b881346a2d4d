//! Exclusive holds on directories, for write-behind unlinks: the server's
//! half, sans-IO.
//!
//! A lease held by one node alone is a write lease in Gray & Cheriton's
//! terms (1989, §2): while a node holds a directory, no other node reads
//! or changes its names without calling the holder back first, so the
//! holder may answer an unlink there before the metadata server has it
//! (the request follows at once). The callback makes the holder finish
//! every unlink it answered, then the other node's request runs: it sees
//! them all, as if each had been made in its own round trip. Granting a
//! hold ends every other node's lease on the directory and on the files
//! named in it (they would show names the holder may have removed).
//!
//! Who holds which directory until when; the metadata server decides what
//! a request touches and drives the callbacks (`super::leases`).

use crate::ids::{FileId, NodeId};
use crate::time::{Span, Time};
use std::collections::HashMap;

/// How long a hold lasts without being asked for again: the longest
/// another node's request waits for a holder that does not answer.
pub const HOLD: Span = super::leases::LEASE;

/// The directories held, each by one node until a time.
#[derive(Debug, Default)]
pub struct DirHolds {
    held: HashMap<FileId, (NodeId, Time)>,
}

impl DirHolds {
    pub fn new() -> Self {
        Self::default()
    }

    /// `node` holds `dir` from `now`; returns the end of its hold (a hold
    /// it had is extended). The caller has called back any other holder
    /// first ([`DirHolds::in_the_way`]).
    pub fn grant(&mut self, now: Time, node: NodeId, dir: FileId) -> Time {
        let until = now + HOLD;
        self.held.insert(dir, (node, until));
        until
    }

    /// Whether any node other than `by` holds a directory at `now`
    /// (`None`: a client without leases, for which every hold is
    /// another's): a request then has to look at what it touches.
    pub fn any_other(&self, now: Time, by: Option<NodeId>) -> bool {
        self.held.values().any(|&(n, until)| Some(n) != by && until > now)
    }

    /// A request by `by` touches `dir` at `now`: the other node holding it,
    /// with the end of its hold, is to be called back before the request
    /// runs; its hold ends here.
    pub fn in_the_way(&mut self, now: Time, by: Option<NodeId>, dir: FileId) -> Option<(NodeId, Time)> {
        let &(n, until) = self.held.get(&dir)?;
        if Some(n) == by {
            return None;
        }
        self.held.remove(&dir);
        (until > now).then_some((n, until))
    }

    /// The holder of `dir` at `now`, if any.
    pub fn holder(&self, now: Time, dir: FileId) -> Option<NodeId> {
        self.held.get(&dir).filter(|h| h.1 > now).map(|h| h.0)
    }

    /// `node` left or lost its connection: it holds nothing any more.
    pub fn node_gone(&mut self, node: NodeId) {
        self.held.retain(|_, h| h.0 != node);
    }

    /// Holds recorded (running or run out).
    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
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
    fn another_nodes_request_calls_the_holder_back_once() {
        let mut h = DirHolds::new();
        assert_eq!(h.grant(t(1), 7, 2), t(11));
        assert!(h.any_other(t(2), Some(8)));
        assert!(!h.any_other(t(2), Some(7)), "the holder's own requests");
        assert_eq!(h.in_the_way(t(2), Some(7), 2), None, "the holder itself");
        assert_eq!(h.in_the_way(t(2), Some(8), 2), Some((7, t(11))));
        assert_eq!(h.in_the_way(t(2), Some(8), 2), None, "called back once");
        assert_eq!(h.holder(t(2), 2), None);
    }

    #[test]
    fn a_client_without_leases_is_in_every_holds_way() {
        let mut h = DirHolds::new();
        h.grant(t(1), 7, 2);
        assert!(h.any_other(t(2), None));
        assert_eq!(h.in_the_way(t(2), None, 2), Some((7, t(11))));
    }

    #[test]
    fn a_hold_run_out_or_of_a_node_gone_needs_no_callback() {
        let mut h = DirHolds::new();
        h.grant(t(1), 7, 2);
        h.grant(t(1), 7, 3);
        h.grant(t(1), 8, 4);
        assert!(!h.any_other(t(11), Some(9)));
        assert_eq!(h.in_the_way(t(11), Some(9), 2), None);
        h.node_gone(7);
        assert_eq!(h.in_the_way(t(2), Some(9), 3), None);
        assert_eq!(h.holder(t(2), 4), Some(8));
        assert_eq!(h.len(), 1);
    }

    proptest! {
        /// However grants and requests interleave, a directory is held by
        /// at most one node, and after another node's request touched it
        /// no node but that one holds it; the holder before was called
        /// back if its hold still ran.
        #[test]
        fn after_a_request_no_other_node_holds_what_it_touched(
            ops in prop::collection::vec((0u64..4, 0u64..3, any::<bool>(), 0u64..30), 1..200)
        ) {
            let mut h = DirHolds::new();
            let mut now = Time(0);
            for (node, dir, grant, dt) in ops {
                now = now + Span(dt * 500_000_000);
                let before = h.holder(now, dir);
                let called = h.in_the_way(now, Some(node), dir);
                match before {
                    Some(b) if b != node => prop_assert_eq!(called.map(|c| c.0), Some(b)),
                    _ => prop_assert!(called.is_none()),
                }
                prop_assert!(h.holder(now, dir).is_none_or(|n| n == node));
                if grant {
                    h.grant(now, node, dir);
                    prop_assert_eq!(h.holder(now, dir), Some(node));
                }
            }
        }
    }
}
