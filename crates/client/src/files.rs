//! Files as this node holds them: the node's state of each file it has
//! touched, and the driver of the file's consistency plug-in
//! (`parcache_core::consistency`). A plug-in's hooks decide; this file
//! carries out the [`Action`]s they return (push dirty blocks, report a
//! size, drop cached blocks, open at the metadata server …) and never
//! asks which plug-in runs.

use crate::{from_below, from_driver, placement_of, Fs, FsError, Pool, Result};
use crate::{REMOVE_LATER_MAX, REMOVING};
use bytes::Bytes;
use parcache_core::consistency::capfs::CapfsParams;
use parcache_core::consistency::{Action, Callback, Consistency, KernelCache, NodeFile, ServerView};
use parcache_core::cooperative::CooperativeKind;
use parcache_core::BlockKey;
use parcache_core::{ConsistencyKind, FilePolicies, PrefetchKind, StoreKind, Time};
use parcache_proto::{never_changed, SMALL_COPY_MAX};
use parcache_proto::{Attr, ErrorCode, Request, Response, SetAttr};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What this node holds of a file it has touched.
#[derive(Clone)]
pub(crate) struct FileState {
    pub(crate) policies: FilePolicies,
    plugin: Arc<dyn Consistency>,
    pub(crate) pool: Arc<Pool>,
    /// The plug-ins' state of the file (size, version, writes reported,
    /// opens, cached).
    pub(crate) file: NodeFile,
    /// Orders this node's requests on the file: reads, writes and size
    /// reports share it; a truncate or a revalidation holds it alone, so a
    /// size report taken before a truncate cannot reach the metadata server
    /// after it, and a read begun before a truncate cannot put the old bytes
    /// back in the cache.
    pub(crate) gate: Arc<tokio::sync::RwLock<()>>,
    /// Held shared by peers' reads and writes through this node's cache
    /// (`lru-interleaved` homes), alone while a peer's newer version drops
    /// its blocks ([`Fs::served_file`](crate::Fs)): pieces of one write
    /// arriving together take the version in once, and no piece written
    /// here is dropped unwritten.
    pub(crate) serving: Arc<tokio::sync::RwLock<()>>,
    /// Held while a size report of the file is on its way: two closes at
    /// once (a descriptor and its duplicate) report one after the other,
    /// the second only what the first did not cover. (Both sent at once
    /// with a small file's content, the metadata server took the second
    /// for a change made from a stale version and dropped the content.)
    reporting: Arc<tokio::sync::Mutex<()>>,
    /// Unlinked (its last name) while open here: the metadata server keeps
    /// it until the last open here ends.
    orphan: bool,
    /// Opens for reading and for writing this node registered at the
    /// metadata server (`sprite`) and has not closed there: what it tells
    /// a restarted server ([`Fs::reclaim`]).
    at_server: (u32, u32),
    /// The counts of changes sent to the metadata server before and after
    /// this node's last change of the file (its creation, a size report,
    /// a truncate; see [`crate::peer::Peer::may_have_lost`]); `(0, 0)`
    /// once an `fsync` found the server has it.
    changed: (u64, u64),
    /// A write-back of the file failed (its dirty blocks were dropped) and
    /// no `fsync` has reported it yet: why. A close of any descriptor
    /// (a forked child's `exec` closes its copies, each a FUSE `FLUSH`)
    /// may meet the failure first; the writer's `fsync` must still say so.
    /// Forgotten when the file's last open here ends.
    lost: Option<String>,
}

pub(crate) fn view(a: &Attr) -> ServerView {
    ServerView {
        size: a.size,
        version: a.version,
    }
}

/// Most small files' copies kept between the lookup that brought them and
/// the open that uses them (a walk that opens nothing starts again).
const SMALL_KEPT: usize = 1024;

/// How much of a file `session`'s open reads into the node cache at most
/// (the rest would only push the start out again).
const FETCH_WHOLE_CHUNK: usize = 1 << 20;

impl Fs {
    /// This node's state of the file, learning its policies on first use.
    pub(crate) async fn state(&self, a: &Attr) -> Result<FileState> {
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

    /// The file's attributes as an open needs them fetched. A file this
    /// node has no state of yet learns its policies in the same request
    /// (one round trip to the metadata server instead of two).
    pub async fn getattr_to_open(&self, handle: u64) -> Result<Attr> {
        if self.files.lock().contains_key(&handle) {
            return self.getattr(handle).await;
        }
        let what = self.what(handle);
        match self.md(&what, Request::GetAttrPolicy { handle }).await? {
            Response::AttrPolicies {
                attr,
                policies,
                content,
            } => {
                self.learn(&attr, &policies)?;
                self.keep_small(&attr, content);
                Ok(attr)
            }
            other => Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
        }
    }

    /// Opens with attributes and policies this node already has from the
    /// metadata server (a mount's lookup just before, still under its
    /// lease, with nothing changed since): no request. Learns the
    /// policies if the node holds no state of the file yet.
    pub fn open_known(&self, a: &Attr, policies: &[(String, String)]) -> Result<()> {
        if !self.files.lock().contains_key(&a.handle) {
            self.learn(a, policies)?;
        }
        Ok(())
    }

    /// Keeps a small file's content the metadata server gave with its
    /// attributes, for the open that usually follows ([`Fs::open`]).
    pub(crate) fn keep_small(&self, a: &Attr, content: Option<Vec<u8>>) {
        let Some(c) = content else {
            return;
        };
        let mut kept = self.small.lock();
        if kept.len() >= SMALL_KEPT {
            kept.clear();
        }
        kept.insert(a.handle, (a.version, c));
    }

    /// Whether the file's blocks live in the node cache alone, as the data
    /// servers have them: cached, in the block store, with no cooperative
    /// tier, global cache, durable write cache or block directory between
    /// (what a small file's copy at the metadata server may stand in for).
    fn plainly_cached(&self, st: &FileState, handle: u64) -> bool {
        let k = st.policies.cooperative;
        st.file.cached
            && Self::cas_of(st).is_none()
            && !st.plugin.tracks_blocks()
            && !self.interleaved(k)
            && !self.discretionary(handle, k)
            && !self.nv_logged(&st.policies)
    }

    /// At an open, after revalidation: a small file's copy the metadata
    /// server gave at this version goes into the node cache as its
    /// blocks, so reading it asks no data server (data on metadata).
    fn take_small(&self, st: &FileState, handle: u64) {
        let Some((version, content)) = self.small.lock().remove(&handle) else {
            return;
        };
        let Some(f) = self.file_now(handle) else {
            return;
        };
        if version != f.version || content.len() as u64 != f.size || !self.plainly_cached(st, handle) {
            return;
        }
        let bs = self.cache.block_size as usize;
        for (i, piece) in content.chunks(bs).enumerate() {
            // A block the cache holds already (this node's own) stays.
            st.pool.adopt(BlockKey::new(handle, i as u64), piece);
        }
    }

    /// The file's whole content if it is small and the node cache holds
    /// all of it clean (just written down), with the version the node
    /// validated its blocks at: what a size report may carry.
    fn small_copy(&self, handle: u64, size: u64) -> Option<(u64, Bytes)> {
        self.small_content(handle, size, false)
    }

    /// [`Fs::small_copy`]; `dirty_too`: with bytes not yet pushed (a copy
    /// for `WrittenInline`, which pushes none).
    fn small_content(&self, handle: u64, size: u64, dirty_too: bool) -> Option<(u64, Bytes)> {
        if size == 0 || size > SMALL_COPY_MAX || size > self.cache.block_size as u64 {
            return None;
        }
        let st = self.files.lock().get(&handle)?.clone();
        if !self.plainly_cached(&st, handle) {
            return None;
        }
        let key = BlockKey::new(handle, 0);
        let copy = match dirty_too {
            true => st.pool.peek_held_prefix(key, size as u32)?,
            false => st.pool.peek_prefix(key, size as u32)?,
        };
        Some((st.file.version, copy))
    }

    /// Starts this node's state of a file from its policy settings (kept
    /// if another task got there first).
    pub(crate) fn learn(&self, a: &Attr, settings: &[(String, String)]) -> Result<FileState> {
        let policies = FilePolicies::from_settings(settings);
        let pool = self.pool(&policies)?;
        let may_live = policies.may_live_on_metadata(settings);
        self.data.place(a.handle, placement_of(a)?, a.size, may_live);
        self.global.learn(a.handle, settings, self.cache.block_size);
        let st = FileState {
            policies,
            plugin: Arc::from(policies.consistency.build()),
            pool,
            file: NodeFile::new(view(a), self.now()),
            gate: Arc::new(tokio::sync::RwLock::new(())),
            serving: Arc::default(),
            reporting: Arc::default(),
            orphan: false,
            at_server: (0, 0),
            changed: (0, 0),
            lost: None,
        };
        Ok(self.files.lock().entry(a.handle).or_insert(st).clone())
    }

    /// This node's change of the file was answered ([`Fs::md_with`] calls
    /// it: [`Request::file_changed`], or a create's answer); `before`: the
    /// count of changes sent to the metadata server before it was sent.
    pub(crate) fn changed_here(&self, handle: u64, before: u64) {
        let after = self.mds.change_count();
        if let Some(st) = self.files.lock().get_mut(&handle) {
            st.changed = (before, after);
        }
    }

    /// After an `fsync` made the file's changes durable: if the metadata
    /// server may have lost this node's last change of it (the connection
    /// was lost before a sync covered it: the server may have crashed and
    /// restarted without it), checks that the server has the file at the
    /// version that change made. A program's `fsync` that returns has its
    /// file there: without this check, a file made and closed just before
    /// a `kill -9` of the server was gone, and the `fsync` that followed
    /// the restart returned success (nothing was left to report).
    async fn check_not_lost(&self, handle: u64) -> Result<()> {
        let Some((changed, known)) = self
            .files
            .lock()
            .get(&handle)
            .map(|s| (s.changed, s.file.known_version))
        else {
            return Ok(());
        };
        if self.settle_losses(changed) {
            return Ok(());
        }
        let now = self.getattr(handle).await?;
        if now.version < known {
            return Err(FsError::Remote {
                path: self.what(handle),
                code: ErrorCode::Io,
                message: format!(
                    "the metadata server has it at version {}, older than {known} this node saw: a crash of the server lost its last changes",
                    now.version
                ),
            });
        }
        self.sync_metadata().await?;
        if let Some(st) = self.files.lock().get_mut(&handle) {
            if st.changed == changed {
                st.changed = (0, 0);
            }
        }
        Ok(())
    }

    /// Counts an open of the file registered at the metadata server
    /// (`open`) or closed there (see [`FileState::at_server`]).
    fn registered(&self, handle: u64, write: bool, open: bool) {
        if let Some(st) = self.files.lock().get_mut(&handle) {
            let n = if write {
                &mut st.at_server.1
            } else {
                &mut st.at_server.0
            };
            *n = if open { *n + 1 } else { n.saturating_sub(1) };
        }
    }

    /// Tells a restarted metadata server what `sprite` kept in its
    /// predecessor's memory: the opens this node registered, and the files
    /// it wrote and has not reported (whose dirty blocks another node's
    /// open must recall). Sprite's clients reopen their files after a
    /// server reboot the same way (Welch 1990). What the server kept of
    /// `sync-write` and CAPFS coherent H-caches (who caches which blocks or
    /// hashes) is not told back: this node drops those blocks and hashes
    /// instead, and fetches (and registers) them again. Called once the
    /// connection to the metadata server is made again; the server holds
    /// other nodes' opens, `sync-write` writes and coherent commits until
    /// the nodes have had time to do this.
    pub(crate) async fn reclaim(&self) {
        let tracked: Vec<(u64, Arc<Pool>, bool)> = self
            .files
            .lock()
            .iter()
            .filter(|(_, st)| st.plugin.tracks_blocks() || st.plugin.capfs().is_some_and(|p| p.registers_holders()))
            .map(|(&handle, st)| (handle, st.pool.clone(), st.plugin.tracks_blocks()))
            .collect();
        for (handle, pool, blocks) in tracked {
            if blocks {
                pool.discard_file(handle, 0).await;
            } else {
                self.cas.drop_hashes(handle);
            }
        }
        let claims: Vec<Request> = self
            .files
            .lock()
            .iter()
            .filter_map(|(&handle, st)| {
                let (readers, writers) = st.at_server;
                let dirty = st.plugin.kind() == ConsistencyKind::Sprite && st.file.unreported();
                (readers + writers > 0 || dirty).then_some(Request::Reclaim {
                    handle,
                    node: self.node,
                    readers,
                    writers,
                    dirty,
                })
            })
            .collect();
        if !claims.is_empty() {
            tracing::info!(
                "telling the metadata server what {} files had open or unreported here (sprite)",
                claims.len()
            );
        }
        for req in claims {
            if let Err(e) = self.mds.call(&req, &[]).await {
                tracing::warn!("reclaiming a sprite open at the metadata server: {e}");
            }
        }
    }

    /// Runs `f` on the node's state of the file (if it has one).
    pub(crate) fn with_file<T: Default>(
        &self,
        handle: u64,
        f: impl FnOnce(&Arc<dyn Consistency>, &mut NodeFile) -> T,
    ) -> T {
        match self.files.lock().get_mut(&handle) {
            Some(st) => {
                let before = st.file.opens;
                let r = f(&st.plugin, &mut st.file);
                self.note_opens(before, st.file.opens);
                r
            }
            None => T::default(),
        }
    }

    /// Counts a file going from not open here to open or back (its
    /// `opens` before and after a change, made under the `files` lock):
    /// [`Fs::any_open`] then needs no walk over every file this node knows.
    fn note_opens(&self, before: u32, after: u32) {
        match (before > 0, after > 0) {
            (false, true) => drop(self.open_files.fetch_add(1, Ordering::SeqCst)),
            (true, false) => drop(self.open_files.fetch_sub(1, Ordering::SeqCst)),
            _ => {}
        }
    }

    /// The node's state of the file now (after actions changed it).
    fn file_now(&self, handle: u64) -> Option<NodeFile> {
        self.files.lock().get(&handle).map(|s| s.file.clone())
    }

    /// A content-addressed file's CAPFS parameters and chunk size (`None`
    /// for a file of the block store).
    fn cas_of(st: &FileState) -> Option<(CapfsParams, u32)> {
        match (st.policies.store, st.plugin.capfs()) {
            (StoreKind::Cas { chunk }, Some(p)) => Some((p, chunk)),
            _ => None,
        }
    }

    /// The policies the node cache applies to a file.
    pub async fn policies_of(&self, a: &Attr) -> Result<FilePolicies> {
        Ok(self.state(a).await?.policies)
    }

    /// How the kernel above a mount may cache the file's pages, as its
    /// consistency plug-in says. Asked at each open, after [`Fs::open`]: `UntilChanged` is resolved
    /// here, to `Keep` when the kernel's pages are current at the version
    /// the open validated ([`NodeFile::kernel_keeps`]), else `UntilOpen`.
    /// The file's `page-cache` setting may bypass it whatever the plug-in
    /// says ([`parcache_core::PageCache::bypasses`]; `writer`: an open for
    /// writing that the kernel lets bypass it; `reader`: an open for reading
    /// only that it lets bypass it, which `auto` does for a large file
    /// ([`NodeFile::streams`])).
    pub async fn kernel_cache(&self, a: &Attr, writer: bool, reader: bool) -> Result<KernelCache> {
        let st = self.state(a).await?;
        let streamed = reader && self.with_file(a.handle, |_, f| f.streams(a.size));
        // A direct write drops the pages it changes from the kernel's
        // cache; a change of setting makes the node learn the file anew, so
        // the kernel's pages from before a bypass are dropped at the next
        // open that keeps pages (`kernel_keeps` starts false).
        if st.policies.page_cache.bypasses(writer, streamed) {
            return Ok(KernelCache::Bypass);
        }
        Ok(match st.plugin.kernel_cache() {
            KernelCache::UntilChanged => {
                if self.with_file(a.handle, |_, f| f.kernel_keeps()) {
                    KernelCache::Keep
                } else {
                    KernelCache::UntilOpen
                }
            }
            other => other,
        })
    }

    /// Carries out a plug-in's actions on a file, in order; `latest` is the
    /// file as the metadata server last showed it, updated as answers come.
    async fn run(&self, st: &FileState, handle: u64, acts: Vec<Action>, latest: &mut Attr) -> Result<()> {
        let mut todo: VecDeque<Action> = acts.into();
        // What the last push found landed: the report after it covers no more.
        let mut pushed = None;
        while let Some(act) = todo.pop_front() {
            match act {
                Action::FetchAttr => {
                    *latest = self.getattr(handle).await?;
                    let now = self.now();
                    let more = self.with_file(handle, |p, f| p.revalidated(f, now, view(latest)));
                    todo.extend(more);
                }
                Action::OpenAtServer { write } => {
                    // Only an open asks this, and `open` does it itself.
                    return Err(FsError::Protocol(format!(
                        "{}: a plug-in asked to open the file at the server outside an open (write {write})",
                        self.what(handle)
                    )));
                }
                Action::CloseAtServer { write } => {
                    // Counted off first: a close lost with the server's
                    // connection is not reclaimed as an open.
                    self.registered(handle, write, false);
                    let req = Request::Close {
                        handle,
                        node: self.node,
                        write,
                    };
                    self.md(&self.what(handle), req).await?;
                }
                Action::PushDirty => {
                    // A push and its report in one request where the file may
                    // live on the metadata server (a close's, mostly).
                    if todo.front() == Some(&Action::ReportSize) && self.report_inline(st, handle, latest).await? {
                        todo.pop_front();
                        continue;
                    }
                    pushed = Some(self.with_file(handle, |_, f| f.report_upto()));
                    self.write_back(&st.pool, handle).await?
                }
                Action::ReportSize => {
                    if let Some(after) = self.report(handle, false, pushed.take()).await? {
                        *latest = after;
                    }
                }
                Action::DropCached => {
                    st.pool.discard_file(handle, 0).await;
                    self.with_file(handle, |_, f| f.kernel = None);
                }
                Action::Adopt => {
                    let now = self.now();
                    self.with_file(handle, |_, f| f.adopt(view(latest), now));
                    self.data.set_size(handle, latest.size, true);
                }
                Action::FetchWhole => self.fetch_whole(st, handle).await?,
                Action::DropHashes => self.cas.drop_hashes(handle),
                Action::CommitDelayed => {
                    if let Some((p, _)) = Self::cas_of(st) {
                        if let Some(after) = self.cas_commit_delayed(handle, p).await? {
                            *latest = after;
                        }
                    }
                }
                Action::InvalidateOthers { first, last } => {
                    let req = Request::SyncWritten {
                        handle,
                        node: self.node,
                        first,
                        last,
                    };
                    self.answer_callbacks();
                    self.md(&self.what(handle), req).await?;
                }
                Action::DropBlocks { first, last } => self.drop_blocks(handle, first, last).await,
            }
        }
        Ok(())
    }

    /// Drops this node's clean copies of blocks `first..=last` of a file
    /// (a block being fetched goes once the fetch ends).
    pub(crate) async fn drop_blocks(&self, handle: u64, first: u64, last: u64) {
        let Some(pool) = self.files.lock().get(&handle).map(|s| s.pool.clone()) else {
            return;
        };
        for i in first..=last {
            pool.discard_clean_block(parcache_core::BlockKey::new(handle, i)).await;
        }
    }

    /// `sync-write`: tells the metadata server's block directory that this
    /// node is about to cache block `index` (before fetching it, so a
    /// write elsewhere in between calls this node back).
    pub(crate) async fn hold_block(&self, handle: u64, index: u64) {
        let tracks = self.files.lock().get(&handle).is_some_and(|s| s.plugin.tracks_blocks());
        if !tracks {
            return;
        }
        self.answer_callbacks();
        let req = Request::SyncHolding {
            handle,
            node: self.node,
            first: index,
            last: index,
        };
        if let Err(e) = self.md(&self.what(handle), req).await {
            tracing::warn!("{}: telling the block directory: {e}", self.what(handle));
        }
    }

    /// A peer knows a newer version of the file than this node: the node
    /// takes the metadata server's view `a` (its cached blocks were
    /// dropped by the caller).
    pub(crate) fn revalidated_by_peer(&self, handle: u64, a: &Attr) {
        let now = self.now();
        self.with_file(handle, |_, f| f.adopt(view(a), now));
        self.data.set_size(handle, a.size, true);
    }

    /// Another node wrote the file through this node's cache
    /// (`lru-interleaved`) and reported it, moving it to `version`: the
    /// cached blocks stay current if no other change came between
    /// (`close_to_open::after_report`).
    pub(crate) fn peer_reported(&self, handle: u64, version: u64) {
        self.with_file(handle, |_, f| {
            f.version = parcache_core::consistency::close_to_open::after_report(f.version, version)
        });
    }

    /// Reads the file into the node cache (as much as its pool holds).
    async fn fetch_whole(&self, st: &FileState, handle: u64) -> Result<()> {
        let size = self.file_now(handle).map_or(0, |f| f.size);
        let end = size.min(self.cache.pool_bytes);
        let mut buf = vec![0u8; FETCH_WHOLE_CHUNK];
        let mut at = 0;
        while at < end {
            let n = (end - at).min(FETCH_WHOLE_CHUNK as u64) as usize;
            st.pool
                .read(handle, at, &mut buf[..n])
                .await
                .map_err(|e| from_driver(self.what(handle), e))?;
            at += n as u64;
        }
        Ok(())
    }

    /// A program opened the file (for writing if `write`); `a` are its
    /// attributes fetched just before. Returns the attributes to use while
    /// it is open. The file's plug-in decides what the open asks of the
    /// metadata server (under `sprite`, the open itself, which may call
    /// other nodes back and say this node may not cache the file) and what
    /// happens to cached blocks (under `close-to-open`, those of a file
    /// another node changed are dropped). The prefetch policy starts here.
    pub async fn open(&self, a: &Attr, write: bool) -> Result<Attr> {
        let st = self.state(a).await?;
        if st.file.opens == 0 && self.hints_may_change(a.handle, st.policies.cooperative) {
            // Another node may have hinted it since this one learned it (a
            // home learns files it serves): the first open here looks again.
            let settings = match self
                .md(&self.what(a.handle), Request::GetPolicy { handle: a.handle })
                .await?
            {
                Response::Policies(p) => p,
                other => return Err(FsError::Protocol(format!("unexpected reply {other:?}"))),
            };
            self.global.learn(a.handle, &settings, self.cache.block_size);
        }
        let mut a = a.clone();
        let mut cacheable = true;
        // Before the open is sent: see `NodeFile::may_cache`.
        let stopped = self.file_now(a.handle).map_or(0, |f| f.stopped);
        let now = self.now();
        let pre = self.with_file(a.handle, |p, f| p.pre_open(f, now, write));
        for act in pre {
            match act {
                // `a` was fetched just now by the caller.
                Action::FetchAttr => {}
                Action::OpenAtServer { write } => {
                    self.answer_callbacks();
                    let what = self.what(a.handle);
                    let req = Request::Open {
                        handle: a.handle,
                        node: self.node,
                        write,
                    };
                    match self.md(&what, req).await? {
                        Response::Opened { attr, cacheable: c } => {
                            a = attr;
                            cacheable = c;
                            self.registered(a.handle, write, true);
                        }
                        other => return Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
                    }
                }
                other => self.run(&st, a.handle, vec![other], &mut a).await?,
            }
        }
        let _alone = st.gate.write().await;
        let st = self.state(&a).await?;
        let now = self.now();
        let acts = self.with_file(a.handle, |p, f| {
            // A callback since the open was sent may have made the answer stale.
            let cacheable = f.may_cache(cacheable, stopped);
            p.post_open(f, now, view(&a), cacheable)
        });
        self.run(&st, a.handle, acts, &mut a).await?;
        let st = self.state(&a).await?;
        self.take_small(&st, a.handle);
        if let Some(f) = self.file_now(a.handle) {
            if f.cached && self.interleaved(st.policies.cooperative) {
                if st.policies.prefetch == PrefetchKind::FullFileOnOpen {
                    let end = f.size.max(a.size).min(self.cache.pool_bytes);
                    self.interleaved_prefetch(&st, a.handle, 0, end, f.version);
                }
            } else if f.cached {
                st.pool.open(a.handle, f.size.max(a.size));
            }
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
        match self.decide_and_run(a, |p, f, now| p.flush(f, now)).await {
            Err(e) => Err(self.gone_from_server(e, a.handle).await),
            Ok(()) => self.lost_writes(a.handle, false),
        }
    }

    /// `EIO` if a write-back of the file failed since an `fsync` last
    /// reported one (`take`: this is an `fsync`, which reports it once; a
    /// close reports it and leaves it for the `fsync`). Without this, a
    /// write-back that failed under a forked child's close of its copy of
    /// the descriptor (whose `FLUSH` got the `EIO`) left the writer's
    /// `fsync` with nothing dirty, and it said success (found by a writer
    /// thread beside a thread running `kill -9` and `parcache up`).
    fn lost_writes(&self, handle: u64, take: bool) -> Result<()> {
        let lost = match self.files.lock().get_mut(&handle) {
            Some(st) if take => st.lost.take(),
            Some(st) => st.lost.clone(),
            None => None,
        };
        match lost {
            None => Ok(()),
            Some(why) => Err(FsError::Remote {
                path: self.what(handle),
                code: ErrorCode::Io,
                message: format!("bytes written to it did not reach the data servers and were dropped ({why})"),
            }),
        }
    }

    /// Runs what the file's plug-in decides (`decide`, given the time now),
    /// if anything, beside this node's other reads and writes of the file.
    async fn decide_and_run(
        &self,
        a: &Attr,
        decide: impl FnOnce(&Arc<dyn Consistency>, &mut NodeFile, Time) -> Vec<Action>,
    ) -> Result<()> {
        let st = self.state(a).await?;
        let now = self.now();
        let acts = self.with_file(a.handle, |p, f| decide(p, f, now));
        if acts.is_empty() {
            return Ok(());
        }
        let _shared = st.gate.read().await;
        self.run(&st, a.handle, acts, &mut a.clone()).await
    }

    /// The file's modification time is about to be set
    /// ([`Consistency::set_times`]): this node's unreported writes go
    /// first. Nothing to do for a file this node holds no state of.
    ///
    /// [`Consistency::set_times`]: parcache_core::consistency::Consistency::set_times
    pub async fn before_times(&self, a: &Attr) -> Result<()> {
        if !self.files.lock().contains_key(&a.handle) {
            return Ok(());
        }
        self.decide_and_run(a, |p, f, now| p.set_times(f, now)).await
    }

    /// An open description of the file (opened with `write`) went away:
    /// under `sprite` the metadata server is told (dirty blocks stay: the
    /// next opener elsewhere recalls them); the last one on this node stops
    /// the file's prefetching, and ends an unlinked file.
    pub async fn release(&self, a: &Attr, write: bool) -> Result<()> {
        let st = self.state(a).await?;
        let now = self.now();
        let (acts, last, orphan) = match self.files.lock().get_mut(&a.handle) {
            Some(s) => {
                let before = s.file.opens;
                let acts = s.plugin.release(&mut s.file, now, write);
                self.note_opens(before, s.file.opens);
                let last = s.file.opens == 0;
                if last {
                    // Every descriptor open at a failed write-back has been
                    // closed (each close said so): later opens do not see
                    // it, as a kernel's do not.
                    s.lost = None;
                }
                (acts, last, last && s.orphan)
            }
            None => (vec![], false, false),
        };
        if last {
            st.pool.close(a.handle);
        }
        self.run(&st, a.handle, acts, &mut a.clone()).await?;
        if orphan {
            // Its last open here ended: the unlinked file goes now.
            let req = Request::Forget { handle: a.handle };
            if let Response::Attr(gone) = self.md(&self.what(a.handle), req).await? {
                self.remove_data(&gone).await?;
            }
        }
        Ok(())
    }

    /// Whether any file is open on this node. Kept as a count: a walk over
    /// every file known here cost each unlink after 10,000 creates more
    /// than its round trip (debug builds check the count against the walk).
    pub(crate) fn any_open(&self) -> bool {
        let files = self.files.lock();
        let open = self.open_files.load(Ordering::SeqCst) > 0;
        // Up to a few thousand files, so that a debug build's unlinks do
        // not grow quadratic in a large directory.
        debug_assert!(
            files.len() > 4096 || open == files.values().any(|s| s.file.opens > 0),
            "the count of open files went wrong"
        );
        open
    }

    /// Whether the file is open here.
    pub(crate) fn is_open(&self, handle: u64) -> bool {
        self.files.lock().get(&handle).is_some_and(|s| s.file.opens > 0)
    }

    /// Marks the file an orphan if it is open here (it is being unlinked);
    /// returns whether it was.
    pub(crate) fn orphan_if_open(&self, handle: u64) -> bool {
        match self.files.lock().get_mut(&handle) {
            Some(s) if s.file.opens > 0 => {
                s.orphan = true;
                true
            }
            _ => false,
        }
    }

    /// Starts the task that answers the metadata server's `sprite`
    /// callbacks, once: it keeps one poll outstanding and does each
    /// callback it gets, then acknowledges it.
    pub(crate) fn answer_callbacks(&self) {
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
                        let core_cb = match cb {
                            parcache_proto::Callback::Recall => Callback::Recall,
                            parcache_proto::Callback::Disable => Callback::Disable,
                            parcache_proto::Callback::Invalidate => Callback::Invalidate,
                            parcache_proto::Callback::DropBlocks { first, last } => {
                                Callback::DropBlocks { first, last }
                            }
                            parcache_proto::Callback::Forget => Callback::Forget,
                        };
                        if let Err(e) = fs.called_back(handle, core_cb).await {
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
        if cb == Callback::Forget {
            // A directory held here: its unlinks under way are done first.
            self.recall_hold(handle).await;
            // The kernel's copy only; answered once it is gone.
            if let Some(forget) = self.kernel.get().cloned() {
                let _ = tokio::task::spawn_blocking(move || forget(Some(handle))).await;
            }
            return Ok(());
        }
        if cb == Callback::Invalidate {
            // Hashes only: no gate (a write here may be waiting for its own
            // commit, which waits for another node answering this one).
            self.cas.drop_hashes(handle);
            return Ok(());
        }
        if let Callback::DropBlocks { first, last } = cb {
            // No gate either: a sync-write here may be waiting for the
            // writer elsewhere, which waits for this answer.
            self.drop_blocks(handle, first, last).await;
            return Ok(());
        }
        let Some(st) = self.files.lock().get(&handle).cloned() else {
            return Ok(()); // never touched here: nothing cached
        };
        let _alone = st.gate.write().await;
        let acts = self.with_file(handle, |p, f| p.called_back(f, cb));
        let mut latest = self.getattr(handle).await?;
        self.run(&st, handle, acts, &mut latest).await
    }

    /// Returns when every byte written to the file is in the data servers'
    /// durable logs (an `nv=on` file's: in the node's durable write cache
    /// or there) and its size and times are at the metadata server.
    pub async fn fsync(&self, a: &Attr) -> Result<()> {
        let r = match self.fsync_as_told(a).await {
            Err(e) => Err(self.gone_from_server(e, a.handle).await),
            ok => ok,
        };
        // Reported once: by this `fsync`'s own failure, or now.
        let earlier = self.lost_writes(a.handle, true);
        r.and(earlier)
    }

    /// A close's or `fsync`'s report answered `NotFound`: the metadata
    /// server has no such file, because a crash of it lost the file's
    /// creation (made within the second before it, which the documented
    /// model allows to lose), or another node removed it while it was
    /// open here (a node knows only its own opens). What was written is
    /// lost: `EIO` says so, where `ENOENT` from a `close` would leave a
    /// program guessing; and this node drops what it held of the file, so
    /// nothing is pushed or reported for it again (an unmount's last push
    /// failed on it).
    async fn gone_from_server(&self, e: FsError, handle: u64) -> FsError {
        let FsError::Remote {
            path,
            code: ErrorCode::NotFound,
            message,
        } = e
        else {
            return e;
        };
        tracing::warn!("{path}: the metadata server no longer has it ({message}): what was written to it is lost");
        let pool = self.files.lock().get(&handle).map(|s| s.pool.clone());
        if let Some(pool) = pool {
            pool.discard_file(handle, 0).await;
        }
        self.with_file(handle, |_, f| f.write_back_failed());
        FsError::Remote {
            path,
            code: ErrorCode::Io,
            message: format!(
                "the metadata server no longer has this file (handle {handle}: a crash of the server lost its creation, made within the second before it, or another node removed it): what was written to it is lost ({message})"
            ),
        }
    }

    async fn fsync_as_told(&self, a: &Attr) -> Result<()> {
        let st = self.state(a).await?;
        let _shared = st.gate.read().await;
        if let Some((p, _)) = Self::cas_of(&st) {
            self.cas_commit_delayed(a.handle, p).await?;
            // Chunks are placed by hash, on any data server.
            let all: Vec<u32> = (0..self.data.servers() as u32).collect();
            self.data.sync_servers(&all, &self.what(a.handle)).await?;
        } else if self.nv_logged(&st.policies) {
            // As durable as the node's log (Biswas et al. 1993 §2.2): the
            // blocks stay in the NV cache, and so does the size they make
            // (reported when they go down, or replayed after a crash): a
            // size reported now would show other nodes zeros.
            self.nv_sync().await?;
        } else {
            let pushed = self.with_file(a.handle, |_, f| f.report_upto());
            self.write_back(&st.pool, a.handle).await?;
            // The data servers sync while the size goes to the metadata
            // server and is committed there: the file's bytes are on the
            // data servers before its size is reported (as at a close),
            // and both are durable before the `fsync` returns.
            // Blocks other nodes held for this one (a cooperative tier's
            // homes) went down through their connections: every server.
            let every = st.policies.cooperative != CooperativeKind::None;
            let data = self.data.sync(a.handle, every);
            let size = async {
                match self.report(a.handle, true, Some(pushed)).await? {
                    Some(_) => Ok(()),
                    None if every => self.md(&self.what(a.handle), Request::Sync).await.map(|_| ()),
                    None => self.sync_metadata().await,
                }
            };
            let (data, size) = tokio::join!(data, size);
            data.and(size)?;
            self.data.check_kept(a.handle, &self.what(a.handle))?;
            return self.check_not_lost(a.handle).await;
        }
        self.sync_metadata().await?;
        self.check_not_lost(a.handle).await
    }

    /// The metadata server showed a file's attributes (a `getattr`, or a
    /// setattr's answer a mount gives for one): the node keeps the newest
    /// view it was given ([`NodeFile::learned`]).
    pub fn seen(&self, a: &Attr) {
        self.with_file(a.handle, |_, f| f.learned(view(a)));
    }

    /// Writes the file's dirty blocks down. If any failed (a data server
    /// died with them), the node forgets what it held of the file and its
    /// size falls back to the one the metadata server has: no size is
    /// reported beyond the bytes the data servers acknowledged, and no
    /// read here returns bytes they do not have. The failure is returned
    /// (to the `close` or `fsync` that asked).
    pub(crate) async fn write_back(&self, pool: &Pool, handle: u64) -> Result<()> {
        let Err(e) = pool.flush_file(handle).await else {
            // Under lru-interleaved the homes hold this node's writes.
            return self.interleaved_flush(handle).await;
        };
        tracing::warn!("handle {handle}: written bytes did not reach the data servers: {e}");
        pool.discard_file(handle, 0).await;
        self.with_file(handle, |_, f| f.write_back_failed());
        if let Some(st) = self.files.lock().get_mut(&handle) {
            st.lost = Some(e.message.clone());
        }
        Err(from_below(self.what(handle), e))
    }

    /// Instead of a push and a size report: a small file this node holds
    /// whole, which may live on the metadata server alone, is reported with
    /// its content only (`WrittenInline`), and the metadata server keeps it
    /// as its only copy (data on metadata, Lustre's DoM): the close costs
    /// one round trip, not two, and its data servers nothing. `false` (and
    /// nothing done) where it may not, or the server refused: the caller
    /// pushes and reports as before. The write-back after an accepted
    /// report sends only bytes that changed meanwhile (another write of the
    /// file here), after the file is written out.
    async fn report_inline(&self, st: &FileState, handle: u64, latest: &mut Attr) -> Result<bool> {
        if self.holds.is_behind(handle) {
            let written = self.files.lock().get(&handle).is_some_and(|s| s.file.unreported());
            if !written {
                // Nothing to report (a shell's first close of a file it
                // redirects to): its create may wait for its content.
                return Ok(false);
            }
            if let Some(done) = self.create_with_content(st, handle, latest).await? {
                return Ok(done);
            }
            // Its create is under way: the report's base is the version
            // the server answers it with.
            self.settled().await;
        }
        if !self.data.may_live(handle) {
            return Ok(false);
        }
        let _one = st.reporting.lock().await;
        let (size, upto) = match self.files.lock().get(&handle) {
            Some(s) if s.file.unreported() => (s.file.landed_size(), s.file.report_upto()),
            _ => return Ok(false),
        };
        let Some((base, copy)) = self.small_content(handle, size, true) else {
            return Ok(false);
        };
        let what = self.what(handle);
        let attr = match self
            .md_with(&what, Request::WrittenInline { handle, size, base }, &copy)
            .await
        {
            Ok(Response::Attr(a)) => a,
            Err(FsError::Remote {
                code: ErrorCode::Refused,
                ..
            }) => {
                // Another node's report may have left it there meanwhile
                // (a file this node made): the push has it written out.
                self.data.refused_on_metadata(handle);
                return Ok(false);
            }
            Err(e) => return Err(e),
            Ok(other) => return Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
        };
        // Its size first: a write-back of other bytes has it written out.
        self.data.set_size(handle, attr.size, false);
        self.data.lives_on_metadata(handle, copy);
        let pushed = self.write_back(&st.pool, handle).await;
        self.data.settled_on_metadata(handle);
        self.with_file(handle, |_, f| f.reported(upto, view(&attr)));
        *latest = attr;
        pushed.map(|()| true)
    }

    /// A close of a file made behind whose create is not sent yet: the
    /// create goes now with the file's content, in one request (one round
    /// trip for a small file made, written and closed). `None`: its create
    /// was sent already, or its content cannot go with it (it is sent
    /// alone then). `Some(false)`: made, without the content (the file's
    /// policies keep it on the data servers): the report goes the usual way.
    async fn create_with_content(&self, st: &FileState, handle: u64, latest: &mut Attr) -> Result<Option<bool>> {
        let _one = st.reporting.lock().await;
        let (size, upto) = match self.files.lock().get(&handle) {
            Some(s) => (s.file.landed_size(), s.file.report_upto()),
            None => return Ok(None),
        };
        let copy = if self.data.may_live(handle) {
            self.small_content(handle, size, true)
        } else {
            None
        };
        let Some((_, copy)) = copy else {
            return Ok(None);
        };
        let Some((dir, mut file)) = self.holds.take_create(handle) else {
            return Ok(None);
        };
        file.size = copy.len() as u64;
        let req = Request::CreatesBehind {
            parent: dir,
            files: vec![file],
        };
        let got = self.made_behind(&req, &[handle], &copy, upto).await;
        let Some(attr) = got.into_iter().next().flatten() else {
            return Err(self
                .lost_writes(handle, false)
                .err()
                .unwrap_or_else(|| FsError::Remote {
                    path: self.what(handle),
                    code: ErrorCode::Io,
                    message: "not made at the metadata server".into(),
                }));
        };
        if attr.size != size {
            *latest = attr;
            return Ok(Some(false));
        }
        self.data.set_size(handle, attr.size, false);
        self.data.lives_on_metadata(handle, copy);
        let pushed = self.write_back(&st.pool, handle).await;
        self.data.settled_on_metadata(handle);
        *latest = attr;
        pushed.map(|()| Some(true))
    }

    /// A file made behind was not made at the metadata server (`why`):
    /// what this node holds of it goes nowhere, which its next close and
    /// `fsync` report (`EIO`).
    pub(crate) fn lost_behind(&self, handle: u64, why: &str) {
        if let Some(st) = self.files.lock().get_mut(&handle) {
            st.lost = Some(format!(
                "the metadata server did not make the file made here behind: {why}"
            ));
        }
    }

    /// Tells the metadata server the size this node wrote the file to, if
    /// a report is due; the file's attributes after.
    pub(crate) async fn report_attr(&self, handle: u64) -> Result<Option<Attr>> {
        self.report(handle, false, None).await
    }

    /// [`Fs::report_attr`]; `durably`: the metadata server commits durably
    /// before it answers (`Request::Durably`: an `fsync`'s report and
    /// commit in one round trip). `pushed`: the writes a push just before
    /// found landed ([`NodeFile::report_upto`] when it began): a write that
    /// landed after it is not on the data servers, and is not covered.
    async fn report(&self, handle: u64, durably: bool, pushed: Option<u64>) -> Result<Option<Attr>> {
        let Some(reporting) = self.files.lock().get(&handle).map(|s| s.reporting.clone()) else {
            return Ok(None);
        };
        let _one = reporting.lock().await;
        let (size, upto, old) = match self.files.lock().get(&handle) {
            Some(s) if s.file.unreported() => {
                let upto = s.file.report_upto();
                let upto = pushed.map_or(upto, |p| p.min(upto));
                if upto <= s.file.reported {
                    // Every write not reported is still under way: its
                    // own end, or a later close, reports it.
                    return Ok(None);
                }
                (s.file.landed_size(), upto, s.file.known_size)
            }
            _ => return Ok(None),
        };
        // Every part as long as the size about to be reported says.
        self.data.extend_parts(handle, old, size).await?;
        let what = self.what(handle);
        let made = |req: Request| match durably {
            true => Request::Durably { req: Box::new(req) },
            false => req,
        };
        // What the commit covers: this node's unlinks answered before the
        // server had them are sent first.
        let mark = match durably {
            true => {
                self.settled().await;
                Some(self.mds.sync_mark())
            }
            false => None,
        };
        let attr = match self.small_copy(handle, size) {
            Some((base, copy)) => {
                let req = Request::WrittenSmall { handle, size, base };
                self.md_attr_with(&what, made(req), &copy).await?
            }
            None => self.md_attr(&what, made(Request::Written { handle, size })).await?,
        };
        if let Some(mark) = mark {
            self.mds.synced_with_own(mark);
        }
        self.with_file(handle, |_, f| f.reported(upto, view(&attr)));
        self.data.set_size(handle, attr.size, false);
        let interleaved = self
            .files
            .lock()
            .get(&handle)
            .is_some_and(|s| self.interleaved(s.policies.cooperative));
        if interleaved {
            self.interleaved_reported(handle, attr.version).await;
        }
        Ok(Some(attr))
    }

    /// Pushes every dirty block of every file and reports sizes; call it
    /// before the program exits (the `parcache` commands do). A file the
    /// metadata server no longer has is dropped with a warning, not failed
    /// on.
    pub async fn shutdown(&self) -> Result<()> {
        self.removed().await;
        let mut first = None;
        // File by file, so a file whose bytes did not all reach the data
        // servers does not have its size reported (see `write_back`).
        let files: Vec<(u64, Arc<Pool>)> = self.files.lock().iter().map(|(&h, s)| (h, s.pool.clone())).collect();
        for (h, pool) in files {
            let r = match self.write_back(&pool, h).await {
                Ok(()) => self.report_attr(h).await.map(|_| ()),
                Err(e) => Err(e),
            };
            match r {
                // Gone from the metadata server (removed by another node, or
                // its creation lost in a crash of the server, which this
                // node said at the time): nothing of it is left to push,
                // and `gone_from_server` says what was lost.
                Err(e) if e.code() == Some(ErrorCode::NotFound) => {
                    self.gone_from_server(e, h).await;
                }
                Err(e) => {
                    first.get_or_insert(e);
                }
                Ok(()) => {}
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

    /// The node learns a file's policies again at its next use: its dirty
    /// blocks go down first (and its size), and its cached ones are
    /// dropped. A file open here keeps its opens under the new plug-in, so
    /// a running program switches without losing anything.
    pub(crate) async fn forget_policies(&self, handle: u64) -> Result<()> {
        let Some(st) = self.files.lock().get(&handle).cloned() else {
            return Ok(());
        };
        let _alone = st.gate.write().await;
        if let Some((p, _)) = Self::cas_of(&st) {
            self.cas_commit_delayed(handle, p).await?;
        }
        self.write_back(&st.pool, handle).await?;
        self.report_attr(handle).await?;
        st.pool.discard_file(handle, 0).await;
        let a = self.getattr(handle).await?;
        let settings = match self.md(&self.what(handle), Request::GetPolicy { handle }).await? {
            Response::Policies(p) => p,
            other => return Err(FsError::Protocol(format!("unexpected reply {other:?}"))),
        };
        let policies = FilePolicies::from_settings(&settings);
        let pool = self.pool(&policies)?;
        self.global.learn(handle, &settings, self.cache.block_size);
        let now = self.now();
        let mut file = NodeFile::new(view(&a), now);
        if let Some(s) = self.files.lock().get_mut(&handle) {
            // The opens as they are now: a release may have ended one
            // while this waited (`st` is from before).
            file.opens = s.file.opens;
            s.policies = policies;
            s.plugin = Arc::from(policies.consistency.build());
            s.pool = pool.clone();
            s.file = file.clone();
        }
        if file.opens > 0 {
            // Open under the new plug-in as an open would (an uncached
            // plug-in stops caching; prefetching restarts in the new pool).
            let st = self.state(&a).await?;
            let acts = self.with_file(handle, |p, f| {
                f.opens -= 1;
                p.post_open(f, now, view(&a), true)
            });
            self.run(&st, handle, acts, &mut a.clone()).await?;
            if self.file_now(handle).is_some_and(|f| f.cached) {
                pool.open(handle, a.size);
            }
        }
        Ok(())
    }

    /// Forgets a removed file here and has the data servers drop its
    /// parts. A small file's parts are dropped after this returns (the
    /// name is already gone at the metadata server; the space is little),
    /// at most [`REMOVING`] at a time; [`Fs::shutdown`] waits for them. A
    /// larger file's space is free when this returns, as a program that
    /// removes a file to make room expects.
    pub(crate) async fn remove_data(&self, a: &Attr) -> Result<()> {
        self.nv_forget(a.handle).await;
        let size = self.size_of(a);
        let known = {
            let mut files = self.files.lock();
            let known = files.remove(&a.handle);
            if let Some(st) = &known {
                self.note_opens(st.file.opens, 0);
            }
            known
        };
        if let Some(st) = known {
            st.pool.discard_file(a.handle, 0).await;
        }
        let Some(l) = &a.layout else {
            self.data.forget(a.handle);
            return Ok(());
        };
        if never_changed(a.version) && size == 0 && self.data.untouched(a.handle) {
            // This node created it and sent its data servers nothing for
            // it, and no node reported data or a size for it (a write's
            // close, a truncate, an fsync all move the version): the data
            // servers hold no part of it, and are not asked (mdtest's
            // files). A file another node (or an earlier run of this
            // one, killed while writing it) may have written is removed
            // from them as before.
            self.data.forget(a.handle);
            return Ok(());
        }
        if size > REMOVE_LATER_MAX {
            self.data.remove(a.handle, &l.servers).await?;
            self.data.forget(a.handle);
            return Ok(());
        }
        let permit = self.removing.clone().acquire_owned().await;
        let (data, handle, servers) = (self.data.clone(), a.handle, l.servers.clone());
        let what = self.what(handle);
        tokio::spawn(async move {
            if let Err(e) = data.remove(handle, &servers).await {
                tracing::warn!("{what}: removing its data after its last name went: {e} (its space stays taken)");
            }
            data.forget(handle);
            drop(permit);
        });
        Ok(())
    }

    /// Waits until the data of every file removed so far is gone.
    pub(crate) async fn removed(&self) {
        let _all = self.removing.acquire_many(REMOVING as u32).await;
    }

    /// The file's size for the metadata server's answer `a`: what this node
    /// wrote and has not reported yet counts, and an answer older than a
    /// report or truncate of this node's shows that one's size
    /// ([`NodeFile::size_for`]).
    pub fn size_of(&self, a: &Attr) -> u64 {
        self.files
            .lock()
            .get(&a.handle)
            .map_or(a.size, |s| s.file.size_for(view(a)))
    }

    /// The size of a file as this node wrote it, while the metadata server
    /// does not know it yet (`None` when it does).
    pub fn local_size(&self, handle: u64) -> Option<u64> {
        self.files
            .lock()
            .get(&handle)
            .filter(|s| s.file.unreported())
            .map(|s| s.file.landed_size())
    }

    /// Sets a file's size: dirty blocks go down first, the node's cached
    /// blocks of the file are dropped, the data servers cut or extend their
    /// parts and the metadata server records the size.
    pub async fn truncate(&self, a: &Attr, size: u64) -> Result<Attr> {
        let st = self.state(a).await?;
        let _alone = st.gate.write().await;
        self.truncate_alone(&st, a, size).await
    }

    /// Extends a file to `size` if it is shorter (`fallocate`): the size
    /// is checked with no write of this node in between, so a file longer
    /// than `size` is never cut. `None` if it was long enough.
    pub async fn extend(&self, a: &Attr, size: u64) -> Result<Option<Attr>> {
        let st = self.state(a).await?;
        let _alone = st.gate.write().await;
        let now = self.getattr(a.handle).await?;
        if self.size_of(&now) >= size {
            return Ok(None);
        }
        self.truncate_alone(&st, a, size).await.map(Some)
    }

    /// [`Fs::truncate`] with the file's gate held.
    async fn truncate_alone(&self, st: &FileState, a: &Attr, size: u64) -> Result<Attr> {
        let what = self.what(a.handle);
        st.pool
            .flush_file(a.handle)
            .await
            .map_err(|e| from_below(what.clone(), e))?;
        st.pool.discard_file(a.handle, 0).await;
        if Self::cas_of(st).is_none() && self.data.may_cut_on_metadata(a.handle, size) {
            // A small file living on the metadata server is cut there alone.
            match self.md(&what, Request::TruncateInline { handle: a.handle, size }).await {
                Ok(Response::Attr(attr)) => {
                    self.with_file(a.handle, |_, f| f.truncated(size, attr.version));
                    self.data.set_size(a.handle, size, true);
                    self.data.kept_on_metadata(a.handle);
                    return Ok(attr);
                }
                Err(FsError::Remote {
                    code: ErrorCode::Refused,
                    ..
                }) => self.data.refused_on_metadata(a.handle),
                Err(e) => return Err(e),
                Ok(other) => return Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
            }
        }
        match Self::cas_of(st) {
            Some((p, chunk)) => self.cas_truncate(a, p, chunk, size).await?,
            None => self.data.truncate(a.handle, size).await?,
        }
        let set = SetAttr {
            size: Some(size),
            ..SetAttr::default()
        };
        let attr = self.md_attr(&what, Request::SetAttr { handle: a.handle, set }).await?;
        self.with_file(a.handle, |_, f| f.truncated(size, attr.version));
        self.data.set_size(a.handle, size, true);
        Ok(attr)
    }

    /// Writes `data` at `offset` into the node cache; the file's write
    /// policy decides when it goes to the data servers (`write-through`:
    /// before this returns). [`Fs::fsync`] makes it durable. Uncached
    /// (`posix`, or `sprite` while write-shared), the bytes go to the data
    /// servers before this returns.
    pub async fn write_at(&self, a: &Attr, offset: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let st = self.state(a).await?;
        let _shared = st.gate.read().await;
        let st = self.state(a).await?;
        self.write_gated(&st, a, offset, data).await
    }

    /// An `O_APPEND` write (`offset`: where the caller took the file's end
    /// to be). Where the file's plug-in has the metadata server place
    /// appends ([`Consistency::appends_at_server`]), the server reserves
    /// the bytes after the end every node's appends leave, so two nodes
    /// appending to one file keep every byte of both; the bytes and the
    /// size then go down as any write's (under `close-to-open`, at the
    /// close). Otherwise the bytes go at `offset`. Returns where they went.
    ///
    /// [`Consistency::appends_at_server`]: parcache_core::consistency::Consistency::appends_at_server
    pub async fn append(&self, a: &Attr, offset: u64, data: &[u8]) -> Result<u64> {
        let st = self.state(a).await?;
        if data.is_empty() || !st.plugin.appends_at_server() {
            self.write_at(a, offset, data).await?;
            return Ok(offset);
        }
        // Alone on this node: no write or report of the file in between.
        let _alone = st.gate.write().await;
        let st = self.state(a).await?;
        let handle = a.handle;
        let at_least = self.with_file(handle, |_, f| f.append_floor());
        let what = self.what(handle);
        let req = Request::Append {
            handle,
            at_least,
            len: data.len() as u64,
        };
        let offset = match self.md(&what, req).await? {
            Response::Appended { offset, .. } => offset,
            other => return Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
        };
        self.write_gated(&st, a, offset, data).await?;
        Ok(offset)
    }

    /// [`Fs::write_at`] with the file's gate held.
    async fn write_gated(&self, st: &FileState, a: &Attr, offset: u64, data: &[u8]) -> Result<()> {
        let end = offset + data.len() as u64;
        let now = self.now();
        if let Some((p, chunk)) = Self::cas_of(st) {
            // Stored and committed: the size is at the metadata server too.
            // A write of more chunks than one commit takes goes in parts.
            let most = crate::cas::COMMIT_CHANGES * chunk as usize;
            let mut attr = None;
            for (k, piece) in data.chunks(most).enumerate() {
                attr = self.cas_write(a, p, chunk, offset + (k * most) as u64, piece).await?;
            }
            self.with_file(a.handle, |_, f| {
                f.wrote(end);
                if let Some(attr) = &attr {
                    let upto = f.writes;
                    f.reported(upto, view(attr));
                }
            });
            return Ok(());
        }
        if !st.file.cached {
            self.data.write_with(a.handle, offset, data, st.policies.nv).await?;
        }
        // Counted before cached bytes land; a report before they land does
        // not cover it, and readers see the size from before it.
        let bs = self.cache.block_size as u64;
        let (acts, n) = self.with_file(a.handle, |p, f| {
            let grew = end > f.size;
            let n = f.begin_write(end);
            f.written_blocks = Some((offset / bs, (end - 1) / bs));
            (p.post_write(f, now, grew), n)
        });
        let landing = Landing(self, a.handle, n);
        if st.file.cached && self.interleaved(st.policies.cooperative) {
            let (size, version) = self.file_now(a.handle).map_or((end, 0), |f| (f.size, f.version));
            self.interleaved_write(&st.pool, a.handle, offset, data, size, version)
                .await?;
        } else if st.file.cached && self.discretionary(a.handle, st.policies.cooperative) {
            self.discretionary_write(&st.pool, a.handle, st.policies.cooperative, offset, data)
                .await?;
        } else if st.file.cached && self.nv_logged(&st.policies) {
            self.nv_write(&st.pool, a.handle, offset, data).await?;
        } else if st.file.cached {
            st.pool
                .write(a.handle, offset, data)
                .await
                .map_err(|e| from_driver(self.what(a.handle), e))?;
        }
        drop(landing);
        self.run(st, a.handle, acts, &mut a.clone()).await
    }

    /// Reads up to `len` bytes at `offset` (holes read as zeros), through
    /// the node cache; stops at the end of the file as this node knows it.
    /// Each call takes a new buffer: a program reading much should read
    /// into its own with [`Fs::read_into`] (8 readers of 1 MiB each spent a
    /// fifth of their CPU clearing the pages of new buffers, `cluster-io`).
    pub async fn read_at(&self, a: &Attr, offset: u64, len: u64) -> Result<Vec<u8>> {
        let st = self.state(a).await?;
        // Uncached, another node may have grown the file: read_into asks.
        let known = if st.file.cached {
            st.file.landed_size().max(a.size)
        } else {
            u64::MAX
        };
        let end = known.min(offset.saturating_add(len));
        let mut out = vec![0u8; end.saturating_sub(offset) as usize];
        let n = self.read_into(a, offset, &mut out).await?;
        out.truncate(n);
        Ok(out)
    }

    /// Reads `out` at `offset` of the file around the node cache, from a
    /// part file of a data server on this machine or else only its pages
    /// from the data server, where a random reader asks for a few pages of
    /// a block the node cache lacks ([`crate::local_part`]): a plain file
    /// (no cooperative tier, no durable write cache, no block directory
    /// that would call a holder back), at most a quarter of a block, in
    /// one block not yet read around the cache twice lately. False: read
    /// it through the node cache.
    async fn reads_around(&self, st: &FileState, handle: u64, offset: u64, out: &mut [u8]) -> bool {
        let bs = self.cache.block_size as u64;
        let len = out.len() as u64;
        let index = offset / bs;
        if len == 0
            || len * 4 > bs
            || (offset + len - 1) / bs != index
            || st.policies.cooperative != CooperativeKind::None
            || st.policies.nv
            || st.plugin.tracks_blocks()
            || st.pool.holds(parcache_core::BlockKey::new(handle, index))
            || !self.data.admits_around(handle, index)
        {
            return false;
        }
        self.data.read_pages_here(handle, offset, index, out).await
    }

    /// Reads into `buf` at `offset`; returns how many bytes the file had
    /// there (fewer than asked at its end), every one of `buf[..n]` written
    /// (a mount reuses its buffers: what they held before never shows). A
    /// cache hit costs one copy.
    pub async fn read_into(&self, a: &Attr, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let st = self.state(a).await?;
        let now = self.now();
        let end = offset.saturating_add(buf.len() as u64);
        // A read that does not continue one of the file's last ones.
        let mut random = false;
        let pre = self.with_file(a.handle, |p, f| {
            random = !f.continues_a_read(offset);
            f.note_read(offset, buf.len() as u64);
            let mut acts = p.pre_read(f, now);
            if acts.is_empty() && f.cached && f.read_past_known_end(end, a.size) {
                acts = p.read_past_end(f);
            }
            acts
        });
        let mut a = a.clone();
        if !pre.is_empty() {
            // Revalidation may drop cached blocks: no read in between.
            let _alone = st.gate.write().await;
            self.run(&st, a.handle, pre, &mut a).await?;
        }
        let _shared = st.gate.read().await;
        let st = self.state(&a).await?;
        if let Some((p, chunk)) = Self::cas_of(&st) {
            return self.cas_read(&a, p, chunk, offset, buf).await;
        }
        if !st.file.cached {
            // The size and the bytes as the servers have them now (this
            // node's writes not yet reported count too). The data path
            // takes the size as well: a larger one from before another
            // node cut the file made each data server's part look short
            // (`consistency=posix` readers got EIO, "stripes … are
            // missing", after every rewrite elsewhere).
            let server = self.getattr(a.handle).await?;
            let size = self
                .with_file(a.handle, |_, f| Some(f.size_for(view(&server))))
                .unwrap_or(server.size);
            self.data.set_size(a.handle, size, false);
            let end = size.min(offset.saturating_add(buf.len() as u64));
            if offset >= end {
                return Ok(0);
            }
            let got = self.data.read(a.handle, offset, end - offset).await?;
            buf[..got.len()].copy_from_slice(&got);
            return Ok(got.len());
        }
        let end = st
            .file
            .landed_size()
            .max(a.size)
            .min(offset.saturating_add(buf.len() as u64));
        if offset >= end {
            return Ok(0);
        }
        let n = (end - offset) as usize;
        if self.interleaved(st.policies.cooperative) {
            let size = st.file.landed_size().max(a.size);
            let version = st.file.version;
            self.interleaved_read(&st.pool, a.handle, offset, &mut buf[..n], size, version)
                .await?;
            // The homes' caches see no stream: read-ahead asks for the next
            // block as one-block-ahead does.
            if matches!(
                st.policies.prefetch,
                PrefetchKind::OneBlockAhead | PrefetchKind::ReadAhead
            ) {
                let bs = self.cache.block_size as u64;
                let next = end.div_ceil(bs) * bs;
                self.interleaved_prefetch(&st, a.handle, next, (next + bs).min(size), version);
            }
            return Ok(n);
        }
        if self.discretionary(a.handle, st.policies.cooperative) {
            self.discretionary_read(&st.pool, a.handle, st.policies.cooperative, offset, &mut buf[..n])
                .await?;
            return Ok(n);
        }
        if random && self.reads_around(&st, a.handle, offset, &mut buf[..n]).await {
            return Ok(n);
        }
        st.pool
            .read(a.handle, offset, &mut buf[..n])
            .await
            .map_err(|e| from_driver(self.what(a.handle), e))?;
        if matches!(st.policies.cooperative, CooperativeKind::NChance { .. }) {
            self.referenced(a.handle, offset, n as u64);
        }
        Ok(n)
    }
}

/// A write counted at its file ([`NodeFile::begin_write`]) until its bytes
/// land or it fails: dropped, it marks the write landed.
struct Landing<'a>(&'a Fs, u64, u64);

impl Drop for Landing<'_> {
    fn drop(&mut self) {
        let Landing(fs, handle, n) = *self;
        fs.with_file(handle, |_, f| f.write_landed(n));
    }
}
