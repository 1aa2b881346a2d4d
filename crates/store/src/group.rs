//! Group commit: many writers, one sync. A thread owns the log's syncs;
//! durable writers hand it entries and wait for their acknowledgement, which
//! comes only after the sync that made the entry durable. While one sync
//! runs, new entries queue up and share the next one. A buffered append
//! (durable only at the next sync) is written in place by its caller when
//! the log is idle: no hand-over to the thread and back.

use crate::media::Media;
use crate::wal::{Entry, Wal};
use parking_lot::Mutex;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use tokio::sync::oneshot;

enum Cmd {
    Append(Entry, oneshot::Sender<io::Result<()>>),
    AppendBuffered(Entry, oneshot::Sender<io::Result<()>>),
    Sync(oneshot::Sender<io::Result<()>>),
    Compact(Vec<Entry>, oneshot::Sender<io::Result<()>>),
}

/// What an in-place append needs of the log, whatever its media.
trait Appender: Send {
    fn append(&mut self, e: &Entry) -> io::Result<()>;
    fn len(&self) -> u64;
}

impl<M: Media> Appender for Wal<M> {
    fn append(&mut self, e: &Entry) -> io::Result<()> {
        Wal::append(self, e)
    }

    fn len(&self) -> u64 {
        Wal::len(self)
    }
}

/// A handle to a log served by its group-commit thread. Cheap to clone.
#[derive(Clone)]
pub struct GroupLog {
    tx: mpsc::Sender<Cmd>,
    /// The log, locked by its thread for each batch (syncs included) and
    /// by an in-place append.
    wal: Arc<Mutex<dyn Appender>>,
    /// Commands that append, handed to the thread and not yet done: an
    /// in-place append waits its turn behind them (entries handed over in
    /// one order are logged in that order).
    queued: Arc<AtomicU64>,
    /// The log's length, as its last append left it: read on every write
    /// (is a checkpoint due?) without a trip to the thread.
    len: Arc<AtomicU64>,
}

/// Most entries one sync covers.
const MAX_BATCH: usize = 1024;

/// The largest entry (its bytes of data) written in place.
const IN_PLACE_MAX: usize = 16 << 10;

/// How long an append in place waits for the log before handing its
/// entry to the thread instead.
const IN_PLACE_WAIT: std::time::Duration = std::time::Duration::from_micros(50);

impl GroupLog {
    /// Starts the thread that syncs `wal`.
    pub fn start<M: Media + 'static>(wal: Wal<M>) -> GroupLog {
        let (tx, rx) = mpsc::channel::<Cmd>();
        let len = Arc::new(AtomicU64::new(wal.len()));
        let queued = Arc::new(AtomicU64::new(0));
        let wal = Arc::new(Mutex::new(wal));
        let (shown, done, mine) = (len.clone(), queued.clone(), wal.clone());
        std::thread::Builder::new()
            .name("parcache-log".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    let mut wal = mine.lock();
                    let mut waiting = Vec::new();
                    let mut next = Some(first);
                    while let Some(cmd) = next.take() {
                        match cmd {
                            Cmd::Append(e, reply) => match wal.append(&e) {
                                Ok(()) => {
                                    shown.store(wal.len(), Ordering::Release);
                                    done.fetch_sub(1, Ordering::AcqRel);
                                    waiting.push(reply)
                                }
                                Err(err) => {
                                    done.fetch_sub(1, Ordering::AcqRel);
                                    let _ = reply.send(Err(err));
                                }
                            },
                            Cmd::AppendBuffered(e, reply) => {
                                let r = wal.append(&e);
                                shown.store(wal.len(), Ordering::Release);
                                done.fetch_sub(1, Ordering::AcqRel);
                                let _ = reply.send(r);
                            }
                            Cmd::Sync(reply) => waiting.push(reply),
                            Cmd::Compact(live, reply) => {
                                finish(&mut wal, &mut waiting);
                                let r = wal.compact(&live);
                                shown.store(wal.len(), Ordering::Release);
                                done.fetch_sub(1, Ordering::AcqRel);
                                let _ = reply.send(r);
                            }
                        }
                        if waiting.len() < MAX_BATCH {
                            next = rx.try_recv().ok();
                        }
                    }
                    finish(&mut wal, &mut waiting);
                }
            })
            .expect("spawn the log thread");
        GroupLog { tx, wal, queued, len }
    }

    /// Hands an appending command to the thread.
    fn queue(&self, cmd: Cmd) -> io::Result<()> {
        self.queued.fetch_add(1, Ordering::AcqRel);
        self.tx.send(cmd).map_err(|_| {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            gone()
        })
    }

    /// Appends `e` and returns once it is durable.
    pub async fn append(&self, e: Entry) -> io::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.queue(Cmd::Append(e, tx))?;
        rx.await.map_err(|_| gone())?
    }

    /// Appends `e` and returns once it is written, before it is durable: a
    /// crash of the machine (not of the process) may lose it until the next
    /// [`GroupLog::sync`] or durable append returns.
    pub async fn append_buffered(&self, e: Entry) -> io::Result<()> {
        self.send_buffered(e).await
    }

    /// Hands `e` to the log now (entries handed over in one order are
    /// logged in that order) and returns the wait for it to be written,
    /// not yet durable (as [`GroupLog::append_buffered`]). When the thread
    /// neither holds the log (a batch or its sync) nor has appends queued,
    /// `e` is written here and now.
    pub fn send_buffered(&self, e: Entry) -> impl std::future::Future<Output = io::Result<()>> {
        // `Err`: done already (in place, or the thread is gone).
        let sent = match self.append_in_place(&e) {
            Some(r) => Err(r),
            None => {
                let (tx, rx) = oneshot::channel();
                match self.queue(Cmd::AppendBuffered(e, tx)) {
                    Ok(()) => Ok(rx),
                    Err(e) => Err(Err(e)),
                }
            }
        };
        async move {
            match sent {
                Err(done) => done,
                Ok(rx) => rx.await.map_err(|_| gone())?,
            }
        }
    }

    /// Appends `e` in place if it is small and the log is idle; `None` if
    /// not. An append in place holds the log for a few microseconds (one
    /// write into the page cache), the thread for a whole sync: a short
    /// wait tells them apart. A large entry goes to the thread, which
    /// writes it while its writer goes on (a sequential write's blocks
    /// were slower written in place).
    fn append_in_place(&self, e: &Entry) -> Option<io::Result<()>> {
        let data = match e {
            Entry::Write { data, .. } | Entry::NodeWrite { data, .. } => data.len(),
            _ => 0,
        };
        if data > IN_PLACE_MAX || self.queued.load(Ordering::Acquire) != 0 {
            return None;
        }
        let mut wal = self.wal.try_lock_for(IN_PLACE_WAIT)?;
        if self.queued.load(Ordering::Acquire) != 0 {
            return None;
        }
        let r = wal.append(e);
        self.len.store(wal.len(), Ordering::Release);
        Some(r)
    }

    /// Returns once everything appended before it is durable (it joins
    /// the next group commit).
    pub async fn sync(&self) -> io::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Cmd::Sync(tx)).map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// Replaces the log by the live entries.
    pub async fn compact(&self, live: Vec<Entry>) -> io::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.queue(Cmd::Compact(live, tx))?;
        rx.await.map_err(|_| gone())?
    }

    /// Bytes in the log, counting every entry whose append has returned.
    pub fn bytes(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }
}

fn finish<M: Media>(wal: &mut Wal<M>, waiting: &mut Vec<oneshot::Sender<io::Result<()>>>) {
    if waiting.is_empty() {
        return;
    }
    let r = wal.sync();
    for reply in waiting.drain(..) {
        let _ = reply.send(match &r {
            Ok(()) => Ok(()),
            Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
        });
    }
}

fn gone() -> io::Error {
    io::Error::other("the write log thread has stopped")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::CrashMedia;

    /// The length a writer reads counts its own append as soon as the
    /// append returns (it decides whether a checkpoint is due), and a
    /// compaction's result as soon as the compaction returns.
    #[tokio::test]
    async fn the_length_counts_every_append_that_has_returned() {
        let (wal, _) = Wal::open(CrashMedia::new()).unwrap();
        let log = GroupLog::start(wal);
        assert_eq!(log.bytes(), 0);
        let write = |n: usize| Entry::Write {
            handle: 1,
            offset: 0,
            data: bytes::Bytes::from(vec![7u8; n]),
        };
        log.append_buffered(write(100)).await.unwrap();
        let one = log.bytes();
        assert!(one > 100, "{one}");
        log.append(write(1000)).await.unwrap();
        let two = log.bytes();
        assert!(two > one + 1000, "{one} then {two}");
        log.compact(Vec::new()).await.unwrap();
        assert!(log.bytes() < one, "{} after emptying", log.bytes());
    }

    /// Each writer's entries are logged in the order it handed them over,
    /// whether written in place or by the thread, while other writers
    /// append and syncs run; none is lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_writers_entries_are_logged_in_its_order() {
        let media = CrashMedia::new();
        let (wal, _) = Wal::open(media.clone()).unwrap();
        let log = GroupLog::start(wal);
        const WRITERS: u64 = 4;
        const EACH: u64 = 300;
        let mut tasks = Vec::new();
        for w in 0..WRITERS {
            let log = log.clone();
            tasks.push(tokio::spawn(async move {
                let e = |i: u64| Entry::Write {
                    handle: w,
                    offset: i,
                    data: bytes::Bytes::from(vec![w as u8; 16]),
                };
                let mut i = 0;
                while i < EACH {
                    if (i + w) % 5 == 0 {
                        log.append(e(i)).await.unwrap();
                        i += 1;
                    } else if i % 4 == 0 {
                        log.append_buffered(e(i)).await.unwrap();
                        i += 1;
                    } else {
                        // Three handed over before any is waited for, as
                        // the node's durable cache does.
                        let waits: Vec<_> = (i..(i + 3).min(EACH)).map(|i| log.send_buffered(e(i))).collect();
                        i = (i + 3).min(EACH);
                        if w == 0 {
                            log.sync().await.unwrap();
                        }
                        for wait in waits {
                            wait.await.unwrap();
                        }
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        log.sync().await.unwrap();
        let (_, replay) = Wal::open(media).unwrap();
        let mut next = [0u64; WRITERS as usize];
        for e in replay.entries {
            let Entry::Write { handle, offset, .. } = e else {
                panic!("only writes were appended");
            };
            assert_eq!(offset, next[handle as usize], "writer {handle}'s entries out of order");
            next[handle as usize] += 1;
        }
        assert_eq!(next, [EACH; WRITERS as usize]);
    }

    /// An entry handed over while the thread holds the log is queued; one
    /// handed over after it, when the log is free again, still waits
    /// behind it instead of being written in place first.
    #[tokio::test]
    async fn an_append_in_place_waits_behind_queued_ones() {
        let media = CrashMedia::new();
        let (wal, _) = Wal::open(media.clone()).unwrap();
        let log = GroupLog::start(wal);
        let e = |i: u64| Entry::Write {
            handle: 1,
            offset: i,
            data: bytes::Bytes::from(vec![1u8; 16]),
        };
        let held = log.wal.lock(); // as the thread during a sync
        let first = log.send_buffered(e(0));
        drop(held);
        let second = log.send_buffered(e(1));
        first.await.unwrap();
        second.await.unwrap();
        log.sync().await.unwrap();
        let (_, replay) = Wal::open(media).unwrap();
        let offsets: Vec<u64> = replay
            .entries
            .iter()
            .map(|e| match e {
                Entry::Write { offset, .. } => *offset,
                _ => panic!("only writes were appended"),
            })
            .collect();
        assert_eq!(offsets, [0, 1]);
    }
}
