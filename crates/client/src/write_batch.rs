//! Write-backs to one data server that are made together go as one
//! request per run of adjacent whole blocks.
//!
//! A node cache writes its dirty blocks down one by one (each block's
//! write-back is its own task), yet a sequential writer fills many blocks
//! at once: a 1 MiB write through a mount is 16 blocks, four of them
//! adjacent in each of four data servers' parts (64 KiB stripes). Sent
//! apart, each block cost its data server a request: a receive, a hop to
//! a blocking thread for the write and back, an answer (about 3 thread
//! switches per 64 KiB block; issue 14). Here each data server has a
//! queue: a sequential writer's whole block (of the file the server was
//! last written for, within 1 MiB of where that write ended) starts a
//! sender, which lets the write-backs started with it join, then takes
//! what waits and sends it as runs; a write-back arriving meanwhile starts
//! the next batch at once, so none waits for another's answer. Any other
//! write (a partial block, a small file's, a random writer's) is sent
//! alone at once, with no hop to a sender. The node cache never has two
//! write-backs of one block in flight, so requests that overlap do not
//! arrive together.

use crate::data::server_error;
use crate::peer::Peer;
use crate::{FsError, Result};
use bytes::Bytes;
use parcache_driver::join_all;
use parcache_proto::{Payload, Request, Response};
use parking_lot::Mutex;
use std::sync::Arc;
use tokio::sync::oneshot;

/// Largest request a run makes (4 blocks of 64 KiB). Runs of up to 1 MiB
/// raised a data server's CPU on a sequential write (28–35 against 22–26
/// ticks unbatched, where 256 KiB runs gave 17–22): on this machine's
/// kernel, 1 MiB writes into the page cache are at times far slower than
/// smaller ones (fio on a local file: 0.6 and 1.4 GB/s in 2 of 4 runs,
/// 64 KiB writes 5.2–5.3 GB/s in every run).
const RUN_MAX: usize = 256 << 10;

/// One data server's queue.
pub(crate) struct ServerQueue {
    peer: Arc<Peer>,
    /// Its index in the cluster (for errors).
    index: u32,
    block: u64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// A sender is about to take what waits.
    sending: bool,
    waiting: Vec<Waiting>,
    /// Where the last write ended (handle, offset): a whole block starting
    /// near it is a sequential writer's.
    last: Option<(u64, u64)>,
}

/// How far from where the last write ended a sequential writer's next one
/// may start (a write's blocks go down in any order).
const NEAR: u64 = 1 << 20;

struct Waiting {
    handle: u64,
    offset: u64,
    data: Bytes,
    done: oneshot::Sender<Result<()>>,
}

impl ServerQueue {
    pub(crate) fn new(peer: Arc<Peer>, index: u32, block: u32) -> Arc<ServerQueue> {
        Arc::new(ServerQueue {
            peer,
            index,
            block: block.max(1) as u64,
            state: Mutex::default(),
        })
    }

    /// Writes `data` at `offset` of the handle's part on this server
    /// (`WriteBuffered`), with whatever else a sequential writer sends it now.
    pub(crate) async fn write(self: &Arc<Self>, handle: u64, offset: u64, data: Bytes) -> Result<()> {
        let (done, rx) = oneshot::channel();
        let w = Waiting {
            handle,
            offset,
            data,
            done,
        };
        let alone = {
            let mut st = self.state.lock();
            let sequential = whole(&w, self.block)
                && st
                    .last
                    .is_some_and(|(h, end)| h == handle && offset.abs_diff(end) <= NEAR);
            st.last = Some((handle, offset + w.data.len() as u64));
            if !sequential && !st.sending {
                Some(w)
            } else {
                st.waiting.push(w);
                if !std::mem::replace(&mut st.sending, true) {
                    tokio::spawn(self.clone().send_all());
                }
                None
            }
        };
        if let Some(w) = alone {
            self.send(vec![w]).await;
        }
        rx.await.unwrap_or_else(|_| {
            Err(FsError::Protocol(format!(
                "data server {}: write abandoned",
                self.index
            )))
        })
    }

    /// Sends what waits, once the write-backs started with the first joined.
    async fn send_all(self: Arc<Self>) {
        // The write-backs started together with the first are queued
        // tasks: their turn comes before this one's next.
        tokio::task::yield_now().await;
        let batch = {
            let mut st = self.state.lock();
            st.sending = false;
            std::mem::take(&mut st.waiting)
        };
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

/// Whether `w` is whole blocks of `block` bytes.
fn whole(w: &Waiting, block: u64) -> bool {
    w.offset.is_multiple_of(block) && (w.data.len() as u64).is_multiple_of(block) && !w.data.is_empty()
}

/// Groups a batch into runs: adjacent whole blocks of one part, up to
/// [`RUN_MAX`] bytes; anything else alone.
fn runs(mut batch: Vec<Waiting>, block: u64) -> Vec<Vec<Waiting>> {
    let whole = |w: &Waiting| whole(w, block);
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
}
