//! Group commit: many writers, one sync. A thread owns the log; writers
//! hand it entries and wait for their acknowledgement, which comes only
//! after the sync that made the entry durable. While one sync runs, new
//! entries queue up and share the next one.

use crate::media::Media;
use crate::wal::{Entry, Wal};
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

/// A handle to a log served by its group-commit thread. Cheap to clone.
#[derive(Clone)]
pub struct GroupLog {
    tx: mpsc::Sender<Cmd>,
    /// The log's length, as its thread last left it: read on every write
    /// (is a checkpoint due?) without a trip to that thread.
    len: Arc<AtomicU64>,
}

/// Most entries one sync covers.
const MAX_BATCH: usize = 1024;

impl GroupLog {
    /// Starts the thread that owns `wal`.
    pub fn start<M: Media + 'static>(mut wal: Wal<M>) -> GroupLog {
        let (tx, rx) = mpsc::channel::<Cmd>();
        let len = Arc::new(AtomicU64::new(wal.len()));
        let shown = len.clone();
        std::thread::Builder::new()
            .name("parcache-log".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    let mut waiting = Vec::new();
                    let mut next = Some(first);
                    while let Some(cmd) = next.take() {
                        match cmd {
                            Cmd::Append(e, reply) => match wal.append(&e) {
                                Ok(()) => {
                                    shown.store(wal.len(), Ordering::Release);
                                    waiting.push(reply)
                                }
                                Err(err) => {
                                    let _ = reply.send(Err(err));
                                }
                            },
                            Cmd::AppendBuffered(e, reply) => {
                                let r = wal.append(&e);
                                shown.store(wal.len(), Ordering::Release);
                                let _ = reply.send(r);
                            }
                            Cmd::Sync(reply) => waiting.push(reply),
                            Cmd::Compact(live, reply) => {
                                finish(&mut wal, &mut waiting);
                                let r = wal.compact(&live);
                                shown.store(wal.len(), Ordering::Release);
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
        GroupLog { tx, len }
    }

    /// Appends `e` and returns once it is durable.
    pub async fn append(&self, e: Entry) -> io::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Cmd::Append(e, tx)).map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// Appends `e` and returns once it is written, before it is durable: a
    /// crash of the machine (not of the process) may lose it until the next
    /// [`GroupLog::sync`] or durable append returns.
    pub async fn append_buffered(&self, e: Entry) -> io::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Cmd::AppendBuffered(e, tx)).map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// Hands `e` to the log now (entries handed over in one order are
    /// logged in that order) and returns the wait for it to be written,
    /// not yet durable (as [`GroupLog::append_buffered`]).
    pub fn send_buffered(&self, e: Entry) -> impl std::future::Future<Output = io::Result<()>> {
        let (tx, rx) = oneshot::channel();
        let sent = self.tx.send(Cmd::AppendBuffered(e, tx)).map_err(|_| gone());
        async move {
            sent?;
            rx.await.map_err(|_| gone())?
        }
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
        self.tx.send(Cmd::Compact(live, tx)).map_err(|_| gone())?;
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
}
