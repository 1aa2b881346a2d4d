//! A data server's reads of its block store, merged. The server's cache
//! asks for one block at a time, so a node's read of 256 KiB of a part is
//! four fetches arriving together, which took a blocking thread, a system
//! call and a wake-up each (a cold 512 MiB read through a mount made 2,048
//! reads per data server; with the queue, 927: issue 14).
//!
//! Fetches wait in a queue. A reader thread is started when one arrives and
//! none is starting yet (at most [`READERS`] at once); it takes every fetch
//! waiting when it starts, and again after each round, so fetches that
//! arrive together or while the readers are busy are served together, and
//! a run of adjacent blocks of one part is one read, whose answer each
//! block takes a slice of (no copy), or, where every fetch of the run lent
//! its cache buffer, one read straight into them ([`ReadQueue::fetch_into`]:
//! the data server's cache then copies nothing). A lone demand fetch (a random read)
//! that finds the store idle is read at once on the thread that asked
//! ([`ReadQueue::read_here`]).

use bytes::Bytes;
use parcache_proto::{Block, BufPool};
use parcache_store::{BlockStore, DIRECT_ALIGN};
use parking_lot::Mutex;
use std::io;
use std::sync::Arc;
use tokio::sync::oneshot;

/// Most reader threads at once (each is one of the runtime's blocking
/// threads; random reads from several jobs keep several busy).
pub const READERS: usize = 8;

/// Most blocks one read covers.
pub const RUN_MAX: u64 = 16;

/// What a fetch is answered: the buffer it lent back (filled, if
/// [`Got::Into`]), and what was read.
type Answered = (Option<Block>, io::Result<Got>);

type Answer = oneshot::Sender<Answered>;

/// What a fetch got.
enum Got {
    /// This many bytes, read into the buffer it lent.
    Into(usize),
    /// A slice of a run's buffer.
    Shared(Bytes),
}

/// A fetch waiting: part, block index, the buffer it lent, its answer.
struct Waiting {
    handle: u64,
    index: u64,
    into: Option<Block>,
    answer: Answer,
}

/// The queue of fetches waiting for a reader (see the module's comment).
pub struct ReadQueue {
    store: Arc<BlockStore>,
    /// Buffers for the reads, used again once every block of a run is
    /// dropped (a new one per read cost a page fault per 4 KiB).
    bufs: Arc<BufPool>,
    block: u64,
    st: Mutex<QueueState>,
    /// Reads of the block store made (one per run of blocks).
    reads: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct QueueState {
    /// In arrival order.
    waiting: Vec<Waiting>,
    /// Reader threads started and not yet finished.
    readers: usize,
    /// A reader was started and has not taken the queue yet: a fetch that
    /// arrives now waits for it instead of starting another.
    starting: bool,
    /// A block is being read on the thread that asked for it
    /// ([`ReadQueue::read_here`]).
    reading_here: bool,
}

impl ReadQueue {
    pub fn new(store: Arc<BlockStore>, block: u32) -> Arc<ReadQueue> {
        Arc::new(ReadQueue {
            store,
            bufs: Arc::default(),
            block: block as u64,
            st: Mutex::new(QueueState::default()),
            reads: Default::default(),
        })
    }

    /// Reads of the block store made so far (fewer than the fetches when
    /// runs were merged).
    pub fn reads(&self) -> u64 {
        self.reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Block `index` of part `handle`: short at the part's end, empty past it.
    pub async fn fetch(self: &Arc<Self>, handle: u64, index: u64) -> io::Result<Bytes> {
        let (into, got) = self.queued(handle, index, None).await;
        got.map(|g| shared(into, g))
    }

    /// As [`ReadQueue::fetch`], into `into` (a cache buffer, whose stale
    /// bytes it overwrites): read straight into it where its run lets
    /// (see the module's comment), copied in otherwise. Gives it back with
    /// how many bytes the block has.
    pub async fn fetch_into(self: &Arc<Self>, handle: u64, index: u64, into: Block) -> (Block, io::Result<usize>) {
        let (into, got) = self.queued(handle, index, Some(into)).await;
        filled(into, got)
    }

    /// Queues a fetch (starting a reader if it must) and waits for it.
    async fn queued(self: &Arc<Self>, handle: u64, index: u64, into: Option<Block>) -> Answered {
        let (rx, start) = self.enqueue(handle, index, into);
        if start {
            let me = Arc::clone(self);
            tokio::task::spawn_blocking(move || me.read_rounds());
        }
        rx.await.unwrap_or_else(|_| {
            (
                None,
                Err(io::Error::other("the block store's reader stopped before answering")),
            )
        })
    }

    /// Block `index` of part `handle`, read on this thread if the store is
    /// idle (no reader at work, nothing waiting, no other read here);
    /// `None` if it is not, and the caller should [`ReadQueue::fetch`]. A
    /// reader waiting for one block (a random read) then costs no hand-off
    /// to a reader thread and back (two thread switches; 4 KiB random cold
    /// reads through a mount ran 10-25 % faster without them, issue 14).
    /// Only for demand reads: prefetches go through the queue, which
    /// merges them.
    pub fn read_here(&self, handle: u64, index: u64) -> Option<io::Result<Bytes>> {
        let (into, got) = self.here(handle, index, None).ok()?;
        Some(got.map(|g| shared(into, g)))
    }

    /// As [`ReadQueue::read_here`], into `into` as [`ReadQueue::fetch_into`]
    /// reads; `Err` gives `into` back when the store is not idle.
    pub fn read_here_into(&self, handle: u64, index: u64, into: Block) -> Result<(Block, io::Result<usize>), Block> {
        match self.here(handle, index, Some(into)) {
            Ok((into, got)) => Ok(filled(into, got)),
            Err(into) => Err(into.unwrap_or_default()),
        }
    }

    /// Reads in place if the store is idle; gives `into` back if not.
    fn here(&self, handle: u64, index: u64, mut into: Option<Block>) -> Result<Answered, Option<Block>> {
        let got = self.if_idle(|| match into.as_mut() {
            Some(b) => self.read_into(handle, index, &mut [b]).map(|n| Got::Into(n[0])),
            None => self.read_run(handle, index, index).map(Got::Shared),
        });
        match got {
            Some(got) => Ok((into, got)),
            None => Err(into),
        }
    }

    /// `len` bytes at `offset` of part `handle` (short at its end), read
    /// on this thread if the store is idle, as [`ReadQueue::read_here`]
    /// reads a block; `None` if it is not. For a read around the cache
    /// (`ReadPages`), which no queue merges.
    pub fn read_range_here(&self, handle: u64, offset: u64, len: u64) -> Option<io::Result<Bytes>> {
        self.if_idle(|| {
            self.reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.store
                .read_in(handle, offset, len, self.bufs.take(len as usize + DIRECT_ALIGN))
                .map(|(buf, at)| self.bufs.bytes(buf).slice(at))
        })
    }

    /// Runs `read` on this thread if the store is idle (no reader at work,
    /// nothing waiting, no other read here); `None` if it is not.
    fn if_idle<T>(&self, read: impl FnOnce() -> T) -> Option<T> {
        {
            let mut st = self.st.lock();
            if st.readers > 0 || !st.waiting.is_empty() || st.reading_here {
                return None;
            }
            st.reading_here = true;
        }
        /// Ends the read here, even if it panics.
        struct Here<'a>(&'a ReadQueue);
        impl Drop for Here<'_> {
            fn drop(&mut self) {
                self.0.st.lock().reading_here = false;
            }
        }
        let _here = Here(self);
        Some(read())
    }

    /// Reads blocks `first..=last` of part `handle` as one read.
    fn read_run(&self, handle: u64, first: u64, last: u64) -> io::Result<Bytes> {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let len = (last - first + 1) * self.block;
        self.store
            .read_in(
                handle,
                first * self.block,
                len,
                self.bufs.take(len as usize + DIRECT_ALIGN),
            )
            .map(|(buf, at)| self.bufs.bytes(buf).slice(at))
    }

    /// Reads blocks `first..` of part `handle` into `blocks` in turn, as
    /// one read; returns the bytes each holds now (its length set).
    fn read_into(&self, handle: u64, first: u64, blocks: &mut [&mut Block]) -> io::Result<Vec<usize>> {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let bs = self.block as usize;
        let n = {
            let mut pages: Vec<&mut [u8]> = blocks.iter_mut().map(|b| &mut b.pages_mut(bs)[..bs]).collect();
            self.store.read_pages(handle, first * self.block, &mut pages)
        };
        let n = n.inspect_err(|_| blocks.iter_mut().for_each(|b| b.clear()))?;
        Ok(blocks
            .iter_mut()
            .enumerate()
            .map(|(k, b)| {
                let got = n.saturating_sub(k * bs).min(bs);
                b.set_len(got);
                got
            })
            .collect())
    }

    /// Puts a fetch in the queue; whether the caller must start a reader
    /// (counted as started already).
    fn enqueue(&self, handle: u64, index: u64, into: Option<Block>) -> (oneshot::Receiver<Answered>, bool) {
        let (answer, rx) = oneshot::channel();
        let mut st = self.st.lock();
        st.waiting.push(Waiting {
            handle,
            index,
            into,
            answer,
        });
        let start = !st.starting && st.readers < READERS;
        if start {
            st.starting = true;
            st.readers += 1;
        }
        (rx, start)
    }

    /// A reader thread: serves what waits, round after round, until nothing does.
    fn read_rounds(&self) {
        // Counted out if the thread panics, so a panic cannot use up the
        // readers; a reader that finds nothing waiting counts itself out
        // under the same lock, so a fetch arriving then starts a new one.
        struct Done<'a>(&'a ReadQueue, bool);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                if self.1 {
                    self.0.st.lock().readers -= 1;
                }
            }
        }
        let mut done = Done(self, true);
        loop {
            let mut batch = {
                let mut st = self.st.lock();
                st.starting = false;
                if st.waiting.is_empty() {
                    st.readers -= 1;
                    done.1 = false;
                    return;
                }
                std::mem::take(&mut st.waiting)
            };
            batch.sort_by_key(|w| (w.handle, w.index));
            let mut batch = batch.into_iter().peekable();
            while let Some(head) = batch.next() {
                let (h, first) = (head.handle, head.index);
                let mut run = vec![head];
                // Adjacent blocks of the part (the same block asked twice
                // too), up to RUN_MAX blocks from the first.
                while let Some(next) = batch.next_if(|w| {
                    w.handle == h && w.index <= run.last().map_or(first, |r| r.index) + 1 && w.index < first + RUN_MAX
                }) {
                    run.push(next);
                }
                self.serve(h, first, run);
            }
        }
    }

    /// Reads a run of fetches of part `h` from block `first` on and
    /// answers each: into the buffers they lent if every one lent one and
    /// no block is asked twice, otherwise with slices of one buffer.
    fn serve(&self, h: u64, first: u64, mut run: Vec<Waiting>) {
        let distinct = run.iter().enumerate().all(|(k, w)| w.index == first + k as u64);
        if distinct && run.iter().all(|w| w.into.is_some()) {
            let got = {
                let mut blocks: Vec<&mut Block> = run.iter_mut().filter_map(|w| w.into.as_mut()).collect();
                self.read_into(h, first, &mut blocks)
            };
            for (k, w) in run.into_iter().enumerate() {
                let r = match &got {
                    Ok(n) => Ok(Got::Into(n[k])),
                    Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
                };
                let _ = w.answer.send((w.into, r));
            }
            return;
        }
        let last = run.last().map_or(first, |r| r.index);
        let got = self.read_run(h, first, last);
        for w in run {
            let _ = w.answer.send((
                w.into,
                match &got {
                    Ok(b) => {
                        let from = ((w.index - first) * self.block) as usize;
                        Ok(Got::Shared(if from < b.len() {
                            b.slice(from..b.len().min(from + self.block as usize))
                        } else {
                            Bytes::new()
                        }))
                    }
                    Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
                },
            ));
        }
    }
}

/// A fetch's bytes as a payload, for a fetch that lent no buffer.
fn shared(into: Option<Block>, got: Got) -> Bytes {
    match (got, into) {
        (Got::Shared(b), _) => b,
        (Got::Into(n), Some(mut b)) => {
            b.truncate(n);
            b.into()
        }
        (Got::Into(_), None) => Bytes::new(),
    }
}

/// A fetch's bytes in the buffer it lent (copied in if they came as a
/// slice of a run's buffer), and how many.
fn filled(into: Option<Block>, got: io::Result<Got>) -> (Block, io::Result<usize>) {
    let mut b = into.unwrap_or_default();
    match got {
        Ok(Got::Into(n)) => (b, Ok(n)),
        Ok(Got::Shared(d)) => {
            b.clear();
            b.extend_from_slice(&d);
            (b, Ok(d.len()))
        }
        Err(e) => (b, Err(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(tag: &str) -> (std::path::PathBuf, Arc<BlockStore>) {
        let d = std::env::temp_dir().join(format!("parcache-readq-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        (d.clone(), Arc::new(BlockStore::open(&d).unwrap()))
    }

    /// Fetches waiting together, in any order, of adjacent, repeated,
    /// distant and missing blocks of several parts: one read per run of
    /// adjacent blocks, and each answer what the part holds at that block
    /// (whole, short at the end, empty past it).
    #[test]
    fn waiting_fetches_are_read_in_runs() {
        let (d, s) = store("merge");
        let bs = 4096u32;
        let part = |h: u64| -> Vec<u8> { (0..(10 * bs as u64 + 100)).map(|i| (i * h % 251) as u8).collect() };
        for h in [1u64, 2] {
            s.write(h, 0, &part(h)).unwrap();
        }
        let q = ReadQueue::new(s, bs);
        // Runs: part 1 blocks 0-3 (2 twice), 7, 10-11; part 2 blocks 0-1,
        // 9, 30; part 3 block 0; part 4 blocks 0-15 and 16 (RUN_MAX).
        let mut asks: Vec<(u64, u64)> = vec![
            (1, 3),
            (1, 0),
            (1, 1),
            (2, 1),
            (1, 2),
            (1, 2),
            (1, 10),
            (1, 11),
            (2, 9),
            (2, 30),
            (3, 0),
            (1, 7),
            (2, 0),
        ];
        asks.extend((0..=RUN_MAX).map(|i| (4, i)));
        // Every fetch lends a buffer of stale bytes but part 2's block 0:
        // runs whose fetches all lend one, each block once, are read into
        // them; the others (part 1's with block 2 twice, part 2's first)
        // are copied in from a run's buffer.
        let lends = |h: u64, i: u64| !(h == 2 && i == 0);
        let mut waits = Vec::new();
        for (n, &(h, i)) in asks.iter().enumerate() {
            let lent = lends(h, i).then(|| Block::from_slice(&vec![0xEE; bs as usize]));
            let (rx, start) = q.enqueue(h, i, lent);
            assert_eq!(start, n == 0, "only the first fetch starts a reader");
            waits.push(rx);
        }
        q.read_rounds();
        assert_eq!(q.reads(), 9);
        assert_eq!(q.st.lock().readers, 0);
        for (&(h, i), rx) in asks.iter().zip(waits) {
            let (into, got) = rx.blocking_recv().unwrap();
            let got: Vec<u8> = if lends(h, i) {
                let (b, n) = filled(into, got);
                assert_eq!(n.unwrap(), b.len());
                b.to_vec()
            } else {
                assert!(into.is_none());
                shared(None, got.unwrap()).to_vec()
            };
            let p = if h == 1 || h == 2 { part(h) } else { Vec::new() };
            let from = (i * bs as u64) as usize;
            let want = if from < p.len() {
                &p[from..p.len().min(from + bs as usize)]
            } else {
                &[][..]
            };
            assert!(got[..] == *want, "part {h} block {i}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A lone read of an idle store is read in place, short at the part's
    /// end and empty past it; while fetches wait or a reader works, or
    /// another read is in place, it is not (the caller queues it).
    #[test]
    fn a_lone_read_of_an_idle_store_is_read_in_place() {
        let (d, s) = store("here");
        let bs = 4096u32;
        let part: Vec<u8> = (0..(2 * bs as usize + 10)).map(|i| (i % 253) as u8).collect();
        s.write(7, 0, &part).unwrap();
        let q = ReadQueue::new(s, bs);
        let got = q.read_here(7, 1).expect("idle").unwrap();
        assert!(got[..] == part[bs as usize..2 * bs as usize]);
        assert!(q.read_here(7, 2).expect("idle").unwrap()[..] == part[2 * bs as usize..]);
        assert!(q.read_here(7, 3).expect("idle").unwrap().is_empty());
        assert_eq!(q.reads(), 3);
        // Into a cache buffer of stale bytes: the block's, short at the end.
        let stale = || Block::from_slice(&vec![0xEE; bs as usize]);
        let (b, n) = q.read_here_into(7, 2, stale()).expect("idle");
        assert_eq!((&b[..], n.unwrap()), (&part[2 * bs as usize..], 10));
        let (rx, start) = q.enqueue(7, 0, None);
        assert!(start);
        assert!(q.read_here(7, 1).is_none(), "a fetch waits and a reader is starting");
        assert_eq!(
            q.read_here_into(7, 1, stale()).unwrap_err().len(),
            bs as usize,
            "given back"
        );
        q.read_rounds();
        let (into, got) = rx.blocking_recv().unwrap();
        assert!(shared(into, got.unwrap())[..] == part[..bs as usize]);
        q.st.lock().reading_here = true;
        assert!(q.read_here(7, 1).is_none(), "one read in place at a time");
        q.st.lock().reading_here = false;
        assert!(q.read_here(7, 1).is_some(), "idle again");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// More fetches than readers at once: every one is answered and the
    /// readers never pass their bound.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_fetches_stay_within_the_readers() {
        let (d, s) = store("many");
        let bs = 4096u32;
        for h in 0..64u64 {
            s.write(h, 0, &vec![h as u8; bs as usize]).unwrap();
        }
        let q = ReadQueue::new(s, bs);
        let tasks: Vec<_> = (0..64u64)
            .map(|h| {
                let q = q.clone();
                tokio::spawn(async move {
                    assert!(q.st.lock().readers <= READERS);
                    // Half of them lend a buffer.
                    let got = if h % 2 == 0 {
                        q.fetch(h, 0).await.unwrap()
                    } else {
                        let (b, n) = q.fetch_into(h, 0, Block::new()).await;
                        assert_eq!(n.unwrap(), b.len());
                        b.into()
                    };
                    (h, got)
                })
            })
            .collect();
        for t in tasks {
            let (h, b) = t.await.unwrap();
            assert_eq!(b[..], vec![h as u8; bs as usize][..]);
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
