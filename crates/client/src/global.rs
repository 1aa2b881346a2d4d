//! Discretionary caching on a node (Vilayannur et al. 2003): the bypass
//! bits a file's hints set (setting `bypass`, `parcache hint`, the xattr
//! `user.parcache.bypass`), requests that go around the node's own cache
//! or around the global cache, and this node's share of the global cache
//! (`cooperative=global`): a block's home, by hash over the tier, keeps it
//! in memory for every node; a miss there is fetched from the data servers
//! and kept if the file's runtime bypass admits it (§5). Writes through
//! the global cache go on to the data servers before they are answered
//! (the node's own cache already absorbed them, as the paper's flusher
//! did), so the data servers always hold what the global cache holds, and
//! a request that goes around it never reads stale bytes; a write around
//! it drops the home's copy.
//!
//! The decisions are the core's (`parcache_core::bypass`,
//! `parcache_core::cooperative::global`); this file carries them out.

use crate::{from_driver, Fs, FsError, Result};
use bytes::Bytes;
use parcache_core::bypass::hints::HintList;
use parcache_core::bypass::segments::SegmentMap;
use parcache_core::bypass::{Level, Op, DEFAULT_SEGMENT_BLOCKS};
use parcache_core::cooperative::global::{GlobalCache, Lookup};
use parcache_core::cooperative::{lru_interleaved, CooperativeKind};
use parcache_core::{split_blocks, BlockKey};
use parcache_driver::join_all;
use parcache_proto::{NodeStats, Request, Response};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};

/// This node's share of the global cache: the core's bookkeeping and the
/// bytes.
struct Share {
    cache: GlobalCache,
    bytes: HashMap<BlockKey, Bytes>,
    /// The newest version of each file a request named: an older copy is
    /// dropped when a newer version is named.
    versions: HashMap<u64, u64>,
    /// Per file, a count of writes through or around this share: a fetch
    /// that a write overtook does not put its (older) bytes in.
    writes: HashMap<u64, u64>,
}

/// The node's discretionary caching: hints, decisions, its share, counters.
pub(crate) struct Global {
    hints: Mutex<SegmentMap>,
    share: Mutex<Share>,
    /// Blocks the runtime at their home keeps out: reads of them go around
    /// the global cache from now on (§5: "it is told … to avoid going
    /// through the global cache").
    told: Mutex<HashSet<BlockKey>>,
    local_read_bypasses: AtomicU64,
    local_write_bypasses: AtomicU64,
    global_read_bypasses: AtomicU64,
    global_write_bypasses: AtomicU64,
}

impl Global {
    /// A node whose share of the global cache holds `blocks` blocks.
    pub(crate) fn new(blocks: usize) -> Global {
        Global {
            hints: Mutex::new(SegmentMap::new(DEFAULT_SEGMENT_BLOCKS)),
            share: Mutex::new(Share {
                cache: GlobalCache::new(blocks, DEFAULT_SEGMENT_BLOCKS),
                bytes: HashMap::new(),
                versions: HashMap::new(),
                writes: HashMap::new(),
            }),
            told: Mutex::new(HashSet::new()),
            local_read_bypasses: AtomicU64::new(0),
            local_write_bypasses: AtomicU64::new(0),
            global_read_bypasses: AtomicU64::new(0),
            global_write_bypasses: AtomicU64::new(0),
        }
    }

    /// Sets a file's bits from its `bypass` setting (the rules as the
    /// metadata server holds them; a bad one is ignored as unset).
    pub(crate) fn learn(&self, file: u64, settings: &[(String, String)], block_size: u32) {
        let rules = settings
            .iter()
            .find(|(k, _)| k == "bypass")
            .and_then(|(_, v)| v.parse::<HintList>().ok())
            .unwrap_or_default();
        rules.apply(&mut self.hints.lock(), file, block_size);
    }

    fn hinted(&self, file: u64) -> bool {
        self.hints.lock().hinted(file)
    }

    fn through(&self, key: BlockKey, op: Op, level: Level) -> bool {
        let hinted = self.hints.lock().through(key, op, level);
        hinted && !(level == Level::Global && op == Op::Read && self.told.lock().contains(&key))
    }

    /// Adds the counters to a node's report.
    pub(crate) fn stats(&self, s: &mut NodeStats) {
        s.local_read_bypasses = self.local_read_bypasses.load(Ordering::Relaxed);
        s.local_write_bypasses = self.local_write_bypasses.load(Ordering::Relaxed);
        s.global_read_bypasses = self.global_read_bypasses.load(Ordering::Relaxed);
        s.global_write_bypasses = self.global_write_bypasses.load(Ordering::Relaxed);
        let sh = self.share.lock();
        s.global_hits = sh.cache.stats.hits;
        s.global_misses = sh.cache.stats.misses;
        s.global_kept_out = sh.cache.stats.bypassed;
        for (low, n) in sh.cache.histogram() {
            let i = if low == 0 {
                0
            } else {
                (low.ilog2() as usize + 1).min(11)
            };
            s.segment_counters[i] += n;
        }
    }
}

/// The runtime threshold of a `global` file (`None`: not one).
fn global_threshold(kind: CooperativeKind) -> Option<u32> {
    match kind {
        CooperativeKind::Global { threshold } => Some(threshold),
        _ => None,
    }
}

impl Fs {
    /// Whether a read or write of this file may go around the node's own
    /// cache: it has hints, and its node cache is its own
    /// (`lru-interleaved`'s is the tier's, and ignores local hints).
    pub(crate) fn discretionary(&self, handle: u64, kind: CooperativeKind) -> bool {
        kind != CooperativeKind::LruInterleaved && self.global.hinted(handle)
    }

    /// Whether a file's hints matter here and may have changed elsewhere:
    /// it has some, or it is a `global` file (whose hints reach its global
    /// level too). Others pay no look at the first open.
    pub(crate) fn hints_may_change(&self, handle: u64, kind: CooperativeKind) -> bool {
        matches!(kind, CooperativeKind::Global { .. }) || self.global.hinted(handle)
    }

    /// This node's size and version of a file (for requests to homes).
    fn size_version(&self, handle: u64) -> (u64, u64) {
        self.files
            .lock()
            .get(&handle)
            .map_or((0, 0), |s| (s.file.size, s.file.version))
    }

    /// This node's id in the tier (as `parcache status` lists it).
    pub fn node_id(&self) -> u64 {
        self.node
    }

    /// The node whose share of the global cache holds block `index` of a
    /// file (its home, by hash over the members this node knows).
    pub fn global_home_of(&self, handle: u64, index: u64) -> u64 {
        self.global_home(BlockKey::new(handle, index))
    }

    /// The home of a block in the global cache: its hash over the tier,
    /// this node if it is not in one.
    fn global_home(&self, key: BlockKey) -> u64 {
        lru_interleaved::home(key, &self.tier.members(self.node)).unwrap_or(self.node)
    }

    /// A block from the level below the node's own cache: the global cache
    /// (a `global` file, unless its bits or the runtime say around), or
    /// the data servers.
    pub(crate) async fn fetch_below(&self, key: BlockKey, kind: CooperativeKind) -> Result<Bytes> {
        let from_servers = || async {
            parcache_driver::Below::fetch(&*self.data, key)
                .await
                .map_err(|e| crate::from_below(self.what(key.file), e))
        };
        let Some(threshold) = global_threshold(kind) else {
            return from_servers().await;
        };
        if !self.global.through(key, Op::Read, Level::Global) {
            self.global.global_read_bypasses.fetch_add(1, Ordering::Relaxed);
            return from_servers().await;
        }
        let (size, version) = self.size_version(key.file);
        let home = self.global_home(key);
        if home == self.node {
            let (b, admitted) = self.global_get_here(key, size, version, threshold).await?;
            if !admitted {
                self.global.told.lock().insert(key);
            }
            return Ok(b);
        }
        let req = Request::GlobalGet {
            handle: key.file,
            index: key.index,
            size,
            version,
            threshold,
        };
        match self.call_peer(home, &req, &[]).await {
            Some((Response::GlobalBlock { admitted, .. }, d)) => {
                if !admitted {
                    self.global.told.lock().insert(key);
                }
                Ok(d)
            }
            // A home that cannot answer: the data servers have every byte.
            _ => from_servers().await,
        }
    }

    /// Writes bytes from below the node's own cache: through the global
    /// cache's homes (which write them on to the data servers), or around
    /// them, dropping their copies.
    pub(crate) async fn write_below(&self, handle: u64, offset: u64, data: &[u8], kind: CooperativeKind) -> Result<()> {
        let Some(threshold) = global_threshold(kind) else {
            return self.data.write(handle, offset, data).await;
        };
        let (size, version) = self.size_version(handle);
        let size = size.max(offset + data.len() as u64);
        let bs = self.cache.block_size as u64;
        // Runs of blocks with one home and one bit.
        let mut runs: Vec<((u64, bool), u64, u64)> = Vec::new();
        for p in split_blocks(offset, data.len() as u64, bs as u32) {
            let key = BlockKey::new(handle, p.index);
            let tag = (
                self.global_home(key),
                self.global.through(key, Op::Write, Level::Global),
            );
            let (start, end) = (p.index * bs + p.range.start as u64, p.index * bs + p.range.end as u64);
            match runs.last_mut() {
                Some((t, _, e)) if *t == tag && *e == start => *e = end,
                _ => runs.push((tag, start, end)),
            }
        }
        let parts = runs.into_iter().map(|((home, through), start, end)| async move {
            let bytes = &data[(start - offset) as usize..(end - offset) as usize];
            let (first, last) = (start / bs, (end - 1) / bs);
            if !through {
                self.global
                    .global_write_bypasses
                    .fetch_add(last - first + 1, Ordering::Relaxed);
                self.data.write(handle, start, bytes).await?;
                if home == self.node {
                    self.global_drop_here(handle, first, last);
                } else {
                    let req = Request::GlobalDrop { handle, first, last };
                    self.call_peer(home, &req, &[]).await;
                }
                return Ok(());
            }
            if home == self.node {
                return self
                    .global_put_here(handle, start, bytes, size, version, threshold)
                    .await;
            }
            let req = Request::GlobalPut {
                handle,
                offset: start,
                size,
                version,
                threshold,
            };
            match self.call_peer(home, &req, bytes).await {
                Some((Response::Ok, _)) => Ok(()),
                Some((Response::Error(e), _)) => Err(FsError::Remote {
                    path: self.what(handle),
                    code: e.code,
                    message: format!("node {home:x} writing it through the global cache: {}", e.message),
                }),
                // The home is gone, and its copies with it.
                _ => self.data.write(handle, start, bytes).await,
            }
        });
        for r in join_all(parts).await {
            r?;
        }
        Ok(())
    }

    /// Drops this share's copies of a file a request names a newer version
    /// of, and makes sure the node can reach its data servers.
    async fn global_file(&self, handle: u64, size: u64, version: u64) -> Result<()> {
        {
            let mut sh = self.global.share.lock();
            let known = sh.versions.entry(handle).or_insert(version);
            if *known < version {
                *known = version;
                for k in sh.cache.forget_file(handle) {
                    sh.bytes.remove(&k);
                }
            }
        }
        if !self.files.lock().contains_key(&handle) {
            let a = self.getattr(handle).await?;
            self.state(&a).await?;
        }
        let known = self.files.lock().get(&handle).map_or(0, |s| s.file.size);
        self.data.set_size(handle, size.max(known), false);
        Ok(())
    }

    /// A block through this node's share of the global cache (a peer's
    /// [`Request::GlobalGet`], or this node's own); whether it was admitted.
    pub(crate) async fn global_get_here(
        &self,
        key: BlockKey,
        size: u64,
        version: u64,
        threshold: u32,
    ) -> Result<(Bytes, bool)> {
        self.global_file(key.file, size, version).await?;
        let (admit, seq) = {
            let mut sh = self.global.share.lock();
            match sh.cache.read(key, threshold) {
                Lookup::Hit => {
                    if let Some(b) = sh.bytes.get(&key) {
                        return Ok((b.clone(), true));
                    }
                    sh.cache.invalidate(key);
                    (true, sh.writes.get(&key.file).copied().unwrap_or(0))
                }
                Lookup::Miss { admit } => (admit, sh.writes.get(&key.file).copied().unwrap_or(0)),
            }
        };
        let b = parcache_driver::Below::fetch(&*self.data, key)
            .await
            .map_err(|e| crate::from_below(self.what(key.file), e))?;
        if admit {
            let mut sh = self.global.share.lock();
            if sh.writes.get(&key.file).copied().unwrap_or(0) == seq {
                for gone in sh.cache.insert(key, threshold) {
                    sh.bytes.remove(&gone);
                }
                sh.bytes.insert(key, b.clone());
            }
        }
        Ok((b, admit))
    }

    /// Writes bytes through this node's share: on to the data servers,
    /// then into the copies it holds (or a whole block it admits).
    pub(crate) async fn global_put_here(
        &self,
        handle: u64,
        offset: u64,
        data: &[u8],
        size: u64,
        version: u64,
        threshold: u32,
    ) -> Result<()> {
        self.global_file(handle, size, version).await?;
        self.data.write(handle, offset, data).await?;
        let bs = self.cache.block_size;
        let mut sh = self.global.share.lock();
        *sh.writes.entry(handle).or_default() += 1;
        for p in split_blocks(offset, data.len() as u64, bs) {
            let key = BlockKey::new(handle, p.index);
            let at = (p.index * bs as u64 + p.range.start as u64 - offset) as usize;
            let piece = &data[at..at + p.range.len() as usize];
            let held = sh.cache.contains(key);
            if !sh.cache.write(key, threshold) {
                continue;
            }
            if held {
                let mut v = sh.bytes.get(&key).map(|b| b.to_vec()).unwrap_or_default();
                if v.len() < p.range.end as usize {
                    v.resize(p.range.end as usize, 0);
                }
                v[p.range.start as usize..p.range.end as usize].copy_from_slice(piece);
                sh.bytes.insert(key, Bytes::from(v));
            } else if p.range.len() == bs {
                for gone in sh.cache.insert(key, threshold) {
                    sh.bytes.remove(&gone);
                }
                sh.bytes.insert(key, Bytes::copy_from_slice(piece));
            }
        }
        Ok(())
    }

    /// Drops this share's copies of blocks `first..=last` (written around).
    pub(crate) fn global_drop_here(&self, handle: u64, first: u64, last: u64) {
        let mut sh = self.global.share.lock();
        *sh.writes.entry(handle).or_default() += 1;
        for i in first..=last {
            let key = BlockKey::new(handle, i);
            sh.cache.invalidate(key);
            sh.bytes.remove(&key);
        }
    }

    /// A read of a hinted file: blocks whose bits say around the node's
    /// cache (and that it does not hold) come from below without entering
    /// it; the rest go through it.
    pub(crate) async fn discretionary_read(
        &self,
        pool: &crate::Pool,
        handle: u64,
        kind: CooperativeKind,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let bs = self.cache.block_size as u64;
        let mut rest = &mut *buf;
        let mut parts = Vec::new();
        for p in split_blocks(offset, rest.len() as u64, bs as u32) {
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(p.range.len() as usize);
            rest = tail;
            let key = BlockKey::new(handle, p.index);
            let around = !self.global.through(key, Op::Read, Level::Local) && !pool.holds(key);
            parts.push(async move {
                if around {
                    self.global.local_read_bypasses.fetch_add(1, Ordering::Relaxed);
                    let b = self.fetch_below(key, kind).await?;
                    let r = p.range.start as usize..p.range.end as usize;
                    let have = b.len().min(r.end).saturating_sub(r.start);
                    mine[..have].copy_from_slice(&b[r.start..r.start + have]);
                    mine[have..].fill(0);
                    return Ok(());
                }
                pool.read(handle, p.index * bs + p.range.start as u64, mine)
                    .await
                    .map_err(|e| from_driver(self.what(handle), e))
            });
        }
        for r in join_all(parts).await {
            r?;
        }
        Ok(())
    }

    /// A write of a hinted file: blocks whose bits say around the node's
    /// cache (and that it does not hold) go below at once; the rest into
    /// the node cache.
    pub(crate) async fn discretionary_write(
        &self,
        pool: &crate::Pool,
        handle: u64,
        kind: CooperativeKind,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        let bs = self.cache.block_size as u64;
        let parts = split_blocks(offset, data.len() as u64, bs as u32).map(|p| {
            let key = BlockKey::new(handle, p.index);
            let at = p.index * bs + p.range.start as u64;
            let bytes = &data[(at - offset) as usize..(at - offset) as usize + p.range.len() as usize];
            let around = !self.global.through(key, Op::Write, Level::Local) && !pool.holds(key);
            async move {
                if around {
                    self.global.local_write_bypasses.fetch_add(1, Ordering::Relaxed);
                    self.write_below(handle, at, bytes, kind).await?;
                    // A prefetch may have begun fetching the old bytes.
                    pool.discard_clean_block(key).await;
                    return Ok(());
                }
                pool.write(handle, at, bytes)
                    .await
                    .map_err(|e| from_driver(self.what(handle), e))
            }
        });
        for r in join_all(parts.collect::<Vec<_>>()).await {
            r?;
        }
        Ok(())
    }

    /// Answers a peer's global cache request.
    pub(crate) async fn serve_global(&self, req: Request, data: Bytes) -> Result<(Response, Bytes)> {
        match req {
            Request::GlobalGet {
                handle,
                index,
                size,
                version,
                threshold,
            } => {
                let (b, admitted) = self
                    .global_get_here(BlockKey::new(handle, index), size, version, threshold)
                    .await?;
                Ok((
                    Response::GlobalBlock {
                        len: b.len() as u64,
                        admitted,
                    },
                    b,
                ))
            }
            Request::GlobalPut {
                handle,
                offset,
                size,
                version,
                threshold,
            } => {
                self.global_put_here(handle, offset, &data, size, version, threshold)
                    .await?;
                Ok((Response::Ok, Bytes::new()))
            }
            Request::GlobalDrop { handle, first, last } => {
                self.global_drop_here(handle, first, last);
                Ok((Response::Ok, Bytes::new()))
            }
            other => Err(FsError::Protocol(format!("not a global cache request: {other:?}"))),
        }
    }
}
