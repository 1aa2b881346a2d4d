//! The node's place in the cooperative tier (Cortes, Girona & Labarta 1996
//! §3): a mount sends the metadata server a heartbeat with its counters
//! every few seconds and learns the members from the answer, so `parcache
//! status` lists the nodes and a node that dies drops out of the tier once
//! silent. A node in the tier answers its peers on its own authenticated
//! listener (`Peer*` requests), served by [`PeerHandler`].
//!
//! The decisions (which node is a block's home, who holds what, where an
//! evicted last copy goes) are the core's (`parcache_core::cooperative`);
//! this file carries them out: [`NodeBelow`] is the node cache's level
//! below (`n-chance`/`greedy` ask a holding peer before the data servers,
//! and forward evicted last copies), and [`Fs::interleaved_read`] /
//! [`Fs::interleaved_write`] send each block of a request to its home
//! (`lru-interleaved`).

use crate::data::DataPath;
use crate::peer::Peer;
use crate::{Fs, FsError, Result};
use bytes::Bytes;
use parcache_core::cooperative::membership::{HEARTBEAT, NODE_SILENT};
use parcache_core::cooperative::{lru_interleaved, CooperativeKind, Members};
use parcache_core::{split_blocks, BlockKey};
use parcache_driver::{join_all, Below, BelowError};
use parcache_proto::{ErrorCode, NodeStats, Request, Response, Secret};
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Evicted last copies on their way to peers at once: the paper's 16
/// auxiliary buffers for delayed forwards (1996 §6.2). With all busy, a
/// last copy is dropped rather than forwarded: the cache never waits.
const FORWARDS_IN_FLIGHT: usize = 16;

/// What this node knows of the tier and has counted.
#[derive(Default)]
pub(crate) struct Tier {
    /// Where this node answers its peers (empty: not in the tier).
    addr: Mutex<String>,
    /// The members that answer peers, with their addresses, as the last
    /// heartbeat's answer listed them.
    members: Mutex<Vec<(u64, String)>>,
    /// Peers found unreachable: left out of placement until then (the
    /// metadata server drops them within [`NODE_SILENT`]).
    down: Mutex<HashMap<u64, Instant>>,
    peers: Mutex<HashMap<u64, Arc<Peer>>>,
    /// `n-chance`: the file version of each block this node caches for the
    /// tier, and how often it was forwarded since last read.
    held: Mutex<HashMap<BlockKey, (u64, u8)>>,
    /// `lru-interleaved`: the homes holding this node's writes of a file
    /// that a close or fsync must push down.
    written_at: Mutex<HashMap<u64, BTreeSet<u64>>>,
    /// Forwards on their way (at most [`FORWARDS_IN_FLIGHT`]).
    forwarding: std::sync::atomic::AtomicUsize,
    remote_hits: AtomicU64,
    /// Of those, the ones the node cache fetched from a peer (`n-chance`);
    /// `lru-interleaved`'s go around it.
    fetched_from_peers: AtomicU64,
    forwards: AtomicU64,
    recirculations: AtomicU64,
    served: AtomicU64,
}

impl Tier {
    fn joined(&self) -> bool {
        !self.addr.lock().is_empty()
    }

    /// The members placement uses now: those listed, less the ones found
    /// down lately; always this node itself once it joined.
    pub(crate) fn members(&self, me: u64) -> Members {
        let now = Instant::now();
        let mut down = self.down.lock();
        down.retain(|_, until| *until > now);
        let listed = self.members.lock();
        Members::new(
            listed
                .iter()
                .map(|(n, _)| *n)
                .filter(|n| !down.contains_key(n))
                .chain(std::iter::once(me)),
        )
    }

    fn peer(&self, node: u64, secret: &Secret) -> Option<Arc<Peer>> {
        let addr = self.members.lock().iter().find(|(n, _)| *n == node)?.1.clone();
        let mut peers = self.peers.lock();
        let p = peers
            .entry(node)
            .or_insert_with(|| {
                let p = Peer::new(format!("node {node:x}"), addr, secret.clone());
                p.set_retries(1);
                Arc::new(p)
            })
            .clone();
        Some(p)
    }

    /// A peer did not answer: leave it out of placement for a while.
    fn found_down(&self, node: u64) {
        tracing::warn!("node {node:x} of the cooperative tier does not answer; leaving it out");
        self.down
            .lock()
            .insert(node, Instant::now() + Duration::from_nanos(NODE_SILENT.0));
        self.peers.lock().remove(&node);
    }
}

impl Fs {
    /// The node's counters: summed over its cache's pools, and the tier's.
    pub fn node_stats(&self) -> NodeStats {
        let mut s = NodeStats::default();
        let t = &self.tier;
        s.remote_hits = t.remote_hits.load(Ordering::Relaxed);
        for (_, c) in self.cache_stats() {
            // Prefetch hits are read hits already.
            s.local_hits += c.read_hits;
            s.server_reads += c.fetches;
        }
        // A fetch a peer answered did not reach the data servers.
        s.server_reads = s
            .server_reads
            .saturating_sub(t.fetched_from_peers.load(Ordering::Relaxed));
        s.forwards = t.forwards.load(Ordering::Relaxed);
        s.recirculations = t.recirculations.load(Ordering::Relaxed);
        s.served = t.served.load(Ordering::Relaxed);
        self.global.stats(&mut s);
        self.nv_counters(&mut s);
        let l = self.data.local_read_stats();
        s.local_part_reads = l.reads;
        s.local_part_refused = l.refused;
        s.local_part_short = l.short;
        s.server_page_reads = l.server_pages;
        s
    }

    /// Starts sending heartbeats as `name` (a mount passes its mount
    /// point), until this `Fs` is dropped. A heartbeat that fails (the
    /// metadata server restarting) is simply sent again at the next beat.
    pub fn heartbeat(&self, name: String) {
        let me = self.me.clone();
        let (mds, node) = (self.mds.clone(), self.node);
        tokio::spawn(async move {
            loop {
                let Some(fs) = me.upgrade() else { return };
                let beat = Request::Heartbeat {
                    node,
                    name: name.clone(),
                    addr: fs.tier.addr.lock().clone(),
                    stats: Box::new(fs.node_stats()),
                };
                let tier = fs.clone();
                drop(fs);
                match mds.call(&beat, &[]).await {
                    Ok((Response::Nodes(nodes), _)) => {
                        let listed = nodes
                            .into_iter()
                            .filter(|n| !n.addr.is_empty() && n.node != node)
                            .map(|n| (n.node, n.addr))
                            .collect();
                        *tier.tier.members.lock() = listed;
                    }
                    Ok(_) => {}
                    Err(e) => tracing::debug!("heartbeat: {e}"),
                }
                drop(tier);
                tokio::time::sleep(Duration::from_nanos(HEARTBEAT.0)).await;
            }
        });
    }

    /// Makes this node a member of the cooperative tier: it answers its
    /// peers on a listener at `bind` (port 0: any), authenticated with the
    /// cluster secret, and then sends heartbeats as `name`. Returns the
    /// address it listens on.
    pub async fn join_tier(&self, name: String, bind: &str) -> Result<String> {
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .map_err(|e| FsError::Protocol(format!("cooperative tier: cannot listen on {bind}: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| FsError::Protocol(format!("cooperative tier: {e}")))?
            .to_string();
        *self.tier.addr.lock() = addr.clone();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let handler = Arc::new(PeerHandler(self.me.clone(), stop));
        tokio::spawn(parcache_proto::serve(listener, self.secret.clone(), handler, stopped));
        self.heartbeat(name);
        Ok(addr)
    }

    /// Leaves the tier (before an unmount): the metadata server stops
    /// listing this node at once, and its peers stop placing blocks on it
    /// at their next heartbeat. It still answers peers until dropped.
    pub async fn leave_tier(&self) -> Result<()> {
        if self.tier.joined() {
            self.md("leave", Request::Leave { node: self.node }).await?;
        }
        Ok(())
    }

    /// Calls peer `node`; `None` if it is not reachable (it is then left
    /// out of placement).
    pub(crate) async fn call_peer(&self, node: u64, req: &Request, data: &[u8]) -> Option<(Response, Bytes)> {
        let peer = self.tier.peer(node, &self.secret)?;
        match peer.call(req, data).await {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::debug!("peer {node:x}: {e}");
                self.tier.found_down(node);
                None
            }
        }
    }

    /// Whether a file's blocks are placed by home (`lru-interleaved`) on
    /// this node: it must be in the tier.
    pub(crate) fn interleaved(&self, kind: CooperativeKind) -> bool {
        kind == CooperativeKind::LruInterleaved && self.tier.joined()
    }

    /// The bytes `offset..offset + len` of a file as runs of consecutive
    /// blocks with one home: (home, start, end), in order.
    fn runs_by_home(&self, handle: u64, offset: u64, len: u64) -> Vec<(u64, u64, u64)> {
        let bs = self.cache.block_size as u64;
        let members = self.tier.members(self.node);
        let mut runs: Vec<(u64, u64, u64)> = Vec::new();
        for p in split_blocks(offset, len, bs as u32) {
            let start = p.index * bs + p.range.start as u64;
            let end = p.index * bs + p.range.end as u64;
            let home = lru_interleaved::home(BlockKey::new(handle, p.index), &members).unwrap_or(self.node);
            match runs.last_mut() {
                Some((h, _, e)) if *h == home && *e == start => *e = end,
                _ => runs.push((home, start, end)),
            }
        }
        runs
    }

    /// `lru-interleaved` read: each block is read through its home's cache
    /// (1996 §3.2), the homes all at once; a home that does not answer is
    /// left out and its blocks read through this node. `size` and
    /// `version`: the file as this node knows it.
    pub(crate) async fn interleaved_read(
        &self,
        pool: &crate::Pool,
        handle: u64,
        offset: u64,
        buf: &mut [u8],
        size: u64,
        version: u64,
    ) -> Result<()> {
        let bs = self.cache.block_size;
        let runs = self.runs_by_home(handle, offset, buf.len() as u64);
        let mut rest = &mut *buf;
        let mut parts = Vec::new();
        for &(home, start, end) in &runs {
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut((end - start) as usize);
            rest = tail;
            parts.push(async move {
                if home != self.node {
                    let req = Request::PeerRead {
                        handle,
                        offset: start,
                        len: end - start,
                        size,
                        version,
                    };
                    if let Some((Response::Data { .. }, d)) = self.call_peer(home, &req, &[]).await {
                        let n = d.len().min(mine.len());
                        mine[..n].copy_from_slice(&d[..n]);
                        mine[n..].fill(0);
                        let blocks = (end - 1) / bs as u64 - start / bs as u64 + 1;
                        self.tier.remote_hits.fetch_add(blocks, Ordering::Relaxed);
                        return Ok(());
                    }
                }
                pool.read(handle, start, mine)
                    .await
                    .map_err(|e| crate::from_driver(self.what(handle), e))
            });
        }
        for r in join_all(parts).await {
            r?;
        }
        Ok(())
    }

    /// `lru-interleaved` write: each block goes into its home's cache, whose
    /// write policy takes it down; a close or fsync here pushes the homes
    /// ([`Fs::interleaved_flush`]).
    pub(crate) async fn interleaved_write(
        &self,
        pool: &crate::Pool,
        handle: u64,
        offset: u64,
        data: &[u8],
        size: u64,
        version: u64,
    ) -> Result<()> {
        let runs = self.runs_by_home(handle, offset, data.len() as u64);
        let parts = runs.iter().map(|&(home, start, end)| async move {
            let bytes = &data[(start - offset) as usize..(end - offset) as usize];
            if home != self.node {
                let req = Request::PeerWrite {
                    handle,
                    offset: start,
                    size,
                    version,
                };
                if let Some((Response::Ok, _)) = self.call_peer(home, &req, bytes).await {
                    self.tier.written_at.lock().entry(handle).or_default().insert(home);
                    return Ok(());
                }
            }
            // This node is the home (or stands in for one): its write
            // holds the file's `serving` lock shared, as a peer's does, so
            // a peer's newer version cannot drop it unwritten between the
            // drop's write-back and its discard.
            let serving = self.files.lock().get(&handle).map(|s| s.serving.clone());
            let _shared = match &serving {
                Some(l) => Some(l.read().await),
                None => None,
            };
            pool.write(handle, start, bytes)
                .await
                .map_err(|e| crate::from_driver(self.what(handle), e))
        });
        for r in join_all(parts).await {
            r?;
        }
        Ok(())
    }

    /// Has every home holding this node's writes of the file write them
    /// down (a close or fsync here). A home that died with them loses
    /// them, as this node's own death would: an error, as a failed
    /// write-back is.
    pub(crate) async fn interleaved_flush(&self, handle: u64) -> Result<()> {
        let Some(homes) = self.tier.written_at.lock().remove(&handle) else {
            return Ok(());
        };
        let calls = homes.into_iter().map(|home| async move {
            match self.call_peer(home, &Request::PeerFlush { handle }, &[]).await {
                Some((Response::Ok, _)) => Ok(()),
                Some((Response::Error(e), _)) => Err(FsError::Remote {
                    path: self.what(handle),
                    code: e.code,
                    message: format!("node {home:x} writing it down: {}", e.message),
                }),
                _ => Err(FsError::Remote {
                    path: self.what(handle),
                    code: ErrorCode::Io,
                    message: format!("node {home:x}, which held written blocks of it, is gone"),
                }),
            }
        });
        for r in join_all(calls).await {
            r?;
        }
        Ok(())
    }

    /// `lru-interleaved` prefetch: reads bytes `from..to` through their
    /// homes in the background, so each home fetches its blocks ahead of
    /// the reader (one block ahead, or the whole file at open). Demand
    /// reads do not wait for it.
    pub(crate) fn interleaved_prefetch(
        &self,
        st: &crate::files::FileState,
        handle: u64,
        from: u64,
        to: u64,
        version: u64,
    ) {
        if from >= to {
            return;
        }
        let Some(fs) = self.me.upgrade() else { return };
        let pool = st.pool.clone();
        let size = st.file.size.max(to);
        tokio::spawn(async move {
            let mut at = from;
            while at < to {
                let n = (to - at).min(1 << 20);
                let mut scratch = vec![0u8; n as usize];
                if let Err(e) = fs
                    .interleaved_read(&pool, handle, at, &mut scratch, size, version)
                    .await
                {
                    tracing::debug!("prefetch of {}: {e}", fs.what(handle));
                    return;
                }
                at += n;
            }
        });
    }

    /// `n-chance`: a program here read these bytes, so their blocks start
    /// their chances anew (1996 §4: a forwarded block that is referenced
    /// is no longer a recirculating one).
    pub(crate) fn referenced(&self, handle: u64, offset: u64, len: u64) {
        let bs = self.cache.block_size;
        let mut held = self.tier.held.lock();
        for p in split_blocks(offset, len, bs) {
            if let Some(h) = held.get_mut(&BlockKey::new(handle, p.index)) {
                h.1 = 0;
            }
        }
    }

    /// Tells every other member that this node's report moved the file to
    /// `version`, so homes whose blocks it wrote keep them (else they would
    /// drop them at the next reader's newer version).
    pub(crate) async fn interleaved_reported(&self, handle: u64, version: u64) {
        let others: Vec<u64> = self
            .tier
            .members(self.node)
            .nodes()
            .iter()
            .copied()
            .filter(|&n| n != self.node)
            .collect();
        let req = Request::PeerReported { handle, version };
        join_all(others.into_iter().map(|n| self.call_peer(n, &req, &[]))).await;
    }

    /// This node's state of a file a peer asks about (it may never have
    /// opened it), with cached blocks dropped if the peer knows a newer
    /// version of it than this node does; with the file's `serving` lock
    /// held shared, for the caller to keep while it reads or writes the
    /// pool. The drop runs alone and checks the version again: two pieces
    /// of one write at a newer version (the kernel splits an unaligned
    /// 1 MiB direct write so) each dropped the blocks, the second the
    /// first's bytes with them, unwritten (the `lru-interleaved` test read
    /// a block of zeros but its last page once in 15 runs).
    async fn served_file(
        &self,
        handle: u64,
        version: u64,
    ) -> Result<(crate::files::FileState, tokio::sync::OwnedRwLockReadGuard<()>)> {
        let known = self.files.lock().get(&handle).cloned();
        let st = match known {
            Some(st) => st,
            None => {
                let a = self.getattr(handle).await?;
                self.state(&a).await?
            }
        };
        let behind = || self.files.lock().get(&handle).is_some_and(|s| s.file.version < version);
        let shared = st.serving.clone().read_owned().await;
        if !behind() {
            return Ok((self.files.lock().get(&handle).cloned().unwrap_or(st), shared));
        }
        drop(shared);
        {
            let _alone = st.serving.write().await;
            if behind() {
                let a = self.getattr(handle).await?;
                self.write_back(&st.pool, handle).await?;
                st.pool.discard_file(handle, 0).await;
                self.revalidated_by_peer(handle, &a);
            }
        }
        let shared = st.serving.clone().read_owned().await;
        Ok((self.files.lock().get(&handle).cloned().unwrap_or(st), shared))
    }

    async fn serve(&self, req: Request, data: Bytes) -> Result<(Response, Bytes)> {
        self.tier.served.fetch_add(1, Ordering::Relaxed);
        match req {
            Request::PeerRead {
                handle,
                offset,
                len,
                size,
                version,
            } => {
                let (st, _shared) = self.served_file(handle, version).await?;
                self.data.set_size(handle, size.max(st.file.size), false);
                let mut out = vec![0u8; len as usize];
                st.pool
                    .read(handle, offset, &mut out)
                    .await
                    .map_err(|e| crate::from_driver(self.what(handle), e))?;
                Ok((Response::Data { len }, Bytes::from(out)))
            }
            Request::PeerWrite {
                handle,
                offset,
                size,
                version,
            } => {
                let (st, _shared) = self.served_file(handle, version).await?;
                self.data.set_size(handle, size.max(st.file.size), false);
                st.pool
                    .write(handle, offset, &data)
                    .await
                    .map_err(|e| crate::from_driver(self.what(handle), e))?;
                Ok((Response::Ok, Bytes::new()))
            }
            Request::PeerFlush { handle } => {
                let pool = self.files.lock().get(&handle).map(|s| s.pool.clone());
                if let Some(pool) = pool {
                    self.write_back(&pool, handle).await?;
                }
                Ok((Response::Ok, Bytes::new()))
            }
            Request::PeerReported { handle, version } => {
                self.peer_reported(handle, version);
                Ok((Response::Ok, Bytes::new()))
            }
            Request::PeerGet { handle, index, version } => {
                let key = BlockKey::new(handle, index);
                let held = self.tier.held.lock().get(&key).copied();
                let pool = self.files.lock().get(&handle).map(|s| s.pool.clone());
                match (held, pool) {
                    (Some((v, _)), Some(pool)) if v == version => match pool.peek(key) {
                        Some(b) => Ok((Response::Data { len: b.len() as u64 }, b)),
                        None => Ok((Response::error(ErrorCode::NotFound, "not cached"), Bytes::new())),
                    },
                    _ => Ok((Response::error(ErrorCode::NotFound, "not cached"), Bytes::new())),
                }
            }
            Request::PeerForward {
                handle,
                index,
                version,
                recirculations,
            } => {
                let known = self.files.lock().get(&handle).cloned();
                let st = match known {
                    Some(st) => st,
                    None => {
                        let a = self.getattr(handle).await?;
                        self.state(&a).await?
                    }
                };
                // The copy is taken in only at the version this node has
                // validated: an older one, evicted before another node's
                // change, would be served to this node's reads as current.
                // Under the file's gate, shared: a revalidation that drops
                // the blocks holds it alone, so a copy is either in before
                // the drop (and dropped) or meets the new version.
                let _shared = st.gate.read().await;
                let current = self.files.lock().get(&handle).map(|s| s.file.version);
                let key = BlockKey::new(handle, index);
                if current == Some(version) && st.pool.adopt(key, &data) {
                    self.tier.held.lock().insert(key, (version, recirculations));
                }
                Ok((Response::Ok, Bytes::new()))
            }
            req @ (Request::GlobalGet { .. } | Request::GlobalPut { .. } | Request::GlobalDrop { .. }) => {
                self.serve_global(req, data).await
            }
            other => Ok((
                Response::error(ErrorCode::BadRequest, format!("a node does not answer {other:?}")),
                Bytes::new(),
            )),
        }
    }
}

/// Answers a node's peers.
struct PeerHandler(Weak<Fs>, tokio::sync::watch::Sender<bool>);

impl parcache_proto::Handler for PeerHandler {
    async fn handle(&self, req: Request, data: Bytes) -> (Response, Bytes) {
        let Some(fs) = self.0.upgrade() else {
            let _ = self.1.send(true);
            return (Response::error(ErrorCode::Io, "this node is leaving"), Bytes::new());
        };
        match fs.serve(req, data).await {
            Ok(r) => r,
            Err(e) => (
                Response::error(e.code().unwrap_or(ErrorCode::Io), e.to_string()),
                Bytes::new(),
            ),
        }
    }
}

/// The node cache's level below: the data servers, and for `n-chance` and
/// `greedy` files first a peer holding the block (1996 §4).
pub(crate) struct NodeBelow {
    pub(crate) data: Arc<DataPath>,
    pub(crate) fs: Weak<Fs>,
    pub(crate) kind: CooperativeKind,
    /// The pool of `nv=on` files: blocks go down durably, and the node's
    /// durable write cache marks them clean then.
    pub(crate) nv: bool,
}

impl NodeBelow {
    fn chances(&self) -> Option<u8> {
        match self.kind {
            CooperativeKind::NChance { n } => Some(n),
            _ => None,
        }
    }

    /// A peer's copy of the block, if the directory names a holder that
    /// has it at this node's version of the file.
    async fn ask_holder(&self, fs: &Fs, key: BlockKey, version: u64) -> Option<Bytes> {
        let req = Request::TierLookup {
            handle: key.file,
            index: key.index,
            node: fs.node,
        };
        let holder = match fs.mds.call(&req, &[]).await {
            Ok((Response::Holder(h), _)) => h?,
            _ => return None,
        };
        let get = Request::PeerGet {
            handle: key.file,
            index: key.index,
            version,
        };
        match fs.call_peer(holder, &get, &[]).await {
            Some((Response::Data { .. }, d)) => Some(d),
            _ => None,
        }
    }
}

impl Below for NodeBelow {
    async fn write(&self, key: BlockKey, pieces: Vec<(u32, Bytes)>) -> std::result::Result<(), BelowError> {
        if self.nv {
            let fs = self.fs.upgrade().ok_or_else(|| BelowError {
                errno: 5,
                message: "the node client is shutting down".into(),
            })?;
            return fs.nv_write_down(key, pieces).await;
        }
        if let (CooperativeKind::Global { .. }, Some(fs)) = (self.kind, self.fs.upgrade()) {
            let base = key.index * fs.cache.block_size as u64;
            let calls = pieces
                .iter()
                .map(|(at, d)| fs.write_below(key.file, base + *at as u64, d, self.kind));
            for r in join_all(calls).await {
                r.map_err(crate::data::below_err)?;
            }
            return Ok(());
        }
        Below::write(&*self.data, key, pieces).await
    }

    async fn fetch(&self, key: BlockKey) -> std::result::Result<Bytes, BelowError> {
        if let Some(fs) = self.fs.upgrade() {
            fs.hold_block(key.file, key.index).await;
        }
        if let (CooperativeKind::Global { .. }, Some(fs)) = (self.kind, self.fs.upgrade()) {
            return fs.fetch_below(key, self.kind).await.map_err(crate::data::below_err);
        }
        let fs = match (self.chances(), self.fs.upgrade()) {
            (Some(_), Some(fs)) if fs.tier.joined() => fs,
            _ => return Below::fetch(&*self.data, key).await,
        };
        let version = fs.files.lock().get(&key.file).map_or(0, |s| s.file.version);
        let got = match self.ask_holder(&fs, key, version).await {
            Some(d) => {
                fs.tier.remote_hits.fetch_add(1, Ordering::Relaxed);
                fs.tier.fetched_from_peers.fetch_add(1, Ordering::Relaxed);
                d
            }
            None => Below::fetch(&*self.data, key).await?,
        };
        fs.tier.held.lock().insert(key, (version, 0));
        Ok(got)
    }

    /// The data servers' blocks land in the cache's buffer
    /// ([`DataPath`]'s); a block that may come from the global cache or a
    /// peer is fetched and copied in.
    async fn fetch_into(
        &self,
        key: BlockKey,
        buf: parcache_proto::Block,
        prefetch: bool,
    ) -> (parcache_proto::Block, std::result::Result<usize, BelowError>) {
        let fs = self.fs.upgrade();
        let elsewhere = matches!(self.kind, CooperativeKind::Global { .. })
            || (self.chances().is_some() && fs.as_ref().is_some_and(|fs| fs.tier.joined()));
        if elsewhere {
            return parcache_driver::copied(buf, self.fetch(key).await);
        }
        if let Some(fs) = fs {
            fs.hold_block(key.file, key.index).await;
        }
        // Local reads only where no peer's cache takes part.
        let local = self.kind == CooperativeKind::None;
        self.data.fetch_into_maybe_here(key, buf, prefetch, local).await
    }

    fn discarded(&self, file: u64) {
        Below::discarded(&*self.data, file);
    }

    fn wants_evictions(&self) -> bool {
        self.chances().is_some()
    }

    fn evicted(&self, key: BlockKey, data: Bytes) {
        let (Some(n), Some(fs)) = (self.chances(), self.fs.upgrade()) else {
            return;
        };
        let Some((version, recirculations)) = fs.tier.held.lock().remove(&key) else {
            return;
        };
        if !fs.tier.joined() {
            return;
        }
        if fs.tier.forwarding.fetch_add(1, Ordering::SeqCst) >= FORWARDS_IN_FLIGHT {
            fs.tier.forwarding.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        tokio::spawn(async move {
            fs.forward(key, data, n, version, recirculations).await;
            fs.tier.forwarding.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

impl Fs {
    /// Asks the directory where an evicted last copy goes, and sends it.
    async fn forward(&self, key: BlockKey, data: Bytes, n: u8, version: u64, recirculations: u8) {
        let req = Request::TierEvicted {
            handle: key.file,
            index: key.index,
            node: self.node,
            n,
            recirculations,
        };
        let Ok((Response::Forward(Some((to, recirculations))), _)) = self.mds.call(&req, &[]).await else {
            return;
        };
        let fwd = Request::PeerForward {
            handle: key.file,
            index: key.index,
            version,
            recirculations,
        };
        if self.call_peer(to, &fwd, &data).await.is_some() {
            self.tier.forwards.fetch_add(1, Ordering::Relaxed);
            if recirculations > 1 {
                self.tier.recirculations.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
