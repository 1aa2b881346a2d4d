//! The histories the consistency plug-ins promise, and a checker for them.
//! A run of the model ([`super::model`]) records every open, close, read
//! and write with its start and end in virtual time; the checker finds the
//! reads that broke a promise. Values are unique per write, and the
//! metadata-and-data server numbers them in the order it applied them, so
//! "newer" means later at the server.

use parcache_core::{ConsistencyKind, Time};
use std::collections::HashMap;

/// A guarantee a plug-in may give.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Promise {
    /// A read in a session that opened after another node's session closed
    /// returns what that session wrote, or something newer (NFS's
    /// close-to-open; also given by `session` and `nfs`).
    CloseToOpen,
    /// A read returns what every other node's write that completed before
    /// the read began wrote, or something newer (POSIX read-after-write;
    /// given by `posix` and `sprite`).
    ReadAfterWrite,
}

impl Promise {
    pub const ALL: [Promise; 2] = [Promise::CloseToOpen, Promise::ReadAfterWrite];

    pub fn name(self) -> &'static str {
        match self {
            Promise::CloseToOpen => "close-to-open",
            Promise::ReadAfterWrite => "read-after-write",
        }
    }
}

/// The promises each plug-in makes (DESIGN.md §3; docs/policies.md).
pub fn promises(kind: ConsistencyKind) -> &'static [Promise] {
    match kind {
        ConsistencyKind::CloseToOpen | ConsistencyKind::Nfs { .. } | ConsistencyKind::Session => {
            &[Promise::CloseToOpen]
        }
        ConsistencyKind::Sprite | ConsistencyKind::Posix | ConsistencyKind::SyncWrite => {
            &[Promise::CloseToOpen, Promise::ReadAfterWrite]
        }
        // Modelled in `capfs05` (content-addressed), not in this model.
        ConsistencyKind::None | ConsistencyKind::Capfs(_) => &[],
    }
}

/// What an operation was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Open { write: bool },
    Close,
    Read,
    Write,
}

/// One operation of one node, as it happened.
#[derive(Clone, Copy, Debug)]
pub struct Rec {
    pub node: usize,
    pub kind: OpKind,
    pub block: u64,
    /// The value read or written (0: never written).
    pub value: u64,
    pub start: Time,
    pub end: Time,
    /// The node's session (open to close) the operation belongs to.
    pub session: u64,
}

/// A read that broke a promise, explained.
pub type Violation = String;

/// Checks `history` against `promise`; `applied` maps each value to the
/// order in which the server applied it (values never applied are absent;
/// the initial 0 is order 0).
pub fn check(history: &[Rec], applied: &HashMap<u64, u64>, promise: Promise) -> Vec<Violation> {
    let seq = |v: u64| if v == 0 { Some(0) } else { applied.get(&v).copied() };
    // Per session: its node, open start and close end.
    let mut opened: HashMap<u64, Time> = HashMap::new();
    let mut closed: HashMap<u64, Time> = HashMap::new();
    for r in history {
        match r.kind {
            OpKind::Open { .. } => {
                opened.insert(r.session, r.start);
            }
            OpKind::Close => {
                closed.insert(r.session, r.end);
            }
            _ => {}
        }
    }
    // Writes with their place in the history (the order they completed).
    let writes: Vec<(usize, &Rec)> = history
        .iter()
        .enumerate()
        .filter(|(_, r)| r.kind == OpKind::Write)
        .collect();
    let mut out = Vec::new();
    for r in history.iter().filter(|r| r.kind == OpKind::Read) {
        // A value this session wrote itself is always a right answer.
        if writes
            .iter()
            .any(|(_, w)| w.session == r.session && w.value == r.value && w.block == r.block)
        {
            continue;
        }
        let before: Box<dyn Fn(&Rec) -> bool + '_> = match promise {
            Promise::CloseToOpen => {
                let open = opened.get(&r.session).copied().unwrap_or(r.start);
                let closed = &closed;
                Box::new(move |w: &Rec| closed.get(&w.session).is_some_and(|&c| c < open))
            }
            Promise::ReadAfterWrite => Box::new(move |w: &Rec| w.end < r.start),
        };
        let due: Vec<&(usize, &Rec)> = writes
            .iter()
            .filter(|(_, w)| w.node != r.node && w.block == r.block && before(w))
            .collect();
        // A node's later write of the block supersedes its earlier ones
        // (overwritten in its cache, they need never reach the server).
        let due: Vec<&Rec> = due
            .iter()
            .filter(|(i, w)| !due.iter().any(|(j, x)| x.node == w.node && j > i))
            .map(|(_, w)| *w)
            .collect();
        if due.is_empty() {
            continue;
        }
        // Each due write is an obligation: the read returns it or a value
        // the server applied after it. One that never reached the server
        // (overwritten in its node's cache by a write not yet due) is met
        // by that later write, or by anything the server applied after it.
        for w in due {
            let later = || {
                history
                    .iter()
                    .skip_while(|x| !std::ptr::eq(*x, w))
                    .filter(|x| x.kind == OpKind::Write && x.node == w.node && x.block == w.block)
            };
            let floor = match seq(w.value) {
                Some(s) => Some((s, w.value)),
                None if later().any(|x| x.value == r.value) => continue,
                None => later().find_map(|x| seq(x.value).map(|s| (s, x.value))),
            };
            let Some((s, v)) = floor else {
                out.push(format!(
                    "node {} read block {} = {} at {:?}: node {}'s write of {} was due and never reached the server",
                    r.node, r.block, r.value, r.start, w.node, w.value
                ));
                break;
            };
            // The reader's own write made after the due one is newer too,
            // whether or not it has reached the server yet.
            let own_later = writes
                .iter()
                .any(|(_, x)| x.node == r.node && x.block == r.block && x.value == r.value && x.start >= w.end);
            if r.value != v && !own_later && seq(r.value).is_none_or(|got| got <= s) {
                out.push(format!(
                    "node {} read block {} = {} at {:?} ({}); node {}'s {} was due (applied #{s})",
                    r.node,
                    r.block,
                    r.value,
                    r.start,
                    match seq(r.value) {
                        Some(s) => format!("applied #{s}"),
                        None => "never applied".into(),
                    },
                    w.node,
                    v,
                ));
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(node: usize, kind: OpKind, value: u64, start: u64, end: u64, session: u64) -> Rec {
        Rec {
            node,
            kind,
            block: 0,
            value,
            start: Time(start),
            end: Time(end),
            session,
        }
    }

    #[test]
    fn a_stale_read_after_a_close_is_caught_and_a_fresh_one_passes() {
        let applied: HashMap<u64, u64> = [(7, 1)].into();
        let mut h = vec![
            rec(0, OpKind::Open { write: true }, 0, 0, 1, 1),
            rec(0, OpKind::Write, 7, 2, 3, 1),
            rec(0, OpKind::Close, 0, 4, 5, 1),
            rec(1, OpKind::Open { write: false }, 0, 6, 7, 2),
            rec(1, OpKind::Read, 0, 8, 9, 2),
        ];
        assert_eq!(check(&h, &applied, Promise::CloseToOpen).len(), 1);
        assert_eq!(check(&h, &applied, Promise::ReadAfterWrite).len(), 1);
        h[4].value = 7;
        assert!(check(&h, &applied, Promise::CloseToOpen).is_empty());
        // Opened before the close: close-to-open promises nothing.
        h[3].start = Time(3);
        h[4].value = 0;
        assert!(check(&h, &applied, Promise::CloseToOpen).is_empty());
        assert_eq!(check(&h, &applied, Promise::ReadAfterWrite).len(), 1);
    }

    #[test]
    fn a_write_never_published_is_a_violation() {
        let h = vec![
            rec(0, OpKind::Open { write: true }, 0, 0, 1, 1),
            rec(0, OpKind::Write, 7, 2, 3, 1),
            rec(0, OpKind::Close, 0, 4, 5, 1),
            rec(1, OpKind::Open { write: false }, 0, 6, 7, 2),
            rec(1, OpKind::Read, 0, 8, 9, 2),
        ];
        let v = check(&h, &HashMap::new(), Promise::CloseToOpen);
        assert!(v[0].contains("never reached the server"), "{v:?}");
    }
}
