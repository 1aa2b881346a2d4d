//! Which nodes form the cooperative tier (Cortes, Girona & Labarta 1996
//! §3: the global cache is the union of the members' caches). The metadata
//! server keeps it: a node joins with its first heartbeat and is dropped
//! once silent for [`NODE_SILENT`], so a node that dies leaves placement
//! within that time. Each heartbeat carries the node's latest report.

use super::Members;
use crate::ids::NodeId;
use crate::time::{Span, Time};
use std::collections::BTreeMap;

/// How often a node says it is there.
pub const HEARTBEAT: Span = Span(5_000_000_000);
/// Silence after which a node is no longer a member (three heartbeats).
pub const NODE_SILENT: Span = Span(15_000_000_000);

/// The members, each with when it was last heard and its last report.
#[derive(Clone, Debug)]
pub struct Membership<R> {
    nodes: BTreeMap<NodeId, (Time, R)>,
}

impl<R> Default for Membership<R> {
    fn default() -> Self {
        Membership { nodes: BTreeMap::new() }
    }
}

impl<R: Clone> Membership<R> {
    /// `node` was heard at `now`, reporting `report`.
    pub fn heartbeat(&mut self, node: NodeId, now: Time, report: R) {
        self.nodes.insert(node, (now, report));
    }

    /// `node` said it leaves.
    pub fn left(&mut self, node: NodeId) {
        self.nodes.remove(&node);
    }

    /// The members at `now` (the silent ones dropped), each with how long
    /// ago it was heard and its last report, in node order.
    pub fn members(&mut self, now: Time) -> Vec<(NodeId, Span, R)> {
        self.nodes.retain(|_, (seen, _)| now.since(*seen) < NODE_SILENT);
        self.nodes
            .iter()
            .map(|(&n, (seen, r))| (n, now.since(*seen), r.clone()))
            .collect()
    }

    /// The members at `now`, as placement uses them.
    pub fn set(&mut self, now: Time) -> Members {
        Members::new(self.members(now).into_iter().map(|(n, _, _)| n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_join_report_and_drop_out_when_silent() {
        let mut m: Membership<u32> = Membership::default();
        let t = |s: u64| Time(s * 1_000_000_000);
        m.heartbeat(7, t(0), 1);
        m.heartbeat(3, t(4), 2);
        assert_eq!(
            m.members(t(5)),
            vec![(3, Span::from_secs(1), 2), (7, Span::from_secs(5), 1)]
        );
        m.heartbeat(7, t(10), 9);
        assert_eq!(m.set(t(18)).nodes(), &[3, 7], "node 3 was silent for 14 s: still in");
        assert_eq!(m.set(t(19)).nodes(), &[7], "15 s: out");
        assert_eq!(m.members(t(19))[0].2, 9, "the latest report");
        m.left(7);
        assert!(m.set(t(19)).is_empty());
        m.heartbeat(3, t(30), 4);
        assert_eq!(m.set(t(30)).nodes(), &[3], "a node that was dropped joins again");
    }
}
