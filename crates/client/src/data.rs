//! The data path below the node cache: striped reads and writes of file
//! bytes on the data servers, with the requests to different servers in
//! flight at once, and bounded retries of a server that went away.

use crate::local_part::{LocalParts, LocalReadStats, MayBlock};
use crate::peer::Peer;
use crate::read_batch::{Piece, ReadQueue};
use crate::write_batch::WriteQueue;
use crate::{FsError, Result};
use bytes::Bytes;
use parcache_core::{BlockKey, StripeLayout};
use parcache_driver::{copied, join_all, Below, BelowError};
use parcache_proto::{ErrorReply, Payload, Request, Response, Secret, SMALL_COPY_MAX};
use parking_lot::Mutex as SyncMutex;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock, Weak};

/// Has the metadata server write a file that lives there out to its data
/// servers (`Request::Materialize`).
pub type WriteOut = Arc<dyn Fn(u64) -> Pin<Box<dyn Future<Output = Result<()>> + Send>> + Send + Sync>;

/// Asks the metadata server for a small file's content, if it holds a
/// current copy (`GetAttrPolicy`).
pub type ContentOf = Arc<dyn Fn(u64) -> Pin<Box<dyn Future<Output = Result<Option<Bytes>>> + Send>> + Send + Sync>;

/// A write's bytes: lent by the caller, or shared by reference count.
#[derive(Clone, Copy)]
enum Src<'a> {
    Slice(&'a [u8]),
    Shared(&'a Bytes),
}

/// One server's share of a write: where it starts there, and its chunks.
type ServerPart = (u64, Vec<std::ops::Range<usize>>);

/// A file's placement: its stripe layout and the data servers it uses.
#[derive(Clone, Debug)]
pub struct Placement {
    pub layout: StripeLayout,
    pub servers: Vec<u32>,
}

/// The connections to the data servers, and where each open file's
/// stripes are (the node cache's level below).
pub struct DataPath {
    iods: Vec<Arc<Peer>>,
    /// Each data server's queue of buffered whole-block writes.
    batches: Vec<Arc<WriteQueue>>,
    /// Each data server's queue of block fetches.
    reads: Vec<Arc<ReadQueue>>,
    placements: SyncMutex<HashMap<u64, Known>>,
    /// Files this node created (this process) and has sent no write,
    /// truncate or extension for: none of their parts can come from it.
    fresh: SyncMutex<HashSet<u64>>,
    /// Files whose content this node's report left on the metadata server
    /// alone (`WrittenInline`), with that content: the write-back of the
    /// same bytes that follows sends nothing.
    on_metadata: SyncMutex<HashMap<u64, Bytes>>,
    /// How a file that may live on the metadata server is written out.
    write_out: OnceLock<WriteOut>,
    /// How a small file that may live on the metadata server is read there.
    content_of: OnceLock<ContentOf>,
    block_size: u32,
    /// For each file this node changed at data servers (writes, truncates,
    /// extensions of its parts) since a sync covered it: per server, the
    /// counts of that server's changes before and after them
    /// ([`crate::peer::Peer::may_have_lost`]). A server whose machine
    /// crashed may have lost them; the file's `fsync` then says `EIO`
    /// ([`DataPath::check_kept`]).
    unsynced: SyncMutex<HashMap<u64, Vec<Unsynced>>>,
    /// Part files of data servers on this machine that this node reads
    /// itself.
    local: LocalParts,
    me: Weak<DataPath>,
}

/// A data server, and the window of its change counts around a file's
/// changes there that no sync has covered.
type Unsynced = (u32, (u64, u64));

/// Files noted in [`DataPath::unsynced`] past which a sync of every data
/// server, in the background, lets the covered ones go (a copy of a big
/// tree that never syncs).
const UNSYNCED_NOTED: usize = 4096;

/// Most files kept as [`DataPath::fresh`]: past it, a new file is not
/// kept (its removal then asks its data servers, as any other).
const FRESH_MAX: usize = 1 << 16;

/// What the data path knows of a file this node uses.
#[derive(Clone)]
struct Known {
    placement: Placement,
    /// The file's size as the metadata server last told this node: each
    /// server's part must be at least as long as this size makes it, so a
    /// read of less than that finds stripes missing (and fails).
    size: u64,
    /// For each server of the layout, the end (in the server's part) of
    /// what this node wrote there since the file's size last moved
    /// under it: which parts a growth of the file leaves short.
    written: Vec<u64>,
    /// The file may live on the metadata server alone (its policies allow
    /// it, and this node did not have it written out since): while it is
    /// small, this node reads it there ([`DataPath::content_on_metadata`])
    /// and has it written out before it changes its parts
    /// ([`DataPath::written_out`]).
    may_live: bool,
    /// The metadata server refused to keep the file from this node: its
    /// closes and truncates do not ask again (a file that does not live
    /// there never comes to).
    refused: bool,
}

impl DataPath {
    /// `local_reads`: read a random reader's missed blocks from the part
    /// files of data servers on this machine ([`crate::local_part`]).
    pub fn new(addrs: Vec<String>, secret: Secret, block_size: u32, local_reads: bool) -> Arc<Self> {
        Arc::new_cyclic(|me| DataPath::made(addrs, secret, block_size, local_reads, me.clone()))
    }

    fn made(addrs: Vec<String>, secret: Secret, block_size: u32, local_reads: bool, me: Weak<DataPath>) -> Self {
        let iods: Vec<Arc<Peer>> = addrs
            .into_iter()
            .enumerate()
            .map(|(i, addr)| Arc::new(Peer::new(format!("data server {i}"), addr, secret.clone())))
            .collect();
        DataPath {
            local: LocalParts::new(local_reads, iods.len()),
            batches: iods
                .iter()
                .enumerate()
                .map(|(i, p)| WriteQueue::new(p.clone(), i as u32, block_size))
                .collect(),
            reads: iods
                .iter()
                .enumerate()
                .map(|(i, p)| ReadQueue::new(p.clone(), i as u32, block_size))
                .collect(),
            iods,
            placements: SyncMutex::new(HashMap::new()),
            fresh: SyncMutex::new(HashSet::new()),
            on_metadata: SyncMutex::new(HashMap::new()),
            write_out: OnceLock::new(),
            content_of: OnceLock::new(),
            block_size,
            unsynced: SyncMutex::new(HashMap::new()),
            me,
        }
    }

    pub fn servers(&self) -> usize {
        self.iods.len()
    }

    pub fn set_retries(&self, n: u32) {
        for p in &self.iods {
            p.set_retries(n);
        }
    }

    /// Learns a file's placement and its size at the metadata server;
    /// `may_live`: its policies let it live on the metadata server.
    pub fn place(&self, handle: u64, p: Placement, size: u64, may_live: bool) {
        let n = p.servers.len();
        self.placements.lock().entry(handle).or_insert(Known {
            placement: p,
            size,
            written: vec![0; n],
            may_live,
            refused: false,
        });
    }

    /// How files that may live on the metadata server are written out
    /// (set once, by the client that owns this data path).
    pub fn set_write_out(&self, f: WriteOut, g: ContentOf) {
        let _ = self.write_out.set(f);
        let _ = self.content_of.set(g);
    }

    /// Whether the file may live on the metadata server alone and is small
    /// as this node knows it (see [`DataPath::written_out`]).
    fn maybe_on_metadata(&self, handle: u64) -> bool {
        self.placements
            .lock()
            .get(&handle)
            .is_some_and(|k| k.may_live && k.size <= SMALL_COPY_MAX && !(k.size == 0 && self.untouched(handle)))
    }

    /// Before this node reads a small file's parts at its data servers: a
    /// file that may live on the metadata server is read there instead, if
    /// it holds a current copy (a read writes nothing out, so it works on a
    /// full disk too: found with one). `None`: read the data servers.
    async fn content_on_metadata(&self, handle: u64) -> Result<Option<Bytes>> {
        if !self.maybe_on_metadata(handle) {
            return Ok(None);
        }
        match self.content_of.get() {
            Some(f) => f(handle).await,
            None => Ok(None),
        }
    }

    /// Before this node changes a file's parts at its data servers (a
    /// write, extension or truncate): a file that may live on the metadata
    /// server alone, small as this node knows it, is written out there
    /// first (once; a file written out never lives there again). A file
    /// this node created and sent nothing for yet is not asked about: only
    /// a report from another node could have left it there, and the
    /// metadata server then refuses this node's close, whose push then has
    /// it written out, or its report (an error) rather than lose either.
    async fn written_out(&self, handle: u64) -> Result<()> {
        if !self.maybe_on_metadata(handle) {
            return Ok(());
        }
        if let Some(f) = self.write_out.get() {
            f(handle).await?;
        }
        self.on_metadata.lock().remove(&handle);
        if let Some(k) = self.placements.lock().get_mut(&handle) {
            k.may_live = false;
        }
        Ok(())
    }

    /// This node's report left the file's `content` on the metadata server
    /// alone: the write-back of those same bytes sends nothing, and the
    /// file is written out before its parts are touched.
    pub fn lives_on_metadata(&self, handle: u64, content: Bytes) {
        self.kept_on_metadata(handle);
        self.on_metadata.lock().insert(handle, content);
    }

    /// The metadata server holds the file alone (after this node's report
    /// or truncate there): written out before its parts are touched, even
    /// while empty.
    pub fn kept_on_metadata(&self, handle: u64) {
        if let Some(k) = self.placements.lock().get_mut(&handle) {
            k.may_live = true;
        }
        self.fresh.lock().remove(&handle);
    }

    /// Whether the file may live on the metadata server alone as far as
    /// this node knows (its policies allow it).
    pub fn may_live(&self, handle: u64) -> bool {
        self.placements
            .lock()
            .get(&handle)
            .is_some_and(|k| k.may_live && !k.refused)
    }

    /// Whether a truncate of the file to `size` may be done on the
    /// metadata server alone (`TruncateInline`): it may live there and is
    /// small, as is `size`.
    pub fn may_cut_on_metadata(&self, handle: u64, size: u64) -> bool {
        size <= SMALL_COPY_MAX
            && self
                .placements
                .lock()
                .get(&handle)
                .is_some_and(|k| k.may_live && !k.refused && k.size <= SMALL_COPY_MAX)
    }

    /// The metadata server refused to keep the file: another node may have
    /// left it there, so even a file this node made and sent nothing for
    /// is written out before its parts are touched.
    pub fn refused_on_metadata(&self, handle: u64) {
        self.fresh.lock().remove(&handle);
        if let Some(k) = self.placements.lock().get_mut(&handle) {
            k.refused = true;
        }
    }

    /// The write-back that followed [`DataPath::lives_on_metadata`] is done.
    pub fn settled_on_metadata(&self, handle: u64) {
        self.on_metadata.lock().remove(&handle);
    }

    /// Whether a write-back of block `key`'s `pieces` writes only bytes the
    /// metadata server holds as the file's content already.
    fn held_on_metadata(&self, key: BlockKey, pieces: &[(u32, Bytes)]) -> bool {
        if key.index != 0 {
            return false;
        }
        let held = self.on_metadata.lock();
        let Some(c) = held.get(&key.file) else {
            return false;
        };
        pieces.iter().all(|(at, b)| {
            let at = *at as usize;
            at + b.len() <= c.len() && c[at..at + b.len()] == b[..]
        })
    }

    /// The file's size at the metadata server is `size` now. `reset`: the
    /// file changed in ways this node did not see (another node's truncate),
    /// so what it wrote before tells nothing of its parts' lengths.
    pub fn set_size(&self, handle: u64, size: u64, reset: bool) {
        if let Some(k) = self.placements.lock().get_mut(&handle) {
            k.size = size;
            if reset {
                k.written.iter_mut().for_each(|w| *w = 0);
            }
        }
    }

    /// Before a size that grows the file from `old` to `new` is reported:
    /// every part the growth lengthens that this node's own writes do not
    /// reach is extended (a hole at its end), all at once, so each part is
    /// as long as the file's size says.
    pub async fn extend_parts(&self, handle: u64, old: u64, new: u64) -> Result<()> {
        if new <= old {
            return Ok(());
        }
        self.written_out(handle).await?;
        self.touch(handle);
        let k = self.known(handle)?;
        let calls = k.placement.servers.iter().enumerate().filter_map(|(pos, &s)| {
            let want = k.placement.layout.server_bytes(new, pos as u32);
            let short = want > k.placement.layout.server_bytes(old, pos as u32) && k.written[pos] < want;
            short.then_some(async move {
                let req = Request::Extend { handle, len: want };
                match self.noting(handle, s, self.call(s, &req, &[])).await? {
                    (Response::Ok, _) => Ok(()),
                    (Response::Error(e), _) => Err(server_error(&format!("handle {handle}"), s, e)),
                    (other, _) => Err(FsError::Protocol(format!("unexpected reply to Extend: {other:?}"))),
                }
            })
        });
        for r in join_all(calls).await {
            r?;
        }
        Ok(())
    }

    pub fn forget(&self, handle: u64) {
        self.local.forget(handle);
        self.placements.lock().remove(&handle);
        self.fresh.lock().remove(&handle);
        self.on_metadata.lock().remove(&handle);
    }

    /// This node created the file just now.
    pub fn created(&self, handle: u64) {
        let mut f = self.fresh.lock();
        if f.len() < FRESH_MAX {
            f.insert(handle);
        }
    }

    /// Whether this node created the file and has sent its data servers
    /// nothing for it since.
    pub fn untouched(&self, handle: u64) -> bool {
        self.fresh.lock().contains(&handle)
    }

    /// A write, truncate or extension of the file is about to go to its
    /// data servers.
    fn touch(&self, handle: u64) {
        self.fresh.lock().remove(&handle);
        // The change may be logged at a data server, where its part's
        // file lacks it.
        self.local.forget(handle);
    }

    /// Counters of this node's local reads.
    pub fn local_read_stats(&self) -> LocalReadStats {
        self.local.stats()
    }

    /// Tells when a thread may make a local read itself
    /// ([`crate::local_part`]), and how many may run at once: a mount
    /// says, when no request waits that no other thread will take.
    pub fn set_local_may_block(&self, f: MayBlock, at_once: usize) {
        self.local.set_may_block(f, at_once);
    }

    /// Whether block `index` of `handle` (not in the node cache) may be
    /// read around it ([`LocalParts::admits_around`]).
    pub(crate) fn admits_around(&self, handle: u64, index: u64) -> bool {
        self.local.admits_around(handle, index)
    }

    /// Reads `out.len()` bytes at `offset` of `handle`, which lie in block
    /// `index` and one stripe unit, around the node cache: from the part
    /// file of a data server on this machine ([`LocalParts::read_pages`]),
    /// or else only their pages from the data server
    /// ([`Request::ReadPages`]). False: read them the usual way.
    pub(crate) async fn read_pages_here(&self, handle: u64, offset: u64, index: u64, out: &mut [u8]) -> bool {
        if self.maybe_on_metadata(handle) {
            return false;
        }
        let Ok(k) = self.known(handle) else {
            return false;
        };
        let mut chunks = k.placement.layout.chunks(offset, out.len() as u64);
        let (Some(c), None) = (chunks.next(), chunks.next()) else {
            return false;
        };
        let pos = c.server as usize;
        let s = k.placement.servers[pos];
        let (off, len) = (c.server_offset, c.len);
        if self.local.may_try(s)
            && self
                .local
                .read_pages(self, (s, handle), (off, need(&k, pos, off, len)), index, out)
                .await
        {
            return true;
        }
        // From the data server: only the pages, around its cache too.
        let (first, end) = crate::local_part::page_span(off, len);
        let req = Request::ReadPages {
            handle,
            offset: first,
            len: end - first,
            need: need(&k, pos, first, end - first),
        };
        match self.call(s, &req, &[]).await {
            Ok((Response::Data { .. }, d)) => {
                crate::local_part::copy_out(out, &d, (off - first) as usize);
                self.local.read_at_server(handle, index);
                true
            }
            // The usual read says what is wrong.
            _ => false,
        }
    }

    fn placement(&self, handle: u64) -> Result<Placement> {
        Ok(self.known(handle)?.placement)
    }

    fn known(&self, handle: u64) -> Result<Known> {
        self.placements
            .lock()
            .get(&handle)
            .cloned()
            .ok_or_else(|| FsError::Protocol(format!("handle {handle} is not open on this node")))
    }

    /// Calls data server `i`, reconnecting (a bounded number of times) if it went away.
    pub async fn call(&self, i: u32, req: &Request, data: &[u8]) -> Result<(Response, Bytes)> {
        self.call_with(i, req, Payload::Slice(data)).await
    }

    /// [`DataPath::call`] with a borrowed or shared payload.
    async fn call_with(&self, i: u32, req: &Request, data: Payload<'_>) -> Result<(Response, Bytes)> {
        let iod = self.iods.get(i as usize).ok_or_else(|| {
            FsError::Protocol(format!(
                "layout names data server {i}, the cluster has {}",
                self.iods.len()
            ))
        })?;
        iod.call_with(req, data).await
    }

    /// Writes `data` at file `offset`: one request per data server (its
    /// chunks of the range are contiguous on it), all in flight at once;
    /// returns when every one holds its part in its write log and cache,
    /// visible to every node; [`DataPath::sync`] makes it durable.
    pub async fn write(&self, handle: u64, offset: u64, data: &[u8]) -> Result<()> {
        self.write_with(handle, offset, data, false).await
    }

    /// [`DataPath::write`], or with `durable` one that returns once every
    /// server's part is durable in its log (`nv=on` files: Biswas et al.
    /// 1993 §2.2, a block leaves a node's NV cache only for stable storage).
    pub async fn write_with(&self, handle: u64, offset: u64, data: &[u8], durable: bool) -> Result<()> {
        self.write_payload(handle, offset, Src::Slice(data), durable).await
    }

    /// [`DataPath::write_with`] of bytes shared by reference count: a
    /// server's part that is one piece of them is sent uncopied.
    pub async fn write_shared(&self, handle: u64, offset: u64, data: &Bytes, durable: bool) -> Result<()> {
        self.write_payload(handle, offset, Src::Shared(data), durable).await
    }

    async fn write_payload(&self, handle: u64, offset: u64, data: Src<'_>, durable: bool) -> Result<()> {
        self.written_out(handle).await?;
        self.touch(handle);
        let all: &[u8] = match data {
            Src::Slice(d) => d,
            Src::Shared(b) => b,
        };
        if all.is_empty() {
            return Ok(());
        }
        let p = self.placement(handle)?;
        // Each server's chunks of the range are contiguous on it: one
        // request each, copied into one buffer only when there are several.
        let mut parts: Vec<Option<ServerPart>> = vec![None; p.servers.len()];
        for c in p.layout.chunks(offset, all.len() as u64) {
            let range = (c.file_offset - offset) as usize..(c.file_offset - offset + c.len) as usize;
            match &mut parts[c.server as usize] {
                Some((_, v)) => v.push(range),
                part => *part = Some((c.server_offset, vec![range])),
            }
        }
        let calls = parts.into_iter().enumerate().filter_map(|(pos, part)| {
            let (server_offset, ranges) = part?;
            // A borrowed piece stays borrowed (the frame copies it once).
            let buf: std::result::Result<Bytes, &[u8]> = match (ranges.as_slice(), data) {
                ([one], Src::Shared(b)) => Ok(b.slice(one.clone())),
                ([one], Src::Slice(d)) => Err(&d[one.clone()]),
                (many, _) => Ok(many
                    .iter()
                    .flat_map(|r| &all[r.clone()])
                    .copied()
                    .collect::<Vec<u8>>()
                    .into()),
            };
            let req = if durable {
                Request::Write {
                    handle,
                    offset: server_offset,
                }
            } else {
                Request::WriteBuffered {
                    handle,
                    offset: server_offset,
                }
            };
            let s = p.servers[pos];
            Some(self.noting(handle, s, async move {
                if let (Ok(b), false, Some(q)) = (&buf, durable, self.batches.get(s as usize)) {
                    // Buffered and shared: with what else waits for it.
                    return q.write(handle, server_offset, b.clone()).await;
                }
                let payload = match &buf {
                    Ok(b) => Payload::Shared(b),
                    Err(d) => Payload::Slice(d),
                };
                match self.call_with(s, &req, payload).await? {
                    (Response::Written { .. }, _) => Ok(()),
                    (Response::Error(e), _) => Err(server_error(&format!("handle {handle}"), s, e)),
                    (other, _) => Err(FsError::Protocol(format!("unexpected reply to Write: {other:?}"))),
                }
            }))
        });
        for r in join_all(calls).await {
            r?;
        }
        if let Some(k) = self.placements.lock().get_mut(&handle) {
            for c in p.layout.chunks(offset, all.len() as u64) {
                let w = &mut k.written[c.server as usize];
                *w = (*w).max(c.server_offset + c.len);
            }
        }
        Ok(())
    }

    /// Reads `len` bytes at `offset` (holes and bytes past a server's end
    /// read as zeros), one request per data server, all at once.
    pub async fn read(&self, handle: u64, offset: u64, len: u64) -> Result<Vec<u8>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        if let Some(c) = self.content_on_metadata(handle).await? {
            let mut out = vec![0u8; len as usize];
            let from = (offset as usize).min(c.len());
            let n = (c.len() - from).min(out.len());
            out[..n].copy_from_slice(&c[from..from + n]);
            return Ok(out);
        }
        let k = self.known(handle)?;
        let p = &k.placement;
        let chunks: Vec<_> = p.layout.chunks(offset, len).collect();
        let mut spans: Vec<Option<(u64, u64)>> = vec![None; p.servers.len()];
        for c in &chunks {
            let s = &mut spans[c.server as usize];
            match s {
                Some((_, n)) => *n += c.len,
                None => *s = Some((c.server_offset, c.len)),
            }
        }
        let calls = spans.iter().enumerate().map(|(pos, sp)| {
            let sp = *sp;
            let k = &k;
            async move {
                let Some((off, n)) = sp else { return Ok(Bytes::new()) };
                self.read_span(handle, k, pos, off, n).await
            }
        });
        let got: Vec<Bytes> = join_all(calls).await.into_iter().collect::<Result<_>>()?;
        let mut out = vec![0u8; len as usize];
        let mut used = vec![0u64; p.servers.len()];
        for c in &chunks {
            let src = &got[c.server as usize];
            let from = used[c.server as usize] as usize;
            used[c.server as usize] += c.len;
            let dst = (c.file_offset - offset) as usize;
            let have = src.len().saturating_sub(from).min(c.len as usize);
            out[dst..dst + have].copy_from_slice(&src[from..from + have]);
        }
        Ok(out)
    }

    /// Reads `len` bytes at `offset` as [`DataPath::read`] does; a range on
    /// one data server in one piece (a node cache's block) is the server's
    /// answer itself, not copied into a new buffer, and shorter than `len`
    /// where the server's part ends (the rest reads as zeros).
    pub async fn read_piece(&self, handle: u64, offset: u64, len: u64) -> Result<Bytes> {
        if let Some(c) = self.content_on_metadata(handle).await? {
            let from = (offset as usize).min(c.len());
            let to = offset.saturating_add(len).min(c.len() as u64) as usize;
            return Ok(c.slice(from..to.max(from)));
        }
        let k = self.known(handle)?;
        let mut chunks = k.placement.layout.chunks(offset, len);
        match (chunks.next(), chunks.next()) {
            (Some(c), None) => {
                let pos = c.server as usize;
                let s = k.placement.servers[pos];
                let need = need(&k, pos, c.server_offset, c.len);
                let mut got = match self.reads.get(s as usize) {
                    Some(q) => q.read(handle, c.server_offset, c.len, need).await?,
                    None => self.read_span(handle, &k, pos, c.server_offset, c.len).await?,
                };
                got.truncate(c.len as usize);
                Ok(got)
            }
            _ => Ok(self.read(handle, offset, len).await?.into()),
        }
    }

    /// Bytes `off..off + n` of the part on the layout's server `pos`: what
    /// the part holds of them (short at its end).
    async fn read_span(&self, handle: u64, k: &Known, pos: usize, off: u64, n: u64) -> Result<Bytes> {
        let s = k.placement.servers[pos];
        let req = Request::Read {
            handle,
            offset: off,
            len: n,
            need: need(k, pos, off, n),
        };
        match self.call(s, &req, &[]).await? {
            (Response::Data { .. }, d) => Ok(d),
            (Response::Error(e), _) => Err(server_error(&format!("handle {handle}"), s, e)),
            (other, _) => Err(FsError::Protocol(format!("unexpected reply to Read: {other:?}"))),
        }
    }

    /// Sets the length of each data server's part of a file of `size` bytes.
    pub async fn truncate(&self, handle: u64, size: u64) -> Result<()> {
        self.written_out(handle).await?;
        self.touch(handle);
        let p = self.placement(handle)?;
        for (pos, &s) in p.servers.iter().enumerate() {
            let len = p.layout.server_bytes(size, pos as u32);
            self.noting(handle, s, self.call(s, &Request::Truncate { handle, len }, &[]))
                .await?;
        }
        Ok(())
    }

    /// Returns when everything the file's data servers acknowledged is
    /// durable (each syncs its write log; all at once).
    /// Has each data server of the file's layout sync: those this node
    /// changed something on since its last sync there, or (`every`) all
    /// of them, when other nodes wrote the file's bytes down for this one
    /// (its cooperative tier's homes), which this node's counts miss.
    pub async fn sync(&self, handle: u64, every: bool) -> Result<()> {
        let p = self.placement(handle)?;
        self.sync_on(&p.servers, &format!("handle {handle}"), every).await
    }

    /// Has each of `servers` sync its write log, all at once; `what` names
    /// the file (or the whole node) in errors. A server this node changed
    /// nothing at since its last sync there is not asked
    /// ([`crate::peer::Peer::sync_due`]): an `fsync` costs only the
    /// servers its file's writes went to, not every one of the layout.
    pub async fn sync_servers(&self, servers: &[u32], what: &str) -> Result<()> {
        self.sync_on(servers, what, false).await
    }

    /// [`DataPath::sync_servers`]; `every`: each of `servers`, due or not.
    pub(crate) async fn sync_on(&self, servers: &[u32], what: &str, every: bool) -> Result<()> {
        let calls = servers.iter().filter_map(|&s| {
            // A server the layout names and the cluster lacks: the call's
            // error says so.
            let due = match self.iods.get(s as usize) {
                Some(iod) if every => Some(iod.sync_mark()),
                Some(iod) => Some(iod.sync_due()?),
                None => None,
            };
            Some(async move {
                match self.call(s, &Request::Sync, &[]).await? {
                    (Response::Ok, _) => {
                        if let Some(due) = due {
                            self.iods[s as usize].synced(due);
                        }
                        Ok(())
                    }
                    (Response::Error(e), _) => Err(server_error(what, s, e)),
                    (other, _) => Err(FsError::Protocol(format!("unexpected reply to Sync: {other:?}"))),
                }
            })
        });
        for r in join_all(calls).await {
            r?;
        }
        if servers.len() >= self.iods.len() {
            self.prune_unsynced();
        }
        Ok(())
    }

    /// Runs `change`, of `handle`'s part at data server `s`, noting the
    /// window of the server's change counts around it ([`DataPath::unsynced`]).
    async fn noting<T>(&self, handle: u64, s: u32, change: impl Future<Output = Result<T>>) -> Result<T> {
        let Some(iod) = self.iods.get(s as usize) else {
            return change.await;
        };
        let before = iod.change_count();
        let r = change.await?;
        let window = (before, iod.change_count());
        // The count of files noted, when this one is new to the notes.
        let added = {
            let mut m = self.unsynced.lock();
            let new = !m.contains_key(&handle);
            let ws = m.entry(handle).or_default();
            match ws.iter_mut().find(|(t, _)| *t == s) {
                Some((_, w)) => *w = (w.0.min(window.0), w.1.max(window.1)),
                None => ws.push((s, window)),
            }
            new.then_some(m.len())
        };
        if added.is_some_and(|n| n >= UNSYNCED_NOTED && n.is_multiple_of(UNSYNCED_NOTED)) {
            if let Some(me) = self.me.upgrade() {
                tokio::spawn(async move {
                    let all: Vec<u32> = (0..me.iods.len() as u32).collect();
                    if let Err(e) = me.sync_on(&all, "sync", false).await {
                        tracing::debug!("a sync to let written files' notes go: {e}");
                    }
                });
            }
        }
        Ok(r)
    }

    /// Lets go the notes of files whose changes a sync covered, at every
    /// server, and no lost connection may have lost.
    fn prune_unsynced(&self) {
        self.unsynced.lock().retain(|_, ws| {
            ws.iter().any(|&(s, w)| {
                let iod = &self.iods[s as usize];
                w.1 > iod.synced_count() || iod.may_have_lost(w)
            })
        });
    }

    /// After a sync of the file's data servers (its `fsync`): `EIO` if a
    /// server may have lost a change this node made there since a sync
    /// last covered it (the connection was lost, and the server came back
    /// as an incarnation that lost what it acknowledged: its machine
    /// crashed). Without this the `fsync`, whose sync reached only the
    /// restarted server, said success for bytes it no longer had. Reported
    /// once, as a local file system reports a lost write-back.
    pub fn check_kept(&self, handle: u64, what: &str) -> Result<()> {
        let mut lost = Vec::new();
        {
            let mut m = self.unsynced.lock();
            let Some(ws) = m.get_mut(&handle) else {
                return Ok(());
            };
            ws.retain(|&(s, w)| {
                let iod = &self.iods[s as usize];
                if iod.may_have_lost(w) {
                    lost.push(s);
                    return false;
                }
                // Changes made while the sync was under way stay noted.
                w.1 > iod.synced_count()
            });
            if ws.is_empty() {
                m.remove(&handle);
            }
        }
        if lost.is_empty() {
            return Ok(());
        }
        let servers: Vec<String> = lost.iter().map(|s| s.to_string()).collect();
        Err(FsError::Remote {
            path: what.to_string(),
            code: parcache_proto::ErrorCode::Io,
            message: format!(
                "data server {} restarted after a crash of its machine (the connection was lost, and it lost what it had acknowledged and not yet synced): bytes written to this file before it may be lost",
                servers.join(", ")
            ),
        })
    }

    /// Removes a file's parts from the servers that hold them, all at once.
    pub async fn remove(&self, handle: u64, servers: &[u32]) -> Result<()> {
        self.unsynced.lock().remove(&handle);
        let req = Request::Remove { handle };
        let calls = servers.iter().map(|&s| self.call(s, &req, &[]));
        for r in join_all(calls).await {
            r?;
        }
        Ok(())
    }
}

/// The error for the node cache, without the file's name (the client
/// puts the name in front).
/// How much of the part on the layout's server `pos` a read of `off..off +
/// n` there needs it to hold: the bytes of the range that lie within the
/// file's size.
fn need(k: &Known, pos: usize, off: u64, n: u64) -> u64 {
    let part = k.placement.layout.server_bytes(k.size, pos as u32);
    if part > off {
        part.min(off + n)
    } else {
        0
    }
}

/// A data server's error reply, naming the file (`what`) and the server.
pub(crate) fn server_error(what: &str, s: u32, e: ErrorReply) -> FsError {
    FsError::Remote {
        path: what.to_string(),
        code: e.code,
        message: format!("data server {s}: {}", e.message),
    }
}

pub(crate) fn below_err(e: FsError) -> BelowError {
    BelowError {
        errno: e.errno(),
        message: match e {
            FsError::Remote { message, .. } => message,
            e => e.to_string(),
        },
    }
}

/// The node cache writes and fetches whole blocks through the data path.
impl Below for DataPath {
    async fn write(&self, key: BlockKey, pieces: Vec<(u32, Bytes)>) -> std::result::Result<(), BelowError> {
        if self.held_on_metadata(key, &pieces) {
            return Ok(());
        }
        let base = key.index * self.block_size as u64;
        let calls = pieces
            .iter()
            .map(|(at, data)| self.write_shared(key.file, base + *at as u64, data, false));
        for r in join_all(calls).await {
            r.map_err(below_err)?;
        }
        Ok(())
    }

    async fn fetch(&self, key: BlockKey) -> std::result::Result<Bytes, BelowError> {
        let bs = self.block_size as u64;
        self.read_piece(key.file, key.index * bs, bs).await.map_err(below_err)
    }

    /// A block on one data server, its file's content not on the metadata
    /// server, is read through the server's read queue into `buf` itself
    /// ([`Piece`]); any other is fetched and copied in.
    async fn fetch_into(
        &self,
        key: BlockKey,
        buf: parcache_proto::Block,
        prefetch: bool,
    ) -> (parcache_proto::Block, std::result::Result<usize, BelowError>) {
        self.fetch_into_maybe_here(key, buf, prefetch, true).await
    }

    fn discarded(&self, file: u64) {
        self.local.forget(file);
    }
}

impl DataPath {
    /// [`Below::fetch_into`]; with `local`, a random reader's fetch from a
    /// data server on this machine may read its part's file here
    /// ([`crate::local_part`]).
    pub(crate) async fn fetch_into_maybe_here(
        &self,
        key: BlockKey,
        buf: parcache_proto::Block,
        prefetch: bool,
        local: bool,
    ) -> (parcache_proto::Block, std::result::Result<usize, BelowError>) {
        let bs = self.block_size as u64;
        let queued = (!self.maybe_on_metadata(key.file))
            .then(|| self.known(key.file).ok())
            .flatten()
            .and_then(|k| {
                let mut chunks = k.placement.layout.chunks(key.index * bs, bs);
                let (Some(c), None) = (chunks.next(), chunks.next()) else {
                    return None;
                };
                let pos = c.server as usize;
                let s = k.placement.servers[pos];
                let q = self.reads.get(s as usize)?.clone();
                Some((q, s, c.server_offset, c.len, need(&k, pos, c.server_offset, c.len)))
            });
        let Some((q, s, off, len, need)) = queued else {
            return copied(buf, self.fetch(key).await);
        };
        let alone = q.alone(key.file, off, len);
        let buf = if alone && local && !prefetch && self.local.may_try(s) {
            match self.local.read(self, (s, key.file), off, len, need, buf).await {
                Ok((b, n)) => return (b, Ok(n)),
                Err(b) => b,
            }
        } else {
            buf
        };
        match q.read_as(alone, key.file, off, len, need, Some(buf)).await {
            Ok(Piece::Landed(v)) => {
                let n = v.len();
                (v, Ok(n))
            }
            Ok(Piece::Shared(mut d, lent)) => {
                d.truncate(len as usize);
                copied(lent.unwrap_or_default(), Ok(d))
            }
            Err(e) => (parcache_proto::Block::new(), Err(below_err(e))),
        }
    }
}
