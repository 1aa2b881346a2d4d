//! `sync-write` (Vilayannur et al. 2003 §3.2.3): "a special version of the
//! write ... which not only propagates the writes to the global cache/IOD,
//! but also invalidates the local caches which have a copy ... Coherence is
//! maintained at a block granularity, and thus requires a directory entry
//! per block to keep track of the local caches that have a current copy".
//!
//! The node half: every write goes through to the data servers before it
//! returns, then the metadata server has every other node that caches one
//! of the written blocks drop it, and answers once they all did. A node
//! tells the directory which blocks it caches before it fetches them. The
//! kernel above a mount caches nothing, so a dropped block is read anew.
//! Opens revalidate as `close-to-open` does (a size change elsewhere drops
//! cached blocks). The server half is [`BlockDirectory`], run by
//! [`super::sprite::SpriteServer`] with its callbacks and deadlines.

use super::{revalidate, Action, Callback, Consistency, ConsistencyKind, KernelCache, NodeFile, ServerView};
use crate::block::BlockKey;
use crate::ids::NodeId;
use crate::time::Time;
use std::collections::{BTreeSet, HashMap};

/// The plug-in.
#[derive(Clone, Copy, Debug, Default)]
pub struct SyncWrite;

impl Consistency for SyncWrite {
    fn kind(&self) -> ConsistencyKind {
        ConsistencyKind::SyncWrite
    }

    fn pre_open(&self, _file: &NodeFile, _now: Time, _write: bool) -> Vec<Action> {
        vec![Action::FetchAttr]
    }

    fn post_open(&self, file: &mut NodeFile, now: Time, server: ServerView, _cacheable: bool) -> Vec<Action> {
        file.opens += 1;
        revalidate(file, now, server)
    }

    fn read_past_end(&self, _file: &NodeFile) -> Vec<Action> {
        vec![Action::FetchAttr]
    }

    /// Another node's write that grew the file (its size reported at once)
    /// is read past the end this node knew.
    fn revalidated(&self, file: &mut NodeFile, now: Time, server: ServerView) -> Vec<Action> {
        revalidate(file, now, server)
    }

    fn post_write(&self, file: &mut NodeFile, _now: Time, grew: bool) -> Vec<Action> {
        let mut acts = vec![Action::PushDirty];
        if grew {
            acts.push(Action::ReportSize);
        }
        if let Some((first, last)) = file.written_blocks {
            acts.push(Action::InvalidateOthers { first, last });
        }
        acts
    }

    fn flush(&self, _file: &mut NodeFile, _now: Time) -> Vec<Action> {
        vec![Action::PushDirty, Action::ReportSize]
    }

    fn called_back(&self, _file: &mut NodeFile, cb: Callback) -> Vec<Action> {
        match cb {
            Callback::DropBlocks { first, last } => vec![Action::DropBlocks { first, last }],
            _ => vec![Action::PushDirty, Action::ReportSize],
        }
    }

    fn kernel_cache(&self) -> KernelCache {
        KernelCache::Bypass
    }

    fn tracks_blocks(&self) -> bool {
        true
    }
}

/// The per-block directory: which nodes cache which blocks.
#[derive(Clone, Debug, Default)]
pub struct BlockDirectory {
    holders: HashMap<BlockKey, BTreeSet<NodeId>>,
}

impl BlockDirectory {
    /// `node` is about to cache blocks `first..=last` of `file`.
    pub fn hold(&mut self, node: NodeId, file: u64, first: u64, last: u64) {
        for i in first..=last {
            self.holders.entry(BlockKey::new(file, i)).or_default().insert(node);
        }
    }

    /// `node` wrote blocks `first..=last` of `file` through: every other
    /// node caching one of them must drop them. Returns those nodes (they
    /// hold nothing of the range afterwards); `node` holds the range now
    /// (its cache keeps what it wrote).
    pub fn written(&mut self, node: NodeId, file: u64, first: u64, last: u64) -> Vec<NodeId> {
        let mut others = BTreeSet::new();
        for i in first..=last {
            let key = BlockKey::new(file, i);
            let h = self.holders.entry(key).or_default();
            others.extend(h.iter().copied().filter(|&n| n != node));
            h.clear();
            h.insert(node);
        }
        others.into_iter().collect()
    }

    /// `node` is gone: it holds nothing.
    pub fn node_gone(&mut self, node: NodeId) {
        self.holders.retain(|_, h| {
            h.remove(&node);
            !h.is_empty()
        });
    }

    /// `file` is gone (removed).
    pub fn file_gone(&mut self, file: u64) {
        self.holders.retain(|k, _| k.file != file);
    }

    pub fn holders(&self, file: u64, index: u64) -> Vec<NodeId> {
        self.holders
            .get(&BlockKey::new(file, index))
            .map(|h| h.iter().copied().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_invalidates_exactly_the_other_holders_of_its_blocks() {
        let mut d = BlockDirectory::default();
        d.hold(1, 7, 0, 3);
        d.hold(2, 7, 2, 5);
        d.hold(3, 8, 0, 9);
        // Node 1 writes blocks 3..=4: node 2 holds 3 and 4; node 3 holds
        // another file.
        assert_eq!(d.written(1, 7, 3, 4), vec![2]);
        assert_eq!(d.holders(7, 3), vec![1], "the writer keeps its copy");
        assert_eq!(d.holders(7, 4), vec![1], "a writer caches what it wrote");
        assert_eq!(d.holders(7, 5), vec![2], "outside the write: kept");
        // Once dropped, node 2 is not called again for those blocks; a
        // write by node 2 calls node 1 back.
        assert_eq!(d.written(1, 7, 3, 4), Vec::<NodeId>::new());
        assert_eq!(d.written(2, 7, 4, 4), vec![1]);
        d.node_gone(3);
        assert!(d.holders(8, 0).is_empty());
        d.file_gone(7);
        assert!(d.holders(7, 5).is_empty());
    }

    #[test]
    fn writes_go_through_and_invalidate_and_the_kernel_caches_nothing() {
        let p = SyncWrite;
        let mut f = NodeFile::new(ServerView { size: 0, version: 0 }, Time(0));
        f.written_blocks = Some((2, 3));
        assert_eq!(
            p.post_write(&mut f, Time(1), true),
            vec![
                Action::PushDirty,
                Action::ReportSize,
                Action::InvalidateOthers { first: 2, last: 3 }
            ]
        );
        assert_eq!(
            p.called_back(&mut f, Callback::DropBlocks { first: 4, last: 4 }),
            vec![Action::DropBlocks { first: 4, last: 4 }]
        );
        assert_eq!(p.kernel_cache(), KernelCache::Bypass);
        assert!(p.tracks_blocks());
    }
}
