//! `toss-immediately` — the parallel toss-immediately policy of Kotz & Ellis
//! 1992 §3.3.1: keep each process's most recently used (MRU) block; a buffer
//! is replaceable when no process's MRU block is in it, which a counter per
//! buffer tracks. The cache needs at least one buffer per process.

use super::{RecencyList, Replacement, ReplacementKind};
use crate::error::PolicyError;
use crate::ids::{BufId, ProcId};
use rustc_hash::FxHashMap;

/// Parallel toss-immediately replacement. Among replaceable buffers the
/// least recently used goes first.
pub struct TossImmediately {
    order: RecencyList,
    /// Per buffer: how many processes have their MRU block in it.
    mru_count: Vec<u32>,
    /// Per process: the buffer holding its MRU block.
    mru_of: FxHashMap<ProcId, BufId>,
    buffers: usize,
}

impl TossImmediately {
    pub fn new(buffers: usize) -> Self {
        TossImmediately {
            order: RecencyList::new(buffers),
            mru_count: vec![0; buffers],
            mru_of: FxHashMap::default(),
            buffers,
        }
    }

    /// Whether a cache of `buffers` buffers can serve `processes` processes.
    pub fn check(buffers: usize, processes: usize) -> Result<(), PolicyError> {
        if buffers < processes {
            Err(PolicyError::TooFewBuffers { buffers, processes })
        } else {
            Ok(())
        }
    }
}

impl Replacement for TossImmediately {
    fn kind(&self) -> ReplacementKind {
        ReplacementKind::TossImmediately
    }

    fn admit(&mut self, proc: ProcId) -> Result<(), PolicyError> {
        if self.mru_of.contains_key(&proc) {
            return Ok(());
        }
        // A process that has not yet accessed anything holds no buffer, but it
        // will; refuse it now rather than deadlock later.
        TossImmediately::check(self.buffers, self.mru_of.len() + 1)
    }

    fn on_insert(&mut self, buf: BufId) {
        self.order.touch(buf);
    }

    fn on_access(&mut self, proc: ProcId, buf: BufId) -> Option<BufId> {
        self.order.touch(buf);
        let old = self.mru_of.insert(proc, buf);
        if old == Some(buf) {
            return None;
        }
        self.mru_count[buf.index()] += 1;
        let old = old?;
        let c = &mut self.mru_count[old.index()];
        *c -= 1;
        (*c == 0).then_some(old)
    }

    fn on_evict(&mut self, buf: BufId) {
        // Only a process's own MRU buffer, taken for its next block, can be
        // evicted while counted; that process no longer has an MRU block.
        if self.mru_count[buf.index()] > 0 {
            self.mru_of.retain(|_, b| *b != buf);
            self.mru_count[buf.index()] = 0;
        }
        self.order.remove(buf);
    }

    fn is_replaceable(&self, buf: BufId) -> bool {
        self.order.contains(buf) && self.mru_count[buf.index()] == 0
    }

    fn candidates(&self, proc: Option<ProcId>, visit: &mut dyn FnMut(BufId) -> bool) {
        let own = proc.and_then(|p| self.mru_of.get(&p).copied());
        let mut cur = self.order.lru();
        while let Some(c) = cur {
            let n = self.mru_count[c.index()];
            // The requester's own MRU buffer is one it is leaving: with one
            // buffer per process, that is the only buffer it can have.
            if (n == 0 || (n == 1 && own == Some(c))) && !visit(c) {
                return;
            }
            cur = self.order.newer(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1992 §3.3.1: each process's MRU block is retained; the older blocks
    /// become replaceable ("tossed") as soon as the process moves on.
    #[test]
    fn keeps_each_process_mru_block() {
        let mut t = TossImmediately::new(4);
        for i in 0..4 {
            t.on_insert(BufId(i));
        }
        assert_eq!(t.on_access(0, BufId(0)), None);
        assert_eq!(t.on_access(1, BufId(1)), None);
        assert!(!t.is_replaceable(BufId(0)));
        assert!(!t.is_replaceable(BufId(1)));
        // Process 0 moves on: its old MRU block becomes replaceable.
        assert_eq!(t.on_access(0, BufId(2)), Some(BufId(0)));
        assert!(t.is_replaceable(BufId(0)));
        // Two processes share one MRU buffer: it stays until both leave.
        assert_eq!(t.on_access(0, BufId(1)), Some(BufId(2)));
        assert_eq!(t.on_access(1, BufId(3)), None);
        assert!(!t.is_replaceable(BufId(1)));
        assert_eq!(t.on_access(0, BufId(3)), Some(BufId(1)));
        let cands = |t: &TossImmediately, proc| {
            let mut v = vec![];
            t.candidates(proc, &mut |b| {
                v.push(b);
                true
            });
            v
        };
        assert_eq!(cands(&t, None), vec![BufId(0), BufId(2), BufId(1)]);
        // Process 1's own MRU buffer (3, shared with process 0) is not its to take.
        assert_eq!(cands(&t, Some(1)), vec![BufId(0), BufId(2), BufId(1)]);
        t.on_access(0, BufId(0));
        assert_eq!(
            cands(&t, Some(1)),
            vec![BufId(2), BufId(1), BufId(3)],
            "process 1 alone holds 3 now"
        );
        t.on_evict(BufId(3));
        assert!(!t.is_replaceable(BufId(3)));
        assert_eq!(t.on_access(1, BufId(2)), None, "process 1 had no MRU block left");
    }

    /// 1992 §3.3.1: "The cache must have at least as many buffers as processes."
    #[test]
    fn refuses_fewer_buffers_than_processes() {
        let mut t = TossImmediately::new(2);
        t.on_insert(BufId(0));
        t.on_insert(BufId(1));
        t.admit(0).unwrap();
        t.on_access(0, BufId(0));
        t.admit(1).unwrap();
        t.on_access(1, BufId(1));
        assert!(matches!(
            t.admit(2),
            Err(PolicyError::TooFewBuffers {
                buffers: 2,
                processes: 3
            })
        ));
        assert!(TossImmediately::check(19, 20).is_err());
        assert!(TossImmediately::check(20, 20).is_ok());
    }
}
