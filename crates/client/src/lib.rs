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

mod data;
mod peer;
pub mod policies;

pub use data::{DataPath, Placement};
use peer::Peer;
pub use peer::DEFAULT_RETRIES;
pub use policies::{FilePolicies, NodeCacheConfig};

use parcache_core::consistency::close_to_open::{self, CloseAction, OpenAction};
use parcache_core::{CacheConfig, CacheStats, PrefetchKind, ReplacementKind, StripeLayout, WritePolicyKind};
use parcache_driver::{BelowError, Driver, DriverError};
use parcache_proto::{
    show_name, Attr, Callback, Client, ConnError, DirEntry, ErrorCode, FileKind, Request, Response, Secret, SetAttr,
    ROOT,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use thiserror::Error;

#[derive(Debug, Error)]
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
type Pool = Driver<Arc<DataPath>>;
type PoolKey = (ReplacementKind, WritePolicyKind, PrefetchKind);

/// What this node knows of a file it has touched.
#[derive(Clone)]
struct FileState {
    policies: FilePolicies,
    pool: Arc<Pool>,
    /// The size as this node knows it (its own writes included).
    size: u64,
    /// Writes this node made to the file, counted.
    writes: u64,
    /// How many of those writes the metadata server has acknowledged a size
    /// report for. Until it has, the local size stands in for its size (a
    /// report in flight must not let a `stat` see the old size).
    reported: u64,
    /// The file's size as the metadata server last told it: what a failed
    /// write-back falls back to, so no size is ever reported beyond the
    /// bytes the data servers acknowledged.
    known_size: u64,
    /// The file's version when this node last validated its cached blocks.
    version: u64,
    /// Orders this node's requests on the file: reads, writes and size
    /// reports share it; a truncate or a revalidation holds it alone, so a
    /// size report taken before a truncate cannot reach the metadata server
    /// after it, and a read begun before a truncate cannot put the old bytes
    /// back in the cache.
    gate: Arc<tokio::sync::RwLock<()>>,
    /// Whether this node caches the file (`sprite` turns it off while the
    /// file is write-shared; its reads and writes then go to the data
    /// servers).
    cached: bool,
    /// Open descriptions of the file on this node.
    opens: u32,
    /// Unlinked (its last name) while open here: the metadata server keeps
    /// it until the last open here ends.
    orphan: bool,
}

impl FileState {
    /// Written since the size was last reported to the metadata server.
    fn unreported(&self) -> bool {
        self.writes > self.reported
    }
}

/// A connection to a parcache cluster, with the node's cache.
pub struct Fs {
    mds: Arc<Peer>,
    data: Arc<DataPath>,
    cache: NodeCacheConfig,
    pools: Mutex<HashMap<PoolKey, Arc<Pool>>>,
    files: Mutex<HashMap<u64, FileState>>,
    /// This node's name at the metadata server (`sprite` opens).
    node: u64,
    me: Weak<Fs>,
    /// Whether the task answering the metadata server's callbacks runs.
    answering: AtomicBool,
    /// The path (or, through a mount, the name) each file was reached by,
    /// so errors name files rather than handles.
    names: Mutex<HashMap<u64, String>>,
}

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
        Ok(Arc::new_cyclic(|me| Fs {
            mds: Arc::new(Peer::connected("metadata server".into(), mds, secret.clone())),
            data: Arc::new(DataPath::new(addrs, secret.clone(), cache.block_size)),
            cache,
            pools: Mutex::new(HashMap::new()),
            files: Mutex::new(HashMap::new()),
            node: node_id(),
            me: me.clone(),
            answering: AtomicBool::new(false),
            names: Mutex::new(HashMap::new()),
        }))
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

    /// How many times to try a data server before giving up (at least 1).
    pub fn set_retries(&self, n: u32) {
        self.data.set_retries(n);
    }

    /// Number of data servers.
    pub fn servers(&self) -> usize {
        self.data.servers()
    }

    async fn md(&self, path: &str, req: Request) -> Result<Response> {
        match self.mds.call(&req, &[]).await?.0 {
            Response::Error(e) => Err(FsError::Remote {
                path: path.to_string(),
                code: e.code,
                message: e.message,
            }),
            r => Ok(r),
        }
    }

    async fn md_attr(&self, path: &str, req: Request) -> Result<Attr> {
        match self.md(path, req).await? {
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
        let cfg = CacheConfig {
            buffers: (self.cache.pool_bytes / bs as u64).max(2) as usize,
            block_size: bs,
            replacement: p.replacement,
            write: p.write,
            prefetch: p.prefetch,
            aux_buffers: 0,
            syncer: Some(self.cache.syncer),
            fill_partial_writes: false,
        };
        let pool = Arc::new(
            Driver::new(cfg, self.cache.lanes, self.data.clone())
                .map_err(|e| FsError::Protocol(format!("node cache for {p:?}: {e}")))?,
        );
        pools.insert(p.pool_key(), pool.clone());
        Ok(pool)
    }

    /// This node's state of the file, learning its policies on first use.
    async fn state(&self, a: &Attr) -> Result<FileState> {
        if let Some(st) = self.files.lock().get(&a.handle) {
            return Ok(st.clone());
        }
        let what = self.what(a.handle);
        let settings = match self.md(&what, Request::GetPolicy { handle: a.handle }).await? {
            Response::Policies(p) => p,
            other => return Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
        };
        self.learn(a, &settings)
    }

    /// Starts this node's state of a file from its policy settings (kept
    /// if another task got there first).
    fn learn(&self, a: &Attr, settings: &[(String, String)]) -> Result<FileState> {
        let policies = FilePolicies::from_settings(settings);
        let pool = self.pool(&policies)?;
        self.data.place(a.handle, placement_of(a)?, a.size);
        let st = FileState {
            policies,
            pool,
            size: a.size,
            known_size: a.size,
            writes: 0,
            reported: 0,
            version: a.version,
            gate: Arc::new(tokio::sync::RwLock::new(())),
            cached: true,
            opens: 0,
            orphan: false,
        };
        Ok(self.files.lock().entry(a.handle).or_insert(st).clone())
    }

    fn update(&self, handle: u64, f: impl FnOnce(&mut FileState)) {
        if let Some(st) = self.files.lock().get_mut(&handle) {
            f(st);
        }
    }

    /// The policies the node cache applies to a file.
    pub async fn policies_of(&self, a: &Attr) -> Result<FilePolicies> {
        Ok(self.state(a).await?.policies)
    }

    /// A program opened the file (for writing if `write`); returns the
    /// attributes to use while it is open. Under `sprite` the open goes to
    /// the metadata server first, which calls other nodes back (recalls the
    /// last writer's dirty blocks, disables caching of a write-shared file)
    /// and says whether this node may cache the file. Under `close-to-open`
    /// and `sprite`, cached blocks of a file whose version moved since this
    /// node validated them are dropped (another node changed it). The
    /// prefetch policy starts here.
    pub async fn open(&self, a: &Attr, write: bool) -> Result<Attr> {
        let st = self.state(a).await?;
        let mut a = a.clone();
        let mut cacheable = true;
        if st.policies.consistency.opens_at_server() {
            self.answer_callbacks();
            let what = self.what(a.handle);
            match self
                .md(
                    &what,
                    Request::Open {
                        handle: a.handle,
                        node: self.node,
                        write,
                    },
                )
                .await?
            {
                Response::Opened { attr, cacheable: c } => {
                    a = attr;
                    cacheable = c;
                }
                other => return Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
            }
        }
        let _alone = st.gate.write().await;
        let st = self.state(&a).await?;
        if !cacheable && st.cached {
            self.uncache(&st, a.handle).await?;
        }
        if close_to_open::at_open(st.policies.consistency, st.version, a.version) == OpenAction::Drop {
            // Another node changed the file: this node's own writes go
            // first (pushed and reported), then every cached block.
            self.write_back(&st.pool, a.handle).await?;
            if let Some(after) = self.report_attr(a.handle).await? {
                a = after;
            }
            st.pool.discard_file(a.handle, 0).await;
            self.update(a.handle, |s| {
                s.version = a.version;
                s.size = a.size;
                s.known_size = a.size;
            });
            self.data.set_size(a.handle, a.size, true);
        }
        self.update(a.handle, |s| {
            s.opens += 1;
            s.cached = cacheable;
            if !cacheable {
                s.size = s.size.max(a.size);
            }
        });
        if cacheable {
            st.pool.open(a.handle, st.size.max(a.size));
        }
        Ok(a)
    }

    /// A program closed the file it opened with `write`: [`Fs::flush`]
    /// then [`Fs::release`].
    pub async fn close(&self, a: &Attr, write: bool) -> Result<()> {
        self.flush(a).await?;
        self.release(a, write).await
    }

    /// A descriptor of the file was closed (`close(2)`; a mount sees one for
    /// every descriptor, duplicates too): under `close-to-open` the file's
    /// dirty blocks go down and its size reaches the metadata server.
    pub async fn flush(&self, a: &Attr) -> Result<()> {
        let st = self.state(a).await?;
        if close_to_open::at_close(st.policies.consistency) == CloseAction::Push {
            self.push(a).await?;
        }
        Ok(())
    }

    /// An open description of the file (opened with `write`) went away:
    /// under `sprite` the metadata server is told (dirty blocks stay: the
    /// next opener elsewhere recalls them); the last one on this node stops
    /// the file's prefetching.
    pub async fn release(&self, a: &Attr, write: bool) -> Result<()> {
        let st = self.state(a).await?;
        let (mut last, mut orphan) = (false, false);
        self.update(a.handle, |s| {
            s.opens = s.opens.saturating_sub(1);
            last = s.opens == 0;
            orphan = last && s.orphan;
        });
        if last {
            st.pool.close(a.handle);
        }
        if st.policies.consistency.opens_at_server() {
            if !st.cached {
                // Written straight to the data servers: the size goes now.
                self.report(a.handle).await?;
            }
            self.md(
                &self.what(a.handle),
                Request::Close {
                    handle: a.handle,
                    node: self.node,
                    write,
                },
            )
            .await?;
        }
        if orphan {
            // Its last open here ended: the unlinked file goes now.
            let req = Request::Forget { handle: a.handle };
            if let Response::Attr(gone) = self.md(&self.what(a.handle), req).await? {
                self.remove_data(&gone).await?;
            }
        }
        Ok(())
    }

    /// Stops caching the file on this node: its dirty blocks go down, its
    /// size is reported and its cached blocks are dropped. The caller holds
    /// the file's gate alone.
    async fn uncache(&self, st: &FileState, handle: u64) -> Result<()> {
        self.write_back(&st.pool, handle).await?;
        st.pool.discard_file(handle, 0).await;
        self.update(handle, |s| s.cached = false);
        self.report(handle).await
    }

    /// Starts the task that answers the metadata server's `sprite`
    /// callbacks, once: it keeps one poll outstanding and does each
    /// callback it gets, then acknowledges it.
    fn answer_callbacks(&self) {
        if self.answering.swap(true, Ordering::SeqCst) {
            return;
        }
        let me = self.me.clone();
        let (mds, node) = (self.mds.clone(), self.node);
        tokio::spawn(async move {
            loop {
                if me.strong_count() == 0 {
                    return;
                }
                let got = match mds.call(&Request::Callbacks { node }, &[]).await {
                    Ok((Response::Callbacks(c), _)) => c,
                    Ok(_) => vec![],
                    Err(_) => {
                        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                        continue;
                    }
                };
                for (id, handle, cb) in got {
                    let Some(fs) = me.upgrade() else { return };
                    tokio::spawn(async move {
                        if let Err(e) = fs.called_back(handle, cb).await {
                            tracing::warn!("callback {cb:?} for handle {handle}: {e}");
                        }
                        let _ = fs.mds.call(&Request::CalledBack { node: fs.node, id }, &[]).await;
                    });
                }
            }
        });
    }

    /// Does what the metadata server asked of this node for a file.
    async fn called_back(&self, handle: u64, cb: Callback) -> Result<()> {
        let Some(st) = self.files.lock().get(&handle).cloned() else {
            return Ok(()); // never touched here: nothing cached
        };
        let _alone = st.gate.write().await;
        match cb {
            Callback::Recall => {
                self.write_back(&st.pool, handle).await?;
                self.report(handle).await
            }
            Callback::Disable => self.uncache(&st, handle).await,
        }
    }

    /// Returns when every byte written to the file is in the data servers'
    /// durable logs and its size and times are at the metadata server.
    pub async fn fsync(&self, a: &Attr) -> Result<()> {
        self.push(a).await?;
        let st = self.state(a).await?;
        let _shared = st.gate.read().await;
        self.data.sync(a.handle).await?;
        self.md(&self.what(a.handle), Request::Sync).await?;
        Ok(())
    }

    /// Returns when every byte written to the file is at the data servers
    /// (visible to every node, not yet durable) and its size at the
    /// metadata server: what close-to-open needs.
    async fn push(&self, a: &Attr) -> Result<()> {
        let st = self.state(a).await?;
        let _shared = st.gate.read().await;
        self.write_back(&st.pool, a.handle).await?;
        self.report(a.handle).await
    }

    /// Writes the file's dirty blocks down. If any failed (a data server
    /// died with them), the node forgets what it held of the file and its
    /// size falls back to the one the metadata server has: no size is
    /// reported beyond the bytes the data servers acknowledged, and no
    /// read here returns bytes they do not have. The failure is returned
    /// (to the `close` or `fsync` that asked).
    async fn write_back(&self, pool: &Pool, handle: u64) -> Result<()> {
        let Err(e) = pool.flush_file(handle).await else {
            return Ok(());
        };
        tracing::warn!("handle {handle}: written bytes did not reach the data servers: {e}");
        pool.discard_file(handle, 0).await;
        self.update(handle, |s| {
            s.size = s.known_size;
            s.reported = s.writes;
        });
        Err(from_below(self.what(handle), e))
    }

    /// Tells the metadata server the size this node wrote the file to.
    async fn report(&self, handle: u64) -> Result<()> {
        self.report_attr(handle).await.map(|_| ())
    }

    /// As [`Fs::report`]; the file's attributes after, if a report was due.
    async fn report_attr(&self, handle: u64) -> Result<Option<Attr>> {
        let (size, upto, old) = match self.files.lock().get(&handle) {
            Some(s) if s.unreported() => (s.size, s.writes, s.known_size),
            _ => return Ok(None),
        };
        // Every part as long as the size about to be reported says.
        self.data.extend_parts(handle, old, size).await?;
        let attr = self
            .md_attr(&self.what(handle), Request::Written { handle, size })
            .await?;
        self.update(handle, |s| {
            s.version = close_to_open::after_report(s.version, attr.version);
            s.reported = s.reported.max(upto);
            s.known_size = attr.size;
        });
        self.data.set_size(handle, attr.size, false);
        Ok(Some(attr))
    }

    /// Pushes every dirty block of every file and reports sizes; call it
    /// before the program exits (the `parcache` commands do).
    pub async fn shutdown(&self) -> Result<()> {
        let mut first = None;
        // File by file, so a file whose bytes did not all reach the data
        // servers does not have its size reported (see `write_back`).
        let files: Vec<(u64, Arc<Pool>)> = self.files.lock().iter().map(|(&h, s)| (h, s.pool.clone())).collect();
        for (h, pool) in files {
            let r = match self.write_back(&pool, h).await {
                Ok(()) => self.report(h).await,
                Err(e) => Err(e),
            };
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        }
        let pools: Vec<Arc<Pool>> = self.pools.lock().values().cloned().collect();
        for p in pools {
            if let Err(e) = p.flush_all().await {
                first.get_or_insert(from_below("node cache".into(), e));
            }
        }
        if first.is_none() {
            first = self.sync_all().await.err();
        }
        first.map_or(Ok(()), Err)
    }

    /// Makes everything the servers acknowledged durable: every data
    /// server syncs its write log, then the metadata server commits.
    pub async fn sync_all(&self) -> Result<()> {
        let all: Vec<u32> = (0..self.data.servers() as u32).collect();
        self.data.sync_servers(&all, "sync").await?;
        self.md("sync", Request::Sync).await?;
        Ok(())
    }

    /// Makes every namespace change so far durable at the metadata server.
    pub async fn sync_metadata(&self) -> Result<()> {
        self.md("sync", Request::Sync).await.map(|_| ())
    }

    /// Each pool of the node cache: its policies and counters.
    pub fn cache_stats(&self) -> Vec<(String, CacheStats)> {
        let pools = self.pools.lock();
        let mut v: Vec<_> = pools
            .iter()
            .map(|((r, w, p), pool)| (format!("{r} {w} {p}"), pool.stats()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Resolves an absolute path (symbolic links in the middle are not followed).
    pub async fn resolve(&self, path: &str) -> Result<Attr> {
        let mut cur = self.md_attr(path, Request::GetAttr { handle: ROOT }).await?;
        for name in path.split('/').filter(|c| !c.is_empty()) {
            if cur.kind != FileKind::Dir {
                return Err(FsError::Remote {
                    path: path.into(),
                    code: ErrorCode::NotDir,
                    message: format!("'{name}' is under something that is not a directory"),
                });
            }
            cur = self
                .md_attr(
                    path,
                    Request::Lookup {
                        parent: cur.handle,
                        name: name.as_bytes().to_vec(),
                    },
                )
                .await?;
        }
        self.name(&cur, path);
        Ok(cur)
    }

    /// The parent directory of `path` and the last name.
    pub async fn parent(&self, path: &str) -> Result<(Attr, String)> {
        let p = path.trim_end_matches('/');
        let (dir, name) = p.rsplit_once('/').unwrap_or(("", p));
        if name.is_empty() {
            return Err(FsError::Remote {
                path: path.into(),
                code: ErrorCode::Invalid,
                message: "the root has no parent".into(),
            });
        }
        Ok((
            self.resolve(if dir.is_empty() { "/" } else { dir }).await?,
            name.to_string(),
        ))
    }

    pub async fn getattr(&self, handle: u64) -> Result<Attr> {
        self.md_attr(&self.what(handle), Request::GetAttr { handle }).await
    }

    pub async fn create(&self, path: &str, mode: u32, exclusive: bool) -> Result<Attr> {
        let (dir, name) = self.parent(path).await?;
        let a = self.create_at(dir.handle, name.as_bytes(), mode, exclusive).await?;
        self.name(&a, path);
        Ok(a)
    }

    pub async fn mkdir(&self, path: &str, mode: u32) -> Result<Attr> {
        let (dir, name) = self.parent(path).await?;
        self.mkdir_at(dir.handle, name.as_bytes(), mode).await
    }

    pub async fn readdir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let d = self.resolve(path).await?;
        self.readdir_handle(d.handle).await
    }

    /// Removes a file; its data goes from the data servers when its last link does.
    pub async fn unlink(&self, path: &str) -> Result<()> {
        let (dir, name) = self.parent(path).await?;
        self.unlink_at(dir.handle, name.as_bytes()).await
    }

    pub async fn rmdir(&self, path: &str) -> Result<()> {
        let (dir, name) = self.parent(path).await?;
        self.rmdir_at(dir.handle, name.as_bytes()).await
    }

    /// Renames, replacing an existing target (whose data goes if it was the last link).
    pub async fn rename(&self, from: &str, to: &str) -> Result<()> {
        let (d1, n1) = self.parent(from).await?;
        let (d2, n2) = self.parent(to).await?;
        self.rename_at(d1.handle, n1.as_bytes(), d2.handle, n2.as_bytes()).await
    }

    // Handle-based calls, as a mount sees the namespace: (directory, name).
    // Names are bytes (any but `/` and NUL), as the kernel gives them.

    /// The entry `name` of directory `parent`.
    pub async fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        let req = Request::Lookup {
            parent,
            name: name.to_vec(),
        };
        let shown = show_name(name);
        let a = self.md_attr(&shown, req).await?;
        self.name(&a, &shown);
        Ok(a)
    }

    pub async fn create_at(&self, parent: u64, name: &[u8], mode: u32, exclusive: bool) -> Result<Attr> {
        let req = Request::Create {
            parent,
            name: name.to_vec(),
            mode,
            exclusive,
        };
        let shown = show_name(name);
        match self.md(&shown, req).await? {
            Response::Created { attr, policies } => {
                self.name(&attr, &shown);
                self.learn(&attr, &policies)?;
                Ok(attr)
            }
            other => Err(FsError::Protocol(format!("{shown}: unexpected reply {other:?}"))),
        }
    }

    pub async fn mkdir_at(&self, parent: u64, name: &[u8], mode: u32) -> Result<Attr> {
        let req = Request::Mkdir {
            parent,
            name: name.to_vec(),
            mode,
        };
        self.md_attr(&show_name(name), req).await
    }

    /// A special file (fifo, character or block device, socket): metadata
    /// only, never opened through the data path.
    pub async fn mknod_at(&self, parent: u64, name: &[u8], mode: u32, kind: FileKind, rdev: u32) -> Result<Attr> {
        let req = Request::Mknod {
            parent,
            name: name.to_vec(),
            mode,
            kind,
            rdev,
        };
        self.md_attr(&show_name(name), req).await
    }

    /// Every entry of a directory, fetched in pages (a directory of any
    /// size lists whole).
    pub async fn readdir_handle(&self, handle: u64) -> Result<Vec<DirEntry>> {
        let what = format!("directory {}", self.what(handle));
        let mut all: Vec<DirEntry> = Vec::new();
        loop {
            let after = all.last().map(|e| e.name.clone());
            match self.md(&what, Request::ReadDir { handle, after }).await? {
                Response::Entries { entries, more } => {
                    let progressed = !entries.is_empty();
                    all.extend(entries);
                    if !more || !progressed {
                        return Ok(all);
                    }
                }
                other => return Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
            }
        }
    }

    /// Removes a name. A file open on this node keeps its data until the
    /// last open here ends (POSIX), as an orphan at the metadata server.
    pub async fn unlink_at(&self, parent: u64, name: &[u8]) -> Result<()> {
        let any_open = self.files.lock().values().any(|s| s.opens > 0);
        let mut keep_open = false;
        if any_open {
            if let Ok(a) = self.lookup(parent, name).await {
                if let Some(s) = self.files.lock().get_mut(&a.handle) {
                    if s.opens > 0 {
                        s.orphan = true;
                        keep_open = true;
                    }
                }
            }
        }
        let req = Request::Unlink {
            parent,
            name: name.to_vec(),
            keep_open,
        };
        if let Response::Attr(gone) = self.md(&show_name(name), req).await? {
            self.remove_data(&gone).await?;
        }
        Ok(())
    }

    pub async fn rmdir_at(&self, parent: u64, name: &[u8]) -> Result<()> {
        let req = Request::Rmdir {
            parent,
            name: name.to_vec(),
        };
        self.md(&show_name(name), req).await.map(|_| ())
    }

    pub async fn rename_at(&self, parent: u64, name: &[u8], new_parent: u64, new_name: &[u8]) -> Result<()> {
        let req = Request::Rename {
            parent,
            name: name.to_vec(),
            new_parent,
            new_name: new_name.to_vec(),
        };
        if let Response::Attr(gone) = self.md(&show_name(name), req).await? {
            self.remove_data(&gone).await?;
        }
        Ok(())
    }

    pub async fn symlink_at(&self, parent: u64, name: &[u8], target: &[u8]) -> Result<Attr> {
        let req = Request::Symlink {
            parent,
            name: name.to_vec(),
            target: target.to_vec(),
        };
        self.md_attr(&show_name(name), req).await
    }

    pub async fn readlink(&self, handle: u64) -> Result<Vec<u8>> {
        let what = self.what(handle);
        match self.md(&what, Request::ReadLink { handle }).await? {
            Response::Target(t) => Ok(t),
            other => Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
        }
    }

    /// A hard link to `handle` as `new_name` in `new_parent`.
    pub async fn link_at(&self, handle: u64, new_parent: u64, new_name: &[u8]) -> Result<Attr> {
        let req = Request::Link {
            handle,
            new_parent,
            new_name: new_name.to_vec(),
        };
        self.md_attr(&show_name(new_name), req).await
    }

    /// Sets extended attribute `name` (`flags`: 1 create only, 2 replace only).
    pub async fn set_xattr(&self, handle: u64, name: &str, value: &[u8], flags: u32) -> Result<()> {
        let req = Request::SetXattr {
            handle,
            name: name.into(),
            flags,
        };
        let what = self.what(handle);
        match self.mds.call(&req, value).await?.0 {
            Response::Ok => Ok(()),
            Response::Error(e) => Err(FsError::Remote {
                path: what,
                code: e.code,
                message: e.message,
            }),
            other => Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
        }
    }

    pub async fn get_xattr(&self, handle: u64, name: &str) -> Result<Vec<u8>> {
        let what = self.what(handle);
        let req = Request::GetXattr {
            handle,
            name: name.into(),
        };
        match self.mds.call(&req, &[]).await? {
            (Response::Data { .. }, v) => Ok(v.to_vec()),
            (Response::Error(e), _) => Err(FsError::Remote {
                path: what,
                code: e.code,
                message: e.message,
            }),
            (other, _) => Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
        }
    }

    pub async fn list_xattr(&self, handle: u64) -> Result<Vec<String>> {
        let what = self.what(handle);
        match self.md(&what, Request::ListXattr { handle }).await? {
            Response::Names(n) => Ok(n),
            other => Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
        }
    }

    pub async fn remove_xattr(&self, handle: u64, name: &str) -> Result<()> {
        let req = Request::RemoveXattr {
            handle,
            name: name.into(),
        };
        self.md(&self.what(handle), req).await.map(|_| ())
    }

    /// A file's policy settings with where each came from: (key, value,
    /// inherited from its directory at create).
    pub async fn policy_origins(&self, handle: u64) -> Result<Vec<(String, String, bool)>> {
        let what = self.what(handle);
        match self.md(&what, Request::ExplainPolicy { handle }).await? {
            Response::Origins(o) => Ok(o),
            other => Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
        }
    }

    /// A file's or directory's effective policies, (key, value, origin),
    /// sorted by key: each set on it (`"set"`), copied from its directory
    /// when it was made (`"inherited"`), or the node cache's default
    /// (`"default"`).
    pub async fn effective_policies(&self, handle: u64) -> Result<Vec<(String, String, &'static str)>> {
        let mut all: Vec<(String, String, &'static str)> = self
            .policy_origins(handle)
            .await?
            .into_iter()
            .map(|(k, v, inherited)| (k, v, if inherited { "inherited" } else { "set" }))
            .collect();
        for (k, v) in FilePolicies::default().settings() {
            if !all.iter().any(|(key, _, _)| *key == k) {
                all.push((k.to_string(), v, "default"));
            }
        }
        all.sort();
        Ok(all)
    }

    /// Removes a policy setting: the file or directory falls back to the
    /// default (the node cache drops what it held under the old policy).
    pub async fn unset_policy_handle(&self, handle: u64, key: &str) -> Result<Vec<(String, String)>> {
        let what = self.what(handle);
        let req = Request::UnsetPolicy {
            handle,
            key: key.into(),
        };
        match self.md(&what, req).await? {
            Response::Policies(p) => {
                self.forget_policies(handle).await?;
                Ok(p)
            }
            other => Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
        }
    }

    /// Sets a policy of a file or directory by handle (see [`Fs::set_policy`]).
    pub async fn set_policy_handle(&self, handle: u64, key: &str, value: &str) -> Result<Vec<(String, String)>> {
        let what = self.what(handle);
        let req = Request::SetPolicy {
            handle,
            key: key.into(),
            value: value.into(),
        };
        match self.md(&what, req).await? {
            Response::Policies(p) => {
                self.forget_policies(handle).await?;
                Ok(p)
            }
            other => Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
        }
    }

    /// The node learns a file's policies again at its next use: its dirty
    /// blocks go down first and its cached ones are dropped.
    async fn forget_policies(&self, handle: u64) -> Result<()> {
        let known = self.files.lock().remove(&handle);
        if let Some(st) = known {
            st.pool
                .flush_file(handle)
                .await
                .map_err(|e| from_below(self.what(handle), e))?;
            st.pool.discard_file(handle, 0).await;
        }
        Ok(())
    }

    pub async fn get_policy_handle(&self, handle: u64) -> Result<Vec<(String, String)>> {
        let what = self.what(handle);
        match self.md(&what, Request::GetPolicy { handle }).await? {
            Response::Policies(p) => Ok(p),
            other => Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
        }
    }

    /// Changes mode, owner or times (a size goes through [`Fs::truncate`]).
    pub async fn setattr(&self, handle: u64, set: SetAttr) -> Result<Attr> {
        self.md_attr(&self.what(handle), Request::SetAttr { handle, set }).await
    }

    /// The size of a file as this node wrote it, while the metadata server
    /// does not know it yet (`None` when it does).
    pub fn local_size(&self, handle: u64) -> Option<u64> {
        self.files
            .lock()
            .get(&handle)
            .filter(|s| s.unreported())
            .map(|s| s.size)
    }

    async fn remove_data(&self, a: &Attr) -> Result<()> {
        let known = self.files.lock().remove(&a.handle);
        if let Some(st) = known {
            st.pool.discard_file(a.handle, 0).await;
        }
        if let Some(l) = &a.layout {
            self.data.remove(a.handle, &l.servers).await?;
        }
        self.data.forget(a.handle);
        Ok(())
    }

    pub async fn set_policy(&self, path: &str, key: &str, value: &str) -> Result<Vec<(String, String)>> {
        let a = self.resolve(path).await?;
        self.set_policy_handle(a.handle, key, value).await.map_err(|e| match e {
            FsError::Remote { code, message, .. } => FsError::Remote {
                path: path.to_string(),
                code,
                message,
            },
            e => e,
        })
    }

    pub async fn get_policy(&self, path: &str) -> Result<Vec<(String, String)>> {
        let a = self.resolve(path).await?;
        match self.md(path, Request::GetPolicy { handle: a.handle }).await? {
            Response::Policies(p) => Ok(p),
            other => Err(FsError::Protocol(format!("{path}: unexpected reply {other:?}"))),
        }
    }

    /// Sets a file's size: dirty blocks go down first, the node's cached
    /// blocks of the file are dropped, the data servers cut or extend their
    /// parts and the metadata server records the size.
    pub async fn truncate(&self, a: &Attr, size: u64) -> Result<Attr> {
        let what = self.what(a.handle);
        let st = self.state(a).await?;
        let _alone = st.gate.write().await;
        st.pool
            .flush_file(a.handle)
            .await
            .map_err(|e| from_below(what.clone(), e))?;
        st.pool.discard_file(a.handle, 0).await;
        self.data.truncate(a.handle, size).await?;
        let attr = self
            .md_attr(
                &what,
                Request::SetAttr {
                    handle: a.handle,
                    set: SetAttr {
                        size: Some(size),
                        ..SetAttr::default()
                    },
                },
            )
            .await?;
        self.update(a.handle, |s| {
            s.size = size;
            s.known_size = size;
            s.reported = s.writes;
            s.version = attr.version;
        });
        self.data.set_size(a.handle, size, true);
        Ok(attr)
    }

    /// Writes `data` at `offset` into the node cache; the file's write
    /// policy decides when it goes to the data servers (`write-through`:
    /// before this returns). [`Fs::fsync`] makes it durable.
    pub async fn write_at(&self, a: &Attr, offset: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let st = self.state(a).await?;
        let _shared = st.gate.read().await;
        let st = self.state(a).await?;
        let end = offset + data.len() as u64;
        if !st.cached {
            // `sprite`, write-shared: straight to the data servers, and the
            // size to the metadata server when the file grew.
            self.data.write(a.handle, offset, data).await?;
            self.update(a.handle, |s| {
                s.size = s.size.max(end);
                s.writes += 1;
            });
            return if end > st.size {
                self.report(a.handle).await
            } else {
                Ok(())
            };
        }
        // Known before the bytes land, so a concurrent reader's clamp is right.
        self.update(a.handle, |s| {
            s.size = s.size.max(end);
            s.writes += 1;
        });
        st.pool
            .write(a.handle, offset, data)
            .await
            .map_err(|e| from_driver(self.what(a.handle), e))
    }

    /// Reads up to `len` bytes at `offset` (holes read as zeros), through
    /// the node cache; stops at the end of the file as this node knows it.
    pub async fn read_at(&self, a: &Attr, offset: u64, len: u64) -> Result<Vec<u8>> {
        let st = self.state(a).await?;
        // Uncached, another node may have grown the file: read_into asks.
        let known = if st.cached { st.size.max(a.size) } else { u64::MAX };
        let end = known.min(offset.saturating_add(len));
        let mut out = vec![0u8; end.saturating_sub(offset) as usize];
        let n = self.read_into(a, offset, &mut out).await?;
        out.truncate(n);
        Ok(out)
    }

    /// Reads into `buf` at `offset`; returns how many bytes the file had
    /// there (fewer than asked at its end). A cache hit costs one copy.
    pub async fn read_into(&self, a: &Attr, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let st = self.state(a).await?;
        let _shared = st.gate.read().await;
        let st = self.state(a).await?;
        if !st.cached {
            // `sprite`, write-shared: the size and the bytes as the servers
            // have them now.
            let size = st.size.max(self.getattr(a.handle).await?.size);
            let end = size.min(offset.saturating_add(buf.len() as u64));
            if offset >= end {
                return Ok(0);
            }
            let got = self.data.read(a.handle, offset, end - offset).await?;
            buf[..got.len()].copy_from_slice(&got);
            return Ok(got.len());
        }
        let end = st.size.max(a.size).min(offset.saturating_add(buf.len() as u64));
        if offset >= end {
            return Ok(0);
        }
        let n = (end - offset) as usize;
        st.pool
            .read(a.handle, offset, &mut buf[..n])
            .await
            .map_err(|e| from_driver(self.what(a.handle), e))?;
        Ok(n)
    }
}

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
