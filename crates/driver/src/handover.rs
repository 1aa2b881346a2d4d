//! How work reaches the runtime when it has to wait.
//!
//! A mount's request is polled first on the thread that read it from the
//! kernel (`Mount::run`), and a cache's I/O on the thread that decided it
//! ([`crate::Driver`]). Most that wait have sent their request to a
//! server by then. Spawning such work on the runtime at once woke a runtime worker
//! only to poll it again, find it still waiting, and park: on this machine
//! one more thread switch per metadata request than the answer needs
//! (about a third of an unlink's thread switches in the mount). Here the
//! waiting work is kept aside with a waker of its own, and spawned by
//! whoever wakes it: usually the runtime worker that just read the
//! server's answer, which then runs it next, on its own thread.

use parking_lot::Mutex;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Wake, Waker};
use tokio::runtime::Handle;

/// Work to run, boxed.
pub type Work = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Polls `work` once on this thread (inside `rt`); if it must wait, it is
/// spawned on `rt` when first woken.
pub fn run_here(rt: &Handle, work: impl Future<Output = ()> + Send + 'static) {
    let _in_runtime = rt.enter();
    if let Some(work) = poll_first(rt, Box::pin(work)) {
        rt.spawn(work);
    }
}

/// Polls each of `works` once on this thread, in order, then once more
/// those that woke themselves meanwhile (a write-back that lets the others
/// started with it join its batch first, [`tokio::task::yield_now`]); any
/// that must wait after that is spawned on `rt` when woken.
pub fn run_all_here(rt: &Handle, works: Vec<Work>) {
    let _in_runtime = rt.enter();
    let again: Vec<Work> = works.into_iter().filter_map(|w| poll_first(rt, w)).collect();
    for w in again {
        if let Some(w) = poll_first(rt, w) {
            rt.spawn(w);
        }
    }
}

/// Polls `work` once; returns it if it was woken during the poll (what it
/// waited for is there), else keeps it to be spawned when woken.
fn poll_first(rt: &Handle, mut work: Work) -> Option<Work> {
    let kept = Arc::new(Kept {
        rt: rt.clone(),
        state: Mutex::new(State::Polling),
    });
    let waker = Waker::from(kept.clone());
    if work.as_mut().poll(&mut Context::from_waker(&waker)).is_ready() {
        return None;
    }
    let mut state = kept.state.lock();
    match std::mem::replace(&mut *state, State::Spawned) {
        State::Woken => Some(work),
        _ => {
            *state = State::Waiting(work);
            None
        }
    }
}

/// Work kept aside until woken.
struct Kept {
    rt: Handle,
    state: Mutex<State>,
}

enum State {
    /// Being polled for the first time.
    Polling,
    /// Woken during its first poll.
    Woken,
    /// Waiting for its first wake-up.
    Waiting(Work),
    /// On the runtime, which has wakers of its own for it from its next
    /// poll: wake-ups of this one are stale.
    Spawned,
}

impl Wake for Kept {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut state = self.state.lock();
        match std::mem::replace(&mut *state, State::Spawned) {
            State::Polling => *state = State::Woken,
            State::Woken => *state = State::Woken,
            State::Waiting(work) => {
                drop(state);
                self.rt.spawn(work);
            }
            State::Spawned => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Poll;
    use std::time::Duration;

    #[test]
    fn work_that_waits_finishes_on_the_runtime_once_woken() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let done = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = std::sync::mpsc::channel();
        // Ready at once: done before run_here returns.
        let d = done.clone();
        run_here(rt.handle(), async move {
            d.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(done.load(Ordering::SeqCst), 1);
        // Waits for a channel answered later from another thread, and for
        // a timer (woken by the runtime's own driver), 50 times over.
        for i in 0..50u64 {
            let (otx, orx) = tokio::sync::oneshot::channel::<u64>();
            let (d, tx) = (done.clone(), tx.clone());
            run_here(rt.handle(), async move {
                let v = orx.await.unwrap();
                tokio::time::sleep(Duration::from_millis(v % 3)).await;
                d.fetch_add(1, Ordering::SeqCst);
                tx.send(v).unwrap();
            });
            std::thread::spawn(move || otx.send(i).unwrap());
        }
        let mut got: Vec<u64> = (0..50)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        got.sort();
        assert_eq!(got, (0..50).collect::<Vec<_>>());
        assert_eq!(done.load(Ordering::SeqCst), 51);
    }

    #[test]
    fn a_wake_during_the_first_poll_is_not_lost() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let mut first = true;
        run_here(
            rt.handle(),
            std::future::poll_fn(move |cx| {
                if std::mem::take(&mut first) {
                    // Wakes itself, then says it waits.
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                tx.send(()).unwrap();
                Poll::Ready(())
            }),
        );
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the self-woken work never ran again");
    }

    #[test]
    fn work_nothing_will_wake_is_dropped_not_leaked() {
        struct Flag(Arc<AtomicUsize>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let dropped = Arc::new(AtomicUsize::new(0));
        let flag = Flag(dropped.clone());
        // Waits without keeping its waker: nothing can wake it.
        run_here(
            rt.handle(),
            std::future::poll_fn(move |_| {
                let _keep = &flag;
                Poll::<()>::Pending
            }),
        );
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
    }
}
