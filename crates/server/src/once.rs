//! Requests made at most once (`Request::Once`): the metadata server's
//! duplicate request cache, as NFSv4.1's sessions give (RFC 8881
//! §2.10.6). A client sends a request that is not idempotent again, with
//! the same client id and sequence number, when its connection broke
//! before the answer (the server restarted, or the network dropped). The
//! server keeps each such request's answer in the store, in the same
//! transaction as the change it answers (`mds.rs`, `REPLIES`), and answers
//! a repeat with it instead of doing the request twice. A crash that loses
//! the change loses its answer with it, so the repeat does it again.
//!
//! This file holds the part that lives in memory: a repeat that arrives
//! while its first copy is still being done (on the broken connection)
//! waits for it to finish, then finds its answer.

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

/// A request made at most once: its client, its sequence number, and
/// whether its answer was kept yet.
pub(crate) struct OnceKey {
    pub client: u64,
    pub seq: u64,
    kept: AtomicBool,
}

impl OnceKey {
    pub fn new(client: u64, seq: u64) -> OnceKey {
        OnceKey {
            client,
            seq,
            kept: AtomicBool::new(false),
        }
    }

    /// Notes that the answer was kept (with the request's change).
    pub fn set_kept(&self) {
        self.kept.store(true, Ordering::SeqCst);
    }

    pub fn is_kept(&self) -> bool {
        self.kept.load(Ordering::SeqCst)
    }
}

/// The requests made at most once that are being done now, and those sent
/// again lately.
#[derive(Default)]
pub(crate) struct InFlight(Mutex<HashMap<(u64, u64), Arc<Notify>>>, Mutex<HashSet<(u64, u64)>>);

/// Repeats remembered, at most (all are forgotten past it): a first copy
/// comes within moments of its repeat, if at all.
const REPEATS: usize = 4096;

/// A request being done; dropped when it is done, waking its repeats.
pub(crate) struct Doing<'a> {
    set: &'a InFlight,
    key: (u64, u64),
}

impl InFlight {
    /// Waits until no other copy of `key`'s request is being done, then
    /// marks this one as being done.
    pub async fn enter(&self, key: &OnceKey) -> Doing<'_> {
        let k = (key.client, key.seq);
        loop {
            let wait = {
                let mut m = self.0.lock();
                match m.get(&k) {
                    // Created under the lock: `notify_waiters` at the
                    // first copy's end reaches it even before it is polled.
                    Some(n) => n.clone().notified_owned(),
                    None => {
                        m.insert(k, Arc::new(Notify::new()));
                        return Doing { set: self, key: k };
                    }
                }
            };
            wait.await;
        }
    }
}

impl InFlight {
    /// Whether the request must look for its kept answer: it is a repeat
    /// (`repeat`, noted here), or its repeat came first. (A first copy
    /// read on a connection that then broke may start after its repeat
    /// on a new one is done; only repeats look otherwise.)
    pub fn must_look(&self, key: &OnceKey, repeat: bool) -> bool {
        let mut r = self.1.lock();
        let k = (key.client, key.seq);
        if repeat {
            if r.len() >= REPEATS {
                r.clear();
            }
            r.insert(k);
            return true;
        }
        r.contains(&k)
    }
}

impl Drop for Doing<'_> {
    fn drop(&mut self) {
        if let Some(n) = self.set.0.lock().remove(&self.key) {
            n.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A repeat waits for its first copy to be done; other requests do not.
    #[tokio::test]
    async fn a_repeat_waits_for_its_first_copy() {
        let set = Arc::new(InFlight::default());
        let first = set.enter(&OnceKey::new(7, 1)).await;
        // Another request of the same client goes ahead.
        drop(set.enter(&OnceKey::new(7, 2)).await);
        let s = set.clone();
        let repeat = tokio::spawn(async move {
            let _d = s.enter(&OnceKey::new(7, 1)).await;
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!repeat.is_finished(), "the repeat went ahead of its first copy");
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), repeat)
            .await
            .expect("the repeat goes ahead once the first copy is done")
            .unwrap();
    }

    /// Repeats look for their kept answers, and so does a first copy
    /// that comes after its repeat; other first copies do not.
    #[test]
    fn a_first_copy_after_its_repeat_looks_for_the_answer() {
        let set = InFlight::default();
        assert!(!set.must_look(&OnceKey::new(7, 1), false));
        assert!(set.must_look(&OnceKey::new(7, 1), true));
        assert!(set.must_look(&OnceKey::new(7, 1), false), "the first copy, late");
        assert!(!set.must_look(&OnceKey::new(7, 2), false));
        assert!(!set.must_look(&OnceKey::new(8, 1), false));
    }
}
