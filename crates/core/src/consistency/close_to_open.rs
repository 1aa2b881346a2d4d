//! The node's half of version-checked consistency (`close-to-open`, and
//! `sprite`'s open check): pure decisions a node makes at open and close,
//! from the file's version at the metadata server (bumped by every size
//! report and truncate) and the version the node last validated its cached
//! blocks against. NFS's close-to-open, as Sprite's version numbers do it
//! (Biswas et al. 1993 §2): "when a client opens a file and finds blocks
//! from that file in its cache, it checks the version number ... if it does
//! not have the latest version, it removes the old file blocks".

use super::ConsistencyKind;

/// What a node does with its cached blocks of a file it opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenAction {
    /// They are current (or the policy checks nothing): keep them.
    Keep,
    /// Another node changed the file since this node validated `version`:
    /// push this node's own dirty blocks and size (they must not be lost
    /// or hidden), drop the cached blocks, and take the version the file
    /// has after that as validated.
    Drop,
}

/// What a node does when a program closes a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseAction {
    /// Push the file's dirty blocks to the data servers, then its size to
    /// the metadata server, before the close returns.
    Push,
    /// Nothing now: dirty blocks go when the write policy sends them (or
    /// when the metadata server recalls them, under `sprite`).
    Keep,
}

/// The decision at open: `validated` is the version this node last
/// validated against, `current` the version the metadata server has now.
pub fn at_open(kind: ConsistencyKind, validated: u64, current: u64) -> OpenAction {
    if kind.revalidate_on_open() && validated != current {
        OpenAction::Drop
    } else {
        OpenAction::Keep
    }
}

/// The version a node has validated after its own size report (or
/// truncate) moved the file from `validated` to `reported`. Only when the
/// report was the one change since (`reported == validated + 1`) are the
/// node's cached blocks current at the new version; otherwise another node
/// changed the file in between, and the node keeps the old number so that
/// its next open drops them. (Taking the new number unconditionally loses
/// the other node's change: the simulation below found this.)
pub fn after_report(validated: u64, reported: u64) -> u64 {
    if reported == validated + 1 {
        reported
    } else {
        validated
    }
}

/// The decision at close.
pub fn at_close(kind: ConsistencyKind) -> CloseAction {
    if kind.flush_on_close() {
        CloseAction::Push
    } else {
        CloseAction::Keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// A deterministic simulation of the protocol: a server holding one
    /// file of a few blocks and its version, and nodes that cache blocks,
    /// write them, open and close the file, using only the decisions above.
    #[derive(Default)]
    struct Sim {
        server: HashMap<u8, u32>,
        version: u64,
        nodes: HashMap<u8, Node>,
    }

    #[derive(Default)]
    struct Node {
        cached: HashMap<u8, u32>,
        dirty: HashMap<u8, u32>,
        validated: u64,
    }

    impl Sim {
        fn push(&mut self, n: u8) {
            let node = self.nodes.entry(n).or_default();
            if node.dirty.is_empty() {
                return;
            }
            for (b, v) in node.dirty.drain() {
                self.server.insert(b, v);
            }
            self.version += 1; // the size report bumps the version
            node.validated = after_report(node.validated, self.version);
        }
        fn open(&mut self, n: u8) {
            let validated = self.nodes.entry(n).or_default().validated;
            if at_open(ConsistencyKind::CloseToOpen, validated, self.version) == OpenAction::Drop {
                self.push(n);
                let version = self.version;
                let node = self.nodes.entry(n).or_default();
                node.cached.clear();
                node.validated = version;
            }
        }
        fn read(&mut self, n: u8, b: u8) -> u32 {
            let server = self.server.get(&b).copied().unwrap_or(0);
            let node = self.nodes.entry(n).or_default();
            if let Some(v) = node.dirty.get(&b) {
                return *v;
            }
            *node.cached.entry(b).or_insert(server)
        }
        fn write(&mut self, n: u8, b: u8, v: u32) {
            let node = self.nodes.entry(n).or_default();
            node.dirty.insert(b, v);
            node.cached.insert(b, v);
        }
        fn close(&mut self, n: u8) {
            if at_close(ConsistencyKind::CloseToOpen) == CloseAction::Push {
                self.push(n);
            }
        }
    }

    proptest! {
        /// Close-to-open: a node that opens the file after another node
        /// closed it reads exactly what the server holds (everything the
        /// closer wrote), whatever it had cached before, except the blocks
        /// it wrote itself and has not pushed.
        #[test]
        fn an_open_after_a_close_sees_the_closed_bytes(
            ops in proptest::collection::vec((0u8..3, 0u8..4, 0u8..4, any::<u32>()), 1..80)
        ) {
            let mut sim = Sim::default();
            for (node, kind, block, value) in ops {
                match kind {
                    0 => sim.write(node, block, value),
                    1 => { sim.read(node, block); }
                    2 => sim.close(node),
                    _ => {
                        // Another node closes, then this one opens: every
                        // block it reads is the server's.
                        let other = (node + 1) % 3;
                        sim.close(other);
                        sim.open(node);
                        for b in 0..4 {
                            // Its own unpushed writes, else the server's bytes.
                            let own = sim.nodes[&node].dirty.get(&b).copied();
                            let want = own.unwrap_or_else(|| sim.server.get(&b).copied().unwrap_or(0));
                            prop_assert_eq!(sim.read(node, b), want, "node {} block {}", node, b);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn none_keeps_and_sprite_revalidates() {
        assert_eq!(at_open(ConsistencyKind::None, 1, 5), OpenAction::Keep);
        assert_eq!(at_open(ConsistencyKind::Sprite, 1, 5), OpenAction::Drop);
        assert_eq!(at_open(ConsistencyKind::CloseToOpen, 5, 5), OpenAction::Keep);
        assert_eq!(after_report(4, 5), 5);
        assert_eq!(after_report(4, 6), 4, "another node's change in between");
        assert_eq!(at_close(ConsistencyKind::Sprite), CloseAction::Keep);
        assert_eq!(at_close(ConsistencyKind::CloseToOpen), CloseAction::Push);
    }
}
