//! `lru` — replace the least recently used buffer (DESIGN.md §3).

use super::{RecencyList, Replacement, ReplacementKind};
use crate::ids::{BufId, ProcId};

/// Least recently used replacement: every unpinned, idle buffer is
/// replaceable, oldest first.
pub struct Lru {
    order: RecencyList,
}

impl Lru {
    pub fn new(buffers: usize) -> Self {
        Lru {
            order: RecencyList::new(buffers),
        }
    }
}

impl Replacement for Lru {
    fn kind(&self) -> ReplacementKind {
        ReplacementKind::Lru
    }
    fn on_insert(&mut self, buf: BufId) {
        self.order.touch(buf);
    }
    fn on_access(&mut self, _proc: ProcId, buf: BufId) -> Option<BufId> {
        self.order.touch(buf);
        // Under LRU a buffer is replaceable as soon as its access ends.
        Some(buf)
    }
    fn on_evict(&mut self, buf: BufId) {
        self.order.remove(buf);
    }
    fn is_replaceable(&self, buf: BufId) -> bool {
        self.order.contains(buf)
    }
    fn offers_every_block(&self) -> bool {
        true
    }
    fn candidates(&self, _proc: Option<ProcId>, visit: &mut dyn FnMut(BufId) -> bool) {
        let mut cur = self.order.lru();
        while let Some(c) = cur {
            if !visit(c) {
                return;
            }
            cur = self.order.newer(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_least_recently_used_first() {
        let mut l = Lru::new(3);
        for i in 0..3 {
            l.on_insert(BufId(i));
        }
        l.on_access(0, BufId(0));
        let mut order = vec![];
        l.candidates(None, &mut |b| {
            order.push(b);
            true
        });
        assert_eq!(order, vec![BufId(1), BufId(2), BufId(0)]);
    }
}
