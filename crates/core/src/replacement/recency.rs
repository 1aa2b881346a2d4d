//! An intrusive doubly linked list of buffers in recency order, shared by
//! the LRU-ordered policies. O(1) touch and remove, no allocation after
//! construction.

use crate::ids::BufId;

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Node {
    prev: u32,
    next: u32,
    linked: bool,
}

/// Buffers ordered from least to most recently used.
pub struct RecencyList {
    nodes: Vec<Node>,
    /// Least recently used end.
    head: u32,
    /// Most recently used end.
    tail: u32,
    len: usize,
}

impl RecencyList {
    pub fn new(buffers: usize) -> Self {
        RecencyList {
            nodes: vec![
                Node {
                    prev: NIL,
                    next: NIL,
                    linked: false
                };
                buffers
            ],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn contains(&self, b: BufId) -> bool {
        self.nodes[b.index()].linked
    }

    /// Makes `b` the most recently used, inserting it if absent.
    pub fn touch(&mut self, b: BufId) {
        if self.contains(b) {
            if self.tail == b.0 {
                return;
            }
            self.remove(b);
        }
        let i = b.index();
        self.nodes[i] = Node {
            prev: self.tail,
            next: NIL,
            linked: true,
        };
        if self.tail != NIL {
            self.nodes[self.tail as usize].next = b.0;
        } else {
            self.head = b.0;
        }
        self.tail = b.0;
        self.len += 1;
    }

    pub fn remove(&mut self, b: BufId) {
        let i = b.index();
        if !self.nodes[i].linked {
            return;
        }
        let Node { prev, next, .. } = self.nodes[i];
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        } else {
            self.head = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        } else {
            self.tail = prev;
        }
        self.nodes[i] = Node {
            prev: NIL,
            next: NIL,
            linked: false,
        };
        self.len -= 1;
    }

    /// The least recently used buffer.
    pub fn lru(&self) -> Option<BufId> {
        (self.head != NIL).then_some(BufId(self.head))
    }

    /// The buffer used next after `b` (towards the most recent end).
    pub fn newer(&self, b: BufId) -> Option<BufId> {
        let n = self.nodes[b.index()].next;
        (n != NIL).then_some(BufId(n))
    }

    /// Iterates from least to most recently used.
    pub fn iter(&self) -> impl Iterator<Item = BufId> + '_ {
        let mut cur = self.lru();
        std::iter::from_fn(move || {
            let c = cur?;
            cur = self.newer(c);
            Some(c)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_recency_order() {
        let mut l = RecencyList::new(4);
        for i in 0..4 {
            l.touch(BufId(i));
        }
        l.touch(BufId(1));
        l.remove(BufId(2));
        assert_eq!(l.iter().map(|b| b.0).collect::<Vec<_>>(), vec![0, 3, 1]);
        assert_eq!(l.len(), 3);
        l.touch(BufId(0));
        assert_eq!(l.iter().map(|b| b.0).collect::<Vec<_>>(), vec![3, 1, 0]);
    }
}
