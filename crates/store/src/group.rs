//! Group commit: many writers, one sync. A thread owns the log; writers
//! hand it entries and wait for their acknowledgement, which comes only
//! after the sync that made the entry durable. While one sync runs, new
//! entries queue up and share the next one.

use crate::media::Media;
use crate::wal::{Entry, Wal};
use std::io;
use std::sync::mpsc;
use tokio::sync::oneshot;

enum Cmd {
    Append(Entry, oneshot::Sender<io::Result<()>>),
    AppendBuffered(Entry, oneshot::Sender<io::Result<()>>),
    Sync(oneshot::Sender<io::Result<()>>),
    Compact(Vec<Entry>, oneshot::Sender<io::Result<()>>),
    Len(oneshot::Sender<u64>),
}

/// A handle to a log served by its group-commit thread. Cheap to clone.
#[derive(Clone)]
pub struct GroupLog {
    tx: mpsc::Sender<Cmd>,
}

/// Most entries one sync covers.
const MAX_BATCH: usize = 1024;

impl GroupLog {
    /// Starts the thread that owns `wal`.
    pub fn start<M: Media + 'static>(mut wal: Wal<M>) -> GroupLog {
        let (tx, rx) = mpsc::channel::<Cmd>();
        std::thread::Builder::new()
            .name("parcache-log".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    let mut waiting = Vec::new();
                    let mut next = Some(first);
                    while let Some(cmd) = next.take() {
                        match cmd {
                            Cmd::Append(e, reply) => match wal.append(&e) {
                                Ok(()) => waiting.push(reply),
                                Err(err) => {
                                    let _ = reply.send(Err(err));
                                }
                            },
                            Cmd::AppendBuffered(e, reply) => {
                                let _ = reply.send(wal.append(&e));
                            }
                            Cmd::Sync(reply) => waiting.push(reply),
                            Cmd::Compact(live, reply) => {
                                finish(&mut wal, &mut waiting);
                                let _ = reply.send(wal.compact(&live));
                            }
                            Cmd::Len(reply) => {
                                let _ = reply.send(wal.len());
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
        GroupLog { tx }
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

    /// Bytes in the log.
    pub async fn bytes(&self) -> u64 {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Cmd::Len(tx)).is_err() {
            return 0;
        }
        rx.await.unwrap_or(0)
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
