//! Content-addressed files (`store=cas`, Vilayannur et al. 2005 §3.3–3.4):
//! a file is a recipe of chunk hashes at the metadata server; chunks live
//! on the data servers by hash (server = hash mod servers). A write stores
//! its new chunks first, then commits `(chunk, old hash, new hash)`; a
//! refused commit (another writer came first) is redone on the current
//! chunks, so every write lands whole or not at all. The node keeps an
//! H-cache of hashes (as the file's CAPFS plug-in says) and a D-cache of
//! chunks by hash (a hit needs no server, whatever file it came from).

use crate::{Fs, FsError, Result};
use parcache_core::consistency::capfs::{CapfsParams, HCache, HOLE};
use parcache_driver::join_all;
use parcache_proto::{Attr, ChunkHash, ErrorCode, Request, Response};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};

/// Hashes the node's H-cache holds (the paper capped hashes per file).
const HCACHE_HASHES: usize = 1 << 16;
/// Bytes of chunks the node's D-cache holds.
const DCACHE_BYTES: usize = 64 << 20;
/// Bytes of chunks in one request to a data server.
const BATCH_BYTES: usize = 4 << 20;
/// Chunk changes in one commit (72 bytes each encoded, well inside a
/// message): a write commits whole up to this many chunks (256 MiB of
/// 16 KiB chunks); a larger one commits in parts.
pub(crate) const COMMIT_CHANGES: usize = 16_384;
/// Tries of a write whose commit keeps being refused.
const COMMIT_TRIES: u32 = 64;

/// The node's caches for content-addressed files, and the commits that
/// `delay_commit` holds back, by file.
pub(crate) struct Cas {
    hcache: Mutex<HCache>,
    dcache: Mutex<DCache>,
    delayed: Mutex<HashMap<u64, Delayed>>,
}

/// A file's changes stored but not committed yet (`delay_commit`, 2005
/// §3.6): per chunk the hash before the first of them and the newest; the
/// size the writes reached. This node reads through them.
#[derive(Default)]
struct Delayed {
    changes: std::collections::BTreeMap<u64, (ChunkHash, ChunkHash)>,
    size: u64,
}

/// Chunks by hash, least recently stored out first.
#[derive(Default)]
struct DCache {
    chunks: HashMap<ChunkHash, Vec<u8>>,
    order: VecDeque<ChunkHash>,
    bytes: usize,
}

impl DCache {
    fn get(&self, h: &ChunkHash) -> Option<Vec<u8>> {
        self.chunks.get(h).cloned()
    }
    fn put(&mut self, h: ChunkHash, bytes: Vec<u8>) {
        if self.chunks.contains_key(&h) {
            return;
        }
        self.bytes += bytes.len();
        self.chunks.insert(h, bytes);
        self.order.push_back(h);
        while self.bytes > DCACHE_BYTES {
            let Some(old) = self.order.pop_front() else { break };
            if let Some(b) = self.chunks.remove(&old) {
                self.bytes -= b.len();
            }
        }
    }
}

impl Default for Cas {
    fn default() -> Self {
        Cas {
            hcache: Mutex::new(HCache::new(HCACHE_HASHES)),
            dcache: Mutex::new(DCache::default()),
            delayed: Mutex::new(HashMap::new()),
        }
    }
}

impl Cas {
    /// Drops the file's cached hashes (an invalidation, or a refused commit).
    pub(crate) fn drop_hashes(&self, handle: u64) {
        self.hcache.lock().invalidate(handle);
    }
}

/// The data server that keeps a chunk.
fn server_of(h: &ChunkHash, servers: usize) -> u32 {
    (u64::from_le_bytes(h[..8].try_into().expect("8 bytes")) % servers.max(1) as u64) as u32
}

impl Fs {
    /// Hashes of chunks `from..to` of the file: from the H-cache where the
    /// plug-in keeps one, else from the metadata server in runs of
    /// `num_hashes`.
    async fn hashes(&self, handle: u64, p: CapfsParams, from: u64, to: u64) -> Result<Vec<ChunkHash>> {
        let mut known: HashMap<u64, ChunkHash> = HashMap::new();
        if p.use_hcache {
            let mut hc = self.cas.hcache.lock();
            for i in from..to {
                if let Some(h) = hc.get(handle, i) {
                    known.insert(i, h);
                }
            }
        }
        let mut i = from;
        while i < to {
            if known.contains_key(&i) {
                i += 1;
                continue;
            }
            let count = (to - i).min(p.num_hashes as u64);
            if p.registers_holders() {
                self.answer_callbacks();
            }
            let req = Request::Hashes {
                handle,
                from: i,
                count,
                node: self.node,
                register: p.registers_holders(),
            };
            let got = match self.md(&self.what(handle), req).await? {
                Response::Hashes(h) => h,
                other => return Err(FsError::Protocol(format!("unexpected reply to Hashes: {other:?}"))),
            };
            let mut hc = self.cas.hcache.lock();
            for (k, h) in got.into_iter().enumerate() {
                let at = i + k as u64;
                if p.use_hcache {
                    hc.put(handle, at, h);
                }
                known.insert(at, h);
            }
            i += count;
        }
        // This node's delayed changes come first: it reads its own writes.
        let delayed = self.cas.delayed.lock();
        let mine = delayed.get(&handle).map(|d| &d.changes);
        Ok((from..to)
            .map(|i| match mine.and_then(|m| m.get(&i)) {
                Some((_, new)) => *new,
                None => known.get(&i).copied().unwrap_or(HOLE),
            })
            .collect())
    }

    /// Chunks' bytes: holes are zeros, the D-cache's need no server, the
    /// rest come from their data servers in one request per server (of at
    /// most [`BATCH_BYTES`]), all in flight at once.
    async fn chunks(&self, hashes: &[ChunkHash], chunk: usize) -> Result<Vec<Vec<u8>>> {
        let mut out: Vec<Option<Vec<u8>>> = vec![None; hashes.len()];
        let mut want: HashMap<u32, Vec<usize>> = HashMap::new();
        {
            let dc = self.cas.dcache.lock();
            for (k, h) in hashes.iter().enumerate() {
                if *h == HOLE {
                    out[k] = Some(vec![0; chunk]);
                } else if let Some(b) = dc.get(h) {
                    out[k] = Some(b);
                } else {
                    want.entry(server_of(h, self.data.servers())).or_default().push(k);
                }
            }
        }
        let per = (BATCH_BYTES / chunk.max(1)).max(1);
        let mut asks = Vec::new();
        let mut order = Vec::new();
        for (&s, ks) in &want {
            for ks in ks.chunks(per) {
                asks.push(self.get_chunks(s, ks.iter().map(|&k| hashes[k]).collect()));
                order.push(ks.to_vec());
            }
        }
        let fetched: Vec<Vec<(usize, Vec<u8>)>> = futures_join(asks)
            .await?
            .into_iter()
            .zip(order)
            .map(|(got, ks)| ks.into_iter().zip(got).collect())
            .collect();
        let mut dc = self.cas.dcache.lock();
        for (k, bytes) in fetched.into_iter().flatten() {
            dc.put(hashes[k], bytes.clone());
            out[k] = Some(bytes);
        }
        Ok(out.into_iter().map(|b| b.expect("every chunk filled")).collect())
    }

    /// Stores chunks on their data servers (durable at the file's next fsync), in
    /// one request per server (of at most [`BATCH_BYTES`]), all in flight
    /// at once; returns their hashes.
    async fn put_chunks(&self, chunks: Vec<Vec<u8>>) -> Result<Vec<ChunkHash>> {
        let hashes: Vec<ChunkHash> = chunks.iter().map(|b| parcache_store_hash(b)).collect();
        let mut by_server: HashMap<u32, Vec<usize>> = HashMap::new();
        for (k, h) in hashes.iter().enumerate() {
            by_server.entry(server_of(h, self.data.servers())).or_default().push(k);
        }
        let per = (BATCH_BYTES / chunks.first().map_or(1, |c| c.len().max(1))).max(1);
        let mut puts = Vec::new();
        for (&s, ks) in &by_server {
            for ks in ks.chunks(per) {
                let lens = ks.iter().map(|&k| chunks[k].len() as u32).collect();
                let payload: Vec<u8> = ks.iter().flat_map(|&k| chunks[k].iter().copied()).collect();
                puts.push(self.put_batch(s, lens, payload, ks.iter().map(|&k| hashes[k]).collect()));
            }
        }
        futures_join(puts).await?;
        let mut dc = self.cas.dcache.lock();
        for (h, b) in hashes.iter().zip(chunks) {
            dc.put(*h, b);
        }
        Ok(hashes)
    }

    /// One `GetChunks` request: the chunks' bytes, in order.
    async fn get_chunks(&self, s: u32, hashes: Vec<ChunkHash>) -> Result<Vec<Vec<u8>>> {
        let n = hashes.len();
        match self.data.call(s, &Request::GetChunks { hashes }, &[]).await? {
            (Response::Chunks { lens }, bytes) if lens.len() == n => {
                let mut at = 0;
                let mut got = Vec::with_capacity(n);
                for l in lens {
                    let l = l as usize;
                    let piece = bytes.get(at..at + l).ok_or_else(|| {
                        FsError::Protocol(format!("data server {s} sent fewer chunk bytes than it said"))
                    })?;
                    got.push(piece.to_vec());
                    at += l;
                }
                Ok(got)
            }
            (Response::Error(e), _) => Err(FsError::Remote {
                path: format!("chunks on data server {s}"),
                code: e.code,
                message: e.message,
            }),
            (other, _) => Err(FsError::Protocol(format!("unexpected reply to GetChunks: {other:?}"))),
        }
    }

    /// One `PutChunks` request; checks the server named them `want`.
    async fn put_batch(&self, s: u32, lens: Vec<u32>, payload: Vec<u8>, want: Vec<ChunkHash>) -> Result<()> {
        match self.data.call(s, &Request::PutChunks { lens }, &payload).await? {
            (Response::ChunksStored { hashes, .. }, _) if hashes == want => Ok(()),
            (Response::ChunksStored { .. }, _) => Err(FsError::Protocol(format!(
                "data server {s} stored chunks under other hashes than their bytes have"
            ))),
            (Response::Error(e), _) => Err(FsError::Remote {
                path: format!("chunks on data server {s}"),
                code: e.code,
                message: e.message,
            }),
            (other, _) => Err(FsError::Protocol(format!("unexpected reply to PutChunks: {other:?}"))),
        }
    }

    /// Writes `data` at `offset` of a content-addressed file: the new
    /// chunks (old bytes where the write covers a chunk in part) are
    /// stored, then committed; a refused commit is redone on the current
    /// chunks. Returns the file's attributes after; `None` when the plug-in
    /// delays commits (the changes wait for [`Fs::cas_commit_delayed`]).
    pub(crate) async fn cas_write(
        &self,
        a: &Attr,
        p: CapfsParams,
        chunk: u32,
        offset: u64,
        data: &[u8],
    ) -> Result<Option<Attr>> {
        let cs = chunk as u64;
        let end = offset + data.len() as u64;
        let (first, last) = (offset / cs, (end - 1) / cs);
        let what = self.what(a.handle);
        for _ in 0..COMMIT_TRIES {
            let old = self.hashes(a.handle, p, first, last + 1).await?;
            // Chunks the write covers in part (the first and last at most)
            // start from their old bytes.
            let partial: Vec<usize> = (first..=last)
                .enumerate()
                .filter(|&(_, i)| offset > i * cs || end < (i + 1) * cs)
                .map(|(k, _)| k)
                .collect();
            let bases = self
                .chunks(&partial.iter().map(|&k| old[k]).collect::<Vec<_>>(), chunk as usize)
                .await?;
            let mut bases: HashMap<usize, Vec<u8>> = partial.into_iter().zip(bases).collect();
            let mut news = Vec::new();
            for (k, i) in (first..=last).enumerate() {
                let (start, stop) = (i * cs, (i + 1) * cs);
                let mut bytes = bases.remove(&k).unwrap_or_else(|| vec![0u8; chunk as usize]);
                let from = offset.max(start);
                let to = end.min(stop);
                bytes[(from - start) as usize..(to - start) as usize]
                    .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
                news.push(bytes);
            }
            let stored = self.put_chunks(news).await?;
            let changes: Vec<(u64, ChunkHash, ChunkHash)> = (first..=last)
                .zip(old.iter().zip(stored))
                .map(|(i, (o, n))| (i, *o, n))
                .collect();
            if p.delay_commit {
                let mut delayed = self.cas.delayed.lock();
                let d = delayed.entry(a.handle).or_default();
                for (i, old, new) in changes {
                    d.changes.entry(i).and_modify(|c| c.1 = new).or_insert((old, new));
                }
                d.size = d.size.max(end);
                return Ok(None);
            }
            let req = Request::Commit {
                handle: a.handle,
                changes: changes.clone(),
                force: p.force_commit,
                size: end,
                node: self.node,
                coherence: p.hcache_coherence,
            };
            match self.md(&what, req).await? {
                Response::Committed { attr, .. } => {
                    tracing::debug!("{what}: committed {} bytes at {offset}", data.len());
                    if p.use_hcache {
                        let mut hc = self.cas.hcache.lock();
                        for (i, _, n) in changes {
                            hc.put(a.handle, i, n);
                        }
                    }
                    return Ok(Some(attr));
                }
                Response::Conflict(current) => {
                    // Another writer committed first: its chunks are the
                    // old ones now (ours stay orphans until collected).
                    let mut hc = self.cas.hcache.lock();
                    hc.invalidate(a.handle);
                    tracing::debug!("{what}: commit refused ({} chunks changed), redone", current.len());
                }
                other => {
                    return Err(FsError::Protocol(format!(
                        "{what}: unexpected reply to Commit: {other:?}"
                    )))
                }
            }
        }
        Err(FsError::Remote {
            path: what,
            code: ErrorCode::Io,
            message: format!(
                "the write's commit was refused {COMMIT_TRIES} times (other writers kept changing the same chunks)"
            ),
        })
    }

    /// Commits the file's delayed changes (stored already) in one forced
    /// commit; nothing when there are none. Returns the attributes after.
    /// A failed commit keeps them for the next close or fsync to retry.
    pub(crate) async fn cas_commit_delayed(&self, handle: u64, p: CapfsParams) -> Result<Option<Attr>> {
        let Some(d) = self.cas.delayed.lock().remove(&handle) else {
            return Ok(None);
        };
        let changes: Vec<(u64, ChunkHash, ChunkHash)> = d.changes.iter().map(|(&i, &(o, n))| (i, o, n)).collect();
        let what = self.what(handle);
        // In parts of COMMIT_CHANGES (each whole; the size goes with the last).
        let mut reply = Ok(Response::Ok);
        let parts = changes.chunks(COMMIT_CHANGES).count();
        for (k, part) in changes.chunks(COMMIT_CHANGES).enumerate() {
            let req = Request::Commit {
                handle,
                changes: part.to_vec(),
                force: true,
                size: if k + 1 == parts { d.size } else { 0 },
                node: self.node,
                coherence: p.hcache_coherence,
            };
            reply = self.md(&what, req).await;
            if !matches!(reply, Ok(Response::Committed { .. })) {
                break;
            }
        }
        match reply {
            Ok(Response::Committed { attr, .. }) => {
                tracing::debug!("{what}: committed {} delayed chunk changes", changes.len());
                if p.use_hcache {
                    let mut hc = self.cas.hcache.lock();
                    for (i, _, n) in changes {
                        hc.put(handle, i, n);
                    }
                }
                Ok(Some(attr))
            }
            other => {
                // Back, under any changes written since (they are newer).
                let mut delayed = self.cas.delayed.lock();
                let now = delayed.entry(handle).or_default();
                for (i, c) in d.changes {
                    now.changes.entry(i).or_insert(c);
                }
                now.size = now.size.max(d.size);
                match other {
                    Err(e) => Err(e),
                    Ok(r) => Err(FsError::Protocol(format!("{what}: unexpected reply to Commit: {r:?}"))),
                }
            }
        }
    }

    /// Reads `buf.len()` bytes at `offset` of a content-addressed file up
    /// to its size as the metadata server has it now.
    pub(crate) async fn cas_read(
        &self,
        a: &Attr,
        p: CapfsParams,
        chunk: u32,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize> {
        let mut size = self.getattr(a.handle).await?.size;
        if let Some(d) = self.cas.delayed.lock().get(&a.handle) {
            size = size.max(d.size);
        }
        let end = size.min(offset.saturating_add(buf.len() as u64));
        if offset >= end {
            return Ok(0);
        }
        let cs = chunk as u64;
        // Zeros wherever the chunks below leave a byte unwritten.
        buf[..(end - offset) as usize].fill(0);
        let (first, last) = (offset / cs, (end - 1) / cs);
        let hashes = self.hashes(a.handle, p, first, last + 1).await?;
        let got = self.chunks(&hashes, chunk as usize).await?;
        for (k, bytes) in got.into_iter().enumerate() {
            let i = first + k as u64;
            let (start, stop) = (i * cs, (i + 1) * cs);
            let from = offset.max(start);
            let to = end.min(stop);
            buf[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&bytes[(from - start) as usize..(to - start) as usize]);
        }
        Ok((end - offset) as usize)
    }

    /// Cuts or extends a content-addressed file: chunks wholly past the new
    /// size become holes, a partly cut one is rewritten with zeros after
    /// the size (so bytes past it never come back), in one forced commit.
    pub(crate) async fn cas_truncate(&self, a: &Attr, p: CapfsParams, chunk: u32, size: u64) -> Result<()> {
        self.cas_commit_delayed(a.handle, p).await?;
        let cs = chunk as u64;
        let old_size = self.getattr(a.handle).await?.size;
        if size >= old_size {
            return Ok(());
        }
        let (first, last) = (size / cs, (old_size - 1) / cs);
        let old = self.hashes(a.handle, p, first, last + 1).await?;
        let mut changes = Vec::new();
        for (k, i) in (first..=last).enumerate() {
            let new = if i * cs < size {
                let mut bytes = self.chunks(&old[k..k + 1], chunk as usize).await?.remove(0);
                bytes[(size - i * cs) as usize..].fill(0);
                self.put_chunks(vec![bytes]).await?[0]
            } else {
                HOLE
            };
            changes.push((i, old[k], new));
        }
        let req = Request::Commit {
            handle: a.handle,
            changes,
            force: true,
            size: 0,
            node: self.node,
            coherence: p.hcache_coherence,
        };
        match self.md(&self.what(a.handle), req).await? {
            Response::Committed { .. } => {
                self.cas.drop_hashes(a.handle);
                Ok(())
            }
            other => Err(FsError::Protocol(format!("unexpected reply to Commit: {other:?}"))),
        }
    }

    /// Removes chunks no recipe names from every data server, of those
    /// stored at least `older_than_secs` ago (younger ones may belong to a
    /// commit on its way). Returns (chunks looked at, chunks removed).
    pub async fn collect_chunks(&self, older_than_secs: u64) -> Result<(u64, u64)> {
        let (mut seen, mut dropped) = (0, 0);
        for s in 0..self.data.servers() as u32 {
            let mut after = None;
            loop {
                let req = Request::ListChunks { older_than_secs, after };
                let listed = match self.data.call(s, &req, &[]).await? {
                    (Response::Hashes(h), _) => h,
                    (other, _) => return Err(FsError::Protocol(format!("data server {s}: {other:?}"))),
                };
                seen += listed.len() as u64;
                after = listed.last().copied();
                for batch in listed.chunks(4096) {
                    let req = Request::Unreferenced { hashes: batch.to_vec() };
                    let unnamed = match self.md("collection", req).await? {
                        Response::Hashes(h) => h,
                        other => {
                            return Err(FsError::Protocol(format!(
                                "unexpected reply to Unreferenced: {other:?}"
                            )))
                        }
                    };
                    if unnamed.is_empty() {
                        continue;
                    }
                    dropped += unnamed.len() as u64;
                    match self.data.call(s, &Request::DropChunks { hashes: unnamed }, &[]).await? {
                        (Response::Ok, _) => {}
                        (other, _) => return Err(FsError::Protocol(format!("data server {s}: {other:?}"))),
                    }
                }
                if listed.len() < parcache_proto::LIST_CHUNKS_PAGE {
                    break;
                }
            }
        }
        Ok((seen, dropped))
    }
}

/// The hash that names a chunk: blake3, as the data servers' chunk store
/// (`parcache_store::chunk_hash`) names them and checks them on every read.
fn parcache_store_hash(bytes: &[u8]) -> ChunkHash {
    *blake3::hash(bytes).as_bytes()
}

/// Runs the futures at once; the first error wins.
async fn futures_join<T>(fs: impl IntoIterator<Item = impl std::future::Future<Output = Result<T>>>) -> Result<Vec<T>> {
    let mut set = Vec::new();
    for f in fs {
        set.push(f);
    }
    let mut out = Vec::with_capacity(set.len());
    for r in join_all(set).await {
        out.push(r?);
    }
    Ok(out)
}
