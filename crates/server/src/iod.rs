//! The data server (`parcache iod`): holds its stripes of every file.
//!
//! A write is appended to the durable write log (group commit, fsync) and
//! acknowledged only then, so an acknowledged write survives `kill -9` and a
//! power cut; it is also applied to the block store at once, so reads see
//! it. A checkpoint (when the log passes `checkpoint_bytes`, and at shutdown)
//! syncs the files written since the last one and empties the log. At start
//! the log is replayed into the block store, which is synced, and emptied.

use bytes::Bytes;
use parcache_proto::msg::ServerStats;
use parcache_proto::{serve, ErrorCode, Handler, Request, Response, Secret};
use parcache_store::{BlockStore, Entry, FileMedia, GroupLog, Wal};
use std::collections::HashSet;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio::sync::{watch, RwLock};

/// How a data server runs.
#[derive(Clone, Debug)]
pub struct IodConfig {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub secret: Secret,
    /// Log size that triggers a checkpoint.
    pub checkpoint_bytes: u64,
}

struct Iod {
    store: Arc<BlockStore>,
    log: GroupLog,
    /// Writes hold it shared between logging and applying; a checkpoint
    /// holds it exclusively, so everything logged is applied when it syncs.
    gate: RwLock<()>,
    touched: Mutex<HashSet<u64>>,
    checkpoint_bytes: u64,
    checkpointing: std::sync::atomic::AtomicBool,
    reads: AtomicU64,
    writes: AtomicU64,
}

fn io_reply(what: &str, e: io::Error) -> Response {
    let code = if e.kind() == io::ErrorKind::StorageFull {
        ErrorCode::NoSpace
    } else {
        ErrorCode::Io
    };
    Response::error(code, format!("{what}: {e}"))
}

impl Iod {
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&BlockStore) -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(io::Error::other)?
    }

    /// Logs `entry` durably, then applies it to the block store.
    async fn logged(&self, entry: Entry) -> io::Result<()> {
        let _g = self.gate.read().await;
        self.log.append(entry.clone()).await?;
        let h = entry.handle();
        self.touched.lock().expect("not poisoned").insert(h);
        self.blocking(move |s| apply(s, &entry)).await
    }

    async fn checkpoint(&self) -> io::Result<()> {
        let _g = self.gate.write().await;
        let touched: Vec<u64> = self.touched.lock().expect("not poisoned").drain().collect();
        self.blocking(move |s| {
            for h in touched {
                s.sync(h)?;
            }
            s.sync_dir()
        })
        .await?;
        self.log.compact(Vec::new()).await
    }

    async fn maybe_checkpoint(self: &Arc<Self>) {
        if self.log.bytes().await < self.checkpoint_bytes || self.checkpointing.swap(true, Ordering::SeqCst) {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            if let Err(e) = me.checkpoint().await {
                tracing::error!("checkpoint failed: {e}");
            }
            me.checkpointing.store(false, Ordering::SeqCst);
        });
    }
}

fn apply(s: &BlockStore, e: &Entry) -> io::Result<()> {
    match e {
        Entry::Write { handle, offset, data } => s.write(*handle, *offset, data),
        Entry::Truncate { handle, len } => s.truncate(*handle, *len),
        Entry::Remove { handle } => s.remove(*handle),
    }
}

struct IodHandler(Arc<Iod>, Arc<watch::Sender<bool>>);

impl Handler for IodHandler {
    async fn handle(&self, req: Request, data: Bytes) -> (Response, Bytes) {
        let iod = &self.0;
        let resp = match req {
            Request::Write { handle, offset } => {
                let len = data.len() as u64;
                match iod
                    .logged(Entry::Write {
                        handle,
                        offset,
                        data: data.to_vec(),
                    })
                    .await
                {
                    Ok(()) => {
                        iod.writes.fetch_add(1, Ordering::Relaxed);
                        iod.maybe_checkpoint().await;
                        Response::Written { len }
                    }
                    Err(e) => io_reply(&format!("write of {len} bytes at {offset} of handle {handle}"), e),
                }
            }
            Request::Read { handle, offset, len } => {
                if len > parcache_proto::frame::MAX_PAYLOAD as u64 {
                    return (
                        Response::error(ErrorCode::Invalid, format!("read of {len} bytes is over the limit")),
                        Bytes::new(),
                    );
                }
                iod.reads.fetch_add(1, Ordering::Relaxed);
                return match iod.blocking(move |s| s.read(handle, offset, len)).await {
                    Ok(d) => (Response::Data { len: d.len() as u64 }, Bytes::from(d)),
                    Err(e) => (io_reply(&format!("read of handle {handle}"), e), Bytes::new()),
                };
            }
            Request::Truncate { handle, len } => match iod.logged(Entry::Truncate { handle, len }).await {
                Ok(()) => Response::Ok,
                Err(e) => io_reply(&format!("truncate of handle {handle}"), e),
            },
            Request::Remove { handle } => match iod.logged(Entry::Remove { handle }).await {
                Ok(()) => Response::Ok,
                Err(e) => io_reply(&format!("remove of handle {handle}"), e),
            },
            Request::Shutdown => {
                let _ = self.1.send(true);
                Response::Ok
            }
            Request::Stats => Response::Stats(ServerStats {
                role: "iod".into(),
                log_bytes: iod.log.bytes().await,
                writes_down: iod.writes.load(Ordering::Relaxed),
                read_misses: iod.reads.load(Ordering::Relaxed),
                ..ServerStats::default()
            }),
            other => Response::error(ErrorCode::BadRequest, format!("a data server does not serve {other:?}")),
        };
        (resp, Bytes::new())
    }
}

/// Opens the stores (replaying the log) and binds. Await `served` to run.
pub async fn start(cfg: IodConfig) -> io::Result<crate::Running> {
    std::fs::create_dir_all(&cfg.data_dir)?;
    let store = Arc::new(BlockStore::open(&cfg.data_dir)?);
    let (mut wal, replay) = Wal::open(FileMedia::open(&cfg.data_dir.join("log"))?)?;
    if !replay.entries.is_empty() {
        tracing::info!("replaying {} logged writes into the block store", replay.entries.len());
        let mut handles = HashSet::new();
        for e in &replay.entries {
            apply(&store, e)?;
            handles.insert(e.handle());
        }
        for h in handles {
            store.sync(h)?;
        }
        store.sync_dir()?;
        wal.compact(&[])?;
    }
    let iod = Arc::new(Iod {
        store,
        log: GroupLog::start(wal),
        gate: RwLock::new(()),
        touched: Mutex::new(HashSet::new()),
        checkpoint_bytes: cfg.checkpoint_bytes,
        checkpointing: false.into(),
        reads: AtomicU64::new(0),
        writes: AtomicU64::new(0),
    });
    let listener = TcpListener::bind(cfg.listen).await?;
    let addr = listener.local_addr()?;
    let (stop, rx) = watch::channel(false);
    let stop = Arc::new(stop);
    let handler = Arc::new(IodHandler(iod.clone(), stop.clone()));
    let served = Box::pin(async move {
        serve(listener, cfg.secret, handler, rx).await;
        iod.checkpoint().await
    });
    Ok(crate::Running { addr, stop, served })
}
