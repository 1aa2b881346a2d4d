//! The mount's last work: leave the cooperative tier, push every dirty
//! block (this node's and its peers'), give up its leases and holds. The
//! session's end (fuser's `destroy`, on the session thread) and the
//! process's own stop (SIGTERM, on its main thread) both ask for it; it is
//! done once, by whichever asks first, and the other waits for its outcome.
//! Done twice at once, as before, each step ran twice side by side: with
//! the servers gone, a SIGTERM took 9 s and the runtime was shut down under
//! the session thread still at work (a panic at exit).

use parcache_client::Fs;
use parking_lot::{Condvar, Mutex};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// The work itself: for the mount, [`last_work`] on its [`Fs`].
type Work = Box<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// Where the last work stands.
#[derive(Clone)]
enum State {
    Pending,
    Running,
    /// Its outcome: an error if dirty data did not all reach the servers.
    Done(Result<(), String>),
}

/// The mount's last work, done once (see the module's comment).
pub struct Farewell {
    work: Work,
    state: Mutex<State>,
    changed: Condvar,
}

impl Farewell {
    pub(crate) fn new(fs: Arc<Fs>) -> Arc<Self> {
        Self::with_work(Box::new(move || {
            let fs = fs.clone();
            Box::pin(async move { last_work(&fs).await })
        }))
    }

    fn with_work(work: Work) -> Arc<Self> {
        Arc::new(Farewell {
            work,
            state: Mutex::new(State::Pending),
            changed: Condvar::new(),
        })
    }

    /// Whether the last work has begun (or is done) anywhere.
    pub fn begun(&self) -> bool {
        !matches!(*self.state.lock(), State::Pending)
    }

    /// Does the last work on `rt` unless it has begun elsewhere, in which
    /// case it waits for it; either way returns its outcome. Call it from
    /// outside the runtime.
    pub fn run(&self, rt: &tokio::runtime::Handle) -> Result<(), String> {
        {
            let mut s = self.state.lock();
            loop {
                match &*s {
                    State::Pending => {
                        *s = State::Running;
                        break;
                    }
                    State::Running => self.changed.wait(&mut s),
                    State::Done(r) => return r.clone(),
                }
            }
        }
        let r = rt.block_on((self.work)());
        *self.state.lock() = State::Done(r.clone());
        self.changed.notify_all();
        r
    }
}

/// How long leaving the tier may take: it only spares the metadata server
/// and the peers the wait for this node's heartbeats to stop, so a server
/// that does not answer (gone, or restarting) is not tried again and again
/// (six tries took 4.5 s) while dirty data waits to be pushed.
const LEAVE_WITHIN: Duration = Duration::from_secs(1);

/// Out of the tier first (peers stop placing blocks here), then push what
/// this node holds dirty, then give up leases and holds. A metadata server
/// that could not be reached to leave is not tried again to give up: both
/// are the same request (`Leave`), and its leases run out on their own.
async fn last_work(fs: &Fs) -> Result<(), String> {
    let left = match tokio::time::timeout(LEAVE_WITHIN, fs.leave_tier()).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer within {LEAVE_WITHIN:?}")),
    };
    if let Err(e) = &left {
        tracing::warn!("leaving the cooperative tier: {e}");
    }
    let pushed = fs.shutdown().await.map_err(|e| e.to_string());
    if let Err(e) = &pushed {
        tracing::error!("pushing dirty data at unmount: {e}");
    }
    if left.is_ok() {
        if let Err(e) = fs.drop_leases().await {
            tracing::warn!("giving up this node's leases at unmount: {e}");
        }
    }
    pushed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Asked from two threads at once (the session's end and the process's
    /// stop), the work is done once and both get its outcome.
    #[test]
    fn asked_twice_at_once_the_work_is_done_once_and_both_get_its_outcome() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .unwrap();
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        let f = Farewell::with_work(Box::new(move || {
            let d = d.clone();
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                d.fetch_add(1, Ordering::SeqCst);
                Err("the data server 0 is unreachable".to_string())
            })
        }));
        assert!(!f.begun());
        let (f2, h) = (f.clone(), rt.handle().clone());
        let other = std::thread::spawn(move || f2.run(&h));
        while !f.begun() {
            std::thread::yield_now();
        }
        let mine = f.run(rt.handle());
        let theirs = other.join().unwrap();
        assert_eq!(done.load(Ordering::SeqCst), 1);
        assert_eq!(mine, Err("the data server 0 is unreachable".to_string()));
        assert_eq!(theirs, mine);
        // Asked again later: the outcome, nothing done.
        assert_eq!(f.run(rt.handle()), mine);
        assert_eq!(done.load(Ordering::SeqCst), 1);
    }
}
