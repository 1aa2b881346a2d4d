//! Runs futures concurrently on the calling task.

use std::future::Future;
use std::task::Poll;

/// Polls every future until all are done and returns their results in
/// order. They share the caller's task, so they may borrow from it.
pub async fn join_all<F: Future>(fs: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futs: Vec<_> = fs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in futs.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => out[i] = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|o| o.expect("every future finished")).collect()
}
