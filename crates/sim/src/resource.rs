//! A first-come first-served resource (a disk, a network link, a CPU): one
//! job in service, the rest queued in arrival order (Kotz & Ellis 1992
//! §4.1: "Disk requests were queued in the appropriate disk queue").

use parcache_core::{Span, Time};
use std::collections::VecDeque;

pub struct Fcfs<J> {
    queue: VecDeque<(J, Span)>,
    in_service: Option<J>,
    busy: Span,
    served: u64,
}

impl<J> Default for Fcfs<J> {
    fn default() -> Self {
        Fcfs {
            queue: VecDeque::new(),
            in_service: None,
            busy: Span::ZERO,
            served: 0,
        }
    }
}

impl<J> Fcfs<J> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a job needing `service`. If the resource was idle the job starts
    /// now and its completion time is returned; the driver schedules it.
    pub fn submit(&mut self, now: Time, job: J, service: Span) -> Option<Time> {
        if self.in_service.is_none() {
            self.start(job, service);
            Some(now + service)
        } else {
            self.queue.push_back((job, service));
            None
        }
    }

    /// The job in service finished. Returns it, and the completion time of
    /// the next job if one started.
    pub fn complete(&mut self, now: Time) -> (J, Option<Time>) {
        let done = self.in_service.take().expect("completion on an idle resource");
        let next = self.queue.pop_front().map(|(j, s)| {
            self.start(j, s);
            now + s
        });
        (done, next)
    }

    fn start(&mut self, job: J, service: Span) {
        self.in_service = Some(job);
        self.busy = self.busy + service;
        self.served += 1;
    }

    pub fn is_idle(&self) -> bool {
        self.in_service.is_none()
    }
    /// Jobs waiting or in service.
    pub fn load(&self) -> usize {
        self.queue.len() + usize::from(self.in_service.is_some())
    }
    /// Total service time given (busy time), including the job in service.
    pub fn busy(&self) -> Span {
        self.busy
    }
    pub fn served(&self) -> u64 {
        self.served
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_in_arrival_order() {
        let mut d = Fcfs::new();
        assert_eq!(d.submit(Time(0), 'a', Span(30)), Some(Time(30)));
        assert_eq!(d.submit(Time(5), 'b', Span(30)), None);
        assert_eq!(d.submit(Time(6), 'c', Span(10)), None);
        assert_eq!(d.complete(Time(30)), ('a', Some(Time(60))));
        assert_eq!(d.complete(Time(60)), ('b', Some(Time(70))));
        assert_eq!(d.complete(Time(70)), ('c', None));
        assert!(d.is_idle());
        assert_eq!(d.busy(), Span(70));
        assert_eq!(d.served(), 3);
    }
}
