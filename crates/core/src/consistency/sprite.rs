//! `sprite`: the consistency protocol of the Sprite network file system
//! (Nelson, Welch & Ousterhout 1988), as Biswas et al. 1993 §2 describe it
//! for client caches: every open and close reaches the server; the server
//! remembers the last node that wrote the file with delayed write-back and
//! recalls its dirty blocks when another node opens the file; while a file
//! is open on several nodes and at least one of them writes it
//! (*concurrent write sharing*) caching of it is disabled on all of them,
//! so their reads and writes go to the servers; version numbers (kept by
//! the metadata server) make an opener drop stale cached blocks.
//!
//! Both halves are here. The node's ([`Sprite`]) registers opens and
//! closes at the metadata server and obeys its callbacks; the metadata
//! server's ([`SpriteServer`]) is told of opens, closes and nodes that went
//! away, and answers with the callbacks it must make before it replies to
//! an open.

use super::{
    revalidate, stop_caching, Action, Callback, Consistency, ConsistencyKind, KernelCache, NodeFile, ServerView,
};
pub use crate::ids::{FileId, NodeId};
use crate::time::{Span, Time};
use std::collections::{BTreeMap, HashMap};

/// The node's half.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sprite;

impl Consistency for Sprite {
    fn kind(&self) -> ConsistencyKind {
        ConsistencyKind::Sprite
    }

    fn pre_open(&self, _file: &NodeFile, _now: Time, write: bool) -> Vec<Action> {
        vec![Action::OpenAtServer { write }]
    }

    /// The server said whether this node may cache the file (it may have
    /// become write-shared); the version check follows.
    fn post_open(&self, file: &mut NodeFile, now: Time, server: ServerView, cacheable: bool) -> Vec<Action> {
        file.opens += 1;
        let mut acts = if !cacheable && file.cached {
            stop_caching(file)
        } else {
            vec![]
        };
        acts.extend(revalidate(file, now, server));
        file.cached = cacheable;
        if !cacheable {
            file.size = file.size.max(server.size);
        }
        acts
    }

    /// Delayed write-back: dirty blocks stay (the next opener elsewhere
    /// recalls them); written uncached, the size goes now.
    fn release(&self, file: &mut NodeFile, _now: Time, write: bool) -> Vec<Action> {
        file.opens = file.opens.saturating_sub(1);
        let mut acts = vec![];
        if !file.cached {
            acts.push(Action::ReportSize);
        }
        acts.push(Action::CloseAtServer { write });
        acts
    }

    fn called_back(&self, file: &mut NodeFile, cb: Callback) -> Vec<Action> {
        match cb {
            Callback::Recall => vec![Action::PushDirty, Action::ReportSize],
            Callback::Disable => stop_caching(file),
            Callback::Invalidate => vec![Action::DropHashes],
            Callback::DropBlocks { first, last } => vec![Action::DropBlocks { first, last }],
            // The kernel's attributes: the node's driver, not the plug-in.
            Callback::Forget => vec![],
        }
    }

    /// Caching may be disabled on this node at any moment while the file
    /// is open (when another node starts to share it).
    fn kernel_cache(&self) -> KernelCache {
        KernelCache::Bypass
    }
}

/// The server's answer to an open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Whether the opening node may cache the file.
    pub cacheable: bool,
    /// Callbacks to complete (each node acknowledges) before the open is
    /// answered, so the opener reads what the others wrote.
    pub callbacks: Vec<(NodeId, Callback)>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Opens {
    readers: u32,
    writers: u32,
}

#[derive(Clone, Debug, Default)]
struct Sharing {
    opens: BTreeMap<NodeId, Opens>,
    /// The node that last had the file open for writing with caching on:
    /// it may still hold dirty blocks of it.
    last_writer: Option<NodeId>,
    /// Caching is disabled (the file is, or was since every node last
    /// closed it, write-shared).
    uncached: bool,
}

impl Sharing {
    fn write_shared(&self) -> bool {
        self.opens.len() > 1 && self.opens.values().any(|o| o.writers > 0)
    }
}

/// How long a node has to answer a callback before it is taken to be gone
/// (its opens dropped, the open that waited on it answered).
pub const CALLBACK_TIMEOUT: Span = Span(10_000_000_000);
/// A node that has not polled for callbacks for this long is taken to be
/// gone when a callback for it comes up.
pub const NODE_SILENT: Span = Span(25_000_000_000);

/// How long a restarted server holds opens ([`SpriteServer::recovering`])
/// while the nodes reclaim what they have open and hold dirty: a live node
/// finds the server again within about 1.3 s (its callback poll retries
/// with pauses of at most 1.25 s).
pub const RECLAIM_GRACE: Span = Span(3_000_000_000);

/// A callback waiting for its node to collect it, or to answer it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Queued {
    pub id: u64,
    pub file: FileId,
    pub cb: Callback,
}

/// What an open needs before it is answered: the callbacks to wait for and
/// the nodes that have new ones to collect. Whether the opener may cache is
/// decided when the open is answered ([`SpriteServer::may_cache`]), not
/// here: while it waits, another node's open may make the file write-shared
/// (and call this node back before its own open is answered; the simulator
/// found this).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Opening {
    pub wait: Vec<u64>,
    pub notify: Vec<NodeId>,
    /// Nodes found gone (silent too long): their opens were dropped.
    pub gone: Vec<NodeId>,
}

/// A node as the server sees it: its uncollected callbacks and whether it
/// is listening.
#[derive(Debug, Default)]
struct Link {
    queue: Vec<Queued>,
    polling: u32,
    last_seen: Option<Time>,
}

impl Link {
    fn alive(&self, now: Time) -> bool {
        self.polling > 0 || self.last_seen.is_some_and(|t| now.since(t) < NODE_SILENT)
    }
}

/// The metadata server's half: who has which file open, and the callbacks
/// in flight with their deadlines. Held in memory: after a restart nobody
/// has a file open, and a node with dirty blocks pushes them within its
/// syncer's bound.
#[derive(Debug, Default)]
pub struct SpriteServer {
    files: HashMap<FileId, Sharing>,
    links: HashMap<NodeId, Link>,
    /// Callbacks not yet answered: their node, file and deadline.
    outstanding: BTreeMap<u64, (NodeId, FileId, Time)>,
    /// `Forget` callbacks not yet answered ([`super::leases`]): their node
    /// and the end of its lease, after which nobody waits for them (the
    /// node is not taken to be gone).
    forgets: BTreeMap<u64, (NodeId, Time)>,
    /// Nodes keeping a file's chunk hashes in a coherent H-cache (CAPFS).
    holders: HashMap<FileId, std::collections::BTreeSet<NodeId>>,
    /// Which nodes cache which blocks of `sync-write` files (2003).
    blocks: super::sync_write::BlockDirectory,
    next_id: u64,
    /// Until when opens wait for the nodes' reclaims after a restart.
    grace_until: Option<Time>,
}

impl SpriteServer {
    pub fn new() -> Self {
        Self::default()
    }

    /// `node` opens `file` (for writing if `write`).
    pub fn open(&mut self, node: NodeId, file: FileId, write: bool) -> Grant {
        let s = self.files.entry(file).or_default();
        let mut callbacks = Vec::new();
        let o = s.opens.entry(node).or_default();
        if write {
            o.writers += 1;
        } else {
            o.readers += 1;
        }
        if s.write_shared() {
            if !s.uncached {
                // Every other node with the file open stops caching it (and
                // so writes its dirty blocks down); the last writer among
                // them included.
                s.uncached = true;
                for &n in s.opens.keys().filter(|&&n| n != node) {
                    callbacks.push((n, Callback::Disable));
                }
                if let Some(w) = s.last_writer.filter(|w| *w != node && !s.opens.contains_key(w)) {
                    callbacks.push((w, Callback::Recall));
                }
            } else if let Some(w) = s.last_writer.filter(|w| *w != node) {
                callbacks.push((w, Callback::Recall));
            }
            s.last_writer = None;
        } else if let Some(w) = s.last_writer.filter(|w| *w != node) {
            // Sequential write sharing: the last writer closed the file but
            // may still hold dirty blocks.
            callbacks.push((w, Callback::Recall));
            s.last_writer = None;
        }
        if write && !s.uncached {
            s.last_writer = Some(node);
        }
        Grant {
            cacheable: !s.uncached,
            callbacks,
        }
    }

    /// [`SpriteServer::open`] at `now` with the callback lifecycle: the
    /// callbacks are queued for their nodes (a node silent for
    /// [`NODE_SILENT`] is dropped instead) with a deadline of
    /// [`CALLBACK_TIMEOUT`]; the driver answers the open once none of
    /// `wait` is [`SpriteServer::waiting`] any more.
    pub fn open_at(&mut self, now: Time, node: NodeId, file: FileId, write: bool) -> Opening {
        self.links.entry(node).or_default().last_seen = Some(now);
        let grant = self.open(node, file, write);
        // Callbacks of earlier opens of the file still unanswered: this open
        // waits for them too (the last writer's blocks may be on their way;
        // answering now would let the opener keep stale blocks, as the
        // simulator found).
        let earlier: Vec<u64> = self
            .outstanding
            .iter()
            .filter(|(_, (_, f, _))| *f == file)
            .map(|(id, _)| *id)
            .collect();
        let mut o = Opening {
            wait: earlier,
            notify: vec![],
            gone: vec![],
        };
        for (n, cb) in grant.callbacks {
            self.call_back(now, n, file, cb, &mut o);
        }
        o
    }

    /// Queues `cb` about `file` for node `n` with its deadline, and adds it
    /// to what `o` waits for; a node silent too long is dropped instead.
    fn call_back(&mut self, now: Time, n: NodeId, file: FileId, cb: Callback, o: &mut Opening) {
        if !self.links.get(&n).is_some_and(|l| l.alive(now)) {
            self.drop_node(n);
            o.gone.push(n);
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.links.entry(n).or_default().queue.push(Queued { id, file, cb });
        self.outstanding.insert(id, (n, file, now + CALLBACK_TIMEOUT));
        o.wait.push(id);
        o.notify.push(n);
    }

    /// The server started at `now` knowing nothing of what the nodes have
    /// open, while nodes that outlived its predecessor may have files open
    /// and hold dirty blocks: opens wait until [`RECLAIM_GRACE`] has passed
    /// ([`SpriteServer::grace_ends`]), so the nodes reclaim first. Sprite's
    /// servers recover their state the same way, from their clients
    /// (Welch 1990, "State recovery in Sprite").
    pub fn recovering(&mut self, now: Time) {
        self.grace_until = Some(now + RECLAIM_GRACE);
    }

    /// When an open at `now` may be registered (`None`: at once).
    pub fn grace_ends(&self, now: Time) -> Option<Time> {
        self.grace_until.filter(|&t| t > now)
    }

    /// `node` tells a restarted server that it has `file` open `readers`
    /// and `writers` times, and (`dirty`) that it wrote it and has not
    /// reported all of it: it is (or, if another node claims the same, one
    /// of) the file's last writers. A file these make write-shared is
    /// uncached on every node that has it open, and a second dirty holder
    /// is recalled at once. Sent again, it sets the same.
    pub fn reclaim_at(
        &mut self,
        now: Time,
        node: NodeId,
        file: FileId,
        readers: u32,
        writers: u32,
        dirty: bool,
    ) -> Opening {
        self.links.entry(node).or_default().last_seen = Some(now);
        let s = self.files.entry(file).or_default();
        if readers + writers > 0 {
            s.opens.insert(node, Opens { readers, writers });
        } else {
            s.opens.remove(&node);
        }
        let mut callbacks = vec![];
        if dirty {
            if let Some(w) = s.last_writer.filter(|&w| w != node) {
                callbacks.push((w, Callback::Recall));
            }
            s.last_writer = Some(node);
        }
        if s.write_shared() && !s.uncached {
            s.uncached = true;
            callbacks.extend(s.opens.keys().map(|&n| (n, Callback::Disable)));
        }
        if s.opens.is_empty() && s.last_writer.is_none() {
            self.files.remove(&file);
        }
        let mut o = Opening::default();
        for (n, cb) in callbacks {
            self.call_back(now, n, file, cb, &mut o);
        }
        o
    }

    /// `node` keeps hashes of `file` in a coherent H-cache (CAPFS 2005
    /// §3.4): another node's coherent commit invalidates them.
    pub fn hold(&mut self, now: Time, node: NodeId, file: FileId) {
        self.links.entry(node).or_default().last_seen = Some(now);
        self.holders.entry(file).or_default().insert(node);
    }

    /// `node` committed new hashes of `file` with coherence: every other
    /// holder is sent `Invalidate` (and holds nothing until it fetches
    /// again); the commit is complete when none of `wait` is waiting.
    pub fn invalidate_at(&mut self, now: Time, node: NodeId, file: FileId) -> Opening {
        let mut o = Opening::default();
        let others: Vec<NodeId> = match self.holders.get_mut(&file) {
            Some(h) => {
                let others = h.iter().copied().filter(|&n| n != node).collect();
                h.retain(|&n| n == node);
                others
            }
            None => vec![],
        };
        for n in others {
            self.call_back(now, n, file, Callback::Invalidate, &mut o);
        }
        o
    }

    /// Another node changed `file`: each of `holders` (a node and the end
    /// of its lease, from [`super::leases::Leases::changed`]) is sent
    /// `Forget`; the change is answered when none of `wait` is waiting,
    /// an unanswered one no longer than its lease.
    pub fn forget_at(&mut self, now: Time, file: FileId, holders: &[(NodeId, Time)]) -> Opening {
        let mut o = Opening::default();
        for &(n, until) in holders {
            if until <= now {
                continue;
            }
            let id = self.next_id;
            self.next_id += 1;
            // A node not listening cannot forget: the change waits for
            // its lease to run out instead.
            if self.links.get(&n).is_some_and(|l| l.alive(now)) {
                self.links.entry(n).or_default().queue.push(Queued {
                    id,
                    file,
                    cb: Callback::Forget,
                });
                o.notify.push(n);
            }
            self.forgets.insert(id, (n, until));
            o.wait.push(id);
        }
        o
    }

    /// `node`'s kernel holds nothing any more (its connection closed):
    /// no change waits for its answers to `Forget`.
    pub fn forgets_gone(&mut self, node: NodeId) {
        self.forgets.retain(|_, (n, _)| *n != node);
        if let Some(l) = self.links.get_mut(&node) {
            l.queue.retain(|q| q.cb != Callback::Forget);
        }
    }

    /// `node` is about to cache blocks `first..=last` of a `sync-write`
    /// file.
    pub fn hold_blocks(&mut self, now: Time, node: NodeId, file: FileId, first: u64, last: u64) {
        self.links.entry(node).or_default().last_seen = Some(now);
        self.blocks.hold(node, file, first, last);
    }

    /// `node` wrote blocks `first..=last` of a `sync-write` file through
    /// to the data servers: every other node caching one of them is sent
    /// `DropBlocks`; the write is complete when none of `wait` is waiting.
    pub fn sync_written_at(&mut self, now: Time, node: NodeId, file: FileId, first: u64, last: u64) -> Opening {
        let mut o = Opening::default();
        for n in self.blocks.written(node, file, first, last) {
            self.call_back(now, n, file, Callback::DropBlocks { first, last }, &mut o);
        }
        o
    }

    /// `node` asks for its callbacks: those queued, or `None` when there
    /// are none (the driver waits for a notification, then calls
    /// [`SpriteServer::poll_ended`]).
    pub fn poll(&mut self, now: Time, node: NodeId) -> Option<Vec<Queued>> {
        let link = self.links.entry(node).or_default();
        link.last_seen = Some(now);
        if link.queue.is_empty() {
            link.polling += 1;
            None
        } else {
            Some(std::mem::take(&mut link.queue))
        }
    }

    /// A poll that found nothing ends (notified or timed out).
    pub fn poll_ended(&mut self, now: Time, node: NodeId) -> Vec<Queued> {
        let link = self.links.entry(node).or_default();
        link.polling = link.polling.saturating_sub(1);
        link.last_seen = Some(now);
        std::mem::take(&mut link.queue)
    }

    /// `node` did callback `id`.
    pub fn answered(&mut self, node: NodeId, id: u64) {
        if self.outstanding.get(&id).is_some_and(|(n, _, _)| *n == node) {
            self.outstanding.remove(&id);
        }
        if self.forgets.get(&id).is_some_and(|(n, _)| *n == node) {
            self.forgets.remove(&id);
        }
    }

    /// Whether any of `ids` is still unanswered.
    pub fn waiting(&self, ids: &[u64]) -> bool {
        ids.iter()
            .any(|id| self.outstanding.contains_key(id) || self.forgets.contains_key(id))
    }

    /// The earliest deadline of an unanswered callback.
    pub fn next_deadline(&self) -> Option<Time> {
        let forgets = self.forgets.values().map(|(_, t)| *t);
        self.outstanding.values().map(|(_, _, t)| *t).chain(forgets).min()
    }

    /// Nodes with a callback past its deadline are taken to be gone (their
    /// opens dropped); returns them. A `Forget` unanswered at the end of its lease is dropped alone.
    pub fn expire(&mut self, now: Time) -> Vec<NodeId> {
        self.forgets.retain(|_, (_, until)| *until > now);
        let mut late: Vec<NodeId> = self
            .outstanding
            .values()
            .filter(|(_, _, t)| *t <= now)
            .map(|(n, _, _)| *n)
            .collect();
        late.sort_unstable();
        late.dedup();
        for &n in &late {
            self.drop_node(n);
        }
        late
    }

    fn drop_node(&mut self, node: NodeId) {
        self.links.remove(&node);
        for h in self.holders.values_mut() {
            h.remove(&node);
        }
        self.blocks.node_gone(node);
        self.outstanding.retain(|_, (n, _, _)| *n != node);
        self.node_gone(node);
    }

    /// `node` closes `file`, opened with the same `write`. Dirty blocks may
    /// stay on the node (delayed write-back); the next opener elsewhere
    /// recalls them. When nobody has the file open any more, caching of it
    /// is allowed again.
    pub fn close(&mut self, node: NodeId, file: FileId, write: bool) {
        let Some(s) = self.files.get_mut(&file) else {
            return;
        };
        if let Some(o) = s.opens.get_mut(&node) {
            let n = if write { &mut o.writers } else { &mut o.readers };
            *n = n.saturating_sub(1);
            if *o == Opens::default() {
                s.opens.remove(&node);
            }
        }
        if s.opens.is_empty() {
            s.uncached = false;
            if s.last_writer.is_none() {
                self.files.remove(&file);
            }
        }
    }

    /// `node` went away (its mount ended or stopped answering): its opens
    /// end and it holds no dirty blocks any more that anyone could recall.
    pub fn node_gone(&mut self, node: NodeId) {
        let files: Vec<FileId> = self.files.keys().copied().collect();
        for f in files {
            let s = self.files.get_mut(&f).expect("listed");
            s.opens.remove(&node);
            if s.last_writer == Some(node) {
                s.last_writer = None;
            }
            if s.opens.is_empty() {
                s.uncached = false;
                if s.last_writer.is_none() {
                    self.files.remove(&f);
                }
            }
        }
    }

    /// The file was removed: forget it.
    pub fn removed(&mut self, file: FileId) {
        self.files.remove(&file);
        self.holders.remove(&file);
    }

    /// The answer to an open of `file` once its callbacks are done: whether
    /// the opener may cache it, as the file's sharing is now.
    pub fn may_cache(&self, file: FileId) -> bool {
        !self.is_uncached(file)
    }

    /// Whether caching of `file` is disabled now.
    pub fn is_uncached(&self, file: FileId) -> bool {
        self.files.get(&file).is_some_and(|s| s.uncached)
    }

    /// Nodes that have `file` open.
    pub fn openers(&self, file: FileId) -> usize {
        self.files.get(&file).map_or(0, |s| s.opens.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_lone_node_caches_and_is_never_called_back() {
        let mut s = SpriteServer::new();
        let g = s.open(1, 7, true);
        assert_eq!(
            g,
            Grant {
                cacheable: true,
                callbacks: vec![]
            }
        );
        s.close(1, 7, true);
        let g = s.open(1, 7, false);
        assert_eq!(
            g,
            Grant {
                cacheable: true,
                callbacks: vec![]
            }
        );
    }

    #[test]
    fn the_last_writer_is_recalled_when_another_node_opens() {
        let mut s = SpriteServer::new();
        s.open(1, 7, true);
        s.close(1, 7, true);
        let g = s.open(2, 7, false);
        assert!(g.cacheable);
        assert_eq!(g.callbacks, vec![(1, Callback::Recall)]);
        // Recalled once: a third opener has nothing to recall.
        s.close(2, 7, false);
        assert_eq!(s.open(3, 7, false).callbacks, vec![]);
    }

    #[test]
    fn readers_on_many_nodes_share_with_caching_on() {
        let mut s = SpriteServer::new();
        for n in 1..=4 {
            let g = s.open(n, 7, false);
            assert_eq!(
                g,
                Grant {
                    cacheable: true,
                    callbacks: vec![]
                }
            );
        }
    }

    #[test]
    fn concurrent_write_sharing_disables_caching_everywhere_until_all_close() {
        let mut s = SpriteServer::new();
        assert!(s.open(1, 7, true).cacheable);
        let g = s.open(2, 7, false);
        assert!(!g.cacheable);
        assert_eq!(g.callbacks, vec![(1, Callback::Disable)]);
        // A third node joins an uncached file: nobody else to call.
        let g = s.open(3, 7, true);
        assert_eq!(
            g,
            Grant {
                cacheable: false,
                callbacks: vec![]
            }
        );
        s.close(1, 7, true);
        s.close(2, 7, false);
        assert!(s.is_uncached(7), "node 3 still has it open");
        s.close(3, 7, true);
        assert!(!s.is_uncached(7));
        // Writes went to the servers while uncached: nothing to recall.
        assert_eq!(
            s.open(1, 7, false),
            Grant {
                cacheable: true,
                callbacks: vec![]
            }
        );
    }

    #[test]
    fn a_node_that_went_away_is_neither_recalled_nor_sharing() {
        let mut s = SpriteServer::new();
        s.open(1, 7, true);
        s.node_gone(1);
        assert_eq!(
            s.open(2, 7, true),
            Grant {
                cacheable: true,
                callbacks: vec![]
            }
        );
        assert_eq!(s.openers(7), 1);
    }

    /// After a restart the nodes' reclaims stand for what the server
    /// forgot: a dirty holder is recalled by the next open elsewhere, a
    /// file the reclaims show write-shared is uncached on every node that
    /// has it open, a reclaim sent twice counts once, and opens wait out
    /// the grace period.
    #[test]
    fn reclaims_after_a_restart_stand_for_what_the_server_forgot() {
        let now = Time(5);
        let mut s = SpriteServer::new();
        assert_eq!(s.grace_ends(now), None, "a server that never restarted");
        s.recovering(now);
        assert_eq!(s.grace_ends(now), Some(now + RECLAIM_GRACE));
        assert_eq!(s.grace_ends(now + RECLAIM_GRACE), None);
        // Node 1 closed file 7 with dirty blocks; node 2 has file 8 open
        // for writing, node 3 for reading.
        let o = s.reclaim_at(now, 1, 7, 0, 0, true);
        assert!(o.wait.is_empty());
        s.reclaim_at(now, 2, 8, 0, 1, true);
        s.reclaim_at(now, 2, 8, 0, 1, true);
        let o = s.reclaim_at(now, 3, 8, 1, 0, false);
        assert_eq!(o.notify.len(), 2, "both openers of the write-shared file told");
        assert!(s.is_uncached(8));
        let queued = |s: &mut SpriteServer, n| {
            s.poll(now, n)
                .unwrap_or_default()
                .iter()
                .map(|q| (q.file, q.cb))
                .collect::<Vec<_>>()
        };
        assert_eq!(queued(&mut s, 2), vec![(8, Callback::Disable)]);
        assert_eq!(queued(&mut s, 3), vec![(8, Callback::Disable)]);
        assert_eq!(s.openers(8), 2);
        s.close(2, 8, true);
        s.close(3, 8, false);
        assert_eq!(s.openers(8), 0, "a reclaim sent twice counted twice");
        let g = s.open(4, 7, false);
        assert_eq!(g.callbacks, vec![(1, Callback::Recall)], "the dirty holder is recalled");
    }

    #[derive(Clone, Debug)]
    enum Op {
        Open(NodeId, bool),
        Close(NodeId, bool),
        Gone(NodeId),
        /// The server restarts knowing nothing; every node reclaims.
        Restart,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1..4u64, any::<bool>()).prop_map(|(n, w)| Op::Open(n, w)),
            (1..4u64, any::<bool>()).prop_map(|(n, w)| Op::Close(n, w)),
            (1..4u64).prop_map(Op::Gone),
            Just(Op::Restart),
        ]
    }

    proptest! {
        /// Sprite's guarantee, checked against a model of the nodes' caches:
        /// a node caching the file never has dirty blocks another node
        /// could miss: whenever a node opens, every other node that may
        /// hold dirty blocks of the file is recalled or disabled; and a
        /// file open on several nodes with a writer is cached by none.
        #[test]
        fn no_open_misses_dirty_blocks_and_write_sharing_is_uncached(ops in proptest::collection::vec(op(), 1..60)) {
            let mut s = SpriteServer::new();
            // Model: per node, (readers, writers, caching, may hold dirty blocks).
            let mut nodes: BTreeMap<NodeId, (u32, u32, bool, bool)> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Open(n, w) => {
                        let g = s.open(n, 7, w);
                        for (m, cb) in &g.callbacks {
                            prop_assert_ne!(*m, n);
                            let e = nodes.entry(*m).or_default();
                            e.3 = false; // pushed its dirty blocks
                            if *cb == Callback::Disable {
                                e.2 = false;
                            }
                        }
                        for (m, e) in &nodes {
                            prop_assert!(*m == n || !e.3, "node {} kept dirty blocks past an open by {}", m, n);
                        }
                        let e = nodes.entry(n).or_default();
                        if w { e.1 += 1 } else { e.0 += 1 }
                        e.2 = g.cacheable;
                        if w && g.cacheable {
                            e.3 = true;
                        }
                    }
                    Op::Close(n, w) => {
                        let open = nodes.get(&n).is_some_and(|e| if w { e.1 > 0 } else { e.0 > 0 });
                        if !open {
                            continue;
                        }
                        s.close(n, 7, w);
                        let e = nodes.get_mut(&n).expect("open");
                        if w { e.1 -= 1 } else { e.0 -= 1 }
                    }
                    Op::Gone(n) => {
                        s.node_gone(n);
                        nodes.remove(&n);
                    }
                    Op::Restart => {
                        s = SpriteServer::new();
                        s.recovering(Time::ZERO);
                        for (&n, e) in &nodes {
                            s.reclaim_at(Time::ZERO, n, 7, e.0, e.1, e.3);
                        }
                        for (&n, e) in nodes.iter_mut() {
                            for q in s.poll(Time::ZERO, n).unwrap_or_default() {
                                e.3 = false;
                                if q.cb == Callback::Disable {
                                    e.2 = false;
                                }
                            }
                        }
                    }
                }
                let open: Vec<_> = nodes.iter().filter(|(_, e)| e.0 + e.1 > 0).collect();
                let shared = open.len() > 1 && open.iter().any(|(_, e)| e.1 > 0);
                if shared {
                    for (n, e) in &open {
                        prop_assert!(!e.2, "node {} caches a write-shared file", n);
                    }
                }
                prop_assert_eq!(s.openers(7), open.len());
            }
        }
    }

    /// What travels to a node in the simulation below.
    #[derive(Clone, Debug)]
    enum ToNode {
        /// The answer to an open: may it cache, what [`NodeFile::stopped`]
        /// was when the open was sent, for writing, and the callbacks the
        /// server waits on before it answers.
        Grant(bool, u64, bool, Vec<u64>),
        Call(u64, Callback),
    }

    #[derive(Clone, Debug)]
    enum Step {
        Open(NodeId, bool),
        Close(NodeId, bool),
        /// Delivers the `k`-th message on its way to the node (mod their
        /// number): answers and callbacks travel apart, in any order.
        Deliver(NodeId, usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (1..4u64, any::<bool>()).prop_map(|(n, w)| Step::Open(n, w)),
            (1..4u64, any::<bool>()).prop_map(|(n, w)| Step::Close(n, w)),
            (1..4u64, 0..4usize).prop_map(|(n, k)| Step::Deliver(n, k)),
            (1..4u64, 0..4usize).prop_map(|(n, k)| Step::Deliver(n, k)),
        ]
    }

    proptest! {
        /// Both halves, with the server's answers to opens and its
        /// callbacks delivered to each node in any order (they travel on
        /// different connections): a node never caches the file while the
        /// server has it uncached, unless what tells it so (a `Disable`,
        /// or the answer to its own open) is still on its way. Taking an answer that a later `Disable`
        /// overtook broke this (`NodeFile::may_cache`); two nodes appending
        /// to one log lost a line to it.
        #[test]
        fn no_node_caches_an_uncached_file_whatever_order_messages_arrive(steps in proptest::collection::vec(step(), 1..80)) {
            let mut s = SpriteServer::new();
            let view = ServerView { size: 0, version: 1 };
            let mut files: BTreeMap<NodeId, NodeFile> = BTreeMap::new();
            let mut inbox: BTreeMap<NodeId, Vec<ToNode>> = BTreeMap::new();
            // Opens answered at each node: (readers, writers).
            let mut opened: BTreeMap<NodeId, (u32, u32)> = BTreeMap::new();
            let mut answered = std::collections::BTreeSet::new();
            let mut next = 0;
            for st in steps {
                match st {
                    Step::Open(n, w) => {
                        let f = files.entry(n).or_insert_with(|| NodeFile::new(view, Time::ZERO));
                        let sent = f.stopped;
                        let g = s.open(n, 7, w);
                        let mut waits = vec![];
                        for (m, cb) in g.callbacks {
                            next += 1;
                            waits.push(next);
                            inbox.entry(m).or_default().push(ToNode::Call(next, cb));
                        }
                        inbox.entry(n).or_default().push(ToNode::Grant(g.cacheable, sent, w, waits));
                    }
                    Step::Close(n, w) => {
                        let o = opened.entry(n).or_default();
                        let count = if w { &mut o.1 } else { &mut o.0 };
                        if *count == 0 {
                            continue;
                        }
                        *count -= 1;
                        let f = files.get_mut(&n).expect("opened");
                        Sprite.release(f, Time::ZERO, w);
                        s.close(n, 7, w);
                    }
                    Step::Deliver(n, k) => {
                        let q = inbox.entry(n).or_default();
                        // An open's answer leaves the server once the
                        // callbacks it waits on were answered.
                        let ready: Vec<usize> = (0..q.len())
                            .filter(|&i| match &q[i] {
                                ToNode::Grant(_, _, _, waits) => waits.iter().all(|id| answered.contains(id)),
                                ToNode::Call(..) => true,
                            })
                            .collect();
                        if ready.is_empty() {
                            continue;
                        }
                        let msg = q.remove(ready[k % ready.len()]);
                        let f = files.entry(n).or_insert_with(|| NodeFile::new(view, Time::ZERO));
                        match msg {
                            ToNode::Grant(cacheable, sent, w, _) => {
                                let cacheable = f.may_cache(cacheable, sent);
                                Sprite.post_open(f, Time::ZERO, view, cacheable);
                                let o = opened.entry(n).or_default();
                                if w { o.1 += 1 } else { o.0 += 1 }
                            }
                            ToNode::Call(id, cb) => {
                                Sprite.called_back(f, cb);
                                answered.insert(id);
                            }
                        }
                    }
                }
                for (n, f) in &files {
                    let open = opened.get(n).is_some_and(|o| o.0 + o.1 > 0);
                    let told = inbox.get(n).is_some_and(|q| {
                        q.iter().any(|m| matches!(m, ToNode::Call(_, Callback::Disable) | ToNode::Grant(false, ..)))
                    });
                    prop_assert!(
                        !(open && f.cached && s.is_uncached(7)) || told,
                        "node {} caches a file the server has uncached", n
                    );
                }
            }
        }
    }

    #[test]
    fn callbacks_are_queued_collected_answered_or_expire() {
        let t = |s: u64| Time(s * 1_000_000_000);
        let mut s = SpriteServer::new();
        // Node 1 writes and closes; it polls, so it is alive.
        s.open_at(t(0), 1, 7, true);
        s.close(1, 7, true);
        assert_eq!(s.poll(t(0), 1), None);
        let o = s.open_at(t(1), 2, 7, false);
        assert_eq!((o.wait.len(), o.notify.as_slice()), (1, &[1][..]));
        assert!(s.waiting(&o.wait));
        let got = s.poll_ended(t(1), 1);
        assert_eq!(
            got,
            [Queued {
                id: o.wait[0],
                file: 7,
                cb: Callback::Recall
            }]
        );
        s.answered(1, got[0].id);
        assert!(!s.waiting(&o.wait));
        // Node 2 held it open for writing and never answers: after the
        // deadline it is gone and the open waiting on it goes ahead.
        s.close(2, 7, false);
        s.open_at(t(2), 2, 7, true);
        s.close(2, 7, true);
        let o = s.open_at(t(3), 3, 7, false);
        assert_eq!(s.next_deadline(), Some(t(3) + CALLBACK_TIMEOUT));
        assert!(s.expire(t(12)).is_empty());
        assert_eq!(s.expire(t(13)), [2]);
        assert!(!s.waiting(&o.wait));
        // An open while another open's recall is on its way waits for it
        // too (the simulator found a reader answered before the recalled
        // blocks arrived, keeping stale ones).
        s.open_at(t(14), 6, 9, true);
        s.close(6, 9, true);
        s.poll(t(14), 6);
        let first = s.open_at(t(15), 7, 9, false);
        let second = s.open_at(t(15), 8, 9, false);
        assert_eq!(second.wait, first.wait);
        // Coherent H-caches: a commit invalidates the other holders once.
        s.poll(t(14), 9);
        s.hold(t(14), 9, 11);
        s.hold(t(14), 6, 11);
        let o = s.invalidate_at(t(14), 6, 11);
        assert_eq!(o.notify, [9]);
        assert!(
            s.invalidate_at(t(14), 6, 11).wait.is_empty(),
            "9 holds nothing until it fetches again"
        );
        let got = s.poll_ended(t(14), 9);
        assert_eq!(got[0].cb, Callback::Invalidate);
        // A node silent too long is not called back at all.
        s.open_at(t(20), 4, 8, true);
        s.close(4, 8, true);
        let o = s.open_at(t(60), 5, 8, false);
        assert_eq!((o.wait.len(), o.gone.as_slice()), (0, &[4][..]));
    }

    /// A lease holder is sent `Forget`; the change waits for its answer,
    /// or for the end of its lease if it does not answer, and a holder
    /// that does not answer is not taken to be gone.
    #[test]
    fn forgets_wait_for_the_answer_or_the_end_of_the_lease() {
        let t = |s: u64| Time(s * 1_000_000_000);
        let mut s = SpriteServer::new();
        assert_eq!(s.poll(t(1), 7), None, "7 listens");
        let o = s.forget_at(t(2), 100, &[(7, t(11)), (8, t(11)), (9, t(1))]);
        assert_eq!(o.notify, [7], "8 does not listen; 9's lease is over");
        assert_eq!(o.wait.len(), 2);
        let got = s.poll_ended(t(2), 7);
        assert_eq!((got[0].file, got[0].cb), (100, Callback::Forget));
        s.answered(7, got[0].id);
        assert!(s.waiting(&o.wait), "8 has not answered");
        assert_eq!(s.next_deadline(), Some(t(11)));
        assert_eq!(s.expire(t(10)), Vec::<NodeId>::new());
        assert!(s.waiting(&o.wait));
        assert_eq!(s.expire(t(11)), Vec::<NodeId>::new(), "8 is not gone");
        assert!(!s.waiting(&o.wait));
        assert_eq!(s.next_deadline(), None);
        // A holder whose connection closed holds nothing: no wait for it.
        let o = s.forget_at(t(12), 100, &[(7, t(22))]);
        assert!(s.waiting(&o.wait));
        s.forgets_gone(7);
        assert!(!s.waiting(&o.wait));
        assert_eq!(s.poll(t(12), 7), None, "its queued Forget is gone too");
    }
}
