//! `periodic(interval, age)` — Sprite's delayed write (Biswas et al. 1993
//! §3, after Nelson, Welch and Ousterhout): every `interval` a daemon writes
//! the blocks that have been dirty for longer than `age` (Sprite: 5 s and
//! 30 s, so acknowledged data may be lost for up to 35 s in a volatile cache).

use super::{WritePolicy, WritePolicyKind};
use crate::time::{Span, Time};

pub struct Periodic {
    interval: Span,
    age: Span,
}

impl Periodic {
    pub fn new(interval: Span, age: Span) -> Self {
        assert!(interval.0 > 0, "periodic interval must be positive");
        Periodic { interval, age }
    }
}

impl WritePolicy for Periodic {
    fn kind(&self) -> WritePolicyKind {
        WritePolicyKind::Periodic {
            interval: self.interval,
            age: self.age,
        }
    }
    /// A full NV write cache replaces its LRU block, written back if
    /// dirty: one write per need (Biswas et al. 1993 §2.2).
    fn writes_per_need(&self) -> Option<usize> {
        Some(1)
    }
    fn next_wake(&self, now: Time, dirty: usize) -> Option<Time> {
        // Wake on the interval grid; nothing to do while nothing is dirty.
        (dirty > 0).then(|| Time((now.0 / self.interval.0 + 1) * self.interval.0))
    }
    fn on_timer(&mut self, now: Time) -> Option<Time> {
        // "Dirty for longer than age": dirtied at or before now - age.
        (now.0 >= self.age.0).then(|| now - self.age)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wakes_on_the_interval_and_writes_old_blocks() {
        let mut p = Periodic::new(Span::from_secs(5), Span::from_secs(30));
        assert_eq!(p.next_wake(Time(1), 0), None);
        assert_eq!(p.next_wake(Time(1), 3), Some(Time(5_000_000_000)));
        assert_eq!(p.next_wake(Time(5_000_000_000), 3), Some(Time(10_000_000_000)));
        assert_eq!(p.on_timer(Time(10_000_000_000)), None);
        assert_eq!(p.on_timer(Time(35_000_000_000)), Some(Time(5_000_000_000)));
    }
}
