//! parcache-client: the node's client library. It resolves paths through
//! the metadata server and moves file bytes to and from the data servers,
//! striped as the file's layout says, with the requests to different
//! servers in flight at once.
//!
//! File bytes pass through the node's cache, driven by `parcache-core`
//! through `parcache-driver`: each file gets the replacement, write and
//! prefetch policies the metadata server holds for it (defaults in
//! [`policies`]). [`Fs::fsync`] returns when the file's bytes are in the
//! data servers' durable logs; [`Fs::close`] does the same under
//! `close-to-open`; [`Fs::shutdown`] pushes everything, so a program that
//! calls it before exiting loses nothing.

mod cas;
mod collect;
mod data;
mod dir_hold;
mod files;
mod global;
pub mod local_part;
mod namespace;
mod nv;
mod peer;
pub mod policies;
mod read_batch;
mod server_queue;
mod tier;
mod write_batch;

pub use data::{DataPath, Placement};
pub use local_part::{LocalReadStats, MayBlock};
pub use nv::{NvConfig, NvStats};
use peer::Peer;
pub use peer::DEFAULT_RETRIES;
pub use policies::{FilePolicies, NodeCacheConfig};

use files::FileState;
pub use parcache_core::bypass::hints::{HintList, HintRule};
pub use parcache_core::bypass::segments::Hint;
pub use parcache_core::bypass::Op as HintOp;
pub use parcache_core::consistency::KernelCache;
use parcache_core::cooperative::CooperativeKind;
use parcache_core::{CacheConfig, CacheStats, PrefetchKind, StripeLayout, Time, WritePolicyKind};
use parcache_driver::{BelowError, Driver, DriverError};
pub use parcache_proto::{Attr, DirEntry, EntryPlus, ErrorCode, FileKind, SetAttr, Timestamp, NAME_MAX};
use parcache_proto::{Client, ConnError, Request, Response, Secret};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};
use thiserror::Error;

#[derive(Debug, Error, Clone)]
pub enum FsError {
    #[error("{path}: {message}")]
    Remote {
        path: String,
        code: ErrorCode,
        message: String,
    },
    #[error(transparent)]
    Conn(#[from] ConnError),
    #[error("the {server} ({addr}) is unreachable after {tries} tries: {reason}")]
    ServerDown {
        server: String,
        addr: String,
        tries: u32,
        reason: String,
    },
    #[error("{0}")]
    Protocol(String),
}

impl FsError {
    /// The POSIX errno for this error.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::Remote { code, .. } => code.errno(),
            _ => 5,
        }
    }
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            FsError::Remote { code, .. } => Some(*code),
            _ => None,
        }
    }
}

pub type Result<T> = std::result::Result<T, FsError>;

fn from_below(what: String, e: BelowError) -> FsError {
    FsError::Remote {
        path: what,
        code: ErrorCode::from_errno(e.errno),
        message: e.message,
    }
}

fn from_driver(what: String, e: DriverError) -> FsError {
    match e {
        DriverError::Below(b) => from_below(what, b),
        DriverError::Access(a) => FsError::Protocol(format!("{what}: {a}")),
    }
}

/// The node cache's pool for one combination of policies.
type Pool = Driver<Arc<tier::NodeBelow>>;
use parcache_core::PoolKey;

/// A connection to a parcache cluster, with the node's cache.
pub struct Fs {
    mds: Arc<Peer>,
    data: Arc<DataPath>,
    cache: NodeCacheConfig,
    pools: Mutex<HashMap<PoolKey, Arc<Pool>>>,
    files: Mutex<HashMap<u64, FileState>>,
    /// Files of `files` open here (`opens > 0`), changed under its lock.
    open_files: std::sync::atomic::AtomicUsize,
    /// This node's name at the metadata server (`sprite` opens).
    node: u64,
    me: Weak<Fs>,
    /// Whether the task answering the metadata server's callbacks runs.
    answering: AtomicBool,
    /// Removals of small files' data still under way ([`REMOVING`]
    /// permits, one each).
    removing: Arc<tokio::sync::Semaphore>,
    /// A mount's kernel under leases: what forgets a file's attributes
    /// and names there ([`Fs::lease_kernel_cache`]).
    kernel: std::sync::OnceLock<KernelForget>,
    /// The path (or, through a mount, the name) each file was reached by,
    /// so errors name files rather than handles.
    names: Mutex<HashMap<u64, String>>,
    /// The counts of changes sent to the metadata server before and after
    /// this node's last change of each directory's names, while no sync is
    /// known to cover it ([`Fs::fsync_dir`]).
    dirs_changed: Mutex<HashMap<u64, (u64, u64)>>,
    /// The start of this node's clock (the plug-ins' `now`).
    epoch: std::time::Instant,
    /// H-cache and D-cache of content-addressed files.
    cas: cas::Cas,
    /// The cooperative tier as this node sees it, and its counters.
    tier: tier::Tier,
    /// Discretionary caching: hints, and this node's share of the global
    /// cache.
    global: global::Global,
    /// The node's durable write cache (`nv=on` files), if it has one.
    nv: Option<nv::Nv>,
    /// Small files' content as the metadata server gave it with their
    /// attributes (`SMALL_COPY_MAX`), with the version it is current at,
    /// kept for the open that follows a lookup ([`Fs::keep_small`]).
    small: Mutex<HashMap<u64, (u64, Vec<u8>)>>,
    /// Directories this node holds alone, and its unlinks answered before
    /// the metadata server had them ([`Fs::unlink_behind`]).
    holds: dir_hold::DirHolds,
    secret: Secret,
}

/// Files of at most this many bytes have their data removed after the
/// unlink that removed their last name returns (mdtest-like removals of
/// small files: one round trip, not two).
const REMOVE_LATER_MAX: u64 = 1 << 20;
/// Removals of small files' data under way at once, at most.
const REMOVING: usize = 256;

/// What makes a mount's kernel forget what it keeps of a file (`Some`:
/// its handle) or of every file (`None`). Called on a blocking thread.
pub type KernelForget = Arc<dyn Fn(Option<u64>) + Send + Sync>;

/// A node id no other node is likely to have: random, with the process id.
fn node_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish()
}

fn placement_of(a: &Attr) -> Result<Placement> {
    let l = a
        .layout
        .as_ref()
        .ok_or_else(|| FsError::Protocol(format!("handle {} has no layout", a.handle)))?;
    Ok(Placement {
        layout: StripeLayout::new(l.stripe_unit, l.servers.len() as u32),
        servers: l.servers.clone(),
    })
}

impl Fs {
    /// Connects to the metadata server, then to every data server it names,
    /// with the default node cache.
    pub async fn connect(mds_addr: &str, secret: &Secret) -> Result<Arc<Fs>> {
        Fs::connect_with(mds_addr, secret, NodeCacheConfig::default()).await
    }

    pub async fn connect_with(mds_addr: &str, secret: &Secret, cache: NodeCacheConfig) -> Result<Arc<Fs>> {
        let mds = Client::connect(mds_addr, secret).await?;
        let addrs = match mds.call(&Request::Servers, &[]).await?.0 {
            Response::Servers(a) => a,
            Response::Error(e) => return Err(FsError::Protocol(format!("{mds_addr}: {}", e.message))),
            other => return Err(FsError::Protocol(format!("unexpected reply to Servers: {other:?}"))),
        };
        let incarnation = match mds.call(&Request::Incarnation, &[]).await?.0 {
            Response::Incarnation { now, .. } => now,
            _ => 0,
        };
        let global_blocks = (cache.global_bytes / cache.block_size.max(1) as u64) as usize;
        let (nv, undelivered) = match &cache.nv {
            Some(cfg) => {
                let (nv, left) = nv::Nv::open(cfg, cache.block_size)
                    .map_err(|e| FsError::Protocol(format!("durable write cache {}: {e}", cfg.dir.display())))?;
                (Some(nv), left)
            }
            None => (None, Vec::new()),
        };
        let fs = Arc::new_cyclic(|me| Fs {
            mds: Arc::new({
                let p = Peer::connected("metadata server".into(), mds, secret.clone());
                p.exactly_once();
                p.knows_incarnation(incarnation);
                p
            }),
            data: DataPath::new(addrs, secret.clone(), cache.block_size, cache.local_reads),
            cache,
            pools: Mutex::new(HashMap::new()),
            files: Mutex::new(HashMap::new()),
            open_files: std::sync::atomic::AtomicUsize::new(0),
            small: Mutex::new(HashMap::new()),
            holds: dir_hold::DirHolds::default(),
            node: node_id(),
            me: me.clone(),
            answering: AtomicBool::new(false),
            kernel: std::sync::OnceLock::new(),
            removing: Arc::new(tokio::sync::Semaphore::new(REMOVING)),
            names: Mutex::new(HashMap::new()),
            dirs_changed: Mutex::new(HashMap::new()),
            epoch: std::time::Instant::now(),
            cas: cas::Cas::default(),
            tier: tier::Tier::default(),
            global: global::Global::new(global_blocks),
            nv,
            secret: secret.clone(),
        });
        // While this node has changes no sync covered, a sync every few
        // seconds: what a crash of the metadata server may have lost of
        // them is then the last seconds' (`Peer::note_loss`), not every
        // change since the node's last `fsync` (a directory changed an
        // hour before a crash would fail its next `fsync` with `EIO`).
        let me = Arc::downgrade(&fs);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SYNC_CHANGES_EVERY).await;
                let Some(fs) = me.upgrade() else { return };
                if fs.mds.sync_due().is_some() {
                    if let Err(e) = fs.sync_metadata().await {
                        tracing::debug!("a sync of this node's changes: {e}");
                    }
                }
            }
        });
        // A restarted metadata server is told what `sprite` kept in its
        // predecessor's memory, and asked whether it lost anything.
        let me = Arc::downgrade(&fs);
        fs.mds.on_found(Arc::new(move || {
            if let Some(fs) = me.upgrade() {
                tokio::spawn(async move { fs.reclaim().await });
            }
        }));
        // A file living on the metadata server is written out there before
        // this node touches its parts at the data servers.
        let (me, me2) = (Arc::downgrade(&fs), Arc::downgrade(&fs));
        let closed = || FsError::Protocol("the client was closed".into());
        fs.data.set_write_out(
            Arc::new(move |handle| {
                let me = me.clone();
                Box::pin(async move {
                    let fs = me.upgrade().ok_or_else(closed)?;
                    let what = fs.what(handle);
                    fs.md(&what, Request::Materialize { handle }).await.map(|_| ())
                })
            }),
            Arc::new(move |handle| {
                let me = me2.clone();
                Box::pin(async move {
                    let fs = me.upgrade().ok_or_else(closed)?;
                    let what = fs.what(handle);
                    match fs.md(&what, Request::GetAttrPolicy { handle }).await? {
                        Response::AttrPolicies { content, .. } => Ok(content.map(bytes::Bytes::from)),
                        other => Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
                    }
                })
            }),
        );
        // What a previous run acknowledged from the log reaches the data
        // servers before this node serves anything.
        fs.deliver(undelivered).await?;
        Ok(fs)
    }

    /// The time for the consistency plug-ins (monotonic, from the connect).
    fn now(&self) -> Time {
        Time(self.epoch.elapsed().as_nanos() as u64)
    }

    /// What errors call a file: the path or name it was reached by, else its handle.
    fn what(&self, handle: u64) -> String {
        match self.names.lock().get(&handle) {
            Some(n) => n.clone(),
            None => format!("handle {handle}"),
        }
    }

    fn name(&self, a: &Attr, name: &str) {
        if a.kind == FileKind::File {
            let mut names = self.names.lock();
            if names.len() > 100_000 {
                names.clear();
            }
            names.insert(a.handle, name.to_string());
        }
    }

    /// Tells when a thread may make a local read (a block read from a
    /// data server's part file on this machine, [`local_part`]) itself
    /// rather than send the fetch to the data server: a mount says, when
    /// another of its threads reading requests is free, or no request
    /// waits. At most `at_once` local reads run at a time (a mount: its
    /// reading threads). Once; unset, always, one at a time.
    pub fn set_local_may_block(&self, f: MayBlock, at_once: usize) {
        self.data.set_local_may_block(f, at_once);
    }

    /// Lets the node's kernel keep files' attributes and names under leases
    /// (`parcache_core::consistency::leases`; a mount calls it once): from
    /// now on every request to the metadata server is made for this node,
    /// which answers its callbacks by calling `forget` with the file's
    /// handle, and calls `forget(None)` when the connection to the server
    /// is lost (a restarted server knows of no lease).
    pub fn lease_kernel_cache(&self, forget: KernelForget) {
        if self.kernel.set(forget.clone()).is_err() {
            return;
        }
        let me = self.me.clone();
        self.mds.on_lost(Arc::new(move || {
            if let Some(fs) = me.upgrade() {
                fs.holds_lost();
            }
            forget(None)
        }));
        self.mds.speak_for(self.node);
        self.answer_callbacks();
    }

    /// Whether answers from the metadata server come with leases now
    /// ([`Fs::lease_kernel_cache`]).
    pub fn leasing(&self) -> bool {
        self.kernel.get().is_some()
    }

    /// How many times to try a data server before giving up (at least 1).
    pub fn set_retries(&self, n: u32) {
        self.data.set_retries(n);
    }

    /// The cluster's id, from the metadata server: two clusters' files
    /// may have the same handle, and only this tells them apart.
    pub async fn cluster(&self) -> Result<String> {
        match self.md("/", Request::Cluster).await? {
            Response::Cluster(id) => Ok(id),
            other => Err(FsError::Protocol(format!("unexpected reply to Cluster: {other:?}"))),
        }
    }

    /// Number of data servers.
    pub fn servers(&self) -> usize {
        self.data.servers()
    }

    async fn md(&self, path: &str, req: Request) -> Result<Response> {
        self.md_with(path, req, &[]).await
    }

    /// [`Fs::md`] with a payload.
    /// Sent once this node's unlinks answered before the metadata server
    /// had them are done there, so that its answer shows them.
    async fn md_with(&self, path: &str, req: Request, data: &[u8]) -> Result<Response> {
        self.settled().await;
        let before = self.mds.change_count();
        let got = self.mds.call(&req, data).await;
        self.holds.note(&req, got.as_ref().ok().map(|r| &r.0));
        self.names_changed(&req, before);
        if let Ok((resp, _)) = &got {
            let file = match resp {
                Response::Error(_) => None,
                // Made by this request, not found there.
                Response::Created {
                    attr, parent: Some(_), ..
                } => Some(attr.handle),
                _ => req.file_changed(),
            };
            if let Some(h) = file {
                self.changed_here(h, before);
            }
        }
        match got?.0 {
            Response::Error(e) => Err(FsError::Remote {
                path: path.to_string(),
                code: e.code,
                message: e.message,
            }),
            r => Ok(r),
        }
    }

    async fn md_attr(&self, path: &str, req: Request) -> Result<Attr> {
        self.md_attr_with(path, req, &[]).await
    }

    /// [`Fs::md_attr`] with a payload.
    async fn md_attr_with(&self, path: &str, req: Request, data: &[u8]) -> Result<Attr> {
        match self.md_with(path, req, data).await? {
            Response::Attr(a) => Ok(a),
            other => Err(FsError::Protocol(format!("{path}: unexpected reply {other:?}"))),
        }
    }

    fn pool(&self, p: &FilePolicies) -> Result<Arc<Pool>> {
        let mut pools = self.pools.lock();
        if let Some(pool) = pools.get(&p.pool_key()) {
            return Ok(pool.clone());
        }
        let bs = self.cache.block_size;
        // `nv=on`: the pool is the node's NV cache, of its size; a node
        // without one writes such files through (Biswas et al. 1993 §6.7:
        // with all NV at the server, clients write through).
        // Its blocks are durable already, so no syncer pushes them after
        // 30 s: the write policy alone decides, as in the paper's NV cache.
        let syncer = Some(self.cache.syncer);
        let (bytes, write, aux_buffers, syncer) = match (p.nv, &self.nv) {
            (true, Some(nv)) => (nv.bytes, p.write, 0, None),
            (true, None) => (
                self.cache.pool_bytes,
                WritePolicyKind::WriteThrough,
                self.cache.aux_buffers,
                syncer,
            ),
            (false, _) => (self.cache.pool_bytes, p.write, self.cache.aux_buffers, syncer),
        };
        let cfg = CacheConfig {
            buffers: (bytes / bs as u64).max(2) as usize,
            block_size: bs,
            replacement: p.replacement,
            write,
            // Under lru-interleaved the reader prefetches from the homes;
            // a home prefetching the next block would keep a replica.
            prefetch: match p.cooperative {
                CooperativeKind::LruInterleaved if self.interleaved(p.cooperative) => PrefetchKind::None,
                _ => p.prefetch,
            },
            aux_buffers,
            syncer,
            fill_partial_writes: false,
        };
        let pool = Arc::new(
            Driver::new(
                cfg,
                self.cache.lanes,
                Arc::new(tier::NodeBelow {
                    data: self.data.clone(),
                    fs: self.me.clone(),
                    kind: p.cooperative,
                    nv: p.nv,
                }),
            )
            .map_err(|e| FsError::Protocol(format!("node cache for {p:?}: {e}")))?,
        );
        pools.insert(p.pool_key(), pool.clone());
        Ok(pool)
    }

    /// Takes the memory of the node cache's pool for the root directory's
    /// policies (the pool most files use) ahead, on a thread of its own,
    /// as a data server takes its cache's at start
    /// ([`parcache_driver::take_ahead`]): filling the pool later costs
    /// no page fault (a mount's fresh pool had cost each random cold read
    /// 6–20 %; issue 14, the thirty-first session in `bench/README.md`).
    /// For a node that lives long (a mount); a short copy would pay for
    /// memory it does not use. The thread ends with the bytes it took.
    pub async fn take_cache_memory_ahead(&self) -> Result<std::thread::JoinHandle<u64>> {
        let settings = self.get_policy("/").await?;
        let pool = Arc::downgrade(&self.pool(&FilePolicies::from_settings(&settings))?);
        std::thread::Builder::new()
            .name("cache-memory".into())
            .spawn(move || {
                parcache_driver::take_ahead::take_ahead("node cache", |most| {
                    pool.upgrade().map(|p| p.take_memory(most))
                })
            })
            .map_err(|e| FsError::Protocol(format!("node cache: no thread to take its memory ahead: {e}")))
    }

    /// Makes everything the servers acknowledged durable: every data
    /// server syncs its write log, then the metadata server commits.
    pub async fn sync_all(&self) -> Result<()> {
        let all: Vec<u32> = (0..self.data.servers() as u32).collect();
        // Every server: other nodes may have written this node's blocks
        // down (a cooperative tier's homes), which its counts miss.
        self.data.sync_on(&all, "sync", true).await?;
        self.sync_metadata().await
    }

    /// Makes every namespace change so far durable at the metadata server:
    /// a durable commit there, unless this node changed nothing since its
    /// last one ([`crate::peer::Peer::sync_due`]).
    pub async fn sync_metadata(&self) -> Result<()> {
        // Its unlinks answered before the server had them count.
        self.settled().await;
        let Some(due) = self.mds.sync_due() else {
            return Ok(());
        };
        self.md("sync", Request::Sync).await?;
        self.mds.synced(due);
        // Directories whose changes this sync covered, and no lost
        // connection may have lost, need no check at their `fsync`.
        if let Some(covered) = due.covered() {
            self.dirs_changed
                .lock()
                .retain(|_, &mut w| w.1 > covered || self.mds.may_have_lost(w));
        }
        Ok(())
    }

    /// Whether the changes counted in `window` are sure: no lost
    /// connection may have lost them, or the metadata server said at the
    /// reconnection that it lost nothing ([`crate::peer::Peer`] asks its
    /// incarnation at each connection: the same one, the network dropped
    /// and the server stayed; the one after a graceful stop of it, whose
    /// last commit covered every change it had answered). After a crash,
    /// they stay unsure. (Without this, a graceful restart of the server
    /// had every node's next directory `fsync` fail.)
    pub(crate) fn settle_losses(&self, window: (u64, u64)) -> bool {
        !self.mds.may_have_lost(window)
    }

    /// Notes that `req`, sent when the count of changes was `before`,
    /// changed names in directories ([`Request::dirs_changed`]).
    fn names_changed(&self, req: &Request, before: u64) {
        let dirs = req.dirs_changed();
        if dirs[0].is_none() {
            return;
        }
        let after = self.mds.change_count();
        let mut changed = self.dirs_changed.lock();
        let mut added = false;
        for d in dirs.into_iter().flatten() {
            added |= changed.insert(d, (before, after)).is_none();
        }
        // Many directories changed and none synced (an untar of a big
        // tree): a sync in the background lets their notes go (once per
        // so many new ones: a change of a directory noted already would
        // start another at every change while the count sat there).
        if added && changed.len() >= DIRS_NOTED && changed.len().is_multiple_of(DIRS_NOTED) {
            if let Some(fs) = self.me.upgrade() {
                tokio::spawn(async move {
                    if let Err(e) = fs.sync_metadata().await {
                        tracing::debug!("a sync to let directories' notes go: {e}");
                    }
                });
            }
        }
    }

    /// An `fsync` of a directory: its changes, and every other change this
    /// node made, durable at the metadata server. If a lost connection
    /// may have lost this node's last change of the directory's names (a
    /// crash of the server within the second after it: a rename, say,
    /// whose program then syncs the directory), `EIO`: the server cannot
    /// tell whether it has it, and success would promise it.
    pub async fn fsync_dir(&self, dir: u64) -> Result<()> {
        self.sync_metadata().await?;
        let window = self.dirs_changed.lock().get(&dir).copied();
        if let Some(w) = window {
            if !self.settle_losses(w) {
                self.dirs_changed.lock().remove(&dir);
                return Err(FsError::Remote {
                    path: self.what(dir),
                    code: ErrorCode::Io,
                    message: "a change of its names made just before the connection to the metadata server was lost (a crash of the server?) may be lost".into(),
                });
            }
        }
        Ok(())
    }

    /// Each pool of the node cache: its policies and counters.
    pub fn cache_stats(&self) -> Vec<(String, CacheStats)> {
        let pools = self.pools.lock();
        let mut v: Vec<_> = pools
            .iter()
            .map(|((r, _, p, c, nv), pool)| {
                let w = pool.config().write;
                let name = match c {
                    CooperativeKind::None => format!("{r} {w} {p}"),
                    c => format!("{r} {w} {p} {c}"),
                };
                (if *nv { format!("{name} nv") } else { name }, pool.stats())
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

/// How often a node with changes no sync covered sends one (the
/// metadata server's own syncer commits every second; this bounds what a
/// node must take as unsure after a crash).
const SYNC_CHANGES_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Directories with changes noted for their `fsync` ([`Fs::fsync_dir`]) at
/// which (and at each multiple of it) a sync is sent to let the notes go.
const DIRS_NOTED: usize = 4096;

/// What `statfs` reports for the whole cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsStats {
    /// Sum of the data servers' file systems.
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    /// Files and directories in the namespace.
    pub files: u64,
}

impl Fs {
    /// Capacity and free space summed over the data servers' distinct disks, and the number of files the metadata server holds.
    pub async fn statfs(&self) -> Result<FsStats> {
        let files = match self.md("statfs", Request::StatFs).await? {
            Response::StatFs { files, .. } => files,
            other => return Err(FsError::Protocol(format!("statfs: unexpected reply {other:?}"))),
        };
        let mut out = FsStats {
            capacity_bytes: 0,
            free_bytes: 0,
            files,
        };
        let mut disks = std::collections::HashSet::new();
        for i in 0..self.data.servers() as u32 {
            match self.data.call(i, &Request::Stats, &[]).await? {
                (Response::Stats(s), _) => {
                    // Data servers sharing a disk (one host) count it once.
                    if disks.insert(s.fs_id) {
                        out.capacity_bytes += s.capacity_bytes;
                        out.free_bytes += s.free_bytes;
                    }
                }
                (other, _) => return Err(FsError::Protocol(format!("stats of data server {i}: {other:?}"))),
            }
        }
        Ok(out)
    }
}
