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
//! This is the metadata server's half, a pure state machine: it is told of
//! opens, closes and nodes that went away, and answers with the callbacks
//! the server must make before it replies to an open. The node's half is
//! small (obey a callback; go uncached when told) and lives in the client.

use std::collections::{BTreeMap, HashMap};

/// A node (a client machine, or a mount: each has its own cache).
pub type NodeId = u64;
/// A file, by its metadata handle.
pub type FileId = u64;

/// What the server asks a node to do before an open may proceed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Callback {
    /// Write the file's dirty blocks down and report its size (the node was
    /// the last writer; another node is opening the file).
    Recall,
    /// Write the file's dirty blocks down, drop its cached blocks, and send
    /// its reads and writes to the servers until it is told otherwise by a
    /// later open (the file became write-shared).
    Disable,
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

/// The metadata server's record of who has which file open.
#[derive(Debug, Default)]
pub struct SpriteServer {
    files: HashMap<FileId, Sharing>,
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

    #[derive(Clone, Debug)]
    enum Op {
        Open(NodeId, bool),
        Close(NodeId, bool),
        Gone(NodeId),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1..4u64, any::<bool>()).prop_map(|(n, w)| Op::Open(n, w)),
            (1..4u64, any::<bool>()).prop_map(|(n, w)| Op::Close(n, w)),
            (1..4u64).prop_map(Op::Gone),
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
}
