//! Write-backs to one data server that wait together go as one request per
//! run of adjacent whole blocks.
//!
//! A node cache writes its dirty blocks down one by one (each block's
//! write-back is its own task), yet a sequential writer fills many blocks
//! at once: a 1 MiB write through a mount is 16 blocks, four of them
//! adjacent in each of four data servers' parts (64 KiB stripes). Sent
//! apart, each block cost its data server a request: a receive, a hop to
//! a blocking thread for the write and back, an answer (about 3 thread
//! switches per 64 KiB block; issue 14). Here each data server has a
//! queue: the first write-back to find it idle starts a sender, which lets
//! the write-backs started with it join, then sends everything waiting,
//! merged into runs, and goes on while more waits; one batch at a time
//! per server. Only buffered writes of whole blocks are merged (a partial
//! block goes through the server's log, a run of whole ones around it);
//! the rest go alone. A write that overlaps one taken for a batch waits
//! for the next, so overlapping writes reach the server in the order they
//! came.

use crate::data::server_error;
use crate::server_queue::ServerQueue;
use crate::{FsError, Result};
use bytes::Bytes;
use parcache_driver::join_all;
use parcache_proto::{Payload, Request, Response};
use std::sync::Arc;
use tokio::sync::oneshot;

/// Largest request a run makes (4 blocks of 64 KiB). Runs of up to 1 MiB
/// raised a data server's CPU on a sequential write (28–35 against 22–26
/// ticks unbatched, where 256 KiB runs gave 17–22): on this machine's
/// kernel, 1 MiB writes into the page cache are at times far slower than
/// smaller ones (fio on a local file: 0.6 and 1.4 GB/s in 2 of 4 runs,
/// 64 KiB writes 5.2–5.3 GB/s in every run).
const RUN_MAX: usize = 256 << 10;

/// One data server's queue of write-backs.
pub(crate) type WriteQueue = ServerQueue<State>;

/// What waits in a write queue.
#[derive(Default)]
pub(crate) struct State {
    /// A sender is running (and will see what is pushed to `waiting`).
    sending: bool,
    waiting: Vec<Waiting>,
}

struct Waiting {
    handle: u64,
    offset: u64,
    data: Bytes,
    done: oneshot::Sender<Result<()>>,
}

impl WriteQueue {
    /// Writes `data` at `offset` of the handle's part on this server
    /// (`WriteBuffered`), with whatever else waits for this server.
    pub(crate) async fn write(self: &Arc<Self>, handle: u64, offset: u64, data: Bytes) -> Result<()> {
        let (done, rx) = oneshot::channel();
        let start = {
            let mut st = self.state.lock();
            st.waiting.push(Waiting {
                handle,
                offset,
                data,
                done,
            });
            !std::mem::replace(&mut st.sending, true)
        };
        if start {
            self.send_first().await;
        }
        rx.await.unwrap_or_else(|_| {
            Err(FsError::Protocol(format!(
                "data server {}: write abandoned",
                self.index
            )))
        })
    }

    /// The write-back that found the queue idle sends the first batch (its
    /// own write is in it) itself, so a lone write (a small file's, at its
    /// close) waits for no task but the answer; a sender task takes over
    /// whatever waits after it, even if this write-back is dropped.
    async fn send_first(self: &Arc<Self>) {
        let handover = Handover(self.clone());
        tokio::task::yield_now().await;
        let batch = take_batch(&mut self.state.lock().waiting);
        self.send_batch(batch).await;
        drop(handover);
    }

    /// Sends batches until nothing waits.
    async fn send_all(self: Arc<Self>) {
        // The write-backs started together with the first are queued
        // tasks: their turn comes before this one's next.
        tokio::task::yield_now().await;
        loop {
            let batch = {
                let mut st = self.state.lock();
                if st.waiting.is_empty() {
                    st.sending = false;
                    return;
                }
                take_batch(&mut st.waiting)
            };
            self.send_batch(batch).await;
        }
    }

    /// Sends a batch: its runs at once.
    async fn send_batch(&self, batch: Vec<Waiting>) {
        join_all(runs(batch, self.block).into_iter().map(|run| self.send(run))).await;
    }

    /// Sends one run and tells each of its writes how it went.
    async fn send(&self, run: Vec<Waiting>) {
        let (handle, offset) = (run[0].handle, run[0].offset);
        let pieces: Vec<Bytes> = run.iter().map(|w| w.data.clone()).collect();
        let req = Request::WriteBuffered { handle, offset };
        let r = match self.peer.call_with(&req, Payload::Pieces(&pieces)).await {
            Ok((Response::Written { .. }, _)) => Ok(()),
            Ok((Response::Error(e), _)) => Err(server_error(&format!("handle {handle}"), self.index, e)),
            Ok((other, _)) => Err(FsError::Protocol(format!("unexpected reply to Write: {other:?}"))),
            Err(e) => Err(e),
        };
        for w in run {
            let _ = w.done.send(r.clone());
        }
    }
}

/// The end of a first batch sent by a write-back: a sender task goes on
/// if more waits, else the queue is idle again.
struct Handover(Arc<WriteQueue>);

impl Drop for Handover {
    fn drop(&mut self) {
        let more = {
            let mut st = self.0.state.lock();
            st.sending = !st.waiting.is_empty();
            st.sending
        };
        if more {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn(self.0.clone().send_all())),
                // No runtime to run a sender (it is shutting down): the
                // writes waiting are abandoned, and told so as they drop.
                Err(_) => {
                    let mut st = self.0.state.lock();
                    st.waiting.clear();
                    st.sending = false;
                }
            }
        }
    }
}

/// Takes the writes waiting, in the order they came, up to the first that
/// overlaps one taken (it, and what follows, wait for the next batch: the
/// runs of a batch are sent at once, in no order).
fn take_batch(waiting: &mut Vec<Waiting>) -> Vec<Waiting> {
    let mut cut = waiting.len();
    for (i, w) in waiting.iter().enumerate() {
        let end = w.offset + w.data.len() as u64;
        let overlaps = waiting[..i]
            .iter()
            .any(|t| t.handle == w.handle && t.offset < end && w.offset < t.offset + t.data.len() as u64);
        if overlaps {
            cut = i;
            break;
        }
    }
    let rest = waiting.split_off(cut);
    std::mem::replace(waiting, rest)
}

/// Groups a batch into runs: adjacent whole blocks of one part, up to
/// [`RUN_MAX`] bytes; anything else alone.
fn runs(mut batch: Vec<Waiting>, block: u64) -> Vec<Vec<Waiting>> {
    let whole = |w: &Waiting| {
        w.offset.is_multiple_of(block) && (w.data.len() as u64).is_multiple_of(block) && !w.data.is_empty()
    };
    batch.sort_by_key(|w| (!whole(w), w.handle, w.offset));
    let mut out: Vec<Vec<Waiting>> = Vec::new();
    for w in batch {
        if let Some(run) = out.last_mut() {
            let last = run.last().expect("runs are never empty");
            let len: usize = run.iter().map(|x| x.data.len()).sum();
            if whole(&w)
                && whole(last)
                && last.handle == w.handle
                && last.offset + last.data.len() as u64 == w.offset
                && len + w.data.len() <= RUN_MAX
            {
                run.push(w);
                continue;
            }
        }
        out.push(vec![w]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(handle: u64, offset: u64, len: usize) -> (Waiting, oneshot::Receiver<Result<()>>) {
        let (done, rx) = oneshot::channel();
        let data = Bytes::from(vec![offset as u8; len]);
        (
            Waiting {
                handle,
                offset,
                data,
                done,
            },
            rx,
        )
    }

    fn shape(runs: &[Vec<Waiting>]) -> Vec<Vec<(u64, u64, usize)>> {
        runs.iter()
            .map(|r| r.iter().map(|w| (w.handle, w.offset, w.data.len())).collect())
            .collect()
    }

    #[test]
    fn adjacent_whole_blocks_of_a_part_make_one_run() {
        const B: u64 = 64;
        let batch: Vec<Waiting> = [
            (1, 3 * B, 64),
            (1, B, 64),
            (2, 0, 64),
            (1, 0, 64),
            (1, 2 * B, 64),
            (1, 5 * B, 64),  // a gap before it
            (2, B + 10, 20), // partial: alone
            (2, B, 10),      // partial: alone
            (3, 0, 0),       // empty: alone
        ]
        .into_iter()
        .map(|(h, o, l)| w(h, o, l).0)
        .collect();
        let r = runs(batch, B);
        assert_eq!(
            shape(&r),
            vec![
                vec![(1, 0, 64), (1, 64, 64), (1, 128, 64), (1, 192, 64)],
                vec![(1, 320, 64)],
                vec![(2, 0, 64)],
                vec![(2, 64, 10)],
                vec![(2, 74, 20)],
                vec![(3, 0, 0)],
            ]
        );
        // A run stops at RUN_MAX bytes.
        let big = (RUN_MAX / 1024) as u64 + 3;
        let r = runs((0..big).map(|i| w(9, i * 1024, 1024).0).collect(), 1024);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].iter().map(|w| w.data.len()).sum::<usize>(), RUN_MAX);
        assert_eq!(r[1].len(), 3);
    }

    #[test]
    fn a_write_overlapping_one_taken_waits_for_the_next_batch() {
        let mut waiting: Vec<Waiting> = [(1, 0, 64), (1, 64, 64), (2, 0, 64), (1, 32, 64), (1, 128, 64)]
            .into_iter()
            .map(|(h, o, l)| w(h, o, l).0)
            .collect();
        let first = take_batch(&mut waiting);
        assert_eq!(
            first.iter().map(|w| (w.handle, w.offset)).collect::<Vec<_>>(),
            vec![(1, 0), (1, 64), (2, 0)]
        );
        assert_eq!(
            waiting.iter().map(|w| (w.handle, w.offset)).collect::<Vec<_>>(),
            vec![(1, 32), (1, 128)]
        );
        let second = take_batch(&mut waiting);
        assert_eq!(second.len(), 2);
        assert!(waiting.is_empty());
    }
}
