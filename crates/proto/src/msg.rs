//! The messages between clients, the metadata server (mds) and the data
//! servers (iod). File bytes never travel inside a message: they are the
//! frame's payload.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A file's identity, chosen by the metadata server (an inode number).
pub type Handle = u64;
/// The root directory's handle.
pub const ROOT: Handle = 1;

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    /// Special files: kept as metadata only (the kernel serves them), never
    /// through the data path.
    Fifo,
    CharDevice,
    BlockDevice,
    Socket,
}

/// A file name: any bytes but `/` and NUL, at most 255 of them (names are
/// bytes, not text, as on every POSIX file system).
pub type Name = Vec<u8>;

/// Longest file name, in bytes.
pub const NAME_MAX: usize = 255;

/// A name as people read it: itself when it is printable UTF-8, else with
/// the odd bytes escaped (`bad\xff`).
pub fn show_name(name: &[u8]) -> String {
    match std::str::from_utf8(name) {
        Ok(s) if !s.chars().any(char::is_control) => s.to_string(),
        _ => name.escape_ascii().to_string(),
    }
}

/// Seconds and nanoseconds since the Unix epoch.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, PartialOrd, Ord)]
pub struct Timestamp {
    pub secs: i64,
    pub nanos: u32,
}

impl Timestamp {
    /// The time now, by this machine's clock.
    pub fn now() -> Self {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp {
            secs: d.as_secs() as i64,
            nanos: d.subsec_nanos(),
        }
    }
}

/// How a file's bytes are spread over data servers.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Bytes per stripe unit (default 64 KiB).
    pub stripe_unit: u64,
    /// Data server ids, in round-robin order.
    pub servers: Vec<u32>,
}

impl Layout {
    /// `width` of `n` data servers in round-robin order from `first` on.
    pub fn round_robin(stripe_unit: u64, width: u32, n: u32, first: u32) -> Layout {
        let n = n.max(1);
        Layout {
            stripe_unit,
            servers: (0..width.min(n)).map(|i| (first + i) % n).collect(),
        }
    }
}

/// A file's version when created, in the metadata server's incarnation
/// (its high bits, [`VERSION_SHIFT`]): every change to its content or size
/// (a write's report, a truncate, a layout set anew) moves it on, by one
/// within an incarnation, past every version given before otherwise.
pub const FIRST_VERSION: u64 = 1;

/// A version's bits above this count the metadata server's incarnation:
/// each opening of its store (a start, or again after a failed commit)
/// begins one, since a crash takes versions back to the last durable
/// commit while nodes may hold answers given after it.
pub const VERSION_SHIFT: u32 = 40;

/// Whether a file at `version` was never changed since it was created.
pub fn never_changed(version: u64) -> bool {
    version & ((1 << VERSION_SHIFT) - 1) <= FIRST_VERSION
}

/// The largest file whose whole content its writer's size report may carry
/// to the metadata server (`WrittenSmall`), which keeps it beside the
/// inode and gives it with the file's attributes at a lookup or first open
/// (data on metadata, as Lustre's DoM and ext4's inline data do): a node
/// then reads a small file with no request to a data server. The data
/// servers hold the file as before; the copy is only used while the file
/// is still at the version it was reported with.
pub const SMALL_COPY_MAX: u64 = 8 << 10;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub handle: Handle,
    pub kind: FileKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u32,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    /// Incremented by every change of content or size (close-to-open checks).
    pub version: u64,
    pub layout: Option<Layout>,
    /// Device number of a character or block device (0 otherwise).
    pub rdev: u32,
}

impl Attr {
    /// Attributes of a `kind` with nothing in it: size 0, one link, mode
    /// 0644, owned by root, every time at the epoch, version 0, no layout.
    pub fn empty(handle: Handle, kind: FileKind) -> Self {
        Attr {
            handle,
            kind,
            mode: 0o644,
            uid: 0,
            gid: 0,
            size: 0,
            nlink: 1,
            atime: Timestamp::default(),
            mtime: Timestamp::default(),
            ctime: Timestamp::default(),
            version: 0,
            layout: None,
            rdev: 0,
        }
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Name,
    pub handle: Handle,
    pub kind: FileKind,
}

/// A file named in a directory, as a lookup of its name would answer
/// (`Request::ReadDirPlus`): its attributes, policies and, for a small
/// file, its content.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct EntryPlus {
    pub name: Name,
    pub attr: Attr,
    pub policies: Vec<(String, String)>,
    #[serde(with = "serde_bytes")]
    pub content: Option<Vec<u8>>,
}

/// Attributes to change; `None` leaves one alone.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Timestamp>,
    pub mtime: Option<Timestamp>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `req` made for `node`, a mount: the metadata server grants `node` a
    /// lease (`parcache_core::consistency::leases`) on every file (not directory) whose attributes it
    /// answers with, and calls back (`Callback::Forget`) every other
    /// holder of a lease on a file `req` changes, before answering.
    As {
        node: u64,
        req: Box<Request>,
    },
    // --- metadata server ---
    Lookup {
        parent: Handle,
        name: Name,
    },
    GetAttr {
        handle: Handle,
    },
    /// A `Lookup` answered with the file's policies too (`AttrPolicies`):
    /// a mount's lookup, so that the open after it needs no request.
    LookupPolicy {
        parent: Handle,
        name: Name,
    },
    SetAttr {
        handle: Handle,
        set: SetAttr,
    },
    Create {
        parent: Handle,
        name: Name,
        mode: u32,
        exclusive: bool,
    },
    Mkdir {
        parent: Handle,
        name: Name,
        mode: u32,
    },
    /// A page of a directory's entries, in name order, after `after`
    /// (from the start if `None`); answered with `Entries`.
    ReadDir {
        handle: Handle,
        after: Option<Name>,
    },
    /// A page of the files named in directory `dir` after `after`, each as
    /// a lookup of its name answers (attributes, policies, a small file's
    /// content), and a lease on each for the asking node, as that lookup
    /// would give (NFSv3's READDIRPLUS, RFC 1813 §3.3.17): a node reading
    /// many files of a directory looks them up a page at a time. Only
    /// regular files; answered `EntriesPlus`.
    ReadDirPlus {
        dir: Handle,
        after: Option<Name>,
    },
    /// Remove a name. `keep_open`: the file is open on the asking node, so
    /// when this was its last link it stays (an orphan, no name, its data
    /// kept) until that node's `Forget`, as POSIX keeps an unlinked open file.
    /// `only`: remove the name only while it names this file, otherwise
    /// answer `NotFound`. An unlink answered before the server had it
    /// (under a directory hold) carries it: sent again after a lost
    /// connection, when the hold has ended, it must not remove a file
    /// another node made under the name meanwhile.
    Unlink {
        parent: Handle,
        name: Name,
        keep_open: bool,
        only: Option<Handle>,
    },
    /// The asking node closed an orphan (a file unlinked while open there):
    /// answered with its attributes if it is now gone (its data must go).
    Forget {
        handle: Handle,
    },
    /// Remove an empty directory. Answered `Unlinked` (nothing `gone`:
    /// a directory holds no data), with the parent's attributes after, so
    /// a mount answers the kernel's next `getattr` of it itself.
    Rmdir {
        parent: Handle,
        name: Name,
    },
    Rename {
        parent: Handle,
        name: Name,
        new_parent: Handle,
        new_name: Name,
    },
    Symlink {
        parent: Handle,
        name: Name,
        target: Vec<u8>,
    },
    ReadLink {
        handle: Handle,
    },
    Link {
        handle: Handle,
        new_parent: Handle,
        new_name: Name,
    },
    StatFs,
    /// The server's incarnation (moved on at each start), and the one
    /// before it if that lost nothing it acknowledged (the metadata
    /// server: it stopped gracefully; a data server: that, or a crash of
    /// its process alone, the machine staying up): a node that lost its
    /// connection learns whether the server lost what it had not made
    /// durable (`Response::Incarnation`). Asked at each connection.
    Incarnation,
    SetPolicy {
        handle: Handle,
        key: String,
        value: String,
    },
    GetPolicy {
        handle: Handle,
    },
    /// A file's attributes and its policies in one answer
    /// (`AttrPolicies`): what a node's first open of a file needs.
    GetAttrPolicy {
        handle: Handle,
    },
    /// A mount (a request made `As` a node) takes a lease on the names of
    /// directory `dir`: until it runs out, any other node's change of
    /// them (a name added, removed or renamed) calls it back first. The
    /// node lists the directory after this answer (`Attr`), so it knows
    /// which names are absent without asking (a create's lookup).
    WatchDir {
        dir: Handle,
    },
    /// A mount (a request made `As` a node) holds directory `dir` alone
    /// (`parcache_core::consistency::dir_hold`): every other node's lease
    /// on it and on the files named in it ends, and until the hold runs
    /// out any other node's request that touches them calls this node
    /// back first. The node lists the directory after this answer
    /// (`Attr`) and may answer its unlinks there before sending them.
    HoldDir {
        dir: Handle,
    },
    /// A client wrote up to `size` bytes and changed the content.
    Written {
        handle: Handle,
        size: u64,
    },
    /// As `Written`, from a node that holds the file's whole content (the
    /// payload, `size` bytes, at most [`SMALL_COPY_MAX`]) as its data
    /// servers have it, current at version `base` plus its own writes. The
    /// metadata server keeps the copy only if the file is still at `base`
    /// (no other node reported a change since; as
    /// `close_to_open::after_report`) and no longer than `size`.
    WrittenSmall {
        handle: Handle,
        size: u64,
        base: u64,
    },
    /// The data servers' addresses, by server id.
    Servers,
    /// `sprite` consistency: `node` opens the file (for writing if
    /// `write`); answered with `Opened` once the server's callbacks to
    /// other nodes are done.
    Open {
        handle: Handle,
        node: u64,
        write: bool,
    },
    /// `sprite` consistency: `node` closed the file it opened with `write`.
    Close {
        handle: Handle,
        node: u64,
        write: bool,
    },
    /// Waits (up to about ten seconds) for callbacks to `node`; answered
    /// with `Callbacks`, possibly empty. A node keeps one outstanding.
    Callbacks {
        node: u64,
    },
    /// Make everything this server acknowledged so far durable: a data
    /// server syncs its write log, the metadata server commits durably.
    Sync,
    /// As `Write`, acknowledged once written to the log but before it is
    /// durable (the node cache's write-backs; `fsync` ends with `Sync`).
    WriteBuffered {
        handle: Handle,
        offset: u64,
    },
    /// `node` did callback `id`.
    CalledBack {
        node: u64,
        id: u64,
    },
    // --- any server ---
    /// Stop after finishing (flushing, checkpointing) — `parcache down`.
    Shutdown,
    // --- data server ---
    /// Write the payload at `offset` of this server's part of the file;
    /// acknowledged once in the durable log.
    Write {
        handle: Handle,
        offset: u64,
    },
    /// Read `len` bytes at `offset` of this server's part; the reply holds
    /// only what the part has there (short or empty past its end: zeros
    /// to the reader). `need`: the
    /// part must hold at least this many bytes (the file's size says so);
    /// if it holds fewer, stripes are missing and the read fails (EIO)
    /// rather than return zeros. 0: no such check.
    Read {
        handle: Handle,
        offset: u64,
        len: u64,
        need: u64,
    },
    /// As `Read`, for a random reader's first touch of a block, which
    /// neither end keeps: where no block the bytes lie in is in this
    /// server's cache or write log, they are read from its store alone
    /// (page-aligned: around the page cache), not their whole block into
    /// its cache; otherwise as `Read`.
    ReadPages {
        handle: Handle,
        offset: u64,
        len: u64,
        need: u64,
    },
    /// Grow this server's part of the file to at least `len` bytes (a hole
    /// at its end): sent before a size that covers it is reported, so every
    /// part is as long as the file's size says.
    Extend {
        handle: Handle,
        len: u64,
    },
    /// Cut this server's part of the file to `len` bytes.
    Truncate {
        handle: Handle,
        len: u64,
    },
    /// Forget this server's part of the file.
    Remove {
        handle: Handle,
    },
    /// Counters and capacity.
    Stats,
    /// Make a special file (fifo, device, socket) as metadata.
    Mknod {
        parent: Handle,
        name: Name,
        mode: u32,
        kind: FileKind,
        rdev: u32,
    },
    /// Set extended attribute `name` to the payload. `flags`: 1 create
    /// only (EEXIST if set), 2 replace only (ENODATA if not set).
    SetXattr {
        handle: Handle,
        name: String,
        flags: u32,
    },
    /// An extended attribute's value, as the payload of `Data`.
    GetXattr {
        handle: Handle,
        name: String,
    },
    /// The names of the file's extended attributes (`Names`).
    ListXattr {
        handle: Handle,
    },
    RemoveXattr {
        handle: Handle,
        name: String,
    },
    /// Remove a policy setting of a file or directory (it falls back to
    /// the default); answered with `Policies`.
    UnsetPolicy {
        handle: Handle,
        key: String,
    },
    /// The file's policy settings with where each came from (`Origins`).
    ExplainPolicy {
        handle: Handle,
    },
    /// Which cluster this data server belongs to and its index there.
    Identity,
    /// Become data server `index` of `cluster` (the metadata server's first
    /// start names each data server); refused if it already is another.
    Adopt {
        cluster: String,
        index: u32,
    },
    /// To the metadata server: `node` (a mount, named `name`) is there,
    /// with its counters; sent every few seconds. A node silent for 15 s
    /// is no longer listed (the cooperative tier's membership, 1996 §3).
    /// The answer is the members (`Nodes`), so each beat refreshes the
    /// node's view of the tier; `addr` is where the node answers its peers
    /// (empty for a node outside the tier).
    Heartbeat {
        node: u64,
        name: String,
        addr: String,
        stats: Box<NodeStats>,
    },
    /// To the metadata server: the nodes that sent a heartbeat lately.
    Nodes,
    /// To the metadata server: `node` leaves (an unmount): the tier no
    /// longer lists it, the tier's directory forgets what it held, and its
    /// leases and directory holds end.
    Leave {
        node: u64,
    },
    /// Cooperative tier (1996), `n-chance`: to the metadata server, which
    /// keeps the directory of who caches what. `node` missed block
    /// (`handle`, `index`) and is about to cache it: a peer holding it, if
    /// any (`Holder`).
    TierLookup {
        handle: Handle,
        index: u64,
        node: u64,
    },
    /// `node` evicted its copy of a block that was forwarded
    /// `recirculations` times since it was last read; with `n` chances a
    /// last copy goes to the peer the answer names (`Forward`).
    TierEvicted {
        handle: Handle,
        index: u64,
        node: u64,
        n: u8,
        recirculations: u8,
    },
    /// To a peer node, `lru-interleaved`: read `len` bytes at `offset`
    /// of the file through the peer's cache (it is the blocks' home);
    /// `size` and `version` are the file as the reader knows it.
    PeerRead {
        handle: Handle,
        offset: u64,
        len: u64,
        size: u64,
        version: u64,
    },
    /// To a peer node, `lru-interleaved`: write the payload at `offset`
    /// into its cache (the blocks' home); the file's write policy there
    /// takes it down.
    PeerWrite {
        handle: Handle,
        offset: u64,
        size: u64,
        version: u64,
    },
    /// To a peer node: write the file's dirty blocks down now (a close
    /// or fsync elsewhere).
    PeerFlush {
        handle: Handle,
    },
    /// To a peer node, `lru-interleaved`: a node wrote the file through
    /// the homes and reported it, moving it to `version`; a home whose
    /// cached blocks were current just before is current at `version`.
    PeerReported {
        handle: Handle,
        version: u64,
    },
    /// To a peer node, `n-chance`: the block if it is in its cache at
    /// `version` (`NotFound` otherwise; nothing is fetched).
    PeerGet {
        handle: Handle,
        index: u64,
        version: u64,
    },
    /// To a peer node, `n-chance`: keep this block (the payload), the last
    /// copy another node evicted, as most recently used.
    PeerForward {
        handle: Handle,
        index: u64,
        version: u64,
        recirculations: u8,
    },
    /// To the metadata server, `sync-write` (2003 §3.2.3): `node` is about
    /// to cache blocks `first..=last` of the file (its block directory).
    SyncHolding {
        handle: Handle,
        node: u64,
        first: u64,
        last: u64,
    },
    /// To the metadata server, `sync-write`: `node` wrote blocks
    /// `first..=last` through to the data servers; answered once every
    /// other node caching one of them dropped it.
    SyncWritten {
        handle: Handle,
        node: u64,
        first: u64,
        last: u64,
    },
    /// To a node, `global` (2003 §3.2.2): block `index` through its share
    /// of the global cache, fetched from the data servers on a miss;
    /// `threshold` is the file's runtime bypass threshold (0: off). The
    /// answer is [`Response::GlobalBlock`].
    GlobalGet {
        handle: Handle,
        index: u64,
        size: u64,
        version: u64,
        threshold: u32,
    },
    /// To a node, `global`: write the payload at `offset` through to the
    /// data servers, keeping the new bytes in its share of the global cache
    /// if it holds or admits the blocks.
    GlobalPut {
        handle: Handle,
        offset: u64,
        size: u64,
        version: u64,
        threshold: u32,
    },
    /// To a node, `global`: blocks `first..=last` were written around its
    /// share of the global cache; it drops its copies.
    GlobalDrop {
        handle: Handle,
        first: u64,
        last: u64,
    },
    /// Content-addressed store (`store=cas`, CAPFS 2005 §3.3). To a data
    /// server: store each piece of the payload (`lens` bytes each, in
    /// order) as a chunk under its blake3 hash; all are durable when it
    /// answers.
    PutChunks {
        lens: Vec<u32>,
    },
    /// To a data server: the chunks named `hashes`, their bytes one after
    /// another in the payload.
    GetChunks {
        hashes: Vec<ChunkHash>,
    },
    /// To a data server: its chunks stored more than `older_than_secs`
    /// ago (candidates for collection; younger ones may be about to be
    /// committed).
    /// At most [`LIST_CHUNKS_PAGE`] of them, in hash order, after `after`.
    ListChunks {
        older_than_secs: u64,
        after: Option<ChunkHash>,
    },
    /// To a data server: remove these chunks (no recipe names them).
    DropChunks {
        hashes: Vec<ChunkHash>,
    },
    /// To a data server: the handles of its parts last written more than
    /// `older_than_secs` ago, at most [`LIST_PARTS_PAGE`] of them, in
    /// order, after `after` (candidates for collection: a part whose
    /// file the metadata server does not know was left by a crash).
    /// Answered `Handles`.
    ListParts {
        older_than_secs: u64,
        after: Option<Handle>,
    },
    /// To the metadata server: the hashes of chunks `from..from + count` of
    /// a file's recipe (holes past its end).
    Hashes {
        handle: Handle,
        from: u64,
        count: u64,
        /// The asking node, and whether it keeps the hashes in a coherent
        /// H-cache (it is then sent `Invalidate` at another's commit).
        node: u64,
        register: bool,
    },
    /// To the metadata server: replace chunk hashes of a file's recipe,
    /// `(chunk index, the hash the writer read, the new hash)`, all or
    /// none; unless `force`, refused when an old hash is no longer the
    /// recipe's. The file grows to `size` if it is shorter.
    Commit {
        handle: Handle,
        changes: Vec<(u64, ChunkHash, ChunkHash)>,
        force: bool,
        size: u64,
        /// The committing node, and whether the commit completes only
        /// once the other holders' H-caches are invalidated.
        node: u64,
        coherence: bool,
    },
    /// To the metadata server: which of these hashes no recipe names.
    Unreferenced {
        hashes: Vec<ChunkHash>,
    },
    /// To the metadata server: which of these handles name no file (not
    /// even one unlinked while open). Answered `Handles`.
    UnknownHandles {
        handles: Vec<Handle>,
    },
    /// To the metadata server: end the files unlinked while open on a node
    /// whose connection closed at least `older_than_secs` ago and that has
    /// not been heard from since (`parcache_core::consistency::orphans`).
    /// Answered `Handles`, those ended.
    DropOrphans {
        older_than_secs: u64,
    },
    /// To a data server: write every dirty block of its cache down, then
    /// forget every block, as `sync; echo 3 > /proc/sys/vm/drop_caches`
    /// does for the kernel's page cache (`parcache drop-caches`): the next
    /// reads are cold, while the cache keeps its memory. Answered `Ok`.
    DropCaches,
    /// `sprite` consistency, to a restarted metadata server: `node` has
    /// the file open `readers` and `writers` times, and (`dirty`) wrote it
    /// without reporting all of it, so another node's open must recall it
    /// (`parcache_core::consistency::sprite::SpriteServer::reclaim_at`).
    /// Answered `Ok`.
    Reclaim {
        handle: Handle,
        node: u64,
        readers: u32,
        writers: u32,
        dirty: bool,
    },
    /// `req`, made at most once by the metadata server: a client sends it
    /// again with the same `client` (its random id) and `seq` after a lost
    /// connection, and a repeat of one already done is answered with the
    /// first answer, kept with the change it made (a duplicate request
    /// cache, as NFSv4.1's sessions give, RFC 8881 §2.10.6). `repeat`:
    /// sent before (only then is a kept answer looked for). Inside `As`.
    Once {
        client: u64,
        seq: u64,
        repeat: bool,
        req: Box<Request>,
    },
    /// To the metadata server: the cluster's id (the one its data servers
    /// are adopted into), so that a client can tell two clusters' files
    /// apart. Answered `Cluster`.
    Cluster,
    /// To the metadata server: where an `O_APPEND` write of `len` bytes
    /// goes. Its bytes are reserved after the file's end, after every
    /// append reserved and not yet covered by a size report, and after
    /// `at_least` (the end of the node's own unreported writes), so appends
    /// from two nodes never take the same bytes (POSIX `write(2)`: the
    /// offset is set to the end of the file before each write, with no
    /// change in between). The size moves with the appender's report, once
    /// the bytes are on the data servers. Answered `Appended`.
    Append {
        handle: Handle,
        at_least: u64,
        len: u64,
    },
    /// To the metadata server: `req`, then a durable commit of everything
    /// done so far (as `Sync`), before the answer: an `fsync`'s size report
    /// and commit in one round trip. `req`'s answer, or the commit's error.
    Durably {
        req: Box<Request>,
    },
    /// Unlinks in `parent` that a node answered before the server had them
    /// (under its directory hold), sent together: each as an `Unlink` with
    /// `only` (the name's file, if the node knew it) and `keep_open` unset,
    /// done in order, each on its own (one refused leaves the others done).
    /// Answered `Each`, an answer per name in order.
    Unlinks {
        parent: Handle,
        names: Vec<(Name, Option<Handle>)>,
    },
    /// As `WrittenSmall`, from a node that did not write the content to
    /// the data servers: the metadata server keeps it as the file's only
    /// copy (data on metadata, Lustre's DoM) if the file may live there
    /// ([`inline`](crate::inline)); answered `Attr`, or refused with
    /// [`ErrorCode::Refused`], and the node then writes the bytes to the
    /// data servers and reports as before.
    WrittenInline {
        handle: Handle,
        size: u64,
        base: u64,
    },
    /// Before a node reads or changes the data servers' parts of a file
    /// that may live on the metadata server (at most [`SMALL_COPY_MAX`]
    /// bytes): the metadata server writes the content it holds out to the
    /// data servers, and from then on they hold the file. Answered `Ok`.
    Materialize {
        handle: Handle,
    },
    /// Sets the size of a file living on the metadata server alone to
    /// `size` (at most [`SMALL_COPY_MAX`]) there, cutting or zero-filling
    /// its copy, without writing it out: a truncate (an `O_TRUNC` open) of
    /// a small file costs one request. Answered `Attr`, or refused with
    /// [`ErrorCode::Refused`] for a file that does not live there (the
    /// node then cuts its parts at the data servers and sends `SetAttr`).
    TruncateInline {
        handle: Handle,
        size: u64,
    },
    /// `count` handles (at most [`HANDLES_MOST`]) for files the node will
    /// make behind (`CreatesBehind`), given to no other file; answered
    /// `Reserved`. For a node (a request made `As` one).
    Handles {
        count: u32,
    },
    /// Files a node made in `parent` under its hold on the directory before
    /// the metadata server had them (creates behind, as CephFS's
    /// asynchronous creates with delegated inode numbers): each as an
    /// exclusive `Create` with the handle (from `Handles`), owner and first
    /// data server the node gave it, and its first `size` bytes of content,
    /// kept here as `WrittenInline` keeps them (the payload holds each
    /// file's content after the one before). Done in order, each on its
    /// own; answered `Each`, a `Created` (after the content) or an error
    /// per file.
    CreatesBehind {
        parent: Handle,
        files: Vec<Behind>,
    },
    /// Where this data server keeps its part of the file, for a node on
    /// the same machine that would read it there itself (local reads,
    /// HDFS's short-circuit reads). Answered `LocalPart`.
    LocalPart {
        handle: Handle,
    },
}

/// This machine's boot id (Linux's `/proc/sys/kernel/random/boot_id`),
/// empty if it cannot be read: a node and a data server with the same one
/// run on the same machine since its last boot (`LocalPart`).
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// A data server's part file that a node on the same machine may read
/// itself (answers `LocalPart`): its path, and its device and inode, which
/// the node checks against the file it opened by that path (another mount
/// namespace may have another file there).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct LocalFile {
    pub path: Vec<u8>,
    pub dev: u64,
    pub ino: u64,
    /// The server's block size, and its blocks of the part (in order)
    /// with bytes in its write log that the file may lack: those are
    /// read through the server.
    pub block: u32,
    pub logged: Vec<u64>,
}

/// Most handles one `Handles` request gives.
pub const HANDLES_MOST: u32 = 1024;

/// A file a node made behind (`Request::CreatesBehind`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Behind {
    pub name: Name,
    pub handle: Handle,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// The data server its layout starts at (the unit and width come from
    /// the directory's policies, as for any new file).
    pub first_server: u32,
    /// Bytes of its content in the payload (0: none, an empty file).
    pub size: u64,
}

/// A chunk's name: the blake3 hash of its bytes.
pub type ChunkHash = [u8; 32];

/// Hashes in one answer to `ListChunks` (2 MiB encoded).
pub const LIST_CHUNKS_PAGE: usize = 65_536;

/// Handles in one answer to `ListParts` (at most 640 KiB encoded).
pub const LIST_PARTS_PAGE: usize = 65_536;

/// Counters a node (a mount or another client) reports in its heartbeat.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Block reads its node cache answered.
    pub local_hits: u64,
    /// Block reads that went to the data servers.
    pub server_reads: u64,
    /// Block reads another node's cache answered (cooperative tier).
    pub remote_hits: u64,
    /// Last copies this node forwarded to a peer on eviction (`n-chance`).
    pub forwards: u64,
    /// Blocks forwarded here that were forwarded before (`n-chance`).
    pub recirculations: u64,
    /// Peer requests this node answered.
    pub served: u64,
    /// Discretionary caching (2003): block requests that went around the
    /// node's own cache, for reads and for writes.
    pub local_read_bypasses: u64,
    pub local_write_bypasses: u64,
    /// Block requests that went around the global cache (hinted, or
    /// decided by the runtime).
    pub global_read_bypasses: u64,
    pub global_write_bypasses: u64,
    /// This node's share of the global cache: hits, misses, and misses the
    /// runtime kept out.
    pub global_hits: u64,
    pub global_misses: u64,
    pub global_kept_out: u64,
    /// Segment counters of its share: how many segments have a counter in
    /// 0, 1, 2–3, 4–7, … (the last bucket: 1024 and more).
    pub segment_counters: [u64; 12],
    /// The node's durable write cache (`nv=on` files, Biswas et al. 1993):
    /// its size (0: none), writes it acknowledged, read hits, overwrites
    /// it absorbed, blocks it wrote down (of which immediate: it was full),
    /// blocks held not yet down, blocks delivered at start.
    pub nv_capacity_bytes: u64,
    pub nv_writes: u64,
    pub nv_hits: u64,
    pub nv_overwrites: u64,
    pub nv_write_backs: u64,
    pub nv_immediate: u64,
    pub nv_live_blocks: u64,
    pub nv_replayed: u64,
    /// Block reads this node made from the part files of data servers on
    /// its machine (local reads), and those it sent to such a server
    /// instead because the server's write log held their bytes.
    pub local_part_reads: u64,
    pub local_part_refused: u64,
    /// Of `local_part_reads`, those of only the pages a random reader
    /// asked for, around the node cache.
    pub local_part_short: u64,
    /// Reads around the node cache a data server answered with only the
    /// pages asked for (`ReadPages`).
    pub server_page_reads: u64,
}

/// A node as the metadata server knows it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub node: u64,
    pub name: String,
    /// Where it answers its peers (empty: not in the cooperative tier).
    pub addr: String,
    /// Milliseconds since its last heartbeat.
    pub silent_ms: u64,
    pub stats: NodeStats,
}

/// Counters a server reports.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerStats {
    pub role: String,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub read_hits: u64,
    pub read_misses: u64,
    pub log_bytes: u64,
    pub dirty_blocks: u64,
    pub immediate_writes: u64,
    pub writes_down: u64,
    /// Writes to bytes of the write cache still dirty: overwrites absorbed
    /// (Biswas et al. 1993 §6.1).
    pub overwrites: u64,
    /// Content-addressed chunks this data server stores, and their bytes
    /// (physical); at the metadata server, the chunks and bytes its
    /// recipes name (logical).
    pub chunks: u64,
    pub chunk_bytes: u64,
    /// Id of the file system the server's data is on (servers sharing a
    /// disk report the same id, and its space is counted once).
    pub fs_id: u64,
    /// Blocks a data server's cache read ahead of a sequential reader, and
    /// the read hits on them (part of `read_hits`).
    pub prefetches: u64,
    pub prefetch_hits: u64,
    /// Syncs clients asked the server for (`Request::Sync`: an `fsync` or
    /// `sync` on a node).
    pub syncs: u64,
    /// Requests the server has answered since it started (a batch, such
    /// as `Unlinks`, counts once).
    pub requests: u64,
    /// Memory a data server's cache holds (it takes all of it once it has
    /// started, unless `--lazy-cache`); 0 at the metadata server.
    pub cache_memory_bytes: u64,
    /// Bytes a data server wrote to its block store around the kernel's
    /// page cache (`O_DIRECT`) since it started.
    pub direct_write_bytes: u64,
    /// Bytes of whole blocks written to a data server that its cache took
    /// in the memory they arrived in, not as a copy, since it started.
    pub landed_write_bytes: u64,
    /// Reads a data server answered from its store alone, around its
    /// cache (`ReadPages`: a random reader's first touch of a block).
    pub page_reads: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum Response {
    Ok,
    Attr(Attr),
    /// A page of entries; `more` when the directory goes on after it.
    Entries {
        entries: Vec<DirEntry>,
        more: bool,
    },
    /// A page of `ReadDirPlus`: the files, and the last name it went past
    /// if the directory goes on after it (the next page's `after`).
    EntriesPlus {
        entries: Vec<EntryPlus>,
        more: Option<Name>,
    },
    Target(Vec<u8>),
    Names(Vec<String>),
    /// Policy settings: (key, value, whether it was inherited from the
    /// directory at create rather than set on the file itself).
    Origins(Vec<(String, String, bool)>),
    /// Read data follows as payload; `len` may be short at end of file.
    Data {
        len: u64,
    },
    /// A block through the global cache follows as payload; `admitted`:
    /// whether it is kept there (false: the runtime bypasses it, and the
    /// asking node goes around from now on, 2003 §5).
    GlobalBlock {
        len: u64,
        admitted: bool,
    },
    Written {
        len: u64,
    },
    Policies(Vec<(String, String)>),
    StatFs {
        blocks: u64,
        free: u64,
        files: u64,
        block_size: u32,
    },
    /// Answers `Request::Incarnation`.
    Incarnation {
        now: u64,
        after_graceful_stop_of: Option<u64>,
    },
    Stats(ServerStats),
    Servers(Vec<String>),
    Error(ErrorReply),
    /// The file's attributes after the other nodes were called back, and
    /// whether the opener may cache it.
    Opened {
        attr: Attr,
        cacheable: bool,
    },
    /// Callbacks for a node: (callback id, file, what to do).
    Callbacks(Vec<(u64, Handle, Callback)>),
    /// The nodes heard from lately.
    Nodes(Vec<NodeInfo>),
    /// The peer holding a block (`None`: read it from the data servers).
    Holder(Option<u64>),
    /// Where an evicted last copy goes, and its recirculations there
    /// (`None`: drop it).
    Forward(Option<(u64, u8)>),
    /// A data server's place in its cluster (`None` before it is adopted).
    Identity(Option<ServerIdentity>),
    /// A file created (or found, if not exclusive), with its policies, so
    /// the creator needs no second request to learn them.
    Created {
        attr: Attr,
        policies: Vec<(String, String)>,
        /// The directory after the new name went in (`None` when the file
        /// was found, not created): a mount answers the kernel's next
        /// `getattr` of it without asking again.
        parent: Option<Attr>,
    },
    /// A file's attributes and policies (answer to `GetAttrPolicy`).
    AttrPolicies {
        attr: Attr,
        policies: Vec<(String, String)>,
        /// A small file's whole content at `attr.version`, if the metadata
        /// server holds a copy (see [`SMALL_COPY_MAX`]). Serialized as bytes
        /// (the same wire form as a sequence of them, one copy instead of a
        /// push per byte: a tenth of the metadata server's time on lookups
        /// of small files, issue 14).
        #[serde(with = "serde_bytes")]
        content: Option<Vec<u8>>,
    },
    /// A name removed: the file if that was its last link (its data must
    /// go), and the directory after (a mount answers the kernel's next
    /// `getattr` of it without asking again).
    Unlinked {
        gone: Option<Attr>,
        parent: Attr,
    },
    /// Chunks stored under `hashes` (`new` of them were not there before).
    ChunksStored {
        hashes: Vec<ChunkHash>,
        new: u32,
    },
    /// Chunks read: their lengths, in the order asked; the bytes follow
    /// in the payload.
    Chunks {
        lens: Vec<u32>,
    },
    Hashes(Vec<ChunkHash>),
    /// File handles (answers `ListParts`, `UnknownHandles` and `DropOrphans`).
    Handles(Vec<Handle>),
    /// A commit applied: the file's attributes after, and the chunks no
    /// recipe names any more (the next collection removes them).
    Committed {
        attr: Attr,
        released: Vec<ChunkHash>,
    },
    /// A commit refused: these chunks' hashes changed since the writer read
    /// them (their current hashes).
    Conflict(Vec<(u64, ChunkHash)>),
    /// The cluster's id (to `Cluster`).
    Cluster(String),
    /// Where an `Append`'s bytes go, and the file's attributes.
    Appended {
        offset: u64,
        attr: Attr,
    },
    /// An answer for each request of a batch, in order (to `Unlinks`).
    Each(Vec<Response>),
    /// Handles `first..first + count`, for this node's creates behind (to
    /// `Handles`).
    Reserved {
        first: Handle,
        count: u32,
    },
    /// To `LocalPart`: the data server's machine (its boot id, empty if
    /// it cannot tell), and its part file, if it exists, with the blocks
    /// the file may lack bytes of now (held in the write log and cache).
    LocalPart {
        boot: String,
        file: Option<LocalFile>,
    },
}

/// A data server's place in its cluster, kept in its directory, so a
/// metadata server given its data servers in another order (or another
/// cluster's) refuses to start instead of mixing up stripes.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ServerIdentity {
    pub cluster: String,
    pub index: u32,
}

/// What the metadata server asks of a node under `sprite` consistency.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Callback {
    /// Write the file's dirty blocks down and report its size.
    Recall,
    /// As `Recall`, then drop the file's cached blocks and stop caching it
    /// until the node's next open is granted caching.
    Disable,
    /// Drop the file's cached chunk hashes (CAPFS coherent H-cache).
    Invalidate,
    /// Drop cached blocks `first..=last`: another node wrote them through
    /// (`sync-write`).
    DropBlocks { first: u64, last: u64 },
    /// Drop what the node's kernel keeps of the file (its attributes and
    /// the names it was reached by): another node changed it, and the
    /// node held a lease on it.
    Forget,
}

/// What went wrong, as a POSIX-like code and a message that names the
/// request, path or option at fault.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ErrorReply {
    pub code: ErrorCode,
    pub message: String,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    NotFound,
    Exists,
    NotDir,
    IsDir,
    NotEmpty,
    Access,
    Invalid,
    NoSpace,
    Io,
    BadRequest,
    NameTooLong,
    Loop,
    /// No such extended attribute.
    NoData,
    /// Not supported (an extended attribute namespace, a fallocate mode).
    NotSupported,
    /// The server is stopping and did not do the request: send it again
    /// (to the server once restarted).
    Stopping,
    /// The server declined a request a node may do another way (a
    /// `WrittenInline` for a file that must live on the data servers).
    Refused,
}

impl ErrorCode {
    /// The errno a POSIX caller expects.
    pub fn errno(self) -> i32 {
        match self {
            ErrorCode::NotFound => 2,
            ErrorCode::Exists => 17,
            ErrorCode::NotDir => 20,
            ErrorCode::IsDir => 21,
            ErrorCode::NotEmpty => 39,
            ErrorCode::Access => 13,
            ErrorCode::Invalid | ErrorCode::BadRequest => 22,
            ErrorCode::NoSpace => 28,
            ErrorCode::Io | ErrorCode::Stopping | ErrorCode::Refused => 5,
            ErrorCode::NameTooLong => 36,
            ErrorCode::Loop => 40,
            ErrorCode::NoData => 61,
            ErrorCode::NotSupported => 95,
        }
    }

    /// The code for an errno (EIO for one without a code of its own).
    pub fn from_errno(errno: i32) -> ErrorCode {
        [
            ErrorCode::NotFound,
            ErrorCode::Exists,
            ErrorCode::NotDir,
            ErrorCode::IsDir,
            ErrorCode::NotEmpty,
            ErrorCode::Access,
            ErrorCode::Invalid,
            ErrorCode::NoSpace,
            ErrorCode::NameTooLong,
            ErrorCode::Loop,
            ErrorCode::NoData,
            ErrorCode::NotSupported,
        ]
        .into_iter()
        .find(|c| c.errno() == errno)
        .unwrap_or(ErrorCode::Io)
    }
}

impl fmt::Display for ErrorReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:?})", self.message, self.code)
    }
}

impl Request {
    /// Whether the metadata server answers the request without changing
    /// anything a later answer shows (a mount trusts what it looked up
    /// only while its own node sends none of the others).
    pub fn reads_metadata_only(&self) -> bool {
        use Request::*;
        if let As { req, .. } | Once { req, .. } = self {
            return req.reads_metadata_only();
        }
        matches!(
            self,
            Lookup { .. }
                | LookupPolicy { .. }
                | GetAttr { .. }
                | GetAttrPolicy { .. }
                | WatchDir { .. }
                | HoldDir { .. }
                | GetPolicy { .. }
                | ReadDir { .. }
                | ReadDirPlus { .. }
                | GetXattr { .. }
                | ListXattr { .. }
                | ExplainPolicy { .. }
                | ReadLink { .. }
                | StatFs
                | Incarnation
                | Servers
                | Callbacks { .. }
                | CalledBack { .. }
                | Nodes
        )
    }

    /// Whether the server answers the request without changing anything
    /// a later answer shows or a crash could lose: a read of metadata
    /// ([`Request::reads_metadata_only`]), a data server's read of a part,
    /// or a sync (which makes durable what is there, and changes no
    /// answer). A client that sent only these since its last sync of a
    /// server has nothing there to sync.
    /// The directories whose names the request changes (a create, link,
    /// unlink or rename there): what an `fsync` of each must make durable.
    pub fn dirs_changed(&self) -> [Option<Handle>; 2] {
        use Request::*;
        match self {
            Create { parent, .. }
            | Mkdir { parent, .. }
            | Mknod { parent, .. }
            | Symlink { parent, .. }
            | Unlink { parent, .. }
            | Unlinks { parent, .. }
            | CreatesBehind { parent, .. }
            | Rmdir { parent, .. } => [Some(*parent), None],
            Link { new_parent, .. } => [Some(*new_parent), None],
            Rename { parent, new_parent, .. } => [Some(*parent), (new_parent != parent).then_some(*new_parent)],
            Durably { req } => req.dirs_changed(),
            _ => [None, None],
        }
    }

    /// The file whose content or size the request changes (a size
    /// report, a truncate, a setattr); a create's file is in its answer.
    pub fn file_changed(&self) -> Option<Handle> {
        use Request::*;
        match self {
            Written { handle, .. }
            | WrittenSmall { handle, .. }
            | WrittenInline { handle, .. }
            | TruncateInline { handle, .. }
            | SetAttr { handle, .. } => Some(*handle),
            Durably { req } => req.file_changed(),
            _ => None,
        }
    }

    pub fn changes_nothing(&self) -> bool {
        use Request::*;
        if let Durably { .. } = self {
            return false;
        }
        if let As { req, .. } | Once { req, .. } = self {
            return req.changes_nothing();
        }
        self.reads_metadata_only() || matches!(self, Read { .. } | ReadPages { .. } | LocalPart { .. } | Sync)
    }

    /// Whether a client sends the request to the metadata server made at
    /// most once (`Once`, so it is sent again after a lost connection):
    /// one that is not idempotent, except the cooperative tier's hints
    /// (a lookup or an eviction lost costs a block read from the data
    /// servers, not a wrong answer, and they come at every miss).
    pub fn wants_once(&self) -> bool {
        !self.is_idempotent() && !matches!(self, Request::TierLookup { .. } | Request::TierEvicted { .. })
    }

    /// Whether doing the request twice leaves the same result as doing it
    /// once, so a client may send it again after a lost connection.
    pub fn is_idempotent(&self) -> bool {
        use Request::*;
        if let As { req, .. } | Durably { req } = self {
            return req.is_idempotent();
        }
        matches!(
            self,
            // Its repeat is answered, not done again.
            Once { .. }
                | Lookup { .. }
                | LookupPolicy { .. }
                | GetAttr { .. }
                | ReadDir { .. }
                | ReadDirPlus { .. }
                | GetXattr { .. }
                | ListXattr { .. }
                | ExplainPolicy { .. }
                | UnsetPolicy { .. }
                | ReadLink { .. }
                | StatFs
                | Incarnation
                | GetPolicy { .. }
                | GetAttrPolicy { .. }
                | WatchDir { .. }
                | HoldDir { .. }
                | Servers
                | Written { .. }
                // Again after a first that was done: the base is old, so
                // the copy goes and only the version moves once more.
                | WrittenSmall { .. }
                // As `WrittenSmall`; refused if the first made it a change.
                | WrittenInline { .. }
                | Materialize { .. }
                | TruncateInline { .. }
                | Callbacks { .. }
                | CalledBack { .. }
                | Heartbeat { .. }
                | Nodes
                | Leave { .. }
                | PeerRead { .. }
                | PeerWrite { .. }
                | PeerFlush { .. }
                | PeerReported { .. }
                | PeerGet { .. }
                | GlobalGet { .. }
                | GlobalPut { .. }
                | GlobalDrop { .. }
                | SyncHolding { .. }
                | SyncWritten { .. }
                | Sync
                | Stats
                | Identity
                | Cluster
                | PutChunks { .. }
                | GetChunks { .. }
                | ListChunks { .. }
                | DropChunks { .. }
                | ListParts { .. }
                | Hashes { .. }
                | Unreferenced { .. }
                | UnknownHandles { .. }
                | DropOrphans { .. }
                | Write { .. }
                | WriteBuffered { .. }
                | Read { .. }
                | ReadPages { .. }
                | LocalPart { .. }
                | Extend { .. }
                | Truncate { .. }
                | Remove { .. }
                | SetPolicy { .. }
                | SetAttr { .. }
                | DropCaches
                | Reclaim { .. }
        )
    }
}

impl Response {
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Response {
        Response::Error(ErrorReply {
            code,
            message: message.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests not idempotent are made at most once, but for the
    /// cooperative tier's hints; idempotent ones are sent again as they are.
    #[test]
    fn which_requests_are_made_at_most_once() {
        let create = Request::Create {
            parent: ROOT,
            name: b"f".to_vec(),
            mode: 0o644,
            exclusive: true,
        };
        assert!(create.wants_once());
        assert!(Request::Close {
            handle: 2,
            node: 1,
            write: false
        }
        .wants_once());
        assert!(!Request::GetAttr { handle: 2 }.wants_once());
        let evicted = Request::TierEvicted {
            handle: 2,
            index: 0,
            node: 1,
            n: 2,
            recirculations: 0,
        };
        assert!(!evicted.wants_once() && !evicted.is_idempotent());
        let once = Request::Once {
            client: 1,
            seq: 1,
            repeat: false,
            req: Box::new(create),
        };
        assert!(once.is_idempotent() && !once.wants_once());
    }

    /// A small file's content in an answer keeps the wire form of a
    /// sequence of bytes (a length, then the bytes), with or without it.
    #[test]
    fn a_small_files_content_keeps_its_wire_form() {
        #[derive(Serialize)]
        struct AsSequence {
            content: Option<Vec<u8>>,
        }
        let content: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        let attr = Attr::empty(9, FileKind::File);
        for c in [Some(content), Some(Vec::new()), None] {
            let r = Response::AttrPolicies {
                attr: attr.clone(),
                policies: vec![],
                content: c.clone(),
            };
            let bytes = postcard::to_stdvec(&r).unwrap();
            let tail = postcard::to_stdvec(&AsSequence { content: c.clone() }).unwrap();
            assert!(bytes.ends_with(&tail), "the content's encoding changed");
            match postcard::from_bytes::<Response>(&bytes).unwrap() {
                Response::AttrPolicies { content, .. } => assert_eq!(content, c),
                other => panic!("{other:?}"),
            }
        }
    }
}
