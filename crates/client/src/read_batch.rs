//! Block fetches from one data server made together go as one read per run
//! of adjacent blocks.
//!
//! A node cache fetches each block it misses as its own request, yet a
//! sequential reader misses many at once: a 1 MiB read through a mount is
//! 16 fetches, four adjacent blocks in each of four data servers' parts.
//! Each data server has a queue here: the first fetch to find no sender
//! starts one, which lets the fetches started with it join, then takes
//! everything waiting and sends it as runs of adjacent whole blocks (up to
//! 256 KiB), each answered by one frame whose slices answer its fetches.
//! A fetch that comes while a batch is in flight starts the next batch at
//! once: fetches never wait for another's answer. Only a sequential
//! reader's fetches (of the file of the server's last fetch, within 1 MiB
//! of where it ended) and those arriving while a batch forms take this
//! way; any other is sent at once, so a random reader pays no hop to a
//! sender.
//!
//! A fetch may lend the buffer its bytes are to end in (the node cache's
//! own, [`ReadQueue::read_into`]): a run whose fetches all lend one has its
//! answer read from the socket straight into them ([`Landing`]), one
//! block in each, instead of into a buffer of the connection's and then
//! copied.

use crate::data::server_error;
use crate::server_queue::ServerQueue;
use crate::{FsError, Result};
use bytes::Bytes;
use parcache_driver::join_all;
use parcache_proto::buf_pool::POOLED_MIN;
use parcache_proto::{Block, Landing, Request, Response};
use std::sync::Arc;
use tokio::sync::oneshot;

/// Most blocks a run reads (256 KiB of 64 KiB blocks, as write-backs'
/// runs).
const RUN_BLOCKS: u64 = 4;

/// How far from where the last fetch ended a sequential reader's next one
/// may start.
const NEAR: u64 = 1 << 20;

/// One data server's queue of block fetches.
pub(crate) type ReadQueue = ServerQueue<State>;

/// What waits in a read queue.
#[derive(Default)]
pub(crate) struct State {
    /// A sender is about to take what waits.
    sending: bool,
    waiting: Vec<Fetch>,
    /// Where the last fetch ended (handle, offset): one starting near it
    /// is a sequential reader's (a read's fetches start in any order).
    last: Option<(u64, u64)>,
}

struct Fetch {
    handle: u64,
    offset: u64,
    len: u64,
    /// The part must hold at least this much (`Request::Read`).
    need: u64,
    /// The buffer the bytes are to end in, lent by the fetch.
    into: Option<Block>,
    done: oneshot::Sender<Result<Piece>>,
}

/// A fetch's bytes: landed in the buffer it lent, or in the answer's own
/// (with the lent buffer back, if it was not lost with a connection).
pub(crate) enum Piece {
    Landed(Block),
    Shared(Bytes, Option<Block>),
}

impl ReadQueue {
    /// Bytes `offset..offset + len` of the handle's part on this server
    /// (short where the part ends), read with whatever else is fetched
    /// from it now.
    pub(crate) async fn read(self: &Arc<Self>, handle: u64, offset: u64, len: u64, need: u64) -> Result<Bytes> {
        match self.read_into(handle, offset, len, need, None).await? {
            Piece::Shared(d, _) => Ok(d),
            Piece::Landed(v) => Ok(v.into()),
        }
    }

    /// As [`ReadQueue::read`], the bytes landing in `into` where the
    /// answer allows ([`Piece`]).
    pub(crate) async fn read_into(
        self: &Arc<Self>,
        handle: u64,
        offset: u64,
        len: u64,
        need: u64,
        into: Option<Block>,
    ) -> Result<Piece> {
        let alone = self.alone(handle, offset, len);
        self.read_as(alone, handle, offset, len, need, into).await
    }

    /// Whether a fetch of `len` bytes at `offset` of the handle's part
    /// goes alone, at once (a random reader's: not near where the last
    /// fetch from this server ended, and no batch forming), rather than
    /// joining a batch; notes where it ends. Ask once per fetch.
    pub(crate) fn alone(&self, handle: u64, offset: u64, len: u64) -> bool {
        let mut st = self.state.lock();
        let sequential = st
            .last
            .is_some_and(|(h, end)| h == handle && offset.abs_diff(end) <= NEAR);
        st.last = Some((handle, offset + len));
        !sequential && !st.sending
    }

    /// [`ReadQueue::read_into`], with [`ReadQueue::alone`] already asked.
    pub(crate) async fn read_as(
        self: &Arc<Self>,
        alone: bool,
        handle: u64,
        offset: u64,
        len: u64,
        need: u64,
        into: Option<Block>,
    ) -> Result<Piece> {
        let (done, rx) = oneshot::channel();
        let fetch = Fetch {
            handle,
            offset,
            len,
            need,
            into,
            done,
        };
        if alone {
            // Sent at once, with no hop to a sender.
            self.send(vec![fetch]).await;
        } else {
            let mut st = self.state.lock();
            st.waiting.push(fetch);
            if !std::mem::replace(&mut st.sending, true) {
                tokio::spawn(self.clone().send_all());
            }
        }
        rx.await.unwrap_or_else(|_| Err(self.abandoned()))
    }

    fn abandoned(&self) -> FsError {
        FsError::Protocol(format!("data server {}: read abandoned", self.index))
    }

    /// Sends what waits, once the fetches started with the first joined.
    async fn send_all(self: Arc<Self>) {
        tokio::task::yield_now().await;
        let batch = {
            let mut st = self.state.lock();
            st.sending = false;
            std::mem::take(&mut st.waiting)
        };
        join_all(runs(batch, self.block).into_iter().map(|run| self.send(run))).await;
    }

    /// Sends one run and answers each of its fetches with its slice. A run
    /// of several that fails is tried again fetch by fetch, so that a
    /// failure (a part shorter than it must be) fails only its own.
    async fn send(&self, mut run: Vec<Fetch>) {
        // Every fetch lends a buffer and the answer is large enough to be
        // read on its own: it lands in them, in order. (A smaller one is
        // copied: a buffer made whole for it would take a block's pages
        // for a small file's few.)
        let need = run.iter().map(|f| f.need).max().unwrap_or(0);
        let expect = need.saturating_sub(run[0].offset);
        let lends = expect >= POOLED_MIN as u64 && run.iter().all(|f| f.into.is_some());
        let landing = lends.then(|| {
            Landing::new(
                run.iter_mut()
                    .map(|f| {
                        let mut b = f.into.take().unwrap_or_default();
                        b.stale(f.len as usize);
                        b
                    })
                    .collect(),
            )
        });
        let first = &run[0];
        let (handle, offset) = (first.handle, first.offset);
        let len: u64 = run.iter().map(|f| f.len).sum();
        let req = Request::Read {
            handle,
            offset,
            len,
            need,
        };
        let answer = match &landing {
            Some(l) => self.peer.call_landing(&req, l).await,
            None => self.peer.call(&req, &[]).await,
        };
        let (lent, landed) = landing.as_ref().map(Landing::finish).unwrap_or_default();
        let mut lent = lent.into_iter();
        let r = match answer {
            Ok((Response::Data { .. }, d)) => Ok(d),
            Ok((Response::Error(e), _)) => Err(server_error(&format!("handle {handle}"), self.index, e)),
            Ok((other, _)) => Err(FsError::Protocol(format!("unexpected reply to Read: {other:?}"))),
            Err(e) => Err(e),
        };
        match r {
            Ok(d) => {
                for mut f in run {
                    let from = (f.offset - offset) as usize;
                    // Its buffer: lent to the answer, or not lent at all.
                    let own = f.into.take().or_else(|| lent.next());
                    let piece = match (landed, own) {
                        (Some(n), Some(mut b)) => {
                            b.truncate(n.saturating_sub(from).min(f.len as usize));
                            Piece::Landed(b)
                        }
                        (_, b) => {
                            let from = from.min(d.len());
                            let to = (from + f.len as usize).min(d.len());
                            Piece::Shared(d.slice(from..to), b)
                        }
                    };
                    let _ = f.done.send(Ok(piece));
                }
            }
            Err(e) if run.len() == 1 => {
                let _ = run.into_iter().next().expect("one").done.send(Err(e));
            }
            Err(_) => {
                for (f, b) in run.iter_mut().zip(lent) {
                    f.into = Some(b);
                }
                join_all(run.into_iter().map(|f| Box::pin(self.send(vec![f])))).await;
            }
        }
    }
}

/// Groups fetches into runs: adjacent whole blocks of one part, up to
/// [`RUN_BLOCKS`]; anything else alone.
fn runs(mut batch: Vec<Fetch>, block: u64) -> Vec<Vec<Fetch>> {
    let whole = |f: &Fetch| f.offset.is_multiple_of(block) && f.len == block;
    batch.sort_by_key(|f| (!whole(f), f.handle, f.offset));
    let mut out: Vec<Vec<Fetch>> = Vec::new();
    for f in batch {
        if let Some(run) = out.last_mut() {
            let last = run.last().expect("runs are never empty");
            let len: u64 = run.iter().map(|x| x.len).sum();
            if whole(&f)
                && whole(last)
                && last.handle == f.handle
                && last.offset + last.len == f.offset
                && len + f.len <= RUN_BLOCKS * block
            {
                run.push(f);
                continue;
            }
        }
        out.push(vec![f]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(handle: u64, offset: u64, len: u64) -> Fetch {
        Fetch {
            handle,
            offset,
            len,
            need: 0,
            into: None,
            done: oneshot::channel().0,
        }
    }

    #[test]
    fn adjacent_whole_blocks_of_a_part_make_one_run() {
        const B: u64 = 64;
        let batch = vec![
            f(1, 2 * B, B),
            f(1, 0, B),
            f(2, 0, B),
            f(1, B, B),
            f(1, 2 * B, B),  // the same block twice: apart
            f(1, 4 * B, B),  // a gap before it
            f(2, B + 1, B),  // unaligned: alone
            f(2, 2 * B, 10), // short: alone
            f(1, 5 * B, B),
            f(1, 6 * B, B),
            f(1, 7 * B, B),
            f(1, 8 * B, B), // past RUN_BLOCKS
        ];
        let r = runs(batch, B);
        let shape: Vec<Vec<(u64, u64)>> = r
            .iter()
            .map(|r| r.iter().map(|f| (f.handle, f.offset)).collect())
            .collect();
        assert_eq!(
            shape,
            vec![
                vec![(1, 0), (1, 64), (1, 128)],
                vec![(1, 128)],
                vec![(1, 256), (1, 320), (1, 384), (1, 448)],
                vec![(1, 512)],
                vec![(2, 0)],
                vec![(2, 65)],
                vec![(2, 128)],
            ]
            .into_iter()
            .map(|v| v.into_iter().collect::<Vec<_>>())
            .collect::<Vec<_>>()
        );
    }
}
