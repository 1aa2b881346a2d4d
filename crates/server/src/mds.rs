//! The metadata server (`parcache mds`): namespace, attributes, file layout
//! and per-file policies, in an embedded transactional store (redb), one
//! transaction per request, so a crash leaves every request done or undone.
//! Requests take turns in one open write transaction (group commit): each
//! request's changes are seen by the next at once, and they are all made
//! durable together by the next durable commit: a client's `fsync` (a
//! `Sync` request), the syncer ([`SYNC_EVERY`]) or shutdown. A crash loses
//! at most the last second of changes no client synced, as a local file
//! system would, and never part of a request. A request that fails after
//! changing something has its changes undone alone (an undo log of the
//! values it replaced), since redb cannot roll back part of a transaction.
//!
//! Layout is chosen at create: the stripe unit (default 64 KiB) and the
//! data servers in round-robin order, the first one rotating from file to
//! file. A directory's policies (including `stripe_unit`) are inherited by
//! what is created in it. Every change to a file's content or size bumps
//! its version (for close-to-open consistency checks).

use crate::once::{InFlight, OnceKey};
use bytes::Bytes;
use parcache_core::catalogue::{check_setting, stripe};
use parcache_core::consistency::capfs::{self, HOLE};
use parcache_core::consistency::leases::Leases;
use parcache_core::consistency::orphans::Orphans;
use parcache_core::consistency::sprite::{Opening, Queued, SpriteServer};
use parcache_core::consistency::Callback as CoreCallback;
use parcache_core::cooperative::membership::Membership;
use parcache_core::cooperative::n_chance::{Directory, Evicted};
use parcache_core::cooperative::{CooperativeKind, Members, Source};
use parcache_core::BlockKey;
use parcache_core::{ConsistencyKind, FilePolicies, StoreKind};
use parcache_core::{Span, Time};
use parcache_proto::msg::{NodeInfo, NodeStats, ServerIdentity, ServerStats};
use parcache_proto::{
    serve, show_name, Attr, Behind, Callback, ChunkHash, Client, ConnError, DirEntry, EntryPlus, ErrorCode, FileKind,
    Handle, Handler, Layout, Request, Response, Secret, SetAttr, Timestamp, FIRST_VERSION, NAME_MAX, ROOT,
    SMALL_COPY_MAX, VERSION_SHIFT,
};
use parking_lot::Mutex;
use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};

const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
/// (directory, name) → handle; names are bytes.
const DIRENTS: TableDefinition<(u64, &[u8]), u64> = TableDefinition::new("dirents_b");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// Names a directory may have to be held by one node (its holder lists
/// them after the hold); a larger one is not held.
const HOLD_MOST: usize = 16_384;
/// The cluster's id ("cluster") and its data servers' addresses in order
/// ("iods", postcard), recorded at the first start.
const CLUSTER: TableDefinition<&str, &[u8]> = TableDefinition::new("cluster");
/// Content-addressed files' recipes (CAPFS 2005 §3.3) in pages: (handle,
/// page) → the hashes of chunks page × RECIPE_PAGE and on, 32 bytes each,
/// trailing holes left out. A commit rewrites only the pages it touches and
/// a hash fetch reads only the pages it asks for, whatever the file's size.
const RECIPES: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("recipe_pages");
/// Chunk hashes per recipe page (32 KiB).
const RECIPE_PAGE: u64 = 1024;
/// How many recipe slots name each chunk hash; a chunk no slot names is
/// collected.
const REFS: TableDefinition<&[u8], u64> = TableDefinition::new("refs");
/// Small files' content (data on metadata, [`SMALL_COPY_MAX`]): handle →
/// the version it is current at (8 bytes, little-endian), then the bytes.
/// A copy is given out only while its file is at that version; a stale
/// one stays until the file's next size report or its removal.
const SMALL: TableDefinition<u64, &[u8]> = TableDefinition::new("small_copies");
/// The answers to requests made at most once (`Request::Once`), kept with
/// the changes they answer (the same transaction), so a request sent again
/// after a lost connection, or to the server restarted, is answered and
/// not done twice: (client, seq % [`ONCE_SLOTS`]) → seq and the time kept
/// (8 bytes each, little-endian), then the answer (postcard).
const REPLIES: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("once_replies");
/// Answers kept per client: a client's requests this far behind its
/// latest have their slots taken (none is in flight that long).
const ONCE_SLOTS: u64 = 1024;
/// Kept answers older than this are dropped ([`Mds::prune_replies`]): a
/// client sends a request again within seconds of losing it.
const ONCE_KEPT: Duration = Duration::from_secs(600);

/// A kept answer's record in [`REPLIES`] for request `seq`.
fn answer_record(seq: u64, resp: &Response) -> R<Vec<u8>> {
    let mut v = Vec::with_capacity(64);
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend_from_slice(&now().secs.to_le_bytes());
    v.extend(postcard::to_stdvec(resp).map_err(|e| (ErrorCode::Io, format!("keeping an answer: {e}")))?);
    Ok(v)
}

/// The answer to request `seq` in record `v` of its slot: `Ok(None)` if
/// the slot holds an earlier request's (this one was not done), an error
/// if a later request took it (its answer is lost; doing it again could
/// be wrong).
fn answer_in(v: &[u8], seq: u64) -> R<Option<Response>> {
    let kept = v.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
    match kept {
        Some(k) if k == seq => postcard::from_bytes(&v[16..])
            .map(Some)
            .map_err(|e| (ErrorCode::Io, format!("a kept answer does not decode: {e}"))),
        Some(k) if k > seq => Err((
            ErrorCode::Io,
            format!("request {seq} sent again too late: its answer is no longer kept"),
        )),
        _ => Ok(None),
    }
}
/// Hashes one `Hashes` request may ask for.
const HASHES_MAX: u64 = 1 << 16;
/// Chunks a recipe may have (at 16 KiB, 64 TiB).
const RECIPE_MAX: u64 = 1 << 32;

/// Largest extended attribute value (Linux's XATTR_SIZE_MAX).
const XATTR_VALUE_MAX: usize = 64 << 10;
/// Most extended attributes on one file (they live in its inode record).
const XATTRS_MAX: usize = 64;

/// Bytes of names (and their overhead) in one page of a directory listing.
const READDIR_PAGE_BYTES: usize = 32 << 10;

/// Changes reach the disk at most this long after they were made (sooner
/// when a client syncs).
pub const SYNC_EVERY: Duration = Duration::from_secs(1);

/// File handles are reserved this many at a time, durably, before any of
/// them is given out. A crash (or a failed durable commit) takes the
/// handle counter back to the last durable commit, while the data servers
/// may hold parts of files created after it: a new file given such a
/// handle would show the lost file's bytes in its holes.
const HANDLE_RESERVE: u64 = 4096;

/// The meta table's key for the incarnation whose graceful stop made the
/// last durable commit; removed at the next start.
const GRACEFUL_STOP: &str = "graceful-stop";

/// Incarnations are reserved this many at a time, durably, when the
/// server starts (`incarnations` in the meta table: the first not
/// reserved); the store opened again after a failed commit takes the next
/// one without a durable write.
const INCARNATION_RESERVE: u64 = 16;

/// The file in the metadata server's directory that holds the first handle
/// not yet reserved.
const HANDLES_RESERVED: &str = "handles-reserved";

/// A file of [`SPACE_RESERVE_BYTES`] in the metadata server's directory,
/// deleted at each start before the store's first durable commit and
/// written again after: a full disk (the data servers' parts fill it) still
/// has room for the pages that commit writes, so the server starts.
const SPACE_RESERVE: &str = "space-reserve";
const SPACE_RESERVE_BYTES: usize = 1 << 20;

/// Writes the space reserve again (its bytes, so the disk holds them); on
/// a full disk, leaves none and says so (the next start has less room).
fn keep_space_reserve(dir: &std::path::Path) {
    let path = dir.join(SPACE_RESERVE);
    if path.exists() {
        return;
    }
    if let Err(e) = std::fs::write(&path, vec![0u8; SPACE_RESERVE_BYTES]) {
        let _ = std::fs::remove_file(&path);
        tracing::warn!(
            "could not keep {} ({e}): a restart on a full disk may fail until space is freed",
            path.display()
        );
    }
}

/// The first handle not reserved yet (0 if nothing was ever reserved).
fn reserved_handles(dir: &std::path::Path) -> io::Result<u64> {
    let p = dir.join(HANDLES_RESERVED);
    match std::fs::read_to_string(&p) {
        Ok(s) => s
            .trim()
            .parse()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("{} is damaged: {s:?}", p.display()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

/// Records `upto` as the first handle not reserved, durably (a temporary
/// file, synced, renamed over, the directory synced).
fn reserve_handles(dir: &std::path::Path, upto: u64) -> io::Result<()> {
    let tmp = dir.join(format!("{HANDLES_RESERVED}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    std::io::Write::write_all(&mut f, format!("{upto}\n").as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(HANDLES_RESERVED))?;
    std::fs::File::open(dir)?.sync_all()
}

/// Default stripe unit: 64 KiB.
pub use parcache_core::catalogue::DEFAULT_STRIPE_UNIT;

/// A new file's layout under its policy `settings` over `n` data servers,
/// from server `first` on ([`parcache_core::catalogue::stripe`]).
fn new_layout(settings: &[(String, String)], n: u32, first: u32) -> Layout {
    let (unit, width) = stripe(settings, n);
    Layout::round_robin(unit, width, n, first)
}

/// How a metadata server runs.
#[derive(Clone, Debug)]
pub struct MdsConfig {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub secret: Secret,
    /// Data servers' addresses; a file's layout names them by position.
    pub iods: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
struct Inode {
    attr: Attr,
    /// Directories: the parent (for `..` and rename loops).
    parent: Handle,
    target: Option<Vec<u8>>,
    policies: Vec<(String, String)>,
    /// Keys of `policies` copied from the directory at create (not set on
    /// the file itself: not listed as extended attributes).
    inherited: Vec<String>,
    /// Extended attributes (`user.*`), by name.
    xattrs: Vec<(String, Vec<u8>)>,
}

type Fail = (ErrorCode, String);
type R<T> = Result<T, Fail>;

fn db_err(e: impl std::fmt::Display) -> Fail {
    (ErrorCode::Io, format!("metadata store: {e}"))
}

fn now() -> Timestamp {
    Timestamp::now()
}

fn check_name(name: &[u8]) -> R<()> {
    if name.len() > NAME_MAX {
        return Err((
            ErrorCode::NameTooLong,
            format!("file name of {} bytes is over {NAME_MAX}", name.len()),
        ));
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0) {
        return Err((
            ErrorCode::Invalid,
            format!("'{}' is not a valid file name", show_name(name)),
        ));
    }
    Ok(())
}

/// A name's length is checked in every request that carries one, so a
/// long name answers ENAMETOOLONG, never ENOENT.
fn check_len(name: &[u8]) -> R<()> {
    if name.len() > NAME_MAX {
        return check_name(name);
    }
    Ok(())
}

/// `store` changes only on an empty file (its bytes would be in the other
/// store), and a CAPFS consistency preset needs `store=cas` (set that
/// first): the two must agree.
fn check_store_and_consistency(tx: &Tx, i: &Inode, key: &str, value: &str) -> R<()> {
    let setting = |k: &str| i.policies.iter().find(|(p, _)| p == k).map(|(_, v)| v.clone());
    let store: StoreKind = match key {
        "store" => value.parse().unwrap_or_default(),
        _ => setting("store").and_then(|v| v.parse().ok()).unwrap_or_default(),
    };
    let consistency: ConsistencyKind = match key {
        "consistency" => value.parse().unwrap_or_default(),
        _ => setting("consistency").and_then(|v| v.parse().ok()).unwrap_or_default(),
    };
    if key == "store" && i.attr.kind == FileKind::File && (i.attr.size > 0 || tx.has_recipe(i.attr.handle)?) {
        return Err((
            ErrorCode::Invalid,
            "store applies to new files: this file already has data (set it on the directory, then copy the file)"
                .into(),
        ));
    }
    if consistency.needs_cas() && !matches!(store, StoreKind::Cas { .. }) {
        return Err((
            ErrorCode::Invalid,
            format!("consistency={consistency} works on content-addressed files: set store=cas first"),
        ));
    }
    if matches!(store, StoreKind::Cas { .. }) && !consistency.needs_cas() && setting("consistency").is_some() {
        return Err((
            ErrorCode::Invalid,
            format!("store=cas files take a CAPFS consistency (seq-1, seq-2, for-1, for-2, rel-1), not {consistency}"),
        ));
    }
    Ok(())
}

/// A node changed the file's content up to `size`: it grows to that size
/// if shorter, its times move and its version is bumped (what
/// close-to-open's revalidation compares).
fn changed(tx: &Tx, i: &mut Inode, size: u64) {
    let t = now();
    i.attr.size = i.attr.size.max(size);
    i.attr.mtime = t;
    i.attr.ctime = t;
    i.attr.version = tx.next_version(i.attr.version);
}

/// A new inode named in `parent` with the handle and layout given (its
/// owner and policies are the directory's).
fn new_inode_as(
    tx: &Tx,
    parent: &Inode,
    handle: Handle,
    kind: FileKind,
    mode: u32,
    target: Option<Vec<u8>>,
    layout: Option<Layout>,
) -> Inode {
    let t = now();
    let size = target.as_ref().map_or(0, |t| t.len() as u64);
    Inode {
        attr: Attr {
            handle,
            kind,
            mode: mode & 0o7777,
            uid: parent.attr.uid,
            gid: parent.attr.gid,
            size,
            nlink: if kind == FileKind::Dir { 2 } else { 1 },
            atime: t,
            mtime: t,
            ctime: t,
            version: tx.first_version(),
            layout,
            rdev: 0,
        },
        parent: parent.attr.handle,
        target,
        policies: parent.policies.clone(),
        inherited: parent.policies.iter().map(|(k, _)| k.clone()).collect(),
        xattrs: vec![],
    }
}

/// The inode of a regular file.
fn file_of(tx: &Tx, handle: Handle) -> R<Inode> {
    let i = tx.get(handle)?;
    if i.attr.kind != FileKind::File {
        return Err((ErrorCode::Invalid, format!("handle {handle} is not a regular file")));
    }
    Ok(i)
}

/// A policy setting checked by the catalogue (the one place policy names
/// are parsed), in canonical form.
fn check_policy(key: &str, value: &str) -> R<String> {
    check_setting(key, value).map_err(|e| (ErrorCode::Invalid, e.to_string()))
}

struct Mds {
    /// The open write transaction every request runs in, one at a time;
    /// none right after a durable commit (the next request opens one).
    /// Declared before `db`, so it is dropped (rolled back) first.
    open: parking_lot::Mutex<Option<redb::WriteTransaction>>,
    /// The store; `None` while it could not be opened again after a
    /// failed commit ([`Mds::begin`]).
    db: parking_lot::Mutex<Option<Database>>,
    iods: Vec<String>,
    dir: PathBuf,
    /// Changes made since the last durable commit.
    unsynced: std::sync::atomic::AtomicBool,
    /// Syncs asked for (`Request::Sync`).
    syncs: AtomicU64,
    /// Requests answered ([`ServerStats::requests`]).
    requests: AtomicU64,
    /// Files whose inode, or a name of which, requests changed since
    /// [`MdsHandler::leased`] last took them (for the leases' callbacks).
    changed: parking_lot::Mutex<Vec<Handle>>,
    /// Held through a whole request whose changes are noted, so no other
    /// request's changes mix in and a lease is granted on attributes no
    /// later change has been answered over.
    one_op: parking_lot::Mutex<()>,
    /// The first handle not reserved ([`HANDLE_RESERVE`]).
    reserved: AtomicU64,
    /// The store's incarnation: moved on each time it is opened, at the
    /// state of its last durable commit. Versions given since start past
    /// every version given before ([`Tx::next_version`]).
    incarnation: AtomicU64,
    /// The first incarnation not reserved durably ([`INCARNATION_RESERVE`]).
    incarnations: AtomicU64,
    /// The incarnation whose graceful stop came just before this start (0:
    /// it crashed, or none ran): it lost nothing it had answered
    /// (`Request::Incarnation`).
    graceful_before: AtomicU64,
    /// Set by the last durable commit before a graceful stop
    /// ([`Mds::sync_last`]): every request after it is refused
    /// (`ErrorCode::Stopping`, sent again by the client to the server
    /// restarted), so none is answered and then lost.
    stopped: AtomicBool,
    /// Answers to requests made at most once kept since the last durable
    /// commit (slot → record, [`answer_record`]): written into the store
    /// by the next commit, in its transaction, so they last exactly as
    /// long as the changes they answer; dropped with those changes.
    answers: parking_lot::Mutex<HashMap<(u64, u64), Vec<u8>>>,
    /// Handles given to nodes for their creates behind (`Request::Handles`)
    /// and not used yet, each with its node: a `CreatesBehind` may use only
    /// these, each once. Lost at a restart (the node's hold is too).
    granted: parking_lot::Mutex<HashMap<Handle, u64>>,
}

/// Most handles given for creates behind and not used yet, of all nodes
/// together: a node that takes them and goes away leaves them behind.
const GRANTED_MOST: usize = 1 << 20;

/// A request's view of the open transaction, with the values its changes
/// replaced, so a request that fails part-way can be undone alone.
struct Tx<'a> {
    tx: &'a redb::WriteTransaction,
    undo: std::cell::RefCell<Vec<Undo>>,
    /// The least version a change may give ([`Mds::incarnation`]).
    floor: u64,
}

/// A key a request changed and what it held before (`None`: absent).
enum Undo {
    Inode(u64, Option<Vec<u8>>),
    Dirent(u64, Vec<u8>, Option<u64>),
    Meta(String, Option<u64>),
    Cluster(String, Option<Vec<u8>>),
    Recipe((u64, u64), Option<Vec<u8>>),
    Ref(Vec<u8>, Option<u64>),
    Small(u64, Option<Vec<u8>>),
}

fn inode_in(t: &impl ReadableTable<u64, &'static [u8]>, h: Handle) -> R<Inode> {
    let v = t
        .get(h)
        .map_err(db_err)?
        .ok_or((ErrorCode::NotFound, format!("no file with handle {h}")))?;
    postcard::from_bytes(v.value()).map_err(db_err)
}

fn page_in(t: &impl ReadableTable<(u64, u64), &'static [u8]>, h: Handle, page: u64) -> R<Option<Vec<u8>>> {
    Ok(t.get((h, page)).map_err(db_err)?.map(|v| v.value().to_vec()))
}

/// A recipe page's bytes as hashes.
fn hashes_of(bytes: &[u8]) -> Vec<ChunkHash> {
    bytes
        .chunks_exact(32)
        .map(|c| c.try_into().expect("32 bytes"))
        .collect()
}

/// Whether a file may have a small copy kept ([`Tx::small`]).
fn may_be_small(i: &Inode) -> bool {
    i.attr.kind == FileKind::File && i.attr.size > 0 && i.attr.size <= SMALL_COPY_MAX
}

/// [`Tx::small`] in the small copies' table `t`, opened already.
fn small_in(t: &impl ReadableTable<u64, &'static [u8]>, i: &Inode) -> R<Option<Vec<u8>>> {
    let Some(v) = t.get(i.attr.handle).map_err(db_err)? else {
        return Ok(None);
    };
    let v = v.value();
    let current = v.len() >= 8 && v[..8] == i.attr.version.to_le_bytes() && (v.len() - 8) as u64 == i.attr.size;
    Ok(current.then(|| v[8..].to_vec()))
}

fn entry_in(t: &impl ReadableTable<(u64, &'static [u8]), u64>, parent: Handle, name: &[u8]) -> R<Option<Handle>> {
    Ok(t.get((parent, name)).map_err(db_err)?.map(|v| v.value()))
}

impl Tx<'_> {
    /// The version a change moves a file or directory at `v` to: the
    /// next one within this incarnation of the store, else past every
    /// version given before it was opened, since a crash (or a failed
    /// commit) takes versions back to the last durable commit while nodes
    /// may hold answers given after it. (Counting on from there gave
    /// another node's change a version a node had already seen its own
    /// lost change at, and it kept its stale blocks.) Moving by one within
    /// an incarnation lets a node tell that its own report was the only
    /// change (`close_to_open::after_report`); the low bits never fall to
    /// [`FIRST_VERSION`] or below once changed
    /// ([`parcache_proto::never_changed`]).
    fn next_version(&self, v: u64) -> u64 {
        (v + 1).max(self.floor + FIRST_VERSION + 1)
    }

    /// The version of a file or directory created now.
    fn first_version(&self) -> u64 {
        self.floor + FIRST_VERSION
    }
    fn w(&self) -> &redb::WriteTransaction {
        self.tx
    }

    /// The answer kept in the store for request `seq` of `client`
    /// ([`answer_in`]).
    fn reply(&self, client: u64, seq: u64) -> R<Option<Response>> {
        let t = self.tx.open_table(REPLIES).map_err(db_err)?;
        let Some(v) = t.get((client, seq % ONCE_SLOTS)).map_err(db_err)? else {
            return Ok(None);
        };
        answer_in(v.value(), seq)
    }
    fn undo(&self, u: Undo) {
        self.undo.borrow_mut().push(u);
    }
    fn get(&self, h: Handle) -> R<Inode> {
        inode_in(&self.tx.open_table(INODES).map_err(db_err)?, h)
    }
    fn put(&self, i: &Inode) -> R<()> {
        let mut t = self.w().open_table(INODES).map_err(db_err)?;
        let b = postcard::to_stdvec(i).map_err(db_err)?;
        let old = t.insert(i.attr.handle, b.as_slice()).map_err(db_err)?;
        self.undo(Undo::Inode(i.attr.handle, old.map(|v| v.value().to_vec())));
        Ok(())
    }
    /// The copy of a small file's content kept here, if it is current
    /// (the file is at the version it was kept at).
    fn small(&self, i: &Inode) -> R<Option<Vec<u8>>> {
        if !may_be_small(i) {
            return Ok(None);
        }
        small_in(&self.tx.open_table(SMALL).map_err(db_err)?, i)
    }
    /// Keeps `content` as the file's copy at `version`, or (`None`) drops
    /// the copy it has.
    fn set_small(&self, h: Handle, copy: Option<(u64, &[u8])>) -> R<()> {
        let mut t = self.w().open_table(SMALL).map_err(db_err)?;
        let old = match copy {
            Some((version, content)) => {
                let mut v = Vec::with_capacity(8 + content.len());
                v.extend_from_slice(&version.to_le_bytes());
                v.extend_from_slice(content);
                t.insert(h, v.as_slice()).map_err(db_err)?.map(|o| o.value().to_vec())
            }
            None => t.remove(h).map_err(db_err)?.map(|o| o.value().to_vec()),
        };
        // Nothing to undo when there was no copy and none is kept.
        if old.is_some() || copy.is_some() {
            self.undo(Undo::Small(h, old));
        }
        Ok(())
    }
    /// Deletes an inode; a content-addressed file's chunks lose its
    /// references (the next collection removes those no recipe names).
    fn delete(&self, h: Handle) -> R<()> {
        let mut t = self.w().open_table(INODES).map_err(db_err)?;
        let old = t.remove(h).map_err(db_err)?;
        self.undo(Undo::Inode(h, old.map(|v| v.value().to_vec())));
        drop(t);
        self.set_small(h, None)?;
        self.set_inline(h, false)?;
        self.appends_forgotten(h)?;
        let mut pages = self.w().open_table(RECIPES).map_err(db_err)?;
        let mut named = Vec::new();
        for page in pages
            .extract_from_if((h, 0)..=(h, u64::MAX), |_, _| true)
            .map_err(db_err)?
        {
            let (k, v) = page.map_err(db_err)?;
            named.extend(hashes_of(v.value()));
            self.undo(Undo::Recipe(k.value(), Some(v.value().to_vec())));
        }
        drop(pages);
        self.refs(&[], &named)?;
        Ok(())
    }
    /// One page of a recipe (empty if absent).
    fn recipe_page(&self, h: Handle, page: u64) -> R<Vec<ChunkHash>> {
        let bytes = page_in(&self.tx.open_table(RECIPES).map_err(db_err)?, h, page)?;
        Ok(bytes.map(|b| hashes_of(&b)).unwrap_or_default())
    }
    /// The recipe's hashes of chunks `from..to` (holes where it has none).
    fn recipe_range(&self, h: Handle, from: u64, to: u64) -> R<Vec<ChunkHash>> {
        let mut out = Vec::with_capacity(to.saturating_sub(from) as usize);
        let mut i = from;
        while i < to {
            let (page, at) = (i / RECIPE_PAGE, i % RECIPE_PAGE);
            let hashes = self.recipe_page(h, page)?;
            let upto = (RECIPE_PAGE - at).min(to - i);
            for k in 0..upto {
                out.push(hashes.get((at + k) as usize).copied().unwrap_or(HOLE));
            }
            i += upto;
        }
        Ok(out)
    }
    /// The recipe's hash at each of `chunks`.
    fn recipe_at(&self, h: Handle, chunks: impl Iterator<Item = u64>) -> R<Vec<ChunkHash>> {
        let mut pages: HashMap<u64, Vec<ChunkHash>> = HashMap::new();
        let mut out = Vec::new();
        for i in chunks {
            let page = i / RECIPE_PAGE;
            let p = match pages.entry(page) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => e.insert(self.recipe_page(h, page)?),
            };
            out.push(p.get((i % RECIPE_PAGE) as usize).copied().unwrap_or(HOLE));
        }
        Ok(out)
    }
    /// Sets the recipe's hash of each chunk `(chunk, hash)`, in order,
    /// rewriting only the pages touched.
    fn set_recipe_at(&self, h: Handle, changes: impl Iterator<Item = (u64, ChunkHash)>) -> R<()> {
        let mut pages: std::collections::BTreeMap<u64, Vec<ChunkHash>> = Default::default();
        for (i, hash) in changes {
            let page = i / RECIPE_PAGE;
            let p = match pages.entry(page) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => e.insert(self.recipe_page(h, page)?),
            };
            let at = (i % RECIPE_PAGE) as usize;
            if p.len() <= at {
                p.resize(at + 1, HOLE);
            }
            p[at] = hash;
        }
        let mut t = self.w().open_table(RECIPES).map_err(db_err)?;
        for (page, mut hashes) in pages {
            while hashes.last() == Some(&HOLE) {
                hashes.pop();
            }
            let old = if hashes.is_empty() {
                t.remove((h, page)).map_err(db_err)?
            } else {
                t.insert((h, page), hashes.concat().as_slice()).map_err(db_err)?
            };
            self.undo(Undo::Recipe((h, page), old.map(|v| v.value().to_vec())));
        }
        Ok(())
    }
    /// Whether the file has a recipe page at all.
    fn has_recipe(&self, h: Handle) -> R<bool> {
        let t = self.w().open_table(RECIPES).map_err(db_err)?;
        let any = t.range((h, 0)..=(h, u64::MAX)).map_err(db_err)?.next().is_some();
        Ok(any)
    }
    /// One more reference to each of `named`, one fewer to each of
    /// `unnamed` (holes are not counted); returns the hashes no recipe
    /// names any more.
    fn refs(&self, named: &[ChunkHash], unnamed: &[ChunkHash]) -> R<Vec<ChunkHash>> {
        let mut t = self.w().open_table(REFS).map_err(db_err)?;
        for h in named.iter().filter(|h| **h != HOLE) {
            let n = t.get(&h[..]).map_err(db_err)?.map(|v| v.value());
            self.undo(Undo::Ref(h.to_vec(), n));
            t.insert(&h[..], n.unwrap_or(0) + 1).map_err(db_err)?;
        }
        let mut released = Vec::new();
        for h in unnamed.iter().filter(|h| **h != HOLE) {
            let n = t.get(&h[..]).map_err(db_err)?.map(|v| v.value());
            self.undo(Undo::Ref(h.to_vec(), n));
            let n = n.unwrap_or(0);
            if n <= 1 {
                t.remove(&h[..]).map_err(db_err)?;
                released.push(*h);
            } else {
                t.insert(&h[..], n - 1).map_err(db_err)?;
            }
        }
        Ok(released)
    }
    fn entry(&self, parent: Handle, name: &[u8]) -> R<Option<Handle>> {
        entry_in(&self.tx.open_table(DIRENTS).map_err(db_err)?, parent, name)
    }
    fn link(&self, parent: Handle, name: &[u8], h: Handle) -> R<()> {
        let mut t = self.w().open_table(DIRENTS).map_err(db_err)?;
        let old = t.insert((parent, name), h).map_err(db_err)?;
        self.undo(Undo::Dirent(parent, name.to_vec(), old.map(|v| v.value())));
        Ok(())
    }
    fn unlink(&self, parent: Handle, name: &[u8]) -> R<()> {
        let mut t = self.w().open_table(DIRENTS).map_err(db_err)?;
        let old = t.remove((parent, name)).map_err(db_err)?;
        self.undo(Undo::Dirent(parent, name.to_vec(), old.map(|v| v.value())));
        Ok(())
    }
    fn is_empty_dir(&self, h: Handle) -> R<bool> {
        let t = self.w().open_table(DIRENTS).map_err(db_err)?;
        let empty = t
            .range((h, &b""[..])..(h + 1, &b""[..]))
            .map_err(db_err)?
            .next()
            .is_none();
        Ok(empty)
    }
    /// The files named in directory `h`, at most `most` of them.
    fn entries(&self, h: Handle, most: usize) -> R<Vec<Handle>> {
        let t = self.w().open_table(DIRENTS).map_err(db_err)?;
        let mut out = vec![];
        for e in t.range((h, &b""[..])..(h + 1, &b""[..])).map_err(db_err)?.take(most) {
            out.push(e.map_err(db_err)?.1.value());
        }
        Ok(out)
    }
    /// Sets (`Some`) or removes (`None`) a key of the meta table.
    fn set_meta(&self, key: &str, value: Option<u64>) -> R<()> {
        let mut t = self.w().open_table(META).map_err(db_err)?;
        let old = match value {
            Some(v) => t.insert(key, v).map_err(db_err)?.map(|o| o.value()),
            None => t.remove(key).map_err(db_err)?.map(|o| o.value()),
        };
        // Nothing to undo when the key was absent and stays so.
        if old.is_some() || value.is_some() {
            self.undo(Undo::Meta(key.to_string(), old));
        }
        Ok(())
    }
    fn meta(&self, key: &str) -> R<Option<u64>> {
        let t = self.w().open_table(META).map_err(db_err)?;
        let v = t.get(key).map_err(db_err)?.map(|v| v.value());
        Ok(v)
    }
    /// The file's size is now `size` (reported, cut or gone at 0): appends
    /// reserved up to it are done with, and a cut forgets those beyond.
    fn appends_covered(&self, h: Handle, size: u64) -> R<()> {
        let key = append_key(h);
        if self.meta(&key)?.is_some_and(|end| end <= size) {
            self.set_meta(&key, None)?;
        }
        Ok(())
    }
    fn appends_forgotten(&self, h: Handle) -> R<()> {
        self.set_meta(&append_key(h), None)
    }
    /// Whether the file's only copy is its small copy (see [`inline_key`]).
    fn inline(&self, h: Handle) -> R<bool> {
        Ok(self.meta(&inline_key(h))?.is_some())
    }
    fn set_inline(&self, h: Handle, on: bool) -> R<()> {
        self.set_meta(&inline_key(h), on.then_some(1))
    }
    fn counter(&self, key: &str, first: u64) -> R<u64> {
        self.counter_by(key, first, 1)
    }

    /// The counter `key` (from `first`), moved on by `n`.
    fn counter_by(&self, key: &str, first: u64, n: u64) -> R<u64> {
        let mut t = self.w().open_table(META).map_err(db_err)?;
        let old = t.get(key).map_err(db_err)?.map(|v| v.value());
        self.undo(Undo::Meta(key.to_string(), old));
        let v = old.unwrap_or(first);
        t.insert(key, v + n).map_err(db_err)?;
        Ok(v)
    }
    fn dir(&self, h: Handle) -> R<Inode> {
        let i = self.get(h)?;
        if i.attr.kind != FileKind::Dir {
            return Err((ErrorCode::NotDir, format!("handle {h} is not a directory")));
        }
        Ok(i)
    }
    fn touch_dir(&self, dir: &mut Inode, nlink_delta: i32) -> R<()> {
        let t = now();
        dir.attr.mtime = t;
        dir.attr.ctime = t;
        dir.attr.version = self.next_version(dir.attr.version);
        dir.attr.nlink = (dir.attr.nlink as i64 + nlink_delta as i64).max(0) as u32;
        self.put(dir)
    }
    /// Drops one link of `i`; returns the inode if it is gone (its data must
    /// go too). A file that lived here alone is returned without a layout:
    /// its data servers hold nothing of it, and the node removing it need
    /// not ask them (issue 14).
    fn drop_link(&self, mut i: Inode) -> R<Option<Attr>> {
        i.attr.nlink = i.attr.nlink.saturating_sub(1);
        i.attr.ctime = now();
        if i.attr.nlink == 0 || i.attr.kind == FileKind::Dir {
            if self.inline(i.attr.handle)? {
                i.attr.layout = None;
            }
            self.delete(i.attr.handle)?;
            i.attr.nlink = 0;
            Ok(Some(i.attr))
        } else {
            self.put(&i)?;
            Ok(None)
        }
    }
    /// Puts back, newest first, every value this request's changes
    /// replaced.
    fn roll_back(&self) -> R<()> {
        let undo = std::mem::take(&mut *self.undo.borrow_mut());
        let tx = self.tx;
        for u in undo.into_iter().rev() {
            match u {
                Undo::Inode(k, v) => {
                    let mut t = tx.open_table(INODES).map_err(db_err)?;
                    match v {
                        Some(v) => drop(t.insert(k, v.as_slice()).map_err(db_err)?),
                        None => drop(t.remove(k).map_err(db_err)?),
                    }
                }
                Undo::Dirent(d, n, v) => {
                    let mut t = tx.open_table(DIRENTS).map_err(db_err)?;
                    match v {
                        Some(v) => drop(t.insert((d, n.as_slice()), v).map_err(db_err)?),
                        None => drop(t.remove((d, n.as_slice())).map_err(db_err)?),
                    }
                }
                Undo::Meta(k, v) => {
                    let mut t = tx.open_table(META).map_err(db_err)?;
                    match v {
                        Some(v) => drop(t.insert(k.as_str(), v).map_err(db_err)?),
                        None => drop(t.remove(k.as_str()).map_err(db_err)?),
                    }
                }
                Undo::Cluster(k, v) => {
                    let mut t = tx.open_table(CLUSTER).map_err(db_err)?;
                    match v {
                        Some(v) => drop(t.insert(k.as_str(), v.as_slice()).map_err(db_err)?),
                        None => drop(t.remove(k.as_str()).map_err(db_err)?),
                    }
                }
                Undo::Recipe(k, v) => {
                    let mut t = tx.open_table(RECIPES).map_err(db_err)?;
                    match v {
                        Some(v) => drop(t.insert(k, v.as_slice()).map_err(db_err)?),
                        None => drop(t.remove(k).map_err(db_err)?),
                    }
                }
                Undo::Ref(k, v) => {
                    let mut t = tx.open_table(REFS).map_err(db_err)?;
                    match v {
                        Some(v) => drop(t.insert(k.as_slice(), v).map_err(db_err)?),
                        None => drop(t.remove(k.as_slice()).map_err(db_err)?),
                    }
                }
                Undo::Small(k, v) => {
                    let mut t = tx.open_table(SMALL).map_err(db_err)?;
                    match v {
                        Some(v) => drop(t.insert(k, v.as_slice()).map_err(db_err)?),
                        None => drop(t.remove(k).map_err(db_err)?),
                    }
                }
            }
        }
        Ok(())
    }
}

impl Mds {
    fn open(cfg: &MdsConfig) -> io::Result<Mds> {
        std::fs::create_dir_all(&cfg.data_dir)?;
        let db = Database::create(cfg.data_dir.join("meta.redb")).map_err(io::Error::other)?;
        let mds = Mds {
            db: parking_lot::Mutex::new(Some(db)),
            iods: cfg.iods.clone(),
            dir: cfg.data_dir.clone(),
            unsynced: std::sync::atomic::AtomicBool::new(false),
            syncs: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            reserved: AtomicU64::new(reserved_handles(&cfg.data_dir)?),
            incarnation: AtomicU64::new(0),
            incarnations: AtomicU64::new(0),
            graceful_before: AtomicU64::new(0),
            open: parking_lot::Mutex::new(None),
            changed: parking_lot::Mutex::new(Vec::new()),
            one_op: parking_lot::Mutex::new(()),
            stopped: AtomicBool::new(false),
            answers: parking_lot::Mutex::new(HashMap::new()),
            granted: parking_lot::Mutex::new(HashMap::new()),
        };
        mds.write(|tx| {
            // Every table exists from the start, so lookups (read
            // transactions, which cannot create one) find them.
            let w = tx.w();
            w.open_table(INODES).map_err(db_err)?;
            w.open_table(DIRENTS).map_err(db_err)?;
            w.open_table(META).map_err(db_err)?;
            w.open_table(CLUSTER).map_err(db_err)?;
            w.open_table(SMALL).map_err(db_err)?;
            w.open_table(REPLIES).map_err(db_err)?;
            if tx.get(ROOT).is_err() {
                let t = now();
                tx.put(&Inode {
                    attr: Attr {
                        handle: ROOT,
                        kind: FileKind::Dir,
                        mode: 0o755,
                        uid: 0,
                        gid: 0,
                        size: 0,
                        nlink: 2,
                        atime: t,
                        mtime: t,
                        ctime: t,
                        version: 1,
                        layout: None,
                        rdev: 0,
                    },
                    parent: ROOT,
                    target: None,
                    policies: vec![],
                    inherited: vec![],
                    xattrs: vec![],
                })?;
                tx.counter("next_handle", ROOT + 1)?;
            }
            // A new incarnation, and the next few reserved, made durable
            // below before any request is served.
            let first_free = tx
                .w()
                .open_table(META)
                .map_err(db_err)?
                .get("incarnations")
                .map_err(db_err)?
                .map(|v| v.value());
            let incarnation = first_free.unwrap_or(0).max(1);
            tx.set_meta("incarnations", Some(incarnation + INCARNATION_RESERVE))?;
            // Read once: a crash of this incarnation is no graceful stop.
            let graceful = tx.meta(GRACEFUL_STOP)?;
            tx.set_meta(GRACEFUL_STOP, None)?;
            mds.graceful_before.store(graceful.unwrap_or(0), Ordering::SeqCst);
            mds.incarnation.store(incarnation, Ordering::SeqCst);
            mds.incarnations
                .store(incarnation + INCARNATION_RESERVE, Ordering::SeqCst);
            Ok(Response::Ok)
        })
        .map_err(|(_, m)| io::Error::other(m))?;
        mds.write(|tx| mds.skip_reserved(tx.w()))
            .map_err(|(_, m)| io::Error::other(m))?;
        mds.sync().map_err(|(_, m)| io::Error::other(m))?;
        Ok(mds)
    }

    /// Runs a request in the open transaction (opening one if there is
    /// none) while no other request runs. Its changes are seen by every
    /// later request at once and made durable by the next durable commit
    /// ([`Mds::sync`]: a client's `fsync`, a `Sync`, the syncer within
    /// [`SYNC_EVERY`], or shutdown); a crash before then loses them whole,
    /// as a local file system loses unsynced metadata. A request that
    /// fails has what it changed put back, so it leaves nothing behind.
    fn write<T>(&self, f: impl FnOnce(&Tx) -> R<T>) -> R<T> {
        let mut open = self.open.lock();
        if self.stopped.load(Ordering::SeqCst) {
            return Err((ErrorCode::Stopping, "the metadata server is stopping".into()));
        }
        if open.is_none() {
            *open = Some(self.begin()?);
        }
        let tx = Tx {
            tx: open.as_ref().expect("opened above"),
            undo: Default::default(),
            floor: self.incarnation.load(Ordering::SeqCst) << VERSION_SHIFT,
        };
        let r = f(&tx);
        let changed = !tx.undo.borrow().is_empty();
        if r.is_err() && changed {
            if let Err((_, e)) = tx.roll_back() {
                // What the request changed cannot be told from what came
                // before it: drop them all, as a crash would.
                tracing::error!("metadata store: undoing a failed request failed ({e}); the changes since the last durable commit are dropped");
                drop(tx);
                *open = None;
                self.answers.lock().clear();
                return r;
            }
        } else if changed {
            self.unsynced.store(true, Ordering::SeqCst);
            // The files a lease may be held on: those whose inode changed,
            // and those a changed name pointed at.
            let mut noted = self.changed.lock();
            for u in tx.undo.borrow().iter() {
                match u {
                    Undo::Inode(h, _) | Undo::Dirent(_, _, Some(h)) => noted.push(*h),
                    _ => {}
                }
            }
        }
        r
    }

    /// A new write transaction. After a failed commit (a full disk) redb
    /// refuses every transaction until the database is closed and opened
    /// again, so it is reopened here, at the state of the last durable
    /// commit (what `sync` said was lost, as in a crash); a reopening that
    /// fails is tried again by the next request.
    fn begin(&self) -> R<redb::WriteTransaction> {
        let mut db = self.db.lock();
        match db.as_ref().map(Database::begin_write) {
            Some(Ok(tx)) => return Ok(tx),
            Some(Err(redb::TransactionError::Storage(redb::StorageError::PreviousIo))) | None => {}
            Some(Err(e)) => return Err(db_err(e)),
        }
        tracing::warn!("metadata store: opening it again after an I/O error");
        // Its file lock goes with it, before the file is opened again.
        drop(db.take());
        let again = Database::create(self.dir.join("meta.redb")).map_err(db_err)?;
        let tx = again.begin_write().map_err(db_err)?;
        self.skip_reserved(&tx)?;
        self.next_incarnation(&tx)?;
        *db = Some(again);
        tracing::info!("metadata store: open again, at its last durable commit");
        Ok(tx)
    }

    /// Moves the handle counter past every handle reserved (some may have
    /// been given to files a crash or a failed commit lost). Made durable
    /// with the next durable commit; until then a crash finds the
    /// reservation again.
    fn skip_reserved(&self, tx: &redb::WriteTransaction) -> R<()> {
        let reserved = self.reserved.load(Ordering::SeqCst);
        let mut t = tx.open_table(META).map_err(db_err)?;
        let next = t.get("next_handle").map_err(db_err)?.map(|v| v.value());
        if next.is_some_and(|n| n < reserved) {
            tracing::info!(
                "metadata store: new files' handles start at {reserved}, past those reserved before a crash or a failed commit"
            );
            t.insert("next_handle", reserved).map_err(db_err)?;
            self.unsynced.store(true, Ordering::SeqCst);
        }
        Ok(())
    }

    /// The store was opened again at its last durable commit: versions
    /// given from now on start past those given before ([`Tx::next_version`]).
    /// The incarnation is one reserved when the server started; past
    /// those, the reservation moves on with the next durable commit, and
    /// the durable record never falls behind the incarnations used.
    fn next_incarnation(&self, tx: &redb::WriteTransaction) -> R<()> {
        let incarnation = self.incarnation.fetch_add(1, Ordering::SeqCst) + 1;
        let reserved = self
            .incarnations
            .fetch_max(incarnation + 1, Ordering::SeqCst)
            .max(incarnation + 1);
        let mut t = tx.open_table(META).map_err(db_err)?;
        let durable = t.get("incarnations").map_err(db_err)?.map(|v| v.value());
        if durable.is_none_or(|d| d < reserved) {
            t.insert("incarnations", reserved).map_err(db_err)?;
            self.unsynced.store(true, Ordering::SeqCst);
        }
        tracing::info!("metadata store: versions given from now on start at incarnation {incarnation}");
        Ok(())
    }

    /// `handle` is about to be given to a new file: reserves the next
    /// [`HANDLE_RESERVE`] durably first if it is not reserved yet.
    fn reserve(&self, handle: u64) -> R<()> {
        if handle < self.reserved.load(Ordering::SeqCst) {
            return Ok(());
        }
        let upto = handle + HANDLE_RESERVE;
        reserve_handles(&self.dir, upto).map_err(|e| {
            let code = if e.raw_os_error() == Some(28) {
                ErrorCode::NoSpace
            } else {
                ErrorCode::Io
            };
            (
                code,
                format!(
                    "reserving file handles in {}: {e}",
                    self.dir.join(HANDLES_RESERVED).display()
                ),
            )
        })?;
        self.reserved.store(upto, Ordering::SeqCst);
        Ok(())
    }

    /// Runs a lookup: in the open transaction too, so it sees every change
    /// made before it.
    fn read<T>(&self, f: impl FnOnce(&Tx) -> R<T>) -> R<T> {
        self.write(f)
    }

    /// Sets an extended attribute (`flags`: 1 create only, 2 replace only).
    fn set_xattr(&self, handle: Handle, name: String, flags: u32, value: &[u8]) -> R<Response> {
        if !name.starts_with("user.") {
            return Err((
                ErrorCode::NotSupported,
                format!("extended attribute '{name}': only the user.* namespace is stored"),
            ));
        }
        if value.len() > XATTR_VALUE_MAX {
            return Err((
                ErrorCode::NoSpace,
                format!(
                    "extended attribute '{name}': {} bytes is over {XATTR_VALUE_MAX}",
                    value.len()
                ),
            ));
        }
        self.write(|tx| {
            let mut i = tx.get(handle)?;
            let at = i.xattrs.iter().position(|(k, _)| *k == name);
            match (at, flags & 3) {
                (Some(_), 1) => return Err((ErrorCode::Exists, format!("extended attribute '{name}' exists"))),
                (None, 2) => return Err((ErrorCode::NoData, format!("no extended attribute '{name}'"))),
                (Some(k), _) => i.xattrs[k].1 = value.to_vec(),
                (None, _) => {
                    if i.xattrs.len() >= XATTRS_MAX {
                        return Err((
                            ErrorCode::NoSpace,
                            format!("a file holds at most {XATTRS_MAX} extended attributes"),
                        ));
                    }
                    i.xattrs.push((name, value.to_vec()))
                }
            }
            i.attr.ctime = now();
            tx.put(&i)?;
            Ok(Response::Ok)
        })
    }

    /// A node's size report (`Written`), with the file's whole content
    /// (`WrittenSmall`, `small` = its base version and the bytes): the copy
    /// is kept only if no other node reported a change since the writer
    /// validated the file at `base` and the file is no longer than what it
    /// holds; otherwise any copy the file had goes.
    fn written(&self, handle: Handle, size: u64, small: Option<(u64, &[u8])>) -> R<Response> {
        if let Some((_, content)) = small {
            if content.len() as u64 != size || size > SMALL_COPY_MAX {
                return Err((
                    ErrorCode::Invalid,
                    format!(
                        "size report of handle {handle}: {} bytes of content for a size of {size} \
                         (at most {SMALL_COPY_MAX})",
                        content.len()
                    ),
                ));
            }
        }
        self.write(|tx| {
            if tx.inline(handle)? {
                return Err(lives_here(handle, "size report"));
            }
            let mut i = tx.get(handle)?;
            let keep = small.filter(|&(base, _)| {
                i.attr.kind == FileKind::File
                    && i.attr.version == base
                    && i.attr.size <= size
                    && FilePolicies::from_settings(&i.policies).store == StoreKind::Blocks
            });
            changed(tx, &mut i, size);
            tx.put(&i)?;
            tx.set_small(handle, keep.map(|(_, content)| (i.attr.version, content)))?;
            tx.appends_covered(handle, i.attr.size)?;
            Ok(Response::Attr(i.attr))
        })
    }

    /// A node's size report with the file's whole content, which it did
    /// not write to the data servers (`WrittenInline`): kept as the file's
    /// only copy if the file is at `base` (no change from elsewhere since
    /// the writer validated it), may live here
    /// ([`FilePolicies::may_live_on_metadata`]), has no append under way,
    /// and either lives here already or was never written (created and
    /// still empty at its first version: its data servers hold nothing of
    /// it). Otherwise refused (`Refused`): the node writes the bytes out
    /// and reports them as before.
    fn written_inline(&self, handle: Handle, size: u64, base: u64, content: &[u8]) -> R<Response> {
        if content.len() as u64 != size || size == 0 || size > SMALL_COPY_MAX {
            return Err((
                ErrorCode::Invalid,
                format!(
                    "size report of handle {handle}: {} bytes of content for a size of {size} \
                     (1 to {SMALL_COPY_MAX})",
                    content.len()
                ),
            ));
        }
        self.write(|tx| {
            let mut i = tx.get(handle)?;
            let here = tx.inline(handle)?;
            let empty = parcache_proto::never_changed(i.attr.version) && i.attr.size == 0;
            let may = i.attr.kind == FileKind::File
                && i.attr.version == base
                && (here || empty)
                && FilePolicies::from_settings(&i.policies).may_live_on_metadata(&i.policies)
                && tx.meta(&append_key(handle))?.is_none();
            if !may {
                return Err((
                    ErrorCode::Refused,
                    format!("handle {handle} may not live on the metadata server now"),
                ));
            }
            changed(tx, &mut i, size);
            tx.put(&i)?;
            tx.set_small(handle, Some((i.attr.version, content)))?;
            if !here {
                tx.set_inline(handle, true)?;
            }
            Ok(Response::Attr(i.attr))
        })
    }

    /// A truncate of a file living here alone (`TruncateInline`) to at
    /// most [`SMALL_COPY_MAX`] bytes: its copy is cut or zero-filled and it
    /// stays here. Refused (`Refused`) for any other file.
    fn truncate_inline(&self, handle: Handle, size: u64) -> R<Response> {
        self.write(|tx| {
            if size > SMALL_COPY_MAX || !tx.inline(handle)? {
                return Err((
                    ErrorCode::Refused,
                    format!("handle {handle} does not live on the metadata server"),
                ));
            }
            let mut i = tx.get(handle)?;
            let mut content = match i.attr.size {
                0 => Vec::new(),
                _ => tx.small(&i)?.ok_or_else(|| {
                    (
                        ErrorCode::Io,
                        format!("handle {handle} lives on the metadata server, but its copy there is not current"),
                    )
                })?,
            };
            content.resize(size as usize, 0);
            let t = now();
            if size != i.attr.size {
                i.attr.size = size;
                i.attr.mtime = t;
            }
            i.attr.ctime = t;
            i.attr.version = tx.next_version(i.attr.version);
            tx.appends_forgotten(handle)?;
            tx.put(&i)?;
            tx.set_small(handle, Some((i.attr.version, &content)))?;
            Ok(Response::Attr(i.attr))
        })
    }

    /// An `O_APPEND` write of `len` bytes (`Request::Append`): its bytes
    /// are reserved after the file's end, after every append reserved and
    /// not yet covered by a size report, and after `at_least`. The size
    /// does not move: the appender reports it once its bytes are on the
    /// data servers, so no node reads a size beyond them.
    fn append(&self, handle: Handle, at_least: u64, len: u64) -> R<Response> {
        self.write(|tx| {
            let i = file_of(tx, handle)?;
            let key = append_key(handle);
            let reserved = tx.meta(&key)?.unwrap_or(0);
            let offset = i.attr.size.max(reserved).max(at_least);
            let end = offset
                .checked_add(len)
                .filter(|&e| e <= i64::MAX as u64)
                .ok_or_else(|| {
                    (
                        ErrorCode::Invalid,
                        format!("append of {len} bytes to handle {handle} at {offset}: past the largest file size"),
                    )
                })?;
            tx.set_meta(&key, Some(end))?;
            Ok(Response::Appended { offset, attr: i.attr })
        })
    }

    fn get_xattr(&self, handle: Handle, name: &str) -> R<Vec<u8>> {
        let i = self.read(|tx| tx.get(handle))?;
        i.xattrs
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
            .ok_or((ErrorCode::NoData, format!("no extended attribute '{name}'")))
    }

    /// The orphans the store keeps, with the node that keeps each
    /// ([`orphan_key`]).
    fn orphans(&self) -> R<Vec<(Handle, u64)>> {
        self.read(|tx| {
            let t = tx.w().open_table(META).map_err(db_err)?;
            let end = format!("{ORPHAN_PREFIX}\u{10ffff}");
            let mut out = Vec::new();
            for r in t.range(ORPHAN_PREFIX..end.as_str()).map_err(db_err)? {
                let (k, node) = r.map_err(db_err)?;
                if let Ok(h) = u64::from_str_radix(&k.value()[ORPHAN_PREFIX.len()..], 16) {
                    out.push((h, node.value()));
                }
            }
            Ok(out)
        })
    }

    /// Makes every change made so far durable: commits the open
    /// transaction with an fsync. If that fails (a full disk), the changes
    /// since the last durable commit are lost, as in a crash, and the
    /// caller (a client's `fsync`) gets the error.
    fn sync(&self) -> R<Response> {
        self.commit(false)
    }

    /// The last durable commit, before a graceful stop: no request is
    /// done after it ([`Mds::stopped`]).
    fn sync_last(&self) -> R<Response> {
        self.commit(true)
    }

    /// Commits the open transaction durably, between requests (a request
    /// run by [`MdsHandler::leased`] commits whole with the answer it
    /// keeps, `Request::Once`); `last`: and refuses every later request.
    fn commit(&self, last: bool) -> R<Response> {
        let _one = self.one_op.lock();
        let mut open = self.open.lock();
        if last {
            self.stopped.store(true, Ordering::SeqCst);
        }
        let answered = !self.answers.lock().is_empty();
        if self.unsynced.swap(false, Ordering::SeqCst) || answered || last {
            let tx = match open.take() {
                Some(tx) => tx,
                None if answered || last => self.begin()?,
                None => return Ok(Response::Ok),
            };
            let mut tx = tx;
            if last {
                // A restarted server tells the nodes this one lost nothing.
                let inc = self.incarnation.load(Ordering::SeqCst);
                tx.open_table(META)
                    .map_err(db_err)?
                    .insert(GRACEFUL_STOP, inc)
                    .map_err(db_err)?;
            }
            let answers = std::mem::take(&mut *self.answers.lock());
            if !answers.is_empty() {
                let put = |tx: &redb::WriteTransaction| -> R<()> {
                    let mut t = tx.open_table(REPLIES).map_err(db_err)?;
                    for (k, v) in &answers {
                        t.insert(*k, v.as_slice()).map_err(db_err)?;
                    }
                    Ok(())
                };
                if let Err((code, e)) = put(&tx) {
                    tracing::error!(
                        "metadata store: keeping answers failed ({e}); the changes since the last durable commit are lost"
                    );
                    return Err((code, e));
                }
            }
            tx.set_durability(redb::Durability::Immediate);
            if let Err(e) = tx.commit() {
                tracing::error!(
                    "metadata store: the durable commit failed ({e}); the changes since the last one are lost"
                );
                return Err(db_err(e));
            }
        }
        Ok(Response::Ok)
    }

    /// Keeps `resp` as the answer to `once` (the caller holds `one_op`),
    /// unless the request was not done (the server is stopping); a failure
    /// to keep it is logged (a repeat would be done again).
    fn keep(&self, once: &OnceKey, resp: Response) -> Response {
        if matches!(&resp, Response::Error(e) if e.code == ErrorCode::Stopping) {
            return resp;
        }
        if self.stopped.load(Ordering::SeqCst) {
            return Response::error(ErrorCode::Stopping, "the metadata server is stopping");
        }
        match answer_record(once.seq, &resp) {
            Ok(v) => {
                self.answers.lock().insert((once.client, once.seq % ONCE_SLOTS), v);
                self.unsynced.store(true, Ordering::SeqCst);
                once.set_kept();
            }
            Err((_, e)) => tracing::warn!(
                "keeping the answer to request {} of client {:x}: {e}",
                once.seq,
                once.client
            ),
        }
        resp
    }

    /// The answer kept for request `seq` of `client`: since the last
    /// durable commit, else in the store.
    fn kept(&self, client: u64, seq: u64) -> R<Option<Response>> {
        if let Some(v) = self.answers.lock().get(&(client, seq % ONCE_SLOTS)) {
            return answer_in(v, seq);
        }
        self.read(|tx| tx.reply(client, seq))
    }

    /// Drops the answers kept for requests made at most once longer ago
    /// than [`ONCE_KEPT`] (their clients are done with them, or gone).
    fn prune_replies(&self) -> R<()> {
        self.prune_replies_before(now().secs - ONCE_KEPT.as_secs() as i64)
    }

    /// Drops the answers kept before `cutoff` (seconds since the epoch).
    fn prune_replies_before(&self, cutoff: i64) -> R<()> {
        self.write(|tx| {
            let mut t = tx.w().open_table(REPLIES).map_err(db_err)?;
            t.retain(|_, v| {
                let kept = v.get(8..16).and_then(|b| b.try_into().ok()).map(i64::from_le_bytes);
                kept.is_some_and(|k| k >= cutoff)
            })
            .map_err(db_err)
        })
    }

    /// The recorded cluster id and data server addresses (none before the first start).
    fn cluster_record(&self) -> R<(Option<String>, Option<Vec<String>>)> {
        self.read(|tx| {
            let t = tx.w().open_table(CLUSTER).map_err(db_err)?;
            let id = t
                .get("cluster")
                .map_err(db_err)?
                .map(|v| String::from_utf8_lossy(v.value()).into_owned());
            let iods = match t.get("iods").map_err(db_err)? {
                Some(v) => Some(postcard::from_bytes::<Vec<String>>(v.value()).map_err(db_err)?),
                None => None,
            };
            Ok((id, iods))
        })
    }

    fn record_cluster(&self, id: &str, iods: &[String]) -> R<()> {
        self.write(|tx| {
            let mut t = tx.w().open_table(CLUSTER).map_err(db_err)?;
            let list = postcard::to_stdvec(iods).map_err(db_err)?;
            for (k, v) in [("cluster", id.as_bytes()), ("iods", list.as_slice())] {
                let old = t.insert(k, v).map_err(db_err)?;
                tx.undo(Undo::Cluster(k.into(), old.map(|v| v.value().to_vec())));
            }
            Ok(())
        })?;
        self.sync().map(|_| ())
    }

    /// A new file's layout under `policies` (stripe unit and width): the
    /// data servers in round-robin order, the first rotating file to file.
    fn layout(&self, tx: &Tx, policies: &[(String, String)]) -> R<Option<Layout>> {
        if self.iods.is_empty() {
            return Err((ErrorCode::Io, "no data servers are configured".into()));
        }
        let n = self.iods.len() as u32;
        let first = (tx.counter("next_server", 0)? % n as u64) as u32;
        Ok(Some(new_layout(policies, n, first)))
    }

    fn new_inode(&self, tx: &Tx, parent: &Inode, kind: FileKind, mode: u32, target: Option<Vec<u8>>) -> R<Inode> {
        let handle = tx.counter("next_handle", ROOT + 1)?;
        self.reserve(handle)?;
        let layout = if kind == FileKind::File {
            self.layout(tx, &parent.policies)?
        } else {
            None
        };
        Ok(new_inode_as(tx, parent, handle, kind, mode, target, layout))
    }

    /// `count` handles for a node's creates behind: the counter moves past
    /// them, reserved as any new file's handle is.
    fn give_handles(&self, node: u64, count: u32) -> R<Response> {
        let count = count.clamp(1, parcache_proto::HANDLES_MOST);
        if self.granted.lock().len() + count as usize > GRANTED_MOST {
            return Err((
                ErrorCode::NoSpace,
                format!("{GRANTED_MOST} handles are given for creates behind and not used yet"),
            ));
        }
        let first = self.write(|tx| {
            let first = tx.counter_by("next_handle", ROOT + 1, count as u64)?;
            self.reserve(first + count as u64 - 1)?;
            Ok(first)
        })?;
        let mut g = self.granted.lock();
        for h in first..first + count as u64 {
            g.insert(h, node);
        }
        Ok(Response::Reserved { first, count })
    }

    /// A node's creates behind in `parent` (`Request::CreatesBehind`),
    /// each on its own, in order; `data`: their contents, one after another.
    fn creates_behind(&self, node: u64, parent: Handle, files: &[Behind], data: &[u8]) -> R<Response> {
        let total: u64 = files.iter().map(|f| f.size).sum();
        if total != data.len() as u64 {
            return Err((
                ErrorCode::BadRequest,
                format!("creates behind: {} bytes of content for {total}", data.len()),
            ));
        }
        let mut at = 0usize;
        let mut each = Vec::with_capacity(files.len());
        for f in files {
            let content = &data[at..at + f.size as usize];
            at += f.size as usize;
            each.push(
                self.create_behind(node, parent, f, content)
                    .unwrap_or_else(|(code, msg)| Response::error(code, msg)),
            );
        }
        Ok(Response::Each(each))
    }

    /// One create behind: an exclusive create of the file the node made,
    /// then its content if it has any.
    fn create_behind(&self, node: u64, parent: Handle, f: &Behind, content: &[u8]) -> R<Response> {
        let name = show_name(&f.name);
        if self.granted.lock().get(&f.handle) != Some(&node) {
            return Err((
                ErrorCode::Invalid,
                format!(
                    "'{name}': handle {} was not given to node {node:x} for a create behind",
                    f.handle
                ),
            ));
        }
        let n = self.iods.len() as u32;
        if n == 0 || f.first_server >= n {
            return Err((
                ErrorCode::Invalid,
                format!("'{name}': data server {} of {n} to start a layout at", f.first_server),
            ));
        }
        let made = self.write(|tx| {
            check_name(&f.name)?;
            let mut p = tx.dir(parent)?;
            if tx.entry(parent, &f.name)?.is_some() {
                return Err((ErrorCode::Exists, format!("'{name}' exists")));
            }
            if tx.get(f.handle).is_ok() {
                return Err((ErrorCode::Exists, format!("'{name}': handle {} is in use", f.handle)));
            }
            let layout = Some(new_layout(&p.policies, n, f.first_server));
            let mut i = new_inode_as(tx, &p, f.handle, FileKind::File, f.mode, None, layout);
            i.attr.uid = f.uid;
            i.attr.gid = f.gid;
            tx.put(&i)?;
            tx.link(parent, &f.name, i.attr.handle)?;
            tx.touch_dir(&mut p, 0)?;
            // Its content, in the same transaction, as `WrittenInline`
            // keeps it; not kept here if the file's policies keep it on
            // its data servers (the file is then empty, and the node,
            // seeing so in the answer, writes the bytes out as for any file).
            let settings = FilePolicies::from_settings(&i.policies);
            if f.size > 0 && f.size <= SMALL_COPY_MAX && settings.may_live_on_metadata(&i.policies) {
                changed(tx, &mut i, f.size);
                tx.put(&i)?;
                tx.set_small(f.handle, Some((i.attr.version, content)))?;
                tx.set_inline(f.handle, true)?;
            }
            Ok((i, p))
        })?;
        self.granted.lock().remove(&f.handle);
        let (i, p) = made;
        let attr = i.attr;
        Ok(Response::Created {
            attr,
            policies: i.policies,
            parent: Some(p.attr),
        })
    }

    fn op(&self, req: Request) -> R<Response> {
        match req {
            Request::Sync => {
                self.syncs.fetch_add(1, Ordering::Relaxed);
                self.sync()
            }
            Request::Lookup { parent, name } => self.read(|tx| Ok(Response::Attr(lookup(tx, parent, &name)?.attr))),
            Request::LookupPolicy { parent, name } => self.read(|tx| {
                let i = lookup(tx, parent, &name)?;
                Ok(Response::AttrPolicies {
                    content: tx.small(&i)?,
                    attr: i.attr,
                    policies: i.policies,
                })
            }),
            Request::GetAttr { handle } => self.read(|tx| Ok(Response::Attr(tx.get(handle)?.attr))),
            Request::SetAttr { handle, set } => self.write(|tx| {
                let mut i = tx.get(handle)?;
                if set.size.is_some() && tx.inline(handle)? {
                    return Err(lives_here(handle, "a truncate"));
                }
                apply_setattr(tx, &mut i, set)?;
                tx.put(&i)?;
                Ok(Response::Attr(i.attr))
            }),
            Request::Create {
                parent,
                name,
                mode,
                exclusive,
            } => self.write(|tx| {
                check_name(&name)?;
                let mut p = tx.dir(parent)?;
                if let Some(h) = tx.entry(parent, &name)? {
                    let i = tx.get(h)?;
                    if exclusive {
                        return Err((ErrorCode::Exists, format!("'{}' exists", show_name(&name))));
                    }
                    if i.attr.kind == FileKind::Dir {
                        return Err((ErrorCode::IsDir, format!("'{}' is a directory", show_name(&name))));
                    }
                    return Ok(Response::Created {
                        attr: i.attr,
                        policies: i.policies,
                        parent: None,
                    });
                }
                let i = self.new_inode(tx, &p, FileKind::File, mode, None)?;
                tx.put(&i)?;
                tx.link(parent, &name, i.attr.handle)?;
                tx.touch_dir(&mut p, 0)?;
                Ok(Response::Created {
                    attr: i.attr,
                    policies: i.policies,
                    parent: Some(p.attr),
                })
            }),
            Request::Mkdir { parent, name, mode } => self.write(|tx| {
                check_name(&name)?;
                let mut p = tx.dir(parent)?;
                if tx.entry(parent, &name)?.is_some() {
                    return Err((ErrorCode::Exists, format!("'{}' exists", show_name(&name))));
                }
                let i = self.new_inode(tx, &p, FileKind::Dir, mode, None)?;
                tx.put(&i)?;
                tx.link(parent, &name, i.attr.handle)?;
                tx.touch_dir(&mut p, 1)?;
                Ok(Response::Attr(i.attr))
            }),
            Request::Symlink { parent, name, target } => self.write(|tx| {
                check_name(&name)?;
                let mut p = tx.dir(parent)?;
                if tx.entry(parent, &name)?.is_some() {
                    return Err((ErrorCode::Exists, format!("'{}' exists", show_name(&name))));
                }
                let i = self.new_inode(tx, &p, FileKind::Symlink, 0o777, Some(target))?;
                tx.put(&i)?;
                tx.link(parent, &name, i.attr.handle)?;
                tx.touch_dir(&mut p, 0)?;
                Ok(Response::Attr(i.attr))
            }),
            Request::ReadLink { handle } => self.read(|tx| {
                let i = tx.get(handle)?;
                i.target
                    .map(Response::Target)
                    .ok_or((ErrorCode::Invalid, format!("handle {handle} is not a symbolic link")))
            }),
            Request::Link {
                handle,
                new_parent,
                new_name,
            } => self.write(|tx| {
                check_name(&new_name)?;
                let mut p = tx.dir(new_parent)?;
                let mut i = tx.get(handle)?;
                if i.attr.kind == FileKind::Dir {
                    return Err((ErrorCode::Access, "hard links to directories are not allowed".into()));
                }
                if tx.entry(new_parent, &new_name)?.is_some() {
                    return Err((ErrorCode::Exists, format!("'{}' exists", show_name(&new_name))));
                }
                i.attr.nlink += 1;
                i.attr.ctime = now();
                tx.put(&i)?;
                tx.link(new_parent, &new_name, handle)?;
                tx.touch_dir(&mut p, 0)?;
                Ok(Response::Attr(i.attr))
            }),
            Request::ReadDir { handle, after } => self.read(|tx| {
                let rtx = tx.w();
                let inodes = rtx.open_table(INODES).map_err(db_err)?;
                let v = inodes
                    .get(handle)
                    .map_err(db_err)?
                    .ok_or((ErrorCode::NotFound, format!("no file with handle {handle}")))?;
                let dir: Inode = postcard::from_bytes(v.value()).map_err(db_err)?;
                if dir.attr.kind != FileKind::Dir {
                    return Err((ErrorCode::NotDir, format!("handle {handle} is not a directory")));
                }
                let dirents = rtx.open_table(DIRENTS).map_err(db_err)?;
                let start = after.as_deref().unwrap_or(b"");
                let range = dirents.range((handle, start)..(handle + 1, &b""[..])).map_err(db_err)?;
                // A page fits well inside one frame's header, whatever the names.
                let (mut out, mut bytes, mut more) = (vec![], 0usize, false);
                for e in range {
                    let (k, v) = e.map_err(db_err)?;
                    let name = k.value().1;
                    if after.as_deref() == Some(name) {
                        continue;
                    }
                    if bytes + name.len() > READDIR_PAGE_BYTES {
                        more = true;
                        break;
                    }
                    let h = v.value();
                    let kind = match inodes.get(h).map_err(db_err)? {
                        Some(b) => postcard::from_bytes::<Inode>(b.value()).map_err(db_err)?.attr.kind,
                        None => continue,
                    };
                    bytes += name.len() + 16;
                    out.push(DirEntry {
                        name: name.to_vec(),
                        handle: h,
                        kind,
                    });
                }
                Ok(Response::Entries { entries: out, more })
            }),
            Request::Forget { handle } => self.write(|tx| match tx.get(handle) {
                Ok(i) if i.attr.nlink == 0 && i.attr.kind != FileKind::Dir => {
                    tx.delete(handle)?;
                    tx.set_meta(&orphan_key(handle), None)?;
                    Ok(Response::Attr(i.attr))
                }
                _ => Ok(Response::Ok),
            }),
            Request::Unlink {
                parent,
                name,
                keep_open,
                only,
            } => self.write(|tx| {
                check_len(&name)?;
                let mut p = tx.dir(parent)?;
                let h = tx
                    .entry(parent, &name)?
                    .ok_or((ErrorCode::NotFound, format!("'{}' not found", show_name(&name))))?;
                if only.is_some_and(|f| f != h) {
                    return Err((
                        ErrorCode::NotFound,
                        format!("'{}' names another file now", show_name(&name)),
                    ));
                }
                let i = tx.get(h)?;
                if i.attr.kind == FileKind::Dir {
                    return Err((
                        ErrorCode::IsDir,
                        format!("'{}' is a directory (use rmdir)", show_name(&name)),
                    ));
                }
                tx.unlink(parent, &name)?;
                tx.touch_dir(&mut p, 0)?;
                if keep_open && i.attr.nlink <= 1 && i.attr.kind == FileKind::File {
                    // An orphan until the node that has it open forgets it.
                    let mut i = i;
                    i.attr.nlink = 0;
                    i.attr.ctime = now();
                    tx.put(&i)?;
                    return Ok(Response::Unlinked {
                        gone: None,
                        parent: p.attr,
                    });
                }
                Ok(Response::Unlinked {
                    gone: tx.drop_link(i)?,
                    parent: p.attr,
                })
            }),
            // Each on its own, as if sent alone (`Request::Unlinks`).
            Request::Unlinks { parent, names } => Ok(Response::Each(
                names
                    .into_iter()
                    .map(|(name, only)| {
                        let req = Request::Unlink {
                            parent,
                            name,
                            keep_open: false,
                            only,
                        };
                        self.op(req).unwrap_or_else(|(code, msg)| Response::error(code, msg))
                    })
                    .collect(),
            )),
            Request::Rmdir { parent, name } => self.write(|tx| {
                check_len(&name)?;
                let mut p = tx.dir(parent)?;
                let h = tx
                    .entry(parent, &name)?
                    .ok_or((ErrorCode::NotFound, format!("'{}' not found", show_name(&name))))?;
                let i = tx.dir(h)?;
                if !tx.is_empty_dir(h)? {
                    return Err((
                        ErrorCode::NotEmpty,
                        format!("directory '{}' is not empty", show_name(&name)),
                    ));
                }
                tx.unlink(parent, &name)?;
                tx.delete(i.attr.handle)?;
                tx.touch_dir(&mut p, -1)?;
                Ok(Response::Unlinked {
                    gone: None,
                    parent: p.attr,
                })
            }),
            Request::Rename {
                parent,
                name,
                new_parent,
                new_name,
            } => self.write(|tx| self.rename(tx, parent, &name, new_parent, &new_name)),
            Request::Incarnation => Ok(Response::Incarnation {
                now: self.incarnation.load(Ordering::SeqCst),
                after_graceful_stop_of: Some(self.graceful_before.load(Ordering::SeqCst)).filter(|&i| i != 0),
            }),
            Request::StatFs => self.read(|tx| {
                let rtx = tx.w();
                let files = rtx.open_table(INODES).map_err(db_err)?.len().map_err(db_err)?;
                // The metadata store's own disk; clients add the data servers'.
                let (cap, free) = crate::capacity(&self.dir);
                Ok(Response::StatFs {
                    blocks: cap / 4096,
                    free: free / 4096,
                    files,
                    block_size: 4096,
                })
            }),
            Request::SetPolicy { handle, key, value } => self.write(|tx| {
                let value = check_policy(&key, &value)?;
                let mut i = tx.get(handle)?;
                check_store_and_consistency(tx, &i, &key, &value)?;
                if key.starts_with("stripe_") && i.attr.kind == FileKind::File {
                    if i.attr.size > 0 {
                        return Err((
                            ErrorCode::Invalid,
                            format!(
                                "{key} applies to new files: this file already has data laid out \
                                 (set it on the directory, then copy the file)"
                            ),
                        ));
                    }
                    // An empty file is laid out anew.
                    let mut with = i.clone();
                    with.policies.retain(|(k, _)| *k != key);
                    with.policies.push((key.clone(), value.clone()));
                    i.attr.layout = self.layout(tx, &with.policies)?;
                    i.attr.version = tx.next_version(i.attr.version);
                }
                i.policies.retain(|(k, _)| *k != key);
                i.inherited.retain(|k| *k != key);
                i.policies.push((key, value));
                i.policies.sort();
                i.attr.ctime = now();
                tx.put(&i)?;
                Ok(Response::Policies(i.policies))
            }),
            Request::UnsetPolicy { handle, key } => self.write(|tx| {
                let mut i = tx.get(handle)?;
                match key.as_str() {
                    "store" => check_store_and_consistency(tx, &i, "store", "blocks")?,
                    "consistency" => check_store_and_consistency(tx, &i, "consistency", "close-to-open")?,
                    _ => {}
                }
                if key.starts_with("stripe_") && i.attr.kind == FileKind::File {
                    return Err((
                        ErrorCode::Invalid,
                        format!("{key} applies to new files: a file's layout stays as it was made"),
                    ));
                }
                if !i.policies.iter().any(|(k, _)| *k == key) {
                    return Err((ErrorCode::NoData, format!("no policy '{key}' is set here")));
                }
                i.policies.retain(|(k, _)| *k != key);
                i.inherited.retain(|k| *k != key);
                i.attr.ctime = now();
                tx.put(&i)?;
                Ok(Response::Policies(i.policies))
            }),
            Request::GetPolicy { handle } => self.read(|tx| Ok(Response::Policies(tx.get(handle)?.policies))),
            Request::GetAttrPolicy { handle } => self.read(|tx| {
                let i = tx.get(handle)?;
                Ok(Response::AttrPolicies {
                    content: tx.small(&i)?,
                    attr: i.attr,
                    policies: i.policies,
                })
            }),
            Request::ExplainPolicy { handle } => self.read(|tx| {
                let i = tx.get(handle)?;
                Ok(Response::Origins(
                    i.policies
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone(), i.inherited.contains(k)))
                        .collect(),
                ))
            }),
            Request::Mknod {
                parent,
                name,
                mode,
                kind,
                rdev,
            } => self.write(|tx| {
                check_name(&name)?;
                if matches!(kind, FileKind::File | FileKind::Dir | FileKind::Symlink) {
                    return Err((ErrorCode::Invalid, format!("mknod makes special files, not {kind:?}")));
                }
                let mut p = tx.dir(parent)?;
                if tx.entry(parent, &name)?.is_some() {
                    return Err((ErrorCode::Exists, format!("'{}' exists", show_name(&name))));
                }
                let mut i = self.new_inode(tx, &p, kind, mode, None)?;
                i.attr.rdev = rdev;
                tx.put(&i)?;
                tx.link(parent, &name, i.attr.handle)?;
                tx.touch_dir(&mut p, 0)?;
                Ok(Response::Attr(i.attr))
            }),
            Request::ListXattr { handle } => self.read(|tx| {
                Ok(Response::Names(
                    tx.get(handle)?.xattrs.into_iter().map(|(k, _)| k).collect(),
                ))
            }),
            Request::RemoveXattr { handle, name } => self.write(|tx| {
                let mut i = tx.get(handle)?;
                let before = i.xattrs.len();
                i.xattrs.retain(|(k, _)| *k != name);
                if i.xattrs.len() == before {
                    return Err((ErrorCode::NoData, format!("no extended attribute '{name}'")));
                }
                i.attr.ctime = now();
                tx.put(&i)?;
                Ok(Response::Ok)
            }),
            Request::Written { handle, size } => self.written(handle, size, None),
            Request::Append { handle, at_least, len } => self.append(handle, at_least, len),
            Request::Servers => Ok(Response::Servers(self.iods.clone())),
            Request::Cluster => match self.cluster_record()? {
                (Some(id), _) => Ok(Response::Cluster(id)),
                // Recorded at every start, before anything is served.
                (None, _) => Err((ErrorCode::Io, "the metadata store records no cluster id".into())),
            },
            Request::Hashes {
                handle, from, count, ..
            } => self.read(|tx| {
                file_of(tx, handle)?;
                if count > HASHES_MAX {
                    return Err((
                        ErrorCode::Invalid,
                        format!("hashes of handle {handle}: {count} asked, at most {HASHES_MAX} at once"),
                    ));
                }
                let end = from.saturating_add(count).min(RECIPE_MAX);
                Ok(Response::Hashes(tx.recipe_range(handle, from.min(end), end)?))
            }),
            Request::Commit {
                handle,
                changes,
                force,
                size,
                ..
            } => self.write(|tx| {
                let mut i = file_of(tx, handle)?;
                if let Some((bad, _, _)) = changes.iter().find(|(c, _, _)| *c >= RECIPE_MAX) {
                    return Err((
                        ErrorCode::Invalid,
                        format!("commit to handle {handle}: chunk {bad} is past the limit of {RECIPE_MAX}"),
                    ));
                }
                let current = tx.recipe_at(handle, changes.iter().map(|c| c.0))?;
                if !force {
                    let stale = capfs::stale_at(&current, &changes);
                    if !stale.is_empty() {
                        return Ok(Response::Conflict(stale));
                    }
                }
                let (named, unnamed) = capfs::references(&current, &changes);
                tx.set_recipe_at(handle, changes.iter().map(|&(i, _, new)| (i, new)))?;
                let released = tx.refs(&named, &unnamed)?;
                changed(tx, &mut i, size);
                tx.put(&i)?;
                Ok(Response::Committed { attr: i.attr, released })
            }),
            Request::Unreferenced { hashes } => self.read(|tx| {
                let rtx = tx.w();
                let unnamed = match rtx.open_table(REFS) {
                    Ok(t) => {
                        let mut v = Vec::new();
                        for h in hashes {
                            if t.get(&h[..]).map_err(db_err)?.is_none() {
                                v.push(h);
                            }
                        }
                        v
                    }
                    Err(redb::TableError::TableDoesNotExist(_)) => hashes,
                    Err(e) => return Err(db_err(e)),
                };
                Ok(Response::Hashes(unnamed))
            }),
            // Read in the open transaction, so a file created since the
            // last durable commit is known: only a crash's lost files and
            // removed ones are not.
            Request::UnknownHandles { handles } => self.read(|tx| {
                let inodes = tx.w().open_table(INODES).map_err(db_err)?;
                let mut unknown = Vec::new();
                for h in handles {
                    if inodes.get(h).map_err(db_err)?.is_none() {
                        unknown.push(h);
                    }
                }
                Ok(Response::Handles(unknown))
            }),
            Request::Stats => self.read(|tx| {
                let rtx = tx.w();
                let files = rtx.open_table(INODES).map_err(db_err)?.len().map_err(db_err)?;
                let (capacity_bytes, free_bytes) = crate::capacity(&self.dir);
                let chunks = match rtx.open_table(REFS) {
                    Ok(t) => {
                        let mut n = 0;
                        for r in t.iter().map_err(db_err)? {
                            n += r.map_err(db_err)?.1.value();
                        }
                        n
                    }
                    Err(_) => 0,
                };
                Ok(Response::Stats(ServerStats {
                    role: format!("mds ({files} files)"),
                    capacity_bytes,
                    free_bytes,
                    chunks,
                    syncs: self.syncs.load(Ordering::Relaxed),
                    requests: self.requests.load(Ordering::Relaxed),
                    ..ServerStats::default()
                }))
            }),
            other => Err((
                ErrorCode::BadRequest,
                format!("the metadata server does not serve {other:?}"),
            )),
        }
    }

    fn rename(&self, tx: &Tx, parent: Handle, name: &[u8], new_parent: Handle, new_name: &[u8]) -> R<Response> {
        check_len(name)?;
        check_name(new_name)?;
        let mut src_dir = tx.dir(parent)?;
        tx.dir(new_parent)?;
        let h = tx
            .entry(parent, name)?
            .ok_or((ErrorCode::NotFound, format!("'{}' not found", show_name(name))))?;
        let mut src = tx.get(h)?;
        let is_dir = src.attr.kind == FileKind::Dir;
        if is_dir {
            // A directory cannot move into its own subtree.
            let mut p = new_parent;
            loop {
                if p == h {
                    return Err((
                        ErrorCode::Invalid,
                        format!("cannot move '{}' into itself", show_name(name)),
                    ));
                }
                if p == ROOT {
                    break;
                }
                p = tx.get(p)?.parent;
            }
        }
        let mut destroyed = None;
        if let Some(t) = tx.entry(new_parent, new_name)? {
            if t == h {
                return Ok(Response::Ok);
            }
            let target = tx.get(t)?;
            match (is_dir, target.attr.kind == FileKind::Dir) {
                (true, false) => {
                    return Err((
                        ErrorCode::NotDir,
                        format!("'{}' is not a directory", show_name(new_name)),
                    ))
                }
                (false, true) => return Err((ErrorCode::IsDir, format!("'{}' is a directory", show_name(new_name)))),
                (true, true) if !tx.is_empty_dir(t)? => {
                    return Err((
                        ErrorCode::NotEmpty,
                        format!("directory '{}' is not empty", show_name(new_name)),
                    ))
                }
                _ => {}
            }
            tx.unlink(new_parent, new_name)?;
            if target.attr.kind == FileKind::Dir {
                let mut np = tx.dir(new_parent)?;
                tx.touch_dir(&mut np, -1)?;
            }
            destroyed = tx.drop_link(target)?;
        }
        tx.unlink(parent, name)?;
        tx.link(new_parent, new_name, h)?;
        src.attr.ctime = now();
        if is_dir && parent != new_parent {
            src.parent = new_parent;
            tx.touch_dir(&mut src_dir, -1)?;
            let mut np = tx.dir(new_parent)?;
            tx.touch_dir(&mut np, 1)?;
        } else {
            tx.touch_dir(&mut src_dir, 0)?;
            if parent != new_parent {
                let mut np = tx.dir(new_parent)?;
                tx.touch_dir(&mut np, 0)?;
            }
        }
        tx.put(&src)?;
        Ok(match destroyed.filter(|a| a.kind == FileKind::File) {
            Some(a) => Response::Attr(a),
            None => Response::Ok,
        })
    }
}

fn apply_setattr(tx: &Tx, i: &mut Inode, set: SetAttr) -> R<()> {
    let t = now();
    if let Some(m) = set.mode {
        i.attr.mode = m & 0o7777;
    }
    if let Some(u) = set.uid {
        i.attr.uid = u;
    }
    if let Some(g) = set.gid {
        i.attr.gid = g;
    }
    if let Some(size) = set.size {
        if i.attr.kind != FileKind::File {
            return Err((
                ErrorCode::IsDir,
                format!("handle {} is not a regular file", i.attr.handle),
            ));
        }
        if size != i.attr.size {
            i.attr.size = size;
            i.attr.mtime = t;
        }
        // An append reserved before the cut lands where it was placed.
        tx.appends_forgotten(i.attr.handle)?;
        // Even to the same size: the node cut or made the file's parts
        // at the data servers, and a file still at its first version has
        // none (its removal sends them nothing).
        i.attr.version = tx.next_version(i.attr.version);
    }
    if let Some(a) = set.atime {
        i.attr.atime = a;
    }
    if let Some(m) = set.mtime {
        i.attr.mtime = m;
    }
    i.attr.ctime = t;
    Ok(())
}

/// The metadata server's request handler: the store, its stop signal,
/// sprite's callbacks, the nodes heard from (name, peer address and
/// counters), the cooperative tier's directory of who caches what, and
/// the mounts' leases on files' attributes.
struct MdsHandler(
    Arc<Mds>,
    Arc<watch::Sender<bool>>,
    Sprite,
    Mutex<Membership<(String, String, NodeStats)>>,
    Mutex<TierDirectory>,
    Mutex<Leases>,
    /// Who keeps each file unlinked while open, to end those of a node
    /// that died (`parcache gc`).
    Mutex<Orphans>,
    /// The requests made at most once being done now.
    InFlight,
    /// Connections to the data servers, to write out files that live here.
    DataLinks,
);

/// The metadata server's connections to its data servers, made at first
/// need: it writes out a file whose only copy it holds
/// ([`MdsHandler::materialize`]).
struct DataLinks {
    secret: Secret,
    links: tokio::sync::Mutex<HashMap<u32, Client>>,
}

impl DataLinks {
    /// The connection to data server `id` (at `addr`), made if none is open.
    async fn to(&self, id: u32, addr: &str) -> Result<Client, ConnError> {
        let mut links = self.links.lock().await;
        if let Some(c) = links.get(&id).filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        let c = Client::connect(addr, &self.secret).await?;
        links.insert(id, c.clone());
        Ok(c)
    }
}

/// `n-chance`'s directory (1996 §4), the source of its random picks, and
/// the members it last saw (one that went silent holds nothing any more).
struct TierDirectory {
    dir: Directory,
    picks: u64,
    seen: Members,
}

impl MdsHandler {
    fn nodes(&self) -> Vec<NodeInfo> {
        let now = self.2.now();
        let nodes = self.3.lock().members(now);
        nodes
            .into_iter()
            .map(|(node, silent, (name, addr, stats))| NodeInfo {
                node,
                name,
                addr,
                silent_ms: (silent.as_millis_f64() as u64),
                stats,
            })
            .collect()
    }

    /// The members that answer their peers, as placement uses them; the
    /// directory forgets what a node that dropped out held.
    fn tier(&self) -> Members {
        let now = self.2.now();
        let nodes = self.3.lock().members(now);
        let members = Members::new(nodes.into_iter().filter(|(_, _, r)| !r.1.is_empty()).map(|(n, _, _)| n));
        let mut d = self.4.lock();
        if d.seen != members {
            let gone: Vec<u64> = d
                .seen
                .nodes()
                .iter()
                .copied()
                .filter(|&n| !members.contains(n))
                .collect();
            for n in gone {
                d.dir.left(n);
            }
            d.seen = members.clone();
        }
        members
    }
}

impl MdsHandler {
    /// Runs a request for node `from` (`None`: a client without leases),
    /// answered once every other node holding a lease on a file it changed
    /// has forgotten it (or its lease ran out).
    async fn op(&self, from: Option<u64>, once: Option<&OnceKey>, req: Request) -> Response {
        let mds = self.0.clone();
        if req != Request::Sync {
            // A request in the open transaction (pages in memory): tens of
            // microseconds, less than handing it to another thread costs.
            // It waits while a durable commit runs (2.7 ms after 4,000
            // creates in `mds-ops`).
            let grants = from.filter(|_| grants_lease(&req));
            let touched = touched(&req);
            let orphan = match (&req, from) {
                (
                    Request::Unlink {
                        parent,
                        name,
                        keep_open: true,
                        only: None,
                        ..
                    },
                    Some(node),
                ) => Some((*parent, name, node)),
                _ => None,
            };
            return self
                .leased_alone(from, grants, &touched, once, |m| {
                    let Some((parent, name, node)) = orphan else {
                        return m.op(req.clone());
                    };
                    // The file this unlink may leave as the node's orphan,
                    // as the store decides (its last name, a file).
                    let before = m.read(|tx| lookup(tx, parent, name));
                    let resp = m.op(req.clone())?;
                    if let Ok(i) = before {
                        if i.attr.kind == FileKind::File && i.attr.nlink <= 1 {
                            // Noted in the store, so a restart knows who
                            // keeps it: in the unlink's open transaction,
                            // unless a durable commit came in between (a
                            // crash then loses only this note).
                            m.write(|tx| tx.set_meta(&orphan_key(i.attr.handle), Some(node)))?;
                            self.6.lock().kept(i.attr.handle, node);
                        }
                    }
                    Ok(resp)
                })
                .await;
        }
        match tokio::task::spawn_blocking(move || mds.op(req)).await {
            Ok(Ok(resp)) => resp,
            Ok(Err((code, msg))) => Response::error(code, msg),
            Err(e) => Response::error(ErrorCode::Io, format!("metadata operation failed: {e}")),
        }
    }

    /// Runs `run` in the store with its changes noted, all under the
    /// store's one-request lock: the leases other nodes than `from` hold on
    /// the files it changed end (returned, with their holders, to be called
    /// back), and `grants` is given a lease on the file it answers with.
    ///
    /// `Err`: other nodes hold directories the request touches
    /// (`touched`, and the directories of the files among them); their
    /// holds end and are to be called back before the request is tried
    /// again ([`MdsHandler::leased_alone`]).
    fn leased(
        &self,
        from: Option<u64>,
        grants: Option<u64>,
        touched: &Touched,
        once: Option<&OnceKey>,
        run: impl FnOnce(&Mds) -> R<Response>,
    ) -> Result<(Response, Vec<CallBack>), Vec<CallBack>> {
        let mds = &self.0;
        let _one = mds.one_op.lock();
        let now = self.2.now();
        let holders = self.holds_in_the_way(now, from, touched);
        if !holders.is_empty() {
            return Err(holders);
        }
        let resp = run(mds).unwrap_or_else(|(code, msg)| Response::error(code, msg));
        // Kept with the request's changes: the next durable commit writes
        // both, and none comes between (`Mds::commit` waits for `one_op`).
        let resp = match once {
            Some(o) => mds.keep(o, resp),
            None => resp,
        };
        let mut changed = std::mem::take(&mut *mds.changed.lock());
        let mut leases = self.5.lock();
        changed.sort_unstable();
        changed.dedup();
        let calls = changed
            .into_iter()
            .map(|h| (h, leases.changed(now, from, h)))
            .filter(|(_, holders)| !holders.is_empty())
            .collect();
        if let Some(node) = grants {
            let attr = match &resp {
                Response::Attr(a) | Response::Created { attr: a, .. } | Response::AttrPolicies { attr: a, .. } => {
                    Some(a)
                }
                _ => None,
            };
            if let Some(a) = attr.filter(|a| a.kind != FileKind::Dir) {
                leases.grant(now, node, a.handle);
            }
            if let Response::Each(each) = &resp {
                for r in each {
                    if let Response::Created { attr, .. } = r {
                        leases.grant(now, node, attr.handle);
                    }
                }
            }
        }
        Ok((resp, calls))
    }

    /// [`MdsHandler::leased`], after calling back (and waiting for) the
    /// other nodes holding what the request touches; answered once the
    /// holders of leases on what it changed were called back too.
    async fn leased_alone(
        &self,
        from: Option<u64>,
        grants: Option<u64>,
        touched: &Touched,
        once: Option<&OnceKey>,
        run: impl Fn(&Mds) -> R<Response>,
    ) -> Response {
        loop {
            match self.leased(from, grants, touched, once, &run) {
                Ok((resp, calls)) => {
                    self.forget(calls).await;
                    return resp;
                }
                Err(holders) => self.forget(holders).await,
            }
        }
    }

    /// Ends the orphans of nodes gone for at least `older_than_secs` (as
    /// their own last close would: `Forget`); answers their handles.
    /// Writes a file that lives here (`WrittenInline`) out to its data
    /// servers, which hold it from then on; nothing for any other file.
    /// The bytes go out before the mark goes, and the mark goes only if no
    /// report changed the file meanwhile (else they go out again): a node
    /// told `Ok` finds the data servers holding the file's current bytes.
    async fn materialize(&self, handle: Handle) -> R<()> {
        for _ in 0..16 {
            let held = self.0.read(|tx| {
                if !tx.inline(handle)? {
                    return Ok(None);
                }
                let i = tx.get(handle)?;
                // Empty (cut to 0 here): nothing to write out.
                let copy = match i.attr.size {
                    0 => Vec::new(),
                    _ => tx.small(&i)?.ok_or_else(|| {
                        (
                            ErrorCode::Io,
                            format!("handle {handle} lives on the metadata server, but its copy there is not current"),
                        )
                    })?,
                };
                Ok(Some((i.attr.version, i.attr.layout, copy)))
            })?;
            let Some((version, layout, copy)) = held else {
                return Ok(());
            };
            let layout = layout.ok_or_else(|| (ErrorCode::Io, format!("handle {handle} has no layout")))?;
            self.write_out(handle, &layout, &copy).await?;
            let done = self.0.write(|tx| {
                if tx.get(handle).is_err() {
                    return Ok(None);
                }
                if tx.inline(handle)? && tx.get(handle)?.attr.version != version {
                    return Ok(Some(false));
                }
                tx.set_inline(handle, false)?;
                Ok(Some(true))
            })?;
            match done {
                Some(true) => return Ok(()),
                Some(false) => {}
                None => {
                    // Removed meanwhile, its removal told nothing lives on
                    // the data servers: what was just written goes again.
                    self.remove_parts(handle, &layout).await;
                    return Err((ErrorCode::NotFound, format!("handle {handle} was removed")));
                }
            }
        }
        Err((
            ErrorCode::Io,
            format!("handle {handle}: its content kept changing while it was written out to the data servers"),
        ))
    }

    /// Removes a file's parts from its data servers (a failure is logged:
    /// `parcache gc` finds parts no file owns).
    async fn remove_parts(&self, handle: Handle, layout: &Layout) {
        for &id in &layout.servers {
            let Some(addr) = self.0.iods.get(id as usize) else {
                continue;
            };
            let r = match self.8.to(id, addr).await {
                Ok(c) => c.call(&Request::Remove { handle }, &[]).await.map(|_| ()),
                Err(e) => Err(e),
            };
            if let Err(e) = r {
                tracing::warn!("handle {handle}: removing its part from data server {id} ({addr}): {e}");
            }
        }
    }

    /// Writes `content`, a file's bytes from offset 0, to the parts on its
    /// data servers (durably: `Write` is answered from their logs).
    async fn write_out(&self, handle: Handle, layout: &Layout, content: &[u8]) -> R<()> {
        let su = layout.stripe_unit.max(1);
        let n = layout.servers.len() as u64;
        if n == 0 {
            return Err((
                ErrorCode::Io,
                format!("handle {handle}: its layout names no data server"),
            ));
        }
        let mut off = 0u64;
        while off < content.len() as u64 {
            let unit = off / su;
            let end = ((unit + 1) * su).min(content.len() as u64);
            let id = layout.servers[(unit % n) as usize];
            let at = (unit / n) * su + off % su;
            let addr = self.0.iods.get(id as usize).ok_or_else(|| {
                (
                    ErrorCode::Io,
                    format!(
                        "handle {handle}: its layout names data server {id}, the cluster has {}",
                        self.0.iods.len()
                    ),
                )
            })?;
            let failed = |code, e: String| {
                (
                    code,
                    format!("handle {handle}: writing it out to data server {id} ({addr}): {e}"),
                )
            };
            let c = self
                .8
                .to(id, addr)
                .await
                .map_err(|e| failed(ErrorCode::Io, e.to_string()))?;
            let req = Request::Write { handle, offset: at };
            match c.call(&req, &content[off as usize..end as usize]).await {
                // A full disk there is said as such (ENOSPC to the writer).
                Ok((Response::Error(e), _)) => return Err(failed(e.code, e.message)),
                Ok(_) => {}
                Err(e) => return Err(failed(ErrorCode::Io, e.to_string())),
            }
            off = end;
        }
        Ok(())
    }

    async fn drop_orphans(&self, older_than_secs: u64) -> Response {
        let abandoned = self.6.lock().abandoned(self.2.now(), Span::from_secs(older_than_secs));
        let mut ended = Vec::new();
        for handle in abandoned {
            match self.op(None, None, Request::Forget { handle }).await {
                Response::Attr(_) => ended.push(handle),
                e @ Response::Error(_) => return e,
                _ => {}
            }
            self.6.lock().ended(handle);
        }
        Response::Handles(ended)
    }

    /// The holds of nodes other than `from` on the directories a request
    /// touches (`touched` and, for each file among them, the directory it
    /// was created or renamed in): each ends, to be called back. Nothing
    /// to read while no other node holds anything (the usual case).
    fn holds_in_the_way(&self, now: Time, from: Option<u64>, touched: &Touched) -> Vec<CallBack> {
        let Touched(touched, named) = touched;
        let mut leases = self.5.lock();
        if (touched.is_empty() && named.is_empty()) || !leases.holds.any_other(now, from) {
            return vec![];
        }
        let mut dirs = touched.clone();
        for &h in touched.iter() {
            if let Ok(i) = self.0.read(|tx| tx.get(h)) {
                if i.attr.kind != FileKind::Dir {
                    dirs.push(i.parent);
                }
            }
        }
        // A directory removed, or renamed over, by name: its holder's
        // unlinks are made first (it is empty once they are).
        for (parent, name) in named {
            if let Ok(Some(h)) = self.0.read(|tx| tx.entry(*parent, name)) {
                dirs.push(h);
            }
        }
        dirs.sort_unstable();
        dirs.dedup();
        dirs.into_iter()
            .filter_map(|d| leases.holds.in_the_way(now, from, d).map(|h| (d, vec![h])))
            .collect()
    }

    /// `HoldDir` for `node`: once no other node holds `dir`, every other
    /// node's lease on it and on the files named in it ends (called back
    /// before the answer) and `node` holds it.
    async fn hold_dir(&self, node: u64, dir: Handle) -> Response {
        loop {
            match self.hold_dir_now(node, dir) {
                Ok((resp, calls)) => {
                    self.forget(calls).await;
                    return resp;
                }
                Err(holders) => self.forget(holders).await,
            }
        }
    }

    /// [`MdsHandler::hold_dir`] under the store's one-request lock; `Err`
    /// as [`MdsHandler::leased`]'s.
    fn hold_dir_now(&self, node: u64, dir: Handle) -> Result<(Response, Vec<CallBack>), Vec<CallBack>> {
        let mds = &self.0;
        let _one = mds.one_op.lock();
        let now = self.2.now();
        let holders = self.holds_in_the_way(now, Some(node), &Touched(vec![dir], vec![]));
        if !holders.is_empty() {
            return Err(holders);
        }
        let listed = mds.read(|tx| {
            let d = tx.dir(dir)?;
            let files = tx.entries(dir, HOLD_MOST + 1)?;
            if files.len() > HOLD_MOST {
                return Err((
                    ErrorCode::Invalid,
                    format!("directory {dir} holds more than {HOLD_MOST} names: not held"),
                ));
            }
            Ok((d, files))
        });
        let (d, files) = match listed {
            Ok(x) => x,
            Err((code, msg)) => return Ok((Response::error(code, msg), vec![])),
        };
        let mut leases = self.5.lock();
        leases.holds.grant(now, node, dir);
        let calls = std::iter::once(dir)
            .chain(files)
            .map(|h| (h, leases.changed(now, Some(node), h)))
            .filter(|(_, holders)| !holders.is_empty())
            .collect();
        Ok((Response::Attr(d.attr), calls))
    }

    /// Calls back the holders of leases on changed files (from
    /// [`MdsHandler::leased`]); returns once each answered or its lease
    /// ran out.
    async fn forget(&self, calls: Vec<CallBack>) {
        if calls.is_empty() {
            return;
        }
        let now = self.2.now();
        let mut all = Opening {
            wait: vec![],
            notify: vec![],
            gone: vec![],
        };
        let first = calls[0].0;
        {
            let mut s = self.2.state.lock();
            for (h, holders) in &calls {
                let o = s.forget_at(now, *h, holders);
                all.wait.extend(o.wait);
                all.notify.extend(o.notify);
            }
        }
        all.notify.sort_unstable();
        all.notify.dedup();
        self.2.wait_for(first, all).await;
    }

    /// A `sprite` open: the core decides which nodes to call back; the open
    /// is answered, with the file's attributes as they are after, once they
    /// have all answered (or were given up on).
    async fn open(&self, handle: Handle, node: u64, write: bool) -> Response {
        match self.op(None, None, Request::GetAttr { handle }).await {
            Response::Attr(a) if a.kind == FileKind::File => {}
            Response::Attr(_) => return Response::error(ErrorCode::Invalid, format!("handle {handle} is not a file")),
            other => return other,
        }
        let cacheable = self.2.open(handle, node, write).await;
        match self.op(None, None, Request::GetAttr { handle }).await {
            Response::Attr(attr) => Response::Opened { attr, cacheable },
            other => other,
        }
    }
}

/// A changed file and the other nodes whose leases on it are called back
/// (each with the end of its lease).
type CallBack = (Handle, Vec<(u64, Time)>);

/// Whether a request's answer gives the asking mount a lease on the file
/// it names: those whose attributes a mount hands its kernel.
/// The inode `name` names in directory `parent` (`.` and `..` too).
fn lookup(tx: &Tx<'_>, parent: Handle, name: &[u8]) -> R<Inode> {
    check_len(name)?;
    tx.dir(parent)?;
    let h = match name {
        b"." => parent,
        b".." => tx.get(parent)?.parent,
        _ => tx
            .entry(parent, name)?
            .ok_or((ErrorCode::NotFound, format!("'{}' not found", show_name(name))))?,
    };
    tx.get(h)
}

/// What a request touches: the files and directories it reads or changes
/// names of, or takes a lease on; and the names it removes or renames over
/// (a directory among them). An other node's hold on any of them (or on
/// the directory of a file among them) is called back before it runs.
#[derive(Default)]
struct Touched(Vec<Handle>, Vec<(Handle, Vec<u8>)>);

fn touched(req: &Request) -> Touched {
    use Request::*;
    let handles = match req {
        Lookup { parent, .. }
        | LookupPolicy { parent, .. }
        | Create { parent, .. }
        | Mkdir { parent, .. }
        | Unlink { parent, .. }
        | Unlinks { parent, .. }
        | CreatesBehind { parent, .. }
        | Rmdir { parent, .. }
        | Symlink { parent, .. }
        | Mknod { parent, .. } => vec![*parent],
        Rename { parent, new_parent, .. } => vec![*parent, *new_parent],
        Link { handle, new_parent, .. } => vec![*handle, *new_parent],
        GetAttr { handle }
        | GetAttrPolicy { handle }
        | SetAttr { handle, .. }
        | ReadDir { handle, .. }
        | Forget { handle }
        // A directory's policies are what a node's creates behind there
        // give their files: its hold is called back first.
        | SetPolicy { handle, .. }
        | UnsetPolicy { handle, .. } => vec![*handle],
        WatchDir { dir } | HoldDir { dir } | ReadDirPlus { dir, .. } => vec![*dir],
        _ => vec![],
    };
    let named = match req {
        Rmdir { parent, name } => vec![(*parent, name.clone())],
        Rename {
            parent,
            name,
            new_parent,
            new_name,
        } => vec![(*parent, name.clone()), (*new_parent, new_name.clone())],
        _ => vec![],
    };
    Touched(handles, named)
}

/// Bytes of one `ReadDirPlus` page at most (names, attributes, policies
/// and contents, roughly): about 200 files of 4 KiB.
const PLUS_PAGE_BYTES: usize = 1 << 20;
/// Files in one `ReadDirPlus` page at most (empty ones take little room):
/// a page holds the store's one-request lock for a millisecond or two.
const PLUS_PAGE_FILES: usize = 1024;

/// A page of the regular files named in directory `dir` after `after`,
/// each as `LookupPolicy` answers it, and the last name the page went
/// past if the directory goes on.
fn files_plus(tx: &Tx, dir: Handle, after: Option<&[u8]>) -> R<(Vec<EntryPlus>, Option<Vec<u8>>)> {
    tx.dir(dir)?;
    let rtx = tx.w();
    let dirents = rtx.open_table(DIRENTS).map_err(db_err)?;
    let inodes = rtx.open_table(INODES).map_err(db_err)?;
    let small = rtx.open_table(SMALL).map_err(db_err)?;
    let start = after.unwrap_or(b"");
    let range = dirents.range((dir, start)..(dir + 1, &b""[..])).map_err(db_err)?;
    let (mut out, mut bytes, mut last) = (Vec::new(), 0usize, None);
    for e in range {
        let (k, v) = e.map_err(db_err)?;
        let name = k.value().1;
        if after == Some(name) {
            continue;
        }
        if bytes >= PLUS_PAGE_BYTES || out.len() >= PLUS_PAGE_FILES {
            return Ok((out, last));
        }
        last = Some(name.to_vec());
        let Some(b) = inodes.get(v.value()).map_err(db_err)? else {
            continue;
        };
        let i: Inode = postcard::from_bytes(b.value()).map_err(db_err)?;
        if i.attr.kind != FileKind::File {
            continue;
        }
        let content = if may_be_small(&i) { small_in(&small, &i)? } else { None };
        bytes += name.len()
            + 128
            + content.as_ref().map_or(0, Vec::len)
            + i.policies.iter().map(|(k, v)| k.len() + v.len() + 2).sum::<usize>();
        out.push(EntryPlus {
            name: name.to_vec(),
            attr: i.attr,
            policies: i.policies,
            content,
        });
    }
    Ok((out, None))
}

fn grants_lease(req: &Request) -> bool {
    matches!(
        req,
        Request::Lookup { .. }
            | Request::LookupPolicy { .. }
            | Request::GetAttr { .. }
            | Request::GetAttrPolicy { .. }
            | Request::Create { .. }
            | Request::SetAttr { .. }
            | Request::Link { .. }
            | Request::Symlink { .. }
            | Request::Mknod { .. }
    )
}

impl Handler for MdsHandler {
    /// A mount's connection closed: its kernel holds nothing of ours any
    /// more (the process died, or it dropped its leases when it found the
    /// connection lost), so its leases end and no change waits for it.
    fn disconnected(&self, node: u64) {
        self.5.lock().node_gone(node);
        self.6.lock().node_gone(node, self.2.now());
        self.2.state.lock().forgets_gone(node);
        self.2.answered.notify_waiters();
    }

    async fn handle(&self, req: Request, data: Bytes) -> (Response, Bytes) {
        tracing::debug!("request {req:?}");
        self.0.requests.fetch_add(1, Ordering::Relaxed);
        let (from, req) = match req {
            Request::As { node, req } => (Some(node), *req),
            req => (None, req),
        };
        if let Some(node) = from {
            self.6.lock().node_seen(node);
        }
        let Request::Once {
            client,
            seq,
            repeat,
            req,
        } = req
        else {
            return self.dispatch(from, None, req, data).await;
        };
        let once = OnceKey::new(client, seq);
        let _doing = self.7.enter(&once).await;
        let kept = match self.7.must_look(&once, repeat) {
            true => self.0.kept(client, seq),
            false => Ok(None),
        };
        match kept {
            Ok(Some(resp)) => {
                tracing::info!("request {seq} of client {client:x} came again: answered as before, not done again");
                (resp, Bytes::new())
            }
            Ok(None) => {
                let (resp, data) = self.dispatch(from, Some(&once), *req, data).await;
                if once.is_kept() {
                    return (resp, data);
                }
                // Not a change to the store (`sprite`'s opens, say): kept
                // after, between other requests.
                let _one = self.0.one_op.lock();
                (self.0.keep(&once, resp), data)
            }
            Err((code, msg)) => (Response::error(code, msg), Bytes::new()),
        }
    }
}

impl MdsHandler {
    /// Does a request for node `from` (`None`: a client without leases);
    /// `once`: made at most once, its answer kept with its change.
    async fn dispatch(
        &self,
        from: Option<u64>,
        once: Option<&OnceKey>,
        req: Request,
        data: Bytes,
    ) -> (Response, Bytes) {
        let resp = match req {
            Request::As { .. } => Response::error(ErrorCode::BadRequest, "a request made for a node inside another"),
            Request::Once { .. } => Response::error(ErrorCode::BadRequest, "a request made once inside another"),
            Request::Durably { req } => {
                if matches!(
                    *req,
                    Request::As { .. } | Request::Once { .. } | Request::Durably { .. }
                ) {
                    return (
                        Response::error(
                            ErrorCode::BadRequest,
                            "a request made for a node, once or durably inside a durable one",
                        ),
                        Bytes::new(),
                    );
                }
                let (resp, data) = Box::pin(self.dispatch(from, once, *req, data)).await;
                if matches!(resp, Response::Error(_)) {
                    return (resp, data);
                }
                return match self.op(from, None, Request::Sync).await {
                    e @ Response::Error(_) => (e, Bytes::new()),
                    _ => (resp, data),
                };
            }
            Request::Shutdown => {
                crate::stop_soon(&self.1);
                Response::Ok
            }
            Request::Open { handle, node, write } => self.open(handle, node, write).await,
            Request::Close { handle, node, write } => {
                self.2.close(handle, node, write);
                Response::Ok
            }
            Request::Reclaim {
                handle,
                node,
                readers,
                writers,
                dirty,
            } => {
                self.2.reclaim(handle, node, readers, writers, dirty);
                Response::Ok
            }
            Request::Callbacks { node } => Response::Callbacks(self.2.poll(node).await),
            Request::Heartbeat {
                node,
                name,
                addr,
                stats,
            } => {
                self.3.lock().heartbeat(node, self.2.now(), (name, addr, *stats));
                Response::Nodes(self.nodes())
            }
            Request::Nodes => Response::Nodes(self.nodes()),
            Request::Leave { node } => {
                self.3.lock().left(node);
                self.4.lock().dir.left(node);
                self.5.lock().node_gone(node);
                Response::Ok
            }
            Request::TierLookup { handle, index, node } => {
                let members = self.tier();
                let block = BlockKey::new(handle, index);
                let mut d = self.4.lock();
                let holder = match d.dir.lookup(node, block, &members) {
                    Source::Peer(p) => Some(p),
                    _ => None,
                };
                d.dir.cached(node, block);
                Response::Holder(holder)
            }
            Request::TierEvicted {
                handle,
                index,
                node,
                n,
                recirculations,
            } => {
                let members = self.tier();
                let mut d = self.4.lock();
                d.picks = d.picks.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let pick = d.picks ^ (d.picks >> 29);
                d.dir.set_chances(n);
                let block = BlockKey::new(handle, index);
                match d.dir.evicted(node, block, recirculations, false, pick, &members) {
                    Evicted::Forward { to, recirculations, .. } => Response::Forward(Some((to, recirculations))),
                    Evicted::Dropped => Response::Forward(None),
                }
            }
            Request::Hashes {
                handle,
                node,
                register: true,
                ..
            } => {
                self.2.hold(handle, node);
                self.op(from, once, req).await
            }
            Request::SyncHolding {
                handle,
                node,
                first,
                last,
            } => {
                self.2.hold_blocks(handle, node, first, last);
                Response::Ok
            }
            Request::SyncWritten {
                handle,
                node,
                first,
                last,
            } => {
                self.2.sync_written(handle, node, first, last).await;
                Response::Ok
            }
            Request::Commit {
                handle,
                node,
                coherence: true,
                ..
            } => match self.op(from, once, req).await {
                done @ Response::Committed { .. } => {
                    self.2.invalidate(handle, node).await;
                    done
                }
                other => other,
            },
            Request::CalledBack { node, id } => {
                self.2.called_back(node, id);
                Response::Ok
            }
            Request::ReadDirPlus { dir, after } => match from {
                None => Response::error(
                    ErrorCode::BadRequest,
                    "a page of a directory's files with leases on them is for a node (a request made As one)",
                ),
                // As a lookup of each name: another node holding the
                // directory is called back first (its unlinks are made),
                // and every later change of a file calls this node back.
                Some(node) => {
                    self.leased_alone(Some(node), None, &Touched(vec![dir], vec![]), once, |m| {
                        m.read(|tx| files_plus(tx, dir, after.as_deref()))
                            .map(|(entries, more)| {
                                let now = self.2.now();
                                let mut leases = self.5.lock();
                                for e in &entries {
                                    leases.grant(now, node, e.attr.handle);
                                }
                                Response::EntriesPlus { entries, more }
                            })
                    })
                    .await
                }
            },
            Request::WatchDir { dir } => match from {
                None => Response::error(
                    ErrorCode::BadRequest,
                    "a lease on a directory's names is for a node (a request made As one)",
                ),
                // Granted after any change before it (which the node's
                // listing after this answer shows); every change after it
                // calls the node back. Another node holding the directory
                // is called back first (its unlinks are made).
                Some(node) => {
                    self.leased_alone(Some(node), None, &Touched(vec![dir], vec![]), once, |m| {
                        m.read(|tx| tx.dir(dir)).map(|i| {
                            self.5.lock().grant(self.2.now(), node, dir);
                            Response::Attr(i.attr)
                        })
                    })
                    .await
                }
            },
            Request::WrittenSmall { handle, size, base } => {
                self.leased_alone(from, None, &Touched::default(), once, |m| {
                    m.written(handle, size, Some((base, &data)))
                })
                .await
            }
            Request::WrittenInline { handle, size, base } => {
                self.leased_alone(from, None, &Touched::default(), once, |m| {
                    m.written_inline(handle, size, base, &data)
                })
                .await
            }
            Request::TruncateInline { handle, size } => {
                self.leased_alone(from, None, &Touched::default(), once, |m| {
                    m.truncate_inline(handle, size)
                })
                .await
            }
            Request::Materialize { handle } => match self.materialize(handle).await {
                Ok(()) => Response::Ok,
                Err((code, msg)) => Response::error(code, msg),
            },
            // A file living here is written out before its policies change
            // (under others its nodes may reach its data servers another way).
            Request::SetPolicy { handle, .. } | Request::UnsetPolicy { handle, .. } => {
                match self.materialize(handle).await {
                    Ok(()) => self.op(from, once, req).await,
                    Err((code, msg)) => Response::error(code, msg),
                }
            }
            Request::SetXattr { handle, name, flags } => {
                self.leased_alone(from, None, &Touched::default(), once, |m| {
                    m.set_xattr(handle, name.clone(), flags, &data)
                })
                .await
            }
            Request::Handles { count } => match from {
                None => Response::error(
                    ErrorCode::BadRequest,
                    "handles for creates behind are for a node (a request made As one)",
                ),
                Some(node) => self
                    .0
                    .give_handles(node, count)
                    .unwrap_or_else(|(code, msg)| Response::error(code, msg)),
            },
            // As `Unlinks`: another node's hold in the way is called back;
            // the node gets a lease on each file as at a create.
            Request::CreatesBehind { parent, ref files } => match from {
                None => Response::error(
                    ErrorCode::BadRequest,
                    "creates behind are for a node (a request made As one)",
                ),
                Some(node) => {
                    self.leased_alone(from, Some(node), &touched(&req), once, |m| {
                        m.creates_behind(node, parent, files, &data)
                    })
                    .await
                }
            },
            Request::HoldDir { dir } => match from {
                None => Response::error(
                    ErrorCode::BadRequest,
                    "a hold on a directory is for a node (a request made As one)",
                ),
                Some(node) => self.hold_dir(node, dir).await,
            },
            Request::Forget { handle } => {
                let r = self.op(from, once, req).await;
                self.6.lock().ended(handle);
                r
            }
            Request::DropOrphans { older_than_secs } => self.drop_orphans(older_than_secs).await,
            Request::GetXattr { handle, name } => {
                return match self.0.get_xattr(handle, &name) {
                    Ok(v) => (Response::Data { len: v.len() as u64 }, Bytes::from(v)),
                    Err((code, msg)) => (Response::error(code, msg), Bytes::new()),
                }
            }
            req => self.op(from, once, req).await,
        };
        (resp, Bytes::new())
    }
}

/// The meta table's key noting the node that keeps orphan `h` (fixed
/// width, so the keys of all orphans are one range: [`Mds::orphans`]).
/// The meta key of a file's appends reserved and not yet covered by its
/// size: their end.
fn append_key(h: Handle) -> String {
    format!("append/{h:016x}")
}

/// The key in `META` marking a file whose only copy is its small copy
/// (`WrittenInline`: data on metadata): its data servers hold nothing
/// of it until [`MdsHandler::materialize`] writes it out to them.
fn inline_key(h: Handle) -> String {
    format!("inline/{h:016x}")
}

/// Why a file living on the metadata server refuses a change that
/// assumes its data servers hold it.
fn lives_here(h: Handle, what: &str) -> (ErrorCode, String) {
    (
        ErrorCode::Invalid,
        format!(
            "{what} of handle {h}: the file's content is on the metadata server only; \
             a node has it written out to the data servers (Materialize) before it touches them"
        ),
    )
}

fn orphan_key(h: Handle) -> String {
    format!("{ORPHAN_PREFIX}{h:016x}")
}

const ORPHAN_PREFIX: &str = "orphan/";

/// How long a callback poll waits before it is answered empty.
const POLL_WAIT: Duration = Duration::from_secs(10);

/// `sprite` consistency at the metadata server: the driver of the core's
/// server half ([`SpriteServer`], which holds who has what open, the
/// callbacks in flight and their deadlines). This part only wakes polling
/// nodes and the opens waiting for answers, and keeps the clock.
struct Sprite {
    state: Mutex<SpriteServer>,
    /// Wakes a node's outstanding poll when a callback is queued for it.
    polls: Mutex<HashMap<u64, Arc<Notify>>>,
    /// Wakes opens waiting for callbacks when one is answered.
    answered: Notify,
    epoch: Instant,
}

impl Default for Sprite {
    fn default() -> Self {
        Sprite {
            state: Mutex::new(SpriteServer::new()),
            polls: Mutex::new(HashMap::new()),
            answered: Notify::new(),
            epoch: Instant::now(),
        }
    }
}

impl Sprite {
    fn now(&self) -> Time {
        Time(self.epoch.elapsed().as_nanos() as u64)
    }

    fn poll_of(&self, node: u64) -> Arc<Notify> {
        self.polls.lock().entry(node).or_default().clone()
    }

    /// Registers the open; returns once every callback it needs is answered
    /// (or its node was given up on at the core's deadline).
    async fn open(&self, handle: Handle, node: u64, write: bool) -> bool {
        self.grace().await;
        let o = self.state.lock().open_at(self.now(), node, handle, write);
        self.wait_for(handle, o).await;
        self.state.lock().may_cache(handle)
    }

    /// Returns once the grace period after a restart is over
    /// ([`SpriteServer::recovering`]): the nodes have reclaimed their
    /// `sprite` opens, and dropped the `sync-write` blocks and coherent
    /// hashes they held, by then.
    async fn grace(&self) {
        let ends = self.state.lock().grace_ends(self.now());
        if let Some(t) = ends {
            tokio::time::sleep(Duration::from_nanos(t.0.saturating_sub(self.now().0))).await;
        }
    }

    /// Sends an opening's callbacks and waits until none is unanswered.
    async fn wait_for(&self, handle: Handle, o: Opening) {
        for n in &o.gone {
            tracing::warn!("node {n:x} is gone: its opens are dropped");
        }
        for n in &o.notify {
            self.poll_of(*n).notify_one();
        }
        loop {
            let answered = self.answered.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            let deadline = {
                let s = self.state.lock();
                if !s.waiting(&o.wait) {
                    return;
                }
                s.next_deadline()
            };
            let wait = deadline.map_or(POLL_WAIT, |t| Duration::from_nanos(t.0.saturating_sub(self.now().0)));
            let _ = tokio::time::timeout(wait, answered).await;
            for n in self.state.lock().expire(self.now()) {
                tracing::warn!(
                    "node {n:x} did not answer a callback for handle {handle} in time: its opens are dropped"
                );
            }
        }
    }

    fn close(&self, handle: Handle, node: u64, write: bool) {
        self.state.lock().close(node, handle, write);
    }

    /// A node's reclaim after a restart (`SpriteServer::reclaim_at`): the
    /// callbacks it makes are sent, not waited for (an open waits for them).
    fn reclaim(&self, handle: Handle, node: u64, readers: u32, writers: u32, dirty: bool) {
        let o = self
            .state
            .lock()
            .reclaim_at(self.now(), node, handle, readers, writers, dirty);
        for n in &o.gone {
            tracing::warn!("node {n:x} is gone: its opens are dropped");
        }
        for n in &o.notify {
            self.poll_of(*n).notify_one();
        }
    }

    fn hold(&self, handle: Handle, node: u64) {
        self.state.lock().hold(self.now(), node, handle);
    }

    fn hold_blocks(&self, handle: Handle, node: u64, first: u64, last: u64) {
        self.state.lock().hold_blocks(self.now(), node, handle, first, last);
    }

    /// A `sync-write`: returns once every other node caching one of the
    /// blocks dropped it (or was given up on at the core's deadline).
    async fn sync_written(&self, handle: Handle, node: u64, first: u64, last: u64) {
        self.grace().await;
        let o = self.state.lock().sync_written_at(self.now(), node, handle, first, last);
        self.wait_for(handle, o).await;
    }

    /// A coherent commit: returns once every other holder of the file's
    /// hashes dropped them (or was given up on at the core's deadline).
    async fn invalidate(&self, handle: Handle, node: u64) {
        self.grace().await;
        let o = self.state.lock().invalidate_at(self.now(), node, handle);
        self.wait_for(handle, o).await;
    }

    async fn poll(&self, node: u64) -> Vec<(u64, Handle, Callback)> {
        let wire = |q: Vec<Queued>| {
            q.into_iter()
                .map(|q| {
                    let cb = match q.cb {
                        CoreCallback::Recall => Callback::Recall,
                        CoreCallback::Disable => Callback::Disable,
                        CoreCallback::Invalidate => Callback::Invalidate,
                        CoreCallback::DropBlocks { first, last } => Callback::DropBlocks { first, last },
                        CoreCallback::Forget => Callback::Forget,
                    };
                    (q.id, q.file, cb)
                })
                .collect()
        };
        let notify = self.poll_of(node);
        if let Some(q) = self.state.lock().poll(self.now(), node) {
            return wire(q);
        }
        // A callback queued after the check above left a permit: no loss.
        let _ = tokio::time::timeout(POLL_WAIT, notify.notified()).await;
        wire(self.state.lock().poll_ended(self.now(), node))
    }

    fn called_back(&self, node: u64, id: u64) {
        self.state.lock().answered(node, id);
        self.answered.notify_waiters();
    }
}

/// How long the metadata server waits at start for a data server to answer.
const IDENTITY_WAIT: Duration = Duration::from_secs(10);

/// Asks the data server at `addr` which cluster it belongs to, retrying
/// while it starts.
async fn identity_of(addr: &str, secret: &Secret) -> io::Result<Option<ServerIdentity>> {
    let until = Instant::now() + IDENTITY_WAIT;
    loop {
        let last = match Client::connect(addr, secret).await {
            Ok(c) => match c.call(&Request::Identity, &[]).await {
                Ok((Response::Identity(id), _)) => return Ok(id),
                Ok((other, _)) => {
                    return Err(io::Error::other(format!(
                        "{addr} is not a parcache data server (it answered {other:?} when asked who it is)"
                    )))
                }
                Err(e) => e.to_string(),
            },
            Err(e @ ConnError::Auth { .. }) => return Err(io::Error::other(e.to_string())),
            Err(e) => e.to_string(),
        };
        if Instant::now() > until {
            return Err(io::Error::other(format!(
                "cannot reach data server {addr} to check that it belongs to this cluster \
                 (start the data servers first): {last}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Checks the data servers given at start against the ones this metadata
/// store was made with: the same number, each in its place, of this
/// cluster. Data servers never adopted (a new cluster) are adopted. A
/// mismatch would mix up every file's stripes, so it is refused with the
/// order the servers must be given in.
async fn check_data_servers(mds: &Mds, cfg: &MdsConfig) -> io::Result<()> {
    let refuse = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
    let (id, recorded) = mds.cluster_record().map_err(|(_, m)| io::Error::other(m))?;
    if let Some(rec) = &recorded {
        if rec.len() != cfg.iods.len() {
            return Err(refuse(format!(
                "this metadata store's cluster has {} data servers (in order: {}), {} given",
                rec.len(),
                rec.join(" "),
                cfg.iods.len()
            )));
        }
    }
    let id = match id {
        Some(id) => id,
        // 64 random bits from the OS, as hex.
        None => Secret::generate().to_hex()[..16].to_string(),
    };
    let mut ids = Vec::new();
    for addr in &cfg.iods {
        ids.push(identity_of(addr, &cfg.secret).await?);
    }
    let mut misplaced = false;
    for (i, (addr, got)) in cfg.iods.iter().zip(&ids).enumerate() {
        match got {
            Some(got) if got.cluster != id => {
                return Err(refuse(format!(
                    "data server {addr} belongs to cluster {}, not to this metadata server's cluster {id}",
                    got.cluster
                )))
            }
            Some(got) => misplaced |= got.index as usize != i,
            None if recorded.is_some() => {
                return Err(refuse(format!(
                    "data server {addr} (given as number {i}) was never part of cluster {id}: its directory is new \
                     or was emptied, and data server {i} of this cluster held stripes of every file"
                )))
            }
            None => {}
        }
    }
    if misplaced {
        let mut order: Vec<(u32, &String)> = ids
            .iter()
            .zip(&cfg.iods)
            .filter_map(|(g, a)| Some((g.as_ref()?.index, a)))
            .collect();
        order.sort();
        let args: Vec<String> = order.iter().map(|(_, a)| format!("--iod {a}")).collect();
        return Err(refuse(format!(
            "the data servers are given in the wrong order, which would mix up every file's stripes; \
             give them as: {}",
            args.join(" ")
        )));
    }
    for (i, (addr, got)) in cfg.iods.iter().zip(&ids).enumerate() {
        if got.is_none() {
            let c = Client::connect(addr, &cfg.secret)
                .await
                .map_err(|e| io::Error::other(e.to_string()))?;
            let req = Request::Adopt {
                cluster: id.clone(),
                index: i as u32,
            };
            match c.call(&req, &[]).await.map_err(|e| io::Error::other(e.to_string()))? {
                (Response::Ok, _) => {}
                (Response::Error(e), _) => return Err(refuse(format!("data server {addr}: {}", e.message))),
                (other, _) => {
                    return Err(io::Error::other(format!(
                        "data server {addr}: unexpected reply {other:?}"
                    )))
                }
            }
        }
    }
    mds.record_cluster(&id, &cfg.iods).map_err(|(_, m)| io::Error::other(m))
}

/// Opens the metadata store and binds. Await `served` to run.
pub async fn start(cfg: MdsConfig) -> io::Result<crate::Running> {
    let lock = crate::lock_dir(&cfg.data_dir, "metadata server")?;
    // Room for the durable commits of the start, on a full disk too.
    let _ = std::fs::remove_file(cfg.data_dir.join(SPACE_RESERVE));
    let mds = Arc::new(Mds::open(&cfg)?);
    check_data_servers(&mds, &cfg).await?;
    keep_space_reserve(&cfg.data_dir);
    let listener = TcpListener::bind(cfg.listen).await?;
    let addr = listener.local_addr()?;
    let (stop, rx) = watch::channel(false);
    let stop = Arc::new(stop);
    // The orphans kept before a restart: each node that keeps one counts
    // as gone from now until it is heard from.
    let sprite = Sprite::default();
    if mds.incarnation.load(Ordering::SeqCst) > 1 {
        // Not the store's first start: nodes may have files open.
        sprite.state.lock().recovering(sprite.now());
    }
    let mut orphans = Orphans::default();
    for (handle, node) in mds.orphans().map_err(|(_, e)| io::Error::other(e))? {
        orphans.restored(handle, node, sprite.now());
    }
    let handler = Arc::new(MdsHandler(
        mds.clone(),
        stop.clone(),
        sprite,
        Mutex::new(Membership::default()),
        Mutex::new(TierDirectory {
            dir: Directory::new(CooperativeKind::DEFAULT_N),
            picks: 0,
            seen: Members::default(),
        }),
        Mutex::new(Leases::new()),
        Mutex::new(orphans),
        InFlight::default(),
        DataLinks {
            secret: cfg.secret.clone(),
            links: tokio::sync::Mutex::new(HashMap::new()),
        },
    ));
    let syncer = {
        let (mds, mut stopped) = (mds.clone(), rx.clone());
        tokio::spawn(async move {
            for round in 1u64.. {
                tokio::select! {
                    _ = tokio::time::sleep(SYNC_EVERY) => {}
                    _ = stopped.changed() => return,
                }
                let m = mds.clone();
                let prune = round % 60 == 0;
                let done = tokio::task::spawn_blocking(move || {
                    if prune {
                        m.prune_replies()?;
                    }
                    m.sync()
                });
                if let Ok(Err((_, e))) = done.await {
                    tracing::error!("{e}");
                }
            }
        })
    };
    // Bound now (the local socket too), before the address is announced.
    let serving = serve(listener, cfg.secret, handler, rx);
    let served = Box::pin(async move {
        serving.await;
        syncer.abort();
        tokio::task::spawn_blocking(move || mds.sync_last())
            .await
            .map_err(io::Error::other)?
            .map_err(|(_, e)| io::Error::other(e))?;
        drop(lock);
        Ok(())
    });
    Ok(crate::Running { addr, stop, served })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(name: &str) -> MdsConfig {
        let dir = std::env::temp_dir().join(format!("parcache-mds-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        MdsConfig {
            data_dir: dir,
            listen: "127.0.0.1:0".parse().unwrap(),
            secret: Secret::from_bytes([7; 32]),
            iods: vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()],
        }
    }

    fn size_of(m: &Mds, h: Handle) -> (u64, u64) {
        match m.op(Request::GetAttr { handle: h }) {
            Ok(Response::Attr(a)) => (a.size, a.version),
            other => panic!("{other:?}"),
        }
    }

    /// Unlinks `name` in the root; the file if that was its last name.
    fn remove(m: &Mds, name: &str) -> Option<Attr> {
        match m.op(Request::Unlink {
            parent: ROOT,
            name: name.as_bytes().to_vec(),
            keep_open: false,
            only: None,
        }) {
            Ok(Response::Unlinked { gone, .. }) => gone,
            other => panic!("{other:?}"),
        }
    }

    fn create(m: &Mds, name: &str) -> Handle {
        match m.op(Request::Create {
            parent: ROOT,
            name: name.as_bytes().to_vec(),
            mode: 0o644,
            exclusive: true,
        }) {
            Ok(Response::Created { attr, .. }) => attr.handle,
            other => panic!("{other:?}"),
        }
    }

    /// A change (here a node's size report) is seen by the next request at
    /// once, loses to a later truncate, is made durable by the next sync
    /// and, without one, lost whole as in a crash.
    #[test]
    fn changes_are_seen_at_once_and_made_durable_by_the_next_sync() {
        let cfg = config("reports");
        let m = Mds::open(&cfg).unwrap();
        let (a, b) = (create(&m, "a"), create(&m, "b"));
        let (_, v0) = size_of(&m, a);
        m.op(Request::Written { handle: a, size: 4096 }).unwrap();
        let (size, v1) = size_of(&m, a);
        assert!(size == 4096 && v1 > v0, "{size} at version {v1} after {v0}");
        // A shorter report does not shrink the file.
        m.op(Request::Written { handle: a, size: 100 }).unwrap();
        assert_eq!(size_of(&m, a), (4096, v1 + 1));
        // A truncate after the reports wins over them, now and once stored.
        let set = SetAttr {
            size: Some(10),
            ..SetAttr::default()
        };
        m.op(Request::SetAttr { handle: a, set }).unwrap();
        assert_eq!(size_of(&m, a).0, 10);
        m.op(Request::Written { handle: b, size: 8192 }).unwrap();
        m.op(Request::Sync).unwrap();
        m.op(Request::Written { handle: b, size: 9000 }).unwrap();
        let c = create(&m, "c");
        let (size, lost) = size_of(&m, b);
        assert_eq!(size, 9000);
        // Dropped without a sync: what came after the last one is lost.
        drop(m);
        let m = Mds::open(&cfg).unwrap();
        assert_eq!(size_of(&m, a).0, 10);
        assert_eq!(size_of(&m, b).0, 8192);
        assert!(m.op(Request::GetAttr { handle: c }).is_err());
        m.op(Request::Written { handle: b, size: 9000 }).unwrap();
        // A node may hold the lost change's answer: the same change made
        // again is at a version past it.
        let (_, again) = size_of(&m, b);
        assert!(again > lost, "version {lost} lost in the crash given again ({again})");
        m.op(Request::Sync).unwrap();
        drop(m);
        let m = Mds::open(&cfg).unwrap();
        assert_eq!(size_of(&m, b).0, 9000);
        drop(m);
        let _ = std::fs::remove_dir_all(&cfg.data_dir);
    }

    fn content_of(m: &Mds, name: &str) -> Option<Vec<u8>> {
        match m.op(Request::LookupPolicy {
            parent: ROOT,
            name: name.as_bytes().to_vec(),
        }) {
            Ok(Response::AttrPolicies { content, .. }) => content,
            other => panic!("{other:?}"),
        }
    }

    /// A file lives on the metadata server alone (`WrittenInline`) only
    /// from empty at its first version or from living here already, at the
    /// base its writer names, under policies that allow it; then a report,
    /// a truncate or a policy that assumes its data servers hold it is
    /// refused until it is written out (a small truncate is done here), and
    /// the mark is kept across a restart and goes with the file.
    #[test]
    fn a_file_lives_here_only_from_empty_and_refuses_changes_that_assume_its_data_servers() {
        let cfg = config("inline");
        let m = Mds::open(&cfg).unwrap();
        let lives = |m: &Mds, h| m.read(|tx| tx.inline(h)).unwrap();
        let refused = |r: R<Response>| matches!(r, Err((ErrorCode::Refused, _)));
        let (a, b, c) = (create(&m, "a"), create(&m, "b"), create(&m, "c"));
        let (_, v0) = size_of(&m, a);
        // Content that is not the size, or none, is no report.
        assert!(matches!(
            m.written_inline(a, 4, v0, b"abc"),
            Err((ErrorCode::Invalid, _))
        ));
        assert!(matches!(m.written_inline(a, 0, v0, b""), Err((ErrorCode::Invalid, _))));
        m.written_inline(a, 3, v0, b"abc").unwrap();
        assert!(lives(&m, a));
        assert_eq!(content_of(&m, "a"), Some(b"abc".to_vec()));
        // Its writer again, from the version it made: still here.
        let (_, v1) = size_of(&m, a);
        m.written_inline(a, 5, v1, b"abcde").unwrap();
        assert_eq!((content_of(&m, "a"), size_of(&m, a).0), (Some(b"abcde".to_vec()), 5));
        // From a stale base (another node's change came first): refused.
        assert!(refused(m.written_inline(a, 1, v1, b"z")));
        assert_eq!(content_of(&m, "a"), Some(b"abcde".to_vec()));
        // A report or a truncate that assumes the data servers hold it.
        assert!(matches!(
            m.op(Request::Written { handle: a, size: 9 }),
            Err((ErrorCode::Invalid, _))
        ));
        assert!(matches!(
            m.written(a, 2, Some((v1 + 1, b"xy"))),
            Err((ErrorCode::Invalid, _))
        ));
        let cut = SetAttr {
            size: Some(1),
            ..SetAttr::default()
        };
        assert!(matches!(
            m.op(Request::SetAttr { handle: a, set: cut }),
            Err((ErrorCode::Invalid, _))
        ));
        assert_eq!(size_of(&m, a).0, 5, "changed by a refused request");
        // A mode change is no change of content.
        let chmod = SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        };
        m.op(Request::SetAttr { handle: a, set: chmod }).unwrap();
        assert_eq!(content_of(&m, "a"), Some(b"abcde".to_vec()));
        // A file whose data servers were written: never here.
        m.op(Request::Written { handle: b, size: 2 }).unwrap();
        let (_, vb) = size_of(&m, b);
        assert!(refused(m.written_inline(b, 2, vb, b"xy")));
        assert!(!lives(&m, b));
        // Nor under policies whose nodes reach the data servers another way.
        m.op(Request::SetPolicy {
            handle: c,
            key: "nv".into(),
            value: "on".into(),
        })
        .unwrap();
        let (_, vc) = size_of(&m, c);
        assert!(refused(m.written_inline(c, 2, vc, b"xy")));
        // Cut or zero-filled here, staying here; not past 8 KiB, and not
        // for a file that does not live here.
        let e = create(&m, "e");
        let (_, ve) = size_of(&m, e);
        m.written_inline(e, 4, ve, b"wxyz").unwrap();
        m.truncate_inline(e, 2).unwrap();
        assert_eq!(content_of(&m, "e"), Some(b"wx".to_vec()));
        m.truncate_inline(e, 5).unwrap();
        assert_eq!(content_of(&m, "e"), Some(b"wx\0\0\0".to_vec()));
        m.truncate_inline(e, 0).unwrap();
        assert!(lives(&m, e) && size_of(&m, e).0 == 0, "a file cut to nothing here");
        assert!(refused(m.truncate_inline(e, SMALL_COPY_MAX + 1)));
        assert!(refused(m.truncate_inline(b, 1)));
        assert_eq!(size_of(&m, b).0, 2);
        // Kept across a restart; gone with the file.
        m.op(Request::Sync).unwrap();
        drop(m);
        let m = Mds::open(&cfg).unwrap();
        assert!(lives(&m, a));
        assert_eq!(content_of(&m, "a"), Some(b"abcde".to_vec()));
        // Its removal tells the node that the data servers hold nothing.
        let gone = remove(&m, "a").expect("a's last name");
        assert!(gone.layout.is_none(), "{gone:?}");
        assert!(!lives(&m, a), "the mark outlived its file");
        assert!(remove(&m, "b").expect("b's last name").layout.is_some());
        drop(m);
        let _ = std::fs::remove_dir_all(&cfg.data_dir);
    }

    /// A size report with the file's content keeps it (data on metadata)
    /// only from a node whose blocks were current: the file still at the
    /// base version it names, and no longer than the content. The copy is
    /// given with the attributes only while the file stays at the version
    /// it was kept at, is stored with the inode (a sync makes both
    /// durable) and goes with the file.
    #[test]
    fn a_small_files_copy_is_kept_only_from_current_blocks_and_given_while_current() {
        let cfg = config("small");
        let m = Mds::open(&cfg).unwrap();
        let a = create(&m, "a");
        let (_, v0) = size_of(&m, a);
        assert_eq!(content_of(&m, "a"), None, "an empty file");
        // Another node's report came first: the base is old.
        m.op(Request::Written { handle: a, size: 2 }).unwrap();
        let (_, v1) = size_of(&m, a);
        m.written(a, 3, Some((v0, b"abc"))).unwrap();
        assert_eq!(size_of(&m, a), (3, v1 + 1));
        assert_eq!(content_of(&m, "a"), None, "kept from stale blocks");
        m.written(a, 3, Some((v1 + 1, b"xyz"))).unwrap();
        assert_eq!(content_of(&m, "a"), Some(b"xyz".to_vec()));
        // Content that is not the size is refused, and changes nothing.
        assert!(m.written(a, 4, Some((v1 + 2, b"xyz"))).is_err());
        assert_eq!(size_of(&m, a), (3, v1 + 2));
        // Shorter than the file: not the whole content.
        m.written(a, 2, Some((v1 + 2, b"xy"))).unwrap();
        assert_eq!(content_of(&m, "a"), None, "kept a copy shorter than the file");
        m.written(a, 3, Some((v1 + 3, b"123"))).unwrap();
        m.op(Request::Sync).unwrap();
        drop(m);
        let m = Mds::open(&cfg).unwrap();
        assert_eq!(content_of(&m, "a"), Some(b"123".to_vec()), "lost at a restart");
        // Any later change (a truncate to the same size too) stales it.
        let set = SetAttr {
            size: Some(3),
            ..SetAttr::default()
        };
        m.op(Request::SetAttr { handle: a, set }).unwrap();
        assert_eq!(content_of(&m, "a"), None, "given after a truncate");
        let (_, v) = size_of(&m, a);
        m.written(a, 3, Some((v, b"456"))).unwrap();
        assert_eq!(content_of(&m, "a"), Some(b"456".to_vec()));
        remove(&m, "a");
        let left = m.read(|tx| tx.tx.open_table(SMALL).map_err(db_err)?.len().map_err(db_err));
        assert_eq!(left.unwrap(), 0, "the copy outlived its file");
        drop(m);
        let _ = std::fs::remove_dir_all(&cfg.data_dir);
    }

    /// An unlink that names its file (`only`) removes the name only while
    /// it names that file: one made again under the name stays.
    #[test]
    fn an_unlink_of_one_file_leaves_another_made_under_its_name() {
        let cfg = config("unlink-only");
        let m = Mds::open(&cfg).unwrap();
        let old = create(&m, "f");
        let unlink = |only| {
            m.op(Request::Unlink {
                parent: ROOT,
                name: b"f".to_vec(),
                keep_open: false,
                only,
            })
        };
        unlink(None).unwrap();
        let new = create(&m, "f");
        assert_ne!(old, new);
        match unlink(Some(old)) {
            Err((ErrorCode::NotFound, e)) => assert!(e.contains("another file"), "{e}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(lookup(&m, "f"), Some(new), "the file made again");
        unlink(Some(new)).unwrap();
        assert_eq!(lookup(&m, "f"), None);
        drop(m);
        let _ = std::fs::remove_dir_all(&cfg.data_dir);
    }

    /// `ReadDirPlus`'s pages name every regular file of the directory once,
    /// in name order, each as a lookup answers it (a small file's current
    /// content with it), and leave directories out; a page ends past
    /// about 1 MiB or 1,024 files, and the next starts after the last name
    /// it went past.
    #[test]
    fn pages_of_files_plus_answer_each_file_as_its_lookup() {
        let cfg = config("plus");
        let m = Mds::open(&cfg).unwrap();
        let mut made = std::collections::BTreeMap::new();
        for i in 0..300 {
            let name = format!("f{i:03}");
            let h = create(&m, &name);
            let (_, v) = size_of(&m, h);
            let content = vec![i as u8; 4096];
            m.written(h, 4096, Some((v, &content))).unwrap();
            made.insert(name.into_bytes(), (h, Some(content)));
        }
        // Empty, and a directory (left out).
        made.insert(b"g".to_vec(), (create(&m, "g"), None));
        m.op(Request::Mkdir {
            parent: ROOT,
            name: b"f150d".to_vec(),
            mode: 0o755,
        })
        .unwrap();
        let (mut after, mut pages, mut seen) = (None, 0, Vec::new());
        loop {
            let (page, more) = m.read(|tx| files_plus(tx, ROOT, after.as_deref())).unwrap();
            pages += 1;
            for e in page {
                let (h, content) = &made[&e.name];
                assert_eq!((e.attr.handle, &e.content), (*h, content), "{}", show_name(&e.name));
                match m
                    .op(Request::LookupPolicy {
                        parent: ROOT,
                        name: e.name.clone(),
                    })
                    .unwrap()
                {
                    Response::AttrPolicies { attr, policies, .. } => assert_eq!((attr, policies), (e.attr, e.policies)),
                    other => panic!("{other:?}"),
                }
                seen.push(e.name);
            }
            match more {
                Some(last) => after = Some(last),
                None => break,
            }
        }
        assert_eq!(pages, 2, "300 files of 4 KiB in pages of about 1 MiB");
        assert_eq!(
            seen,
            made.keys().cloned().collect::<Vec<_>>(),
            "each file once, in order"
        );
        assert!(
            m.read(|tx| files_plus(tx, made[&b"g"[..]].0, None)).is_err(),
            "not a directory"
        );
        // Empty files: pages of 1,024.
        m.op(Request::Mkdir {
            parent: ROOT,
            name: b"e".to_vec(),
            mode: 0o755,
        })
        .unwrap();
        let e = lookup(&m, "e").unwrap();
        for i in 0..1500 {
            m.op(Request::Create {
                parent: e,
                name: format!("{i}").into_bytes(),
                mode: 0o644,
                exclusive: true,
            })
            .unwrap();
        }
        let (page, more) = m.read(|tx| files_plus(tx, e, None)).unwrap();
        assert_eq!(page.len(), 1024);
        let (page, more) = m.read(|tx| files_plus(tx, e, more.as_deref())).unwrap();
        assert_eq!((page.len(), more), (476, None));
        drop(m);
        let _ = std::fs::remove_dir_all(&cfg.data_dir);
    }

    /// Unlinks sent together are each done on its own, in order: a name
    /// missing, or naming another file than the one given, is refused
    /// alone; the others go, and each file gone with its last name is
    /// answered so that its data goes too.
    #[test]
    fn unlinks_sent_together_are_each_done_alone() {
        let cfg = config("unlinks");
        let m = Mds::open(&cfg).unwrap();
        let a = create(&m, "a");
        let b = create(&m, "b");
        let c = create(&m, "c");
        let names = vec![
            (b"a".to_vec(), Some(a)),
            (b"missing".to_vec(), None),
            (b"b".to_vec(), Some(c)),
            (b"c".to_vec(), None),
            (b"a".to_vec(), Some(a)),
        ];
        let each = match m.op(Request::Unlinks { parent: ROOT, names }).unwrap() {
            Response::Each(each) => each,
            other => panic!("{other:?}"),
        };
        let codes: Vec<_> = each
            .iter()
            .map(|r| match r {
                Response::Unlinked { gone, .. } => Ok(gone.as_ref().map(|g| g.handle)),
                Response::Error(e) => Err(e.code),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            codes,
            vec![
                Ok(Some(a)),
                Err(ErrorCode::NotFound),
                Err(ErrorCode::NotFound),
                Ok(Some(c)),
                Err(ErrorCode::NotFound)
            ]
        );
        assert_eq!(
            (lookup(&m, "a"), lookup(&m, "b"), lookup(&m, "c")),
            (None, Some(b), None)
        );
        drop(m);
        let _ = std::fs::remove_dir_all(&cfg.data_dir);
    }

    /// Creates behind use only handles given to their node, each once;
    /// each is done on its own (one refused leaves the others made), with
    /// the owner, first data server and content the node gave, and the
    /// handle counter moved past the handles given.
    #[test]
    fn creates_behind_use_only_handles_given_to_their_node() {
        let cfg = config("behind");
        let m = Mds::open(&cfg).unwrap();
        let first = match m.give_handles(7, 3).unwrap() {
            Response::Reserved { first, count: 3 } => first,
            other => panic!("{other:?}"),
        };
        let after = create(&m, "made-here");
        assert!(after >= first + 3, "a handle given is never given again ({after})");
        let behind = |name: &str, handle: Handle, size: u64| Behind {
            name: name.as_bytes().to_vec(),
            handle,
            mode: 0o600,
            uid: 1000,
            gid: 100,
            first_server: 1,
            size,
        };
        let files = vec![
            behind("a", first, 5),
            behind("b", after + 100, 0),
            behind("made-here", first + 1, 0),
            behind("c", first + 1, 0),
            behind("d", first, 0),
        ];
        let each = match m.creates_behind(7, ROOT, &files, b"hello").unwrap() {
            Response::Each(each) => each,
            other => panic!("{other:?}"),
        };
        let got: Vec<_> = each
            .iter()
            .map(|r| match r {
                Response::Created { attr, .. } => Ok(attr.handle),
                Response::Error(e) => Err(e.code),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            got,
            vec![
                Ok(first),
                Err(ErrorCode::Invalid),
                Err(ErrorCode::Exists),
                Ok(first + 1),
                Err(ErrorCode::Invalid)
            ]
        );
        let other_node = m.creates_behind(8, ROOT, &[behind("e", first + 2, 0)], b"").unwrap();
        assert!(
            matches!(&other_node, Response::Each(e) if matches!(&e[0], Response::Error(x) if x.code == ErrorCode::Invalid)),
            "{other_node:?}"
        );
        match m
            .op(Request::LookupPolicy {
                parent: ROOT,
                name: b"a".to_vec(),
            })
            .unwrap()
        {
            Response::AttrPolicies { attr, content, .. } => {
                assert_eq!((attr.uid, attr.gid, attr.mode, attr.size), (1000, 100, 0o600, 5));
                assert_eq!(attr.layout.unwrap().servers, vec![1, 0]);
                assert_eq!(content.as_deref(), Some(&b"hello"[..]));
            }
            other => panic!("{other:?}"),
        }
        let short = m.creates_behind(7, ROOT, &[behind("f", first + 2, 9)], b"hi");
        assert!(matches!(short, Err((ErrorCode::BadRequest, _))), "{short:?}");
        drop(m);
        let _ = std::fs::remove_dir_all(&cfg.data_dir);
    }

    /// Within one opening of the store a change moves a version by one (a
    /// node tells its own report was the only change by that), from the
    /// first on; across a restart the next change goes past every version
    /// given before, and a file never changed still shows so.
    #[test]
    fn versions_move_by_one_within_an_incarnation_and_past_every_earlier_one_across() {
        let cfg = config("incarnations");
        let m = Mds::open(&cfg).unwrap();
        let (a, b) = (create(&m, "a"), create(&m, "b"));
        let (_, v0) = size_of(&m, a);
        m.op(Request::Written { handle: a, size: 1 }).unwrap();
        assert_eq!(size_of(&m, a).1, v0 + 1);
        m.op(Request::Written { handle: a, size: 2 }).unwrap();
        assert_eq!(size_of(&m, a).1, v0 + 2);
        m.op(Request::Sync).unwrap();
        m.op(Request::Written { handle: a, size: 3 }).unwrap();
        let lost = size_of(&m, a).1;
        drop(m);
        let m = Mds::open(&cfg).unwrap();
        assert_eq!(size_of(&m, a).1, v0 + 2, "the unsynced change is lost");
        assert!(parcache_proto::never_changed(size_of(&m, b).1));
        m.op(Request::Written { handle: a, size: 3 }).unwrap();
        let (_, again) = size_of(&m, a);
        assert!(again > lost && !parcache_proto::never_changed(again));
        m.op(Request::Written { handle: a, size: 4 }).unwrap();
        assert_eq!(size_of(&m, a).1, again + 1);
        m.op(Request::Written { handle: b, size: 1 }).unwrap();
        assert!(
            !parcache_proto::never_changed(size_of(&m, b).1),
            "a change from the last incarnation's first version"
        );
        drop(m);
        let _ = std::fs::remove_dir_all(&cfg.data_dir);
    }

    /// A new file is at its first version; a truncate moves it on even to
    /// the size the file has (the node cut or made its parts at the data
    /// servers, so a removal must ask them), and a change of mode does not.
    #[test]
    fn a_truncate_to_the_same_size_moves_the_version() {
        let cfg = config("same-size");
        let m = Mds::open(&cfg).unwrap();
        let a = create(&m, "a");
        let (_, v0) = size_of(&m, a);
        assert!(parcache_proto::never_changed(v0));
        let chmod = SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        };
        m.op(Request::SetAttr { handle: a, set: chmod }).unwrap();
        assert_eq!(size_of(&m, a), (0, v0));
        let truncate = SetAttr {
            size: Some(0),
            ..SetAttr::default()
        };
        m.op(Request::SetAttr {
            handle: a,
            set: truncate,
        })
        .unwrap();
        assert_eq!(size_of(&m, a), (0, v0 + 1));
        assert!(!parcache_proto::never_changed(v0 + 1));
        drop(m);
        let _ = std::fs::remove_dir_all(&cfg.data_dir);
    }

    /// An append (`O_APPEND` from a node) is reserved after the file's
    /// end, after every append reserved and not yet reported and after the
    /// node's own unreported writes; the size moves only with the report.
    /// A report that covers the reservations, or a cut, ends them.
    #[test]
    fn appends_are_reserved_after_the_end_and_the_size_moves_with_reports() {
        let cfg = config("append");
        let m = Mds::open(&cfg).unwrap();
        let a = create(&m, "a");
        m.op(Request::Written { handle: a, size: 10 }).unwrap();
        let (_, v1) = size_of(&m, a);
        let append = |at_least, len| match m.op(Request::Append {
            handle: a,
            at_least,
            len,
        }) {
            Ok(Response::Appended { offset, attr }) => {
                assert_eq!((attr.size, attr.version), size_of(&m, a));
                offset
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(append(0, 5), 10);
        assert_eq!(append(0, 3), 15);
        assert_eq!(size_of(&m, a), (10, v1), "a reservation is no size");
        // The second appender reports first: the first's bytes are inside.
        m.op(Request::Written { handle: a, size: 18 }).unwrap();
        m.op(Request::Written { handle: a, size: 15 }).unwrap();
        assert_eq!(append(0, 2), 18);
        // The node's own writes reach 40: its append goes after them.
        assert_eq!(append(40, 2), 40);
        // A cut forgets the reservations: the next append is at the end.
        let cut = SetAttr {
            size: Some(4),
            ..SetAttr::default()
        };
        m.op(Request::SetAttr { handle: a, set: cut }).unwrap();
        assert_eq!(append(0, 1), 4);
        m.op(Request::Written { handle: a, size: 5 }).unwrap();
        assert_eq!(append(0, 1), 5);
        assert!(matches!(
            m.op(Request::Append {
                handle: ROOT,
                at_least: 0,
                len: 1
            }),
            Err((ErrorCode::Invalid, _))
        ));
        assert!(matches!(
            m.op(Request::Append {
                handle: a,
                at_least: u64::MAX - 1,
                len: 2
            }),
            Err((ErrorCode::Invalid, _))
        ));
        drop(m);
        let _ = std::fs::remove_dir_all(&cfg.data_dir);
    }

    fn lookup(m: &Mds, name: &str) -> Option<Handle> {
        match m.op(Request::Lookup {
            parent: ROOT,
            name: name.as_bytes().to_vec(),
        }) {
            Ok(Response::Attr(a)) => Some(a.handle),
            Err((ErrorCode::NotFound, _)) => None,
            other => panic!("{other:?}"),
        }
    }

    /// Nothing is done after the last commit before a graceful stop: a
    /// request then is refused as not done (the client sends it again to
    /// the server restarted), so none is answered and then lost.
    #[test]
    fn nothing_is_done_after_the_last_commit_before_a_stop() {
        let cfg = config("stop");
        let m = Mds::open(&cfg).unwrap();
        let kept = create(&m, "kept");
        m.sync_last().unwrap();
        let late = m.op(Request::Create {
            parent: ROOT,
            name: b"late".to_vec(),
            mode: 0o644,
            exclusive: true,
        });
        assert!(matches!(late, Err((ErrorCode::Stopping, _))), "{late:?}");
        drop(m);
        let m = Mds::open(&cfg).unwrap();
        assert_eq!(lookup(&m, "kept"), Some(kept));
        assert_eq!(lookup(&m, "late"), None);
        // The restarted server says whose graceful stop came before it; a
        // start after a crash (no last commit) says none.
        let incarnation = |m: &Mds| match m.op(Request::Incarnation) {
            Ok(Response::Incarnation {
                now,
                after_graceful_stop_of,
            }) => (now, after_graceful_stop_of),
            other => panic!("{other:?}"),
        };
        let (first, before) = incarnation(&m);
        assert!(before.is_some_and(|b| b < first), "{before:?} then {first}");
        drop(m);
        let m = Mds::open(&cfg).unwrap();
        let (second, before) = incarnation(&m);
        assert!(second > first && before.is_none(), "after a crash: {before:?}");
        m.sync_last().unwrap();
        drop(m);
        let m = Mds::open(&cfg).unwrap();
        assert_eq!(incarnation(&m).1, Some(second));
        drop(m);
        let _ = std::fs::remove_dir_all(&cfg.data_dir);
    }

    /// An answer kept for a request made at most once is found by its
    /// client and number only, before and after the durable commit that
    /// writes it, and through a restart; one kept after the last commit is
    /// lost with the changes of a crash; a request whose slot a later one
    /// of its client took is refused, not done again.
    #[test]
    fn kept_answers_are_found_by_client_and_number() {
        let cfg = config("once");
        let m = Mds::open(&cfg).unwrap();
        let answer = Response::Attr(Attr::empty(42, FileKind::File));
        let keep = |m: &Mds, client: u64, seq: u64, resp: &Response| {
            let _one = m.one_op.lock();
            let once = OnceKey::new(client, seq);
            assert_eq!(&m.keep(&once, resp.clone()), resp);
            assert!(once.is_kept());
        };
        keep(&m, 9, 5, &answer);
        assert_eq!(m.kept(9, 5).unwrap(), Some(answer.clone()), "before the commit");
        assert_eq!(m.kept(9, 6).unwrap(), None, "another number");
        assert_eq!(m.kept(8, 5).unwrap(), None, "another client");
        m.sync().unwrap();
        assert_eq!(m.kept(9, 5).unwrap(), Some(answer.clone()), "after the commit");
        // Kept after the last commit: lost in a crash, with the changes.
        keep(&m, 9, 6, &Response::Ok);
        drop(m);
        let m = Mds::open(&cfg).unwrap();
        assert_eq!(m.kept(9, 5).unwrap(), Some(answer), "after a restart");
        assert_eq!(m.kept(9, 6).unwrap(), None, "kept after the last commit");
        keep(&m, 9, 5 + ONCE_SLOTS, &Response::Ok);
        assert!(m.kept(9, 5).is_err(), "its slot taken by a later request");
        m.sync().unwrap();
        assert!(m.kept(9, 5).is_err(), "its slot taken by a later request, committed");
        assert_eq!(m.kept(9, 5 + ONCE_SLOTS).unwrap(), Some(Response::Ok));
        // Pruning keeps what is recent, and drops what is older.
        m.prune_replies().unwrap();
        assert_eq!(m.kept(9, 5 + ONCE_SLOTS).unwrap(), Some(Response::Ok));
        m.prune_replies_before(now().secs + 1).unwrap();
        assert_eq!(m.kept(9, 5 + ONCE_SLOTS).unwrap(), None);
        // Nothing is kept after the last commit of a stop.
        m.sync_last().unwrap();
        let _one = m.one_op.lock();
        let late = m.keep(&OnceKey::new(9, 7), Response::Ok);
        assert!(matches!(late, Response::Error(e) if e.code == ErrorCode::Stopping));
        drop(_one);
        let _ = std::fs::remove_dir_all(&cfg.data_dir);
    }

    /// Requests share one open transaction, so a request that fails after
    /// changing something is undone alone: the requests before it keep
    /// their changes, durable at the next sync.
    #[test]
    fn a_failed_request_is_undone_alone() {
        let mut cfg = config("undo");
        let m = Mds::open(&cfg).unwrap();
        let a = create(&m, "a");
        // A request that links a name, bumps a counter and rewrites an
        // inode, then fails.
        let failed = m.write(|tx| -> R<()> {
            let mut i = tx.get(a)?;
            i.attr.mode = 0o600;
            tx.put(&i)?;
            tx.counter("next_handle", ROOT + 1)?;
            tx.link(ROOT, b"ghost", a)?;
            tx.unlink(ROOT, b"a")?;
            Err((ErrorCode::Io, "failed on purpose".into()))
        });
        assert!(failed.is_err());
        assert_eq!(lookup(&m, "ghost"), None);
        assert_eq!(lookup(&m, "a"), Some(a));
        match m.op(Request::GetAttr { handle: a }) {
            Ok(Response::Attr(attr)) => assert_eq!(attr.mode, 0o644),
            other => panic!("{other:?}"),
        }
        assert_eq!(create(&m, "b"), a + 1, "the counter was put back");
        m.op(Request::Sync).unwrap();
        drop(m);
        // A create that fails after taking a handle (no data server to
        // lay the file out on) gives it back.
        cfg.iods.clear();
        let m = Mds::open(&cfg).unwrap();
        // A restart starts past every handle reserved (a crash may have
        // lost files that had some).
        let first = match m.op(Request::Mkdir {
            parent: ROOT,
            name: b"d0".to_vec(),
            mode: 0o755,
        }) {
            Ok(Response::Attr(attr)) | Ok(Response::Created { attr, .. }) => attr.handle,
            other => panic!("{other:?}"),
        };
        assert_eq!(first, a + HANDLE_RESERVE, "the first handle after a restart");
        let failed = m.op(Request::Create {
            parent: ROOT,
            name: b"c".to_vec(),
            mode: 0o644,
            exclusive: true,
        });
        assert!(failed.is_err());
        assert_eq!(lookup(&m, "c"), None);
        match m.op(Request::Mkdir {
            parent: ROOT,
            name: b"d".to_vec(),
            mode: 0o755,
        }) {
            Ok(Response::Attr(attr)) | Ok(Response::Created { attr, .. }) => assert_eq!(attr.handle, first + 1),
            other => panic!("{other:?}"),
        }
        m.op(Request::Sync).unwrap();
        drop(m);
        let m = Mds::open(&cfg).unwrap();
        assert_eq!(
            (lookup(&m, "a"), lookup(&m, "b"), lookup(&m, "ghost")),
            (Some(a), Some(a + 1), None)
        );
        drop(m);
        let _ = std::fs::remove_dir_all(&cfg.data_dir);
    }

    /// A node's first open learns a file's attributes and policies in one
    /// request (or its lookup does): the answer is what `GetAttr` and
    /// `GetPolicy` give, and a missing file is the same error.
    #[test]
    fn attributes_and_policies_come_in_one_answer() {
        let cfg = config("attrpolicy");
        let m = Mds::open(&cfg).unwrap();
        let a = create(&m, "a");
        m.op(Request::SetPolicy {
            handle: a,
            key: "write".into(),
            value: "write-back".into(),
        })
        .unwrap();
        m.op(Request::Written { handle: a, size: 5000 }).unwrap();
        let (attr, policies) = match m.op(Request::GetAttrPolicy { handle: a }) {
            Ok(Response::AttrPolicies { attr, policies, .. }) => (attr, policies),
            other => panic!("{other:?}"),
        };
        match m.op(Request::GetAttr { handle: a }) {
            Ok(Response::Attr(want)) => assert_eq!(attr, want),
            other => panic!("{other:?}"),
        }
        match m.op(Request::GetPolicy { handle: a }) {
            Ok(Response::Policies(want)) => assert_eq!(policies, want),
            other => panic!("{other:?}"),
        }
        assert_eq!(attr.size, 5000);
        assert!(
            policies.contains(&("write".to_string(), "write-back".to_string())),
            "{policies:?}"
        );
        assert!(m.op(Request::GetAttrPolicy { handle: a + 1000 }).is_err());
        // A mount's lookup: the same answer, by name.
        match m.op(Request::LookupPolicy {
            parent: ROOT,
            name: b"a".to_vec(),
        }) {
            Ok(Response::AttrPolicies {
                attr: got, policies: p, ..
            }) => assert_eq!((got, p), (attr, policies)),
            other => panic!("{other:?}"),
        }
        assert!(m
            .op(Request::LookupPolicy {
                parent: ROOT,
                name: b"missing".to_vec(),
            })
            .is_err());
        drop(m);
        let _ = std::fs::remove_dir_all(&cfg.data_dir);
    }

    /// A collection asks which handles name no file: a file created since
    /// the last durable commit is known (the question reads the open
    /// transaction), an unlinked one is not, one unlinked while open is
    /// until forgotten, and a handle never given is not.
    #[test]
    fn unknown_handles_are_those_of_no_file() {
        let cfg = config("unknown");
        let m = Mds::open(&cfg).unwrap();
        let (a, b, c) = (create(&m, "a"), create(&m, "b"), create(&m, "c"));
        m.op(Request::Unlink {
            parent: ROOT,
            name: b"b".to_vec(),
            keep_open: false,
            only: None,
        })
        .unwrap();
        m.op(Request::Unlink {
            parent: ROOT,
            name: b"c".to_vec(),
            keep_open: true,
            only: None,
        })
        .unwrap();
        let ask = |m: &Mds| match m.op(Request::UnknownHandles {
            handles: vec![ROOT, a, b, c, c + 1000],
        }) {
            Ok(Response::Handles(h)) => h,
            other => panic!("{other:?}"),
        };
        assert_eq!(ask(&m), [b, c + 1000]);
        m.op(Request::Forget { handle: c }).unwrap();
        assert_eq!(ask(&m), [b, c, c + 1000]);
        drop(m);
        let _ = std::fs::remove_dir_all(&cfg.data_dir);
    }
}
