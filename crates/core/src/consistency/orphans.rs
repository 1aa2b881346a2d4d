//! Files unlinked while open on a node (orphans), as the metadata server
//! keeps them. POSIX keeps an unlinked file while a process has it open, so
//! the node that unlinks a file it has open keeps it at the metadata server
//! until its last close there (`Forget`). A node that dies first never
//! sends that `Forget`: without this record, the orphan's inode and its
//! parts on the data servers would stay for good.
//!
//! The metadata server notes which node keeps each orphan, when that node's
//! connection closed, and when the node was heard from again (a node that
//! reconnects keeps its orphans). The store keeps who keeps each orphan,
//! so after a restart of the metadata server every such node counts as
//! gone until it is heard from again. An orphan whose node has been gone
//! for longer than a collection asks (`parcache gc --older-than`) is
//! abandoned: the collection ends it, and its parts are then parts no file
//! owns.

use crate::ids::{FileId, NodeId};
use crate::time::{Span, Time};
use std::collections::HashMap;

/// Who keeps each orphan, and since when each such node is gone.
#[derive(Debug, Default)]
pub struct Orphans {
    /// Orphan → the node that keeps it open.
    kept_by: HashMap<FileId, NodeId>,
    /// Nodes keeping orphans whose connection closed, and when it did.
    gone: HashMap<NodeId, Time>,
}

impl Orphans {
    /// `node` unlinked `file` while it had it open.
    pub fn kept(&mut self, file: FileId, node: NodeId) {
        self.kept_by.insert(file, node);
    }

    /// `file` was kept by `node` before the metadata server restarted at
    /// `now`: the node counts as gone from then until it is heard from.
    pub fn restored(&mut self, file: FileId, node: NodeId, now: Time) {
        self.kept_by.insert(file, node);
        self.gone.entry(node).or_insert(now);
    }

    /// `file` ended (its node's last close, or a collection).
    pub fn ended(&mut self, file: FileId) {
        if let Some(node) = self.kept_by.remove(&file) {
            if !self.kept_by.values().any(|&n| n == node) {
                self.gone.remove(&node);
            }
        }
    }

    /// `node`'s connection closed at `now` (its process died, or it will
    /// reconnect). Only a node that keeps orphans is noted.
    pub fn node_gone(&mut self, node: NodeId, now: Time) {
        if self.kept_by.values().any(|&n| n == node) {
            self.gone.entry(node).or_insert(now);
        }
    }

    /// A request came from `node`: it is there, with its orphans.
    pub fn node_seen(&mut self, node: NodeId) {
        if !self.gone.is_empty() {
            self.gone.remove(&node);
        }
    }

    /// Orphans whose node has been gone (and not heard from) for at least
    /// `for_at_least` at `now`, in handle order.
    pub fn abandoned(&self, now: Time, for_at_least: Span) -> Vec<FileId> {
        let mut out: Vec<FileId> = self
            .kept_by
            .iter()
            .filter(|(_, n)| self.gone.get(n).is_some_and(|&t| now.since(t) >= for_at_least))
            .map(|(&f, _)| f)
            .collect();
        out.sort_unstable();
        out
    }

    /// Orphans recorded.
    pub fn len(&self) -> usize {
        self.kept_by.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kept_by.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Span = Span(1_000_000_000);

    fn at(s: u64) -> Time {
        Time(s * S.0)
    }

    #[test]
    fn only_a_node_gone_long_enough_abandons_its_orphans() {
        let mut o = Orphans::default();
        o.kept(10, 1);
        o.kept(11, 1);
        o.kept(20, 2);
        assert!(o.abandoned(at(1_000), Span::ZERO).is_empty(), "every node is there");
        o.node_gone(1, at(100));
        o.node_gone(2, at(150));
        // Gone again later: the first time counts.
        o.node_gone(1, at(140));
        assert!(o.abandoned(at(159), Span::from_secs(60)).is_empty());
        assert_eq!(o.abandoned(at(160), Span::from_secs(60)), [10, 11]);
        assert_eq!(o.abandoned(at(210), Span::from_secs(60)), [10, 11, 20]);
        o.ended(10);
        assert_eq!(o.abandoned(at(210), Span::from_secs(60)), [11, 20]);
        assert_eq!(o.len(), 2);
    }

    #[test]
    fn a_node_heard_from_again_keeps_its_orphans() {
        let mut o = Orphans::default();
        o.kept(10, 1);
        o.node_gone(1, at(100));
        o.node_seen(1);
        assert!(o.abandoned(at(1_000), Span::from_secs(60)).is_empty());
        // Gone anew: counted from then.
        o.node_gone(1, at(900));
        assert!(o.abandoned(at(950), Span::from_secs(60)).is_empty());
        assert_eq!(o.abandoned(at(960), Span::from_secs(60)), [10]);
    }

    #[test]
    fn after_a_restart_each_keeper_is_gone_until_heard_from() {
        let mut o = Orphans::default();
        o.restored(10, 1, at(5));
        o.restored(11, 2, at(5));
        o.node_seen(1);
        assert!(o.abandoned(at(6), Span::from_secs(60)).is_empty());
        assert_eq!(o.abandoned(at(65), Span::from_secs(60)), [11]);
    }

    #[test]
    fn a_node_without_orphans_is_not_noted() {
        let mut o = Orphans::default();
        o.node_gone(3, at(0));
        o.kept(10, 3);
        assert!(
            o.abandoned(at(1_000), Span::ZERO).is_empty(),
            "gone before it kept the orphan: it was heard from since"
        );
        o.node_gone(3, at(1_000));
        o.ended(10);
        assert!(o.is_empty());
        o.kept(11, 3);
        assert!(
            o.abandoned(at(2_000), Span::ZERO).is_empty(),
            "its last orphan's end forgot that it was gone"
        );
    }
}
