//! The event kernel: virtual time and a queue of future events
//! (DESIGN.md §4). Events at the same instant come out in the order they
//! were scheduled, so a run depends only on its inputs and seed.

use parcache_core::{Span, Time};
use std::cmp::Ordering;
use std::collections::BinaryHeap;

struct Entry<E> {
    at: Time,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, o: &Self) -> bool {
        self.at == o.at && self.seq == o.seq
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<E> Ord for Entry<E> {
    /// Reversed: the heap's maximum is the earliest event.
    fn cmp(&self, o: &Self) -> Ordering {
        o.at.cmp(&self.at).then(o.seq.cmp(&self.seq))
    }
}

/// A discrete-event kernel over events of type `E`.
pub struct Kernel<E> {
    now: Time,
    seq: u64,
    queue: BinaryHeap<Entry<E>>,
    handled: u64,
}

impl<E> Default for Kernel<E> {
    fn default() -> Self {
        Kernel {
            now: Time::ZERO,
            seq: 0,
            queue: BinaryHeap::new(),
            handled: 0,
        }
    }
}

impl<E> Kernel<E> {
    pub fn new() -> Self {
        Self::default()
    }
    /// The current virtual time.
    pub fn now(&self) -> Time {
        self.now
    }
    /// Events taken off the queue so far.
    pub fn handled(&self) -> u64 {
        self.handled
    }
    /// Schedules `event` at `at`, which must not be in the past.
    pub fn at(&mut self, at: Time, event: E) {
        assert!(at >= self.now, "event scheduled in the past: {at:?} < {:?}", self.now);
        self.seq += 1;
        self.queue.push(Entry {
            at,
            seq: self.seq,
            event,
        });
    }
    /// Schedules `event` after `delay`.
    pub fn after(&mut self, delay: Span, event: E) {
        self.at(self.now + delay, event);
    }
    /// Takes the next event and advances time to it.
    pub fn pop(&mut self) -> Option<(Time, E)> {
        let e = self.queue.pop()?;
        self.now = e.at;
        self.handled += 1;
        Some((e.at, e.event))
    }
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_out_in_time_then_schedule_order() {
        let mut k = Kernel::new();
        k.at(Time(5), 'c');
        k.at(Time(1), 'a');
        k.at(Time(5), 'd');
        k.at(Time(1), 'b');
        let order: Vec<char> = std::iter::from_fn(|| k.pop().map(|(_, e)| e)).collect();
        assert_eq!(order, vec!['a', 'b', 'c', 'd']);
        assert_eq!(k.now(), Time(5));
        assert_eq!(k.handled(), 4);
    }

    #[test]
    #[should_panic(expected = "in the past")]
    fn refuses_the_past() {
        let mut k = Kernel::new();
        k.at(Time(5), ());
        k.pop();
        k.at(Time(4), ());
    }
}
