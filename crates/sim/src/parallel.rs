//! Runs independent simulations on several threads. Each run is
//! deterministic on its own, and results come back in input order, so the
//! number of threads never changes an answer.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Maps `f` over `items` on up to `threads` threads, calling `done` after
/// each item finishes (for progress bars). Results keep the input order.
pub fn map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> R + Sync,
    done: &(dyn Fn() + Sync),
) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, items.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= items.len() {
                    break;
                }
                let r = f(&items[i]);
                out.lock().expect("no panics while holding the lock")[i] = Some(r);
                done();
            });
        }
    });
    out.into_inner()
        .expect("threads joined")
        .into_iter()
        .map(|r| r.expect("every item ran"))
        .collect()
}

/// Threads to use by default: the machine's cores.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    #[test]
    fn keeps_order_whatever_the_threads() {
        let items: Vec<u64> = (0..100).collect();
        let one = super::map(&items, 1, |x| x * x, &|| {});
        let four = super::map(&items, 4, |x| x * x, &|| {});
        assert_eq!(one, four);
        assert_eq!(one[9], 81);
    }
}
