//! Consistency between nodes as plug-ins (DESIGN.md §3, "Consistency";
//! Vilayannur et al. 2005 §3.6): a file's consistency is not one fixed rule
//! but a plug-in with hooks before and after open, read, write and close,
//! chosen per file and changeable while the system runs.
//!
//! A plug-in is sans-IO: each hook takes the node's state of the file
//! ([`NodeFile`]) and the time, changes the state, and returns [`Action`]s
//! the driver carries out in order (push dirty blocks, report the size,
//! drop cached blocks, open at the metadata server …). The daemons' node
//! client and the simulator are its two drivers.
//!
//! The plug-ins, one file each, named as on the command line:
//! * [`close_to_open`] (the default): close publishes, open revalidates.
//! * [`sprite`]: opens and closes reach the metadata server, which recalls
//!   the last writer's dirty blocks and disables caching of write-shared
//!   files (Nelson, Welch & Ousterhout 1988, as Biswas et al. 1993 §2 use it).
//! * [`nfs`]: as close-to-open, and attributes and data are revalidated
//!   while open once they are older than a timeout (default 3 s).
//! * [`session`]: the whole file is fetched at open and published at close
//!   (AFS sessions, 2005 §3.6).
//! * [`posix`]: nothing is cached on the node; every read sees every write
//!   that completed before it.
//! * [`none`] (PVFS): no guarantee and no traffic.
//!
//! Beside the plug-ins, [`leases`] let a mount's kernel keep files'
//! attributes and names, whatever the plug-in: the metadata server calls a
//! holder back before another node's change is answered.
//!
//! CAPFS's presets ([`seq_1`], [`seq_2`], [`for_1`], [`for_2`], [`rel_1`],
//! Table 1 of the 2005 paper) are settings of [`capfs::CapfsParams`]; their
//! recipes, commits and H-cache are in [`capfs`]. They need the
//! content-addressed store and run in the simulator for now.

pub mod capfs;
pub mod close_to_open;
pub mod dir_hold;
pub mod for_1;
pub mod for_2;
pub mod leases;
pub mod nfs;
pub mod none;
pub mod orphans;
pub mod posix;
pub mod rel_1;
pub mod seq_1;
pub mod seq_2;
pub mod session;
pub mod sprite;
pub mod sync_write;

use crate::catalogue::{find_named, split_params};
use crate::error::PolicyError;
use crate::time::{parse_span, Span, Time};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// The consistency plug-ins of the catalogue, with their parameters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConsistencyKind {
    #[default]
    CloseToOpen,
    Sprite,
    Nfs {
        /// How old attributes may get before a read revalidates them.
        timeout: Span,
    },
    Session,
    Posix,
    None,
    /// A CAPFS plug-in (Table 1's presets, or parameters set one by one);
    /// needs the file's `store=cas`.
    Capfs(capfs::CapfsParams),
    /// [`sync_write`] (2003): writes through, other copies invalidated
    /// block by block.
    SyncWrite,
}

impl ConsistencyKind {
    /// NFS clients' default attribute timeout is 3 to 60 s; 3 s is the
    /// `acregmin` most start with.
    pub const NFS_DEFAULT: ConsistencyKind = ConsistencyKind::Nfs {
        timeout: Span(3_000_000_000),
    };

    /// Every plug-in for the block store, with default parameters.
    pub const ALL: [ConsistencyKind; 7] = [
        ConsistencyKind::CloseToOpen,
        ConsistencyKind::Sprite,
        ConsistencyKind::NFS_DEFAULT,
        ConsistencyKind::Session,
        ConsistencyKind::Posix,
        ConsistencyKind::None,
        ConsistencyKind::SyncWrite,
    ];

    /// Whether the plug-in works on content-addressed files (`store=cas`)
    /// rather than on the block store.
    pub fn needs_cas(self) -> bool {
        matches!(self, ConsistencyKind::Capfs(_))
    }

    /// The bare catalogue name, without parameters.
    pub fn name(self) -> &'static str {
        match self {
            ConsistencyKind::CloseToOpen => "close-to-open",
            ConsistencyKind::Sprite => "sprite",
            ConsistencyKind::Nfs { .. } => "nfs",
            ConsistencyKind::Session => "session",
            ConsistencyKind::Posix => "posix",
            ConsistencyKind::None => "none",
            ConsistencyKind::Capfs(p) => p.preset().unwrap_or("capfs"),
            ConsistencyKind::SyncWrite => "sync-write",
        }
    }

    /// The plug-in itself.
    pub fn build(self) -> Box<dyn Consistency> {
        match self {
            ConsistencyKind::CloseToOpen => Box::new(close_to_open::CloseToOpen),
            ConsistencyKind::Sprite => Box::new(sprite::Sprite),
            ConsistencyKind::Nfs { timeout } => Box::new(nfs::Nfs { timeout }),
            ConsistencyKind::Session => Box::new(session::Session),
            ConsistencyKind::Posix => Box::new(posix::Posix),
            ConsistencyKind::None => Box::new(none::NoConsistency),
            ConsistencyKind::Capfs(p) => Box::new(capfs::Capfs(p)),
            ConsistencyKind::SyncWrite => Box::new(sync_write::SyncWrite),
        }
    }
}

impl fmt::Display for ConsistencyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ConsistencyKind::Nfs { timeout } if timeout != Span::from_secs(3) => write!(f, "nfs(timeout={timeout})"),
            ConsistencyKind::Capfs(p) if p.preset().is_none() => {
                let on = |b: bool| if b { "on" } else { "off" };
                write!(
                    f,
                    "capfs(use_hcache={},hcache_coherence={},force_commit={},delay_commit={},num_hashes={})",
                    on(p.use_hcache),
                    on(p.hcache_coherence),
                    on(p.force_commit),
                    on(p.delay_commit),
                    p.num_hashes
                )
            }
            k => f.write_str(k.name()),
        }
    }
}

impl FromStr for ConsistencyKind {
    type Err = PolicyError;
    /// Accepts the names above and `nfs(timeout=10s)`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, params) = split_params(s)?;
        let mut all: Vec<ConsistencyKind> = ConsistencyKind::ALL.to_vec();
        all.extend(
            capfs::CapfsParams::PRESETS
                .iter()
                .map(|(_, p)| ConsistencyKind::Capfs(*p)),
        );
        let mut kind = if name == "capfs" {
            ConsistencyKind::Capfs(capfs::CapfsParams::PRESETS[0].1)
        } else {
            find_named(&all, name, "consistency", ConsistencyKind::name).map_err(|e| match e {
                // The parameters one by one are a name too.
                PolicyError::Unknown { what, name, known } => PolicyError::Unknown {
                    what,
                    name,
                    known: format!("{known}, capfs(...)"),
                },
                e => e,
            })?
        };
        let bad = |detail: String| PolicyError::BadParameter {
            policy: name.to_string(),
            detail,
        };
        let flag = |v: &str| match v {
            "on" | "true" | "1" | "yes" => Ok(true),
            "off" | "false" | "0" | "no" => Ok(false),
            _ => Err(bad(format!("'{v}' is not on or off"))),
        };
        for (k, v) in params {
            match (&mut kind, k) {
                (ConsistencyKind::Nfs { timeout }, "timeout") => {
                    *timeout = parse_span(v).ok_or_else(|| bad(format!("timeout '{v}'")))?
                }
                (ConsistencyKind::Capfs(p), "use_hcache") => p.use_hcache = flag(v)?,
                (ConsistencyKind::Capfs(p), "hcache_coherence") => p.hcache_coherence = flag(v)?,
                (ConsistencyKind::Capfs(p), "force_commit") => p.force_commit = flag(v)?,
                (ConsistencyKind::Capfs(p), "delay_commit") => p.delay_commit = flag(v)?,
                (ConsistencyKind::Capfs(p), "num_hashes") => {
                    p.num_hashes = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=65536).contains(n))
                        .ok_or_else(|| bad(format!("num_hashes '{v}' must be from 1 to 65536")))?
                }
                _ => return Err(bad(format!("unknown parameter '{k}'"))),
            }
        }
        if let ConsistencyKind::Capfs(p) = kind {
            if p.delay_commit && !p.force_commit {
                return Err(bad(
                    "delay_commit=on needs force_commit=on (a delayed commit that another \
                     writer's commit overtook cannot be redone: its writes are no longer at hand)"
                        .into(),
                ));
            }
        }
        Ok(kind)
    }
}

/// The file as the metadata server has it at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerView {
    pub size: u64,
    /// Bumped by every size report and truncate.
    pub version: u64,
}

/// What a node knows of a file it has touched: the state every plug-in
/// reads and changes (one copy per file per node; the driver keeps no
/// other).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFile {
    /// The size as this node knows it (its own writes included).
    pub size: u64,
    /// The size the metadata server last told: what a failed write-back
    /// falls back to, so no size is ever reported beyond the bytes the data
    /// servers acknowledged.
    pub known_size: u64,
    /// The version the metadata server gave with `known_size`. An answer
    /// of the server at an older version was sent before that one and
    /// overtaken by it (a `getattr` racing a size report made by another
    /// thread's `close`): its size is stale ([`NodeFile::size_for`]).
    pub known_version: u64,
    /// Writes this node made to the file, counted.
    pub writes: u64,
    /// How many of those writes a size report has covered. Until it has,
    /// the local size stands in for the file's size.
    pub reported: u64,
    /// The file's version when this node last validated its cached blocks.
    pub version: u64,
    /// When that was (`nfs` revalidates after a timeout).
    pub validated_at: Time,
    /// Open descriptions of the file on this node.
    pub opens: u32,
    /// Whether this node caches the file (off: reads and writes go to the
    /// data servers).
    pub cached: bool,
    /// The blocks of the write in progress (set by the driver before
    /// `post_write`; `sync-write` invalidates them elsewhere).
    pub written_blocks: Option<(u64, u64)>,
    /// The version at which the pages the kernel above a mount holds of the
    /// file are current (`None`: they may be stale). Under
    /// [`KernelCache::UntilChanged`] an open that finds the file at this
    /// version lets the kernel keep them.
    pub kernel: Option<u64>,
    /// How many times this node stopped caching the file ([`stop_caching`]:
    /// a `sprite` `Disable`, or an open the server said not to cache). An
    /// open's answer that it may cache, sent before one of those reached
    /// the node, is stale ([`NodeFile::may_cache`]).
    pub stopped: u64,
    /// Writes counted ([`NodeFile::begin_write`]) whose bytes are not yet
    /// where a push finds them (in the node cache, or at the data servers),
    /// by number, each with the size before it: a size report made
    /// meanwhile does not cover them ([`NodeFile::report_upto`]), and no
    /// reader is shown the size they make ([`NodeFile::landed_size`]).
    pub landing: BTreeMap<u64, u64>,
    /// Reads of the file on this node shorter than
    /// [`crate::page_cache::SMALL_READ`] that began where the one before
    /// ended, counted up to [`crate::page_cache::SMALL_READS_KEEP`]: enough
    /// of them and a large file's opens for reading keep the page cache,
    /// whose read-ahead asks the node for such pieces many at a time
    /// ([`NodeFile::streams`]). Small reads at random gain nothing from it
    /// the first time (the kernel asks for each piece as it comes), so they
    /// do not count.
    pub small_reads: u32,
    /// Where the last read asked of the node ended.
    pub read_end: u64,
    /// Whether the last read asked of the node was a small one (or there
    /// was none): a small read right after a large one is the rest of a
    /// program's read the kernel split in two (a buffer not on a page
    /// boundary), not a program reading in small pieces.
    pub read_small: bool,
    /// Where the last [`READ_STREAMS`] reads asked of the node ended, most
    /// recent first: a read that starts at one of them continues a
    /// sequential reader's stream, though other readers' reads came in
    /// between ([`NodeFile::continues_a_read`]).
    pub read_ends: [u64; READ_STREAMS],
}

/// Sequential readers of one file whose reads the node tells apart from a
/// random reader's ([`NodeFile::continues_a_read`]): processes or threads
/// each reading their share, interleaved.
pub const READ_STREAMS: usize = 4;

impl NodeFile {
    /// A file first met with the server's view of it at `now`.
    pub fn new(server: ServerView, now: Time) -> Self {
        NodeFile {
            size: server.size,
            known_size: server.size,
            known_version: server.version,
            writes: 0,
            reported: 0,
            version: server.version,
            validated_at: now,
            opens: 0,
            cached: true,
            written_blocks: None,
            kernel: None,
            stopped: 0,
            landing: BTreeMap::new(),
            small_reads: 0,
            read_end: 0,
            read_small: true,
            read_ends: [0; READ_STREAMS],
        }
    }

    /// Whether a read at `offset` starts where one of the file's last
    /// [`READ_STREAMS`] reads ended (or at the start of the file): a
    /// sequential reader's, not a random one's.
    pub fn continues_a_read(&self, offset: u64) -> bool {
        offset == 0 || self.read_ends.contains(&offset)
    }

    /// Whether the kernel's pages of the file are current: the node caches
    /// it, and they were filled at the version it has validated.
    fn kernel_current(&self) -> bool {
        self.cached && self.kernel == Some(self.version)
    }

    /// Notes a read of `len` bytes at `offset` asked of the node.
    pub fn note_read(&mut self, offset: u64, len: u64) {
        let small = len < crate::page_cache::SMALL_READ;
        if small && self.read_small && offset == self.read_end && self.small_reads < crate::page_cache::SMALL_READS_KEEP
        {
            self.small_reads += 1;
        }
        self.read_end = offset.saturating_add(len);
        self.read_small = small;
        // The stream this read continues moves to the front; a new one
        // takes the place of the oldest.
        let at = self
            .read_ends
            .iter()
            .position(|&e| e == offset)
            .unwrap_or(READ_STREAMS - 1);
        self.read_ends.copy_within(0..at, 1);
        self.read_ends[0] = self.read_end;
    }

    /// Whether an open for reading only of the file, `size` bytes long, is
    /// streamed past the page cache under `page-cache=auto`
    /// ([`crate::page_cache::streams`]): not while the kernel's pages of it
    /// are current (an open that bypasses the page cache drops them).
    pub fn streams(&self, size: u64) -> bool {
        crate::page_cache::streams(size, self.small_reads) && !self.kernel_current()
    }

    /// A write up to `end` begins: counted now, landed later
    /// ([`NodeFile::write_landed`]); until then readers see the size from
    /// before it ([`NodeFile::landed_size`]). Returns its number.
    pub fn begin_write(&mut self, end: u64) -> u64 {
        let before = self.size;
        self.wrote(end);
        self.landing.insert(self.writes, before);
        self.writes
    }

    /// Write `n`'s bytes are where a push finds them (or it failed and
    /// nothing of it will be).
    pub fn write_landed(&mut self, n: u64) {
        self.landing.remove(&n);
    }

    /// The size a reader on this node may be shown: the size from before
    /// the first write whose bytes have not landed, as a local file
    /// system raises a file's size only once the written bytes are in its
    /// pages. A `stat` or an open's attributes answered in the middle of
    /// another thread's appending write once showed its size, and the
    /// kernel then read zeros there (several threads answer a mount's
    /// requests at once).
    pub fn landed_size(&self) -> u64 {
        self.landing
            .first_key_value()
            .map_or(self.size, |(_, &before)| before.min(self.size))
    }

    /// The writes a size report made now covers: every one before the
    /// first still landing. A close racing a write through another
    /// descriptor (a duplicate's close, a forked child's) once covered the
    /// write whose bytes were not yet in the node cache: its push found
    /// nothing, the file's own close then had nothing to report, and the
    /// bytes reached the data servers with no new version for other nodes
    /// to see, and no small copy at the metadata server.
    pub fn report_upto(&self) -> u64 {
        self.landing.first_key_value().map_or(self.writes, |(n, _)| n - 1)
    }

    /// Whether an open may take the metadata server's answer `cacheable`,
    /// given [`NodeFile::stopped`] as it was when the open was sent. The
    /// answer and the server's later callbacks travel apart: a `Disable`
    /// the server made after answering (another node opened the file to
    /// write) can reach the node and be obeyed before the answer does.
    /// Taken then, the answer turned caching back on while the server had
    /// it off, and no open elsewhere recalled what the node then wrote
    /// (two nodes appending to one log under `sprite`: a line of one
    /// stayed in its cache, and the other read zeros there). Not caching
    /// is always safe: the node's writes go to the servers and its size is
    /// reported at each close.
    pub fn may_cache(&self, cacheable: bool, stopped_when_sent: u64) -> bool {
        cacheable && self.stopped == stopped_when_sent
    }

    /// Written since the size was last reported to the metadata server.
    pub fn unreported(&self) -> bool {
        self.writes > self.reported
    }

    /// Where this node's next append may go at the earliest, as the
    /// metadata server is to place it ([`Consistency::appends_at_server`]):
    /// after the node's own writes not reported yet (0 when there are none:
    /// the server's end is then the file's end, even if another node cut
    /// the file since this node last looked).
    pub fn append_floor(&self) -> u64 {
        if self.unreported() {
            self.size
        } else {
            0
        }
    }

    /// This node wrote bytes up to `end` (counted before they land; see
    /// [`NodeFile::begin_write`]).
    pub fn wrote(&mut self, end: u64) {
        self.size = self.size.max(end);
        self.writes += 1;
    }

    /// A size report covering the writes up to `upto` was answered with
    /// `after`. Only when the report was the one change since this node
    /// validated are its cached blocks current at the new version (see
    /// [`close_to_open::after_report`]).
    pub fn reported(&mut self, upto: u64, after: ServerView) {
        let before = self.version;
        self.version = close_to_open::after_report(self.version, after.version);
        if self.kernel == Some(before) {
            // The kernel's pages hold this node's writes too: current at
            // the new version exactly when the node's blocks are.
            self.kernel = Some(self.version);
        }
        self.reported = self.reported.max(upto);
        self.learned(after);
    }

    /// The metadata server made the file this node made behind (under its
    /// hold on the directory, `dir_hold`), its answer `after`, with the
    /// content of the node's writes up to `upto` if it carried any: no
    /// other node can have seen the file before, so what this node holds
    /// is current at the server's version.
    pub fn made_behind(&mut self, upto: u64, after: ServerView) {
        if self.kernel == Some(self.version) {
            self.kernel = Some(after.version);
        }
        self.version = after.version;
        self.known_size = after.size;
        self.known_version = after.version;
        self.reported = self.reported.max(upto);
    }

    /// The server's view as an answer gave it (a report's, or any
    /// `getattr`'s): kept unless an answer at a newer version came first
    /// (two reports in flight at once may be answered in either order).
    pub fn learned(&mut self, server: ServerView) {
        if server.version >= self.known_version {
            self.known_size = server.size;
            self.known_version = server.version;
        }
    }

    /// Whether a read of `offset..end` reaches past the end this node
    /// knows (`shown`: the size the caller was given at open) while the
    /// metadata server has shown the file at a version newer than the one
    /// this node validated: another node's change this node has not taken
    /// in ([`Consistency::read_past_end`]). A node's own report that was
    /// the only change leaves the two versions equal.
    pub fn read_past_known_end(&self, end: u64, shown: u64) -> bool {
        end > self.size.max(shown) && self.known_version > self.version
    }

    /// The newer of the server's answer `server` and the newest answer this
    /// node has: an answer fetched before a report or truncate of this
    /// node's was answered is stale. (An open whose attributes were fetched
    /// just before another thread's `close` reported the node's writes
    /// took such an answer as another node's change: it dropped the node's
    /// blocks and adopted the size from before the report, and reads there
    /// returned wrong bytes or none.)
    pub fn newest(&self, server: ServerView) -> ServerView {
        if server.version < self.known_version {
            ServerView {
                size: self.known_size,
                version: self.known_version,
            }
        } else {
            server
        }
    }

    /// The file's size to show for the server's answer `server`: the size
    /// of the newest answer this node has (an older one was overtaken by a
    /// report or truncate of this node's), and at least what this node
    /// wrote and has not reported yet. Without the first, a `stat` whose
    /// answer was overtaken by another thread's `close` showed the size
    /// before the close's report, and the kernel cut the file to it.
    pub fn size_for(&self, server: ServerView) -> u64 {
        let known = self.newest(server).size;
        if self.unreported() {
            known.max(self.landed_size())
        } else {
            known
        }
    }

    /// Dirty blocks did not reach the data servers (they were dropped): the
    /// size falls back to the server's, and nothing is left to report.
    pub fn write_back_failed(&mut self) {
        self.kernel = None;
        self.size = self.known_size;
        self.reported = self.writes;
    }

    /// The file was cut or extended to `size` (its version is now `version`).
    pub fn truncated(&mut self, size: u64, version: u64) {
        self.kernel = None;
        self.size = size;
        self.known_size = size;
        self.known_version = version;
        self.reported = self.writes;
        self.version = version;
    }

    /// The node's cached blocks were dropped: it now holds the file as the
    /// server has it (as the newest answer this node has shows it).
    pub fn adopt(&mut self, server: ServerView, now: Time) {
        let server = self.newest(server);
        self.kernel = None;
        self.version = server.version;
        self.size = server.size;
        self.known_size = server.size;
        self.known_version = server.version;
        self.validated_at = now;
    }

    /// At an open, after the plug-in revalidated the file: whether the
    /// kernel may keep the pages it holds (they are current at the version
    /// the node has validated, and the node caches the file). From this
    /// open on, the kernel's pages are current at that version.
    pub fn kernel_keeps(&mut self) -> bool {
        let keep = self.kernel_current();
        self.kernel = self.cached.then_some(self.version);
        keep
    }
}

/// What the metadata server asks a node to do (`sprite`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Callback {
    /// Write the file's dirty blocks down and report its size (the node was
    /// the last writer; another node is opening the file).
    Recall,
    /// Write the file's dirty blocks down, drop its cached blocks, and send
    /// its reads and writes to the servers until a later open says
    /// otherwise (the file became write-shared).
    Disable,
    /// Drop the file's cached chunk hashes: another node committed new
    /// ones (CAPFS's coherent H-cache, 2005 §3.4).
    Invalidate,
    /// Drop cached blocks `first..=last`: another node wrote them through
    /// (`sync-write`, 2003 §3.2.3).
    DropBlocks { first: u64, last: u64 },
    /// Drop what the node's kernel keeps of the file (attributes, names):
    /// another node changed it while this one held a lease ([`leases`]).
    Forget,
}

/// What a plug-in asks its driver to do, in the order returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Fetch the file's attributes from the metadata server; the driver
    /// then calls [`Consistency::revalidated`] (at open: passes them to
    /// [`Consistency::post_open`]).
    FetchAttr,
    /// Register the open at the metadata server, which may call other
    /// nodes back first and answers whether this node may cache the file.
    OpenAtServer { write: bool },
    /// Tell the metadata server the open ended.
    CloseAtServer { write: bool },
    /// Write the file's dirty blocks to the data servers.
    PushDirty,
    /// Report the size this node wrote the file to, if a report is due
    /// ([`NodeFile::unreported`]); the answer goes to [`NodeFile::reported`].
    ReportSize,
    /// Drop the file's cached blocks (after `PushDirty`: nothing is lost).
    DropCached,
    /// Take the server's latest view as validated ([`NodeFile::adopt`]).
    Adopt,
    /// Read the whole file into the node cache.
    FetchWhole,
    /// Drop the file's cached chunk hashes (a CAPFS H-cache invalidation).
    DropHashes,
    /// Commit the chunks this node's writes stored but held back
    /// (`delay_commit`, 2005 §3.6 "Delayed commits").
    CommitDelayed,
    /// Have the metadata server make every other node drop its copies of
    /// blocks `first..=last` (the write just pushed them), and wait.
    InvalidateOthers { first: u64, last: u64 },
    /// Drop cached blocks `first..=last` (clean ones; a block being fetched
    /// is dropped once the fetch ends).
    DropBlocks { first: u64, last: u64 },
}

/// How the kernel above a mount may cache an open file's pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelCache {
    /// Not at all: every read and write reaches the node (the node may stop
    /// caching at any moment, or never caches).
    Bypass,
    /// Dropped at each open.
    UntilOpen,
    /// Kept across opens while the file is unchanged: dropped at an open
    /// that finds another node changed it ([`NodeFile::kernel_keeps`]), as
    /// NFS clients keep their page cache across opens of a file whose
    /// attributes did not change.
    UntilChanged,
    /// Kept across opens (no guarantee between nodes).
    Keep,
}

/// A consistency plug-in: hooks before and after the operations on a file
/// (Vilayannur et al. 2005, Fig. 6). Each hook may change the node's state
/// of the file and returns what the driver must do. Hooks not defined do
/// nothing.
pub trait Consistency: fmt::Debug + Send + Sync {
    /// The plug-in and its parameters.
    fn kind(&self) -> ConsistencyKind;

    /// Before an open: what to ask the metadata server (`FetchAttr` or
    /// `OpenAtServer`), if anything.
    fn pre_open(&self, file: &NodeFile, now: Time, write: bool) -> Vec<Action> {
        let _ = (file, now, write);
        vec![]
    }

    /// After the metadata server answered an open (`cacheable` is true
    /// unless it said otherwise). The open is counted here.
    fn post_open(&self, file: &mut NodeFile, now: Time, server: ServerView, cacheable: bool) -> Vec<Action> {
        let _ = (now, server, cacheable);
        file.opens += 1;
        vec![]
    }

    /// Before a read of the file through this node.
    fn pre_read(&self, file: &NodeFile, now: Time) -> Vec<Action> {
        let _ = (file, now);
        vec![]
    }

    /// A read reaches past the end this node knows of the file, and the
    /// metadata server has shown a newer version of it (a `stat` after
    /// another node's closed writes; [`NodeFile::read_past_known_end`]). A
    /// plug-in whose guarantee lets an open file show newer bytes asks for
    /// the attributes and takes the change in, so that `tail -f` on one
    /// node follows a log another node appends to, as NFS clients drop
    /// their cached data when attributes they fetch show a change.
    fn read_past_end(&self, file: &NodeFile) -> Vec<Action> {
        let _ = file;
        vec![]
    }

    /// The attributes a `FetchAttr` asked for outside an open arrived.
    fn revalidated(&self, file: &mut NodeFile, now: Time, server: ServerView) -> Vec<Action> {
        let _ = (file, now, server);
        vec![]
    }

    /// After a write up to `end` (already counted by [`NodeFile::wrote`];
    /// `grew` if it extended the file as this node knew it).
    fn post_write(&self, file: &mut NodeFile, now: Time, grew: bool) -> Vec<Action> {
        let _ = now;
        // Uncached, the bytes are at the data servers already: a size that
        // grew goes to the metadata server at once.
        if !file.cached && grew {
            vec![Action::ReportSize]
        } else {
            vec![]
        }
    }

    /// A descriptor of the file was closed (`close(2)`).
    fn flush(&self, file: &mut NodeFile, now: Time) -> Vec<Action> {
        let _ = (file, now);
        vec![]
    }

    /// The file's modification time is about to be set (`utimensat`,
    /// `touch`; `tar x` and `cp -a` set it before closing the file): what
    /// this node wrote and has not reported goes first, whatever the
    /// plug-in. The size report stamps the modification time at the
    /// metadata server, so a report after the new time would undo it
    /// (Linux's NFS client writes a file's dirty pages back before any
    /// SETATTR of it, `nfs_setattr`). A report that is not due sends
    /// nothing.
    fn set_times(&self, file: &mut NodeFile, now: Time) -> Vec<Action> {
        let _ = (file, now);
        vec![Action::PushDirty, Action::ReportSize]
    }

    /// An open description (opened with `write`) went away. The open is
    /// uncounted here.
    fn release(&self, file: &mut NodeFile, now: Time, write: bool) -> Vec<Action> {
        let _ = (now, write);
        file.opens = file.opens.saturating_sub(1);
        vec![]
    }

    /// The metadata server called this node back about the file.
    fn called_back(&self, file: &mut NodeFile, cb: Callback) -> Vec<Action> {
        let _ = (file, cb);
        vec![Action::PushDirty, Action::ReportSize]
    }

    /// How the kernel above a mount may cache the file's pages.
    fn kernel_cache(&self) -> KernelCache {
        KernelCache::UntilOpen
    }

    /// Whether the node must tell the metadata server's block directory
    /// which blocks it caches, before fetching them (`sync-write`).
    fn tracks_blocks(&self) -> bool {
        false
    }

    /// The CAPFS parameters, for a plug-in of content-addressed files.
    fn capfs(&self) -> Option<capfs::CapfsParams> {
        None
    }

    /// Whether an `O_APPEND` write is placed by the metadata server, at the
    /// end every node's appends leave (POSIX `write(2)`), rather than at
    /// the end this node knows. Two nodes appending to one file (a shared
    /// log) then never write over each other's bytes; it costs a round
    /// trip to the metadata server per append. Off where no guarantee
    /// between nodes is given (`none`).
    fn appends_at_server(&self) -> bool {
        true
    }
}

/// The check close-to-open and its relatives make when they learn the
/// server's view: if another node changed the file since this node
/// validated it, push this node's own dirty blocks and size (they must not
/// be lost or hidden), drop the cached blocks and take the server's
/// version (Biswas et al. 1993 §2: "if it does not have the latest version,
/// it removes the old file blocks"). A view older than the node's newest
/// answer is not another node's change ([`NodeFile::newest`]).
pub fn revalidate(file: &mut NodeFile, now: Time, server: ServerView) -> Vec<Action> {
    let server = file.newest(server);
    if close_to_open::at_open(file.version, server.version) == close_to_open::OpenAction::Drop {
        vec![Action::PushDirty, Action::ReportSize, Action::DropCached, Action::Adopt]
    } else {
        file.validated_at = now;
        vec![]
    }
}

/// What stopping caching takes: dirty blocks down, cached ones dropped,
/// the size reported.
pub fn stop_caching(file: &mut NodeFile) -> Vec<Action> {
    file.cached = false;
    file.stopped += 1;
    vec![Action::PushDirty, Action::DropCached, Action::ReportSize]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Writes begin and land in any order, reports come between: a
        /// report covers only writes whose bytes had all landed, and once
        /// nothing is landing it covers every write. Readers are shown no
        /// size past the end the file had before a write still landing.
        #[test]
        fn a_report_covers_only_landed_writes(ops in proptest::collection::vec((0u8..3, 0usize..8), 1..60)) {
            let mut f = NodeFile::new(ServerView { size: 0, version: 1 }, Time::ZERO);
            // (number, the size before it)
            let mut landing: Vec<(u64, u64)> = vec![];
            for (op, k) in ops {
                match op {
                    0 => {
                        let before = f.size;
                        landing.push((f.begin_write(100 * (k as u64 + 1)), before));
                    }
                    1 if !landing.is_empty() => {
                        let (n, _) = landing.remove(k % landing.len());
                        f.write_landed(n);
                    }
                    _ => {
                        let upto = f.report_upto();
                        prop_assert!(landing.iter().all(|&(n, _)| n > upto), "report up to {} covers one of {:?}", upto, landing);
                        f.reported(upto, ServerView { size: f.landed_size(), version: 2 });
                    }
                }
                let shown = f.landed_size();
                prop_assert!(shown <= f.size);
                prop_assert!(landing.iter().all(|&(_, before)| shown <= before), "{} shown while {:?} land", shown, landing);
                if landing.is_empty() {
                    prop_assert_eq!(shown, f.size);
                }
            }
            let landing: Vec<u64> = landing.into_iter().map(|(n, _)| n).collect();
            for n in landing {
                f.write_landed(n);
            }
            prop_assert_eq!(f.report_upto(), f.writes);
        }
    }

    /// A reader is shown no size a write makes until its bytes have landed,
    /// nor a later write's that landed first: an appending write half done
    /// on one thread once showed its size to another thread's `stat`, and
    /// the kernel read zeros there.
    #[test]
    fn readers_see_a_writes_size_once_its_bytes_landed() {
        let server = ServerView { size: 4096, version: 1 };
        let mut f = NodeFile::new(server, Time::ZERO);
        let first = f.begin_write(8192);
        assert_eq!((f.size, f.landed_size()), (8192, 4096));
        assert_eq!(f.size_for(server), 4096, "a stat in the middle of the write");
        let second = f.begin_write(12288);
        f.write_landed(second);
        assert_eq!(f.landed_size(), 4096, "the first write's bytes are still missing");
        f.write_landed(first);
        assert_eq!((f.landed_size(), f.size_for(server)), (12288, 12288));
        // A write inside the file changes no size; a cut below a landing
        // write's start shows the cut.
        let inside = f.begin_write(100);
        assert_eq!(f.landed_size(), 12288);
        f.truncated(50, 2);
        assert_eq!(f.landed_size(), 50);
        f.write_landed(inside);
        assert_eq!(f.landed_size(), 50);
    }

    /// A file made behind is current at the version the server made it at
    /// (its blocks and the kernel's pages are this node's own), with the
    /// writes its content carried reported; writes after it still count.
    #[test]
    fn a_file_made_behind_is_current_at_the_servers_version() {
        let at = |size, version| ServerView { size, version };
        let mut f = NodeFile::new(at(0, 1), Time::ZERO);
        f.wrote(4096);
        f.kernel_keeps(); // opened: the kernel's pages start here
        let upto = f.writes;
        f.wrote(5000);
        f.made_behind(upto, at(4096, (7 << 40) + 2));
        assert_eq!(
            (f.version, f.known_version, f.known_size),
            ((7 << 40) + 2, (7 << 40) + 2, 4096)
        );
        assert_eq!(f.kernel, Some(f.version), "the kernel's pages are current with it");
        assert!(f.unreported(), "the write after the content went is still to report");
        assert_eq!(f.size_for(at(4096, (7 << 40) + 2)), 5000);
    }

    /// A server's answer overtaken by a report or truncate of this node's
    /// shows the newer size; unreported writes count; another node's newer
    /// change shows as it is (found with a `stat` racing a `close` made by
    /// a forked child: the file looked cut to its size before the close).
    #[test]
    fn an_answer_overtaken_by_a_report_shows_the_reported_size() {
        let at = |size, version| ServerView { size, version };
        let mut f = NodeFile::new(at(100, 1), Time::ZERO);
        f.wrote(500);
        assert_eq!(f.size_for(at(100, 1)), 500, "written, not reported");
        // A getattr is sent (version 1); a close reports 500 (version 2)
        // and is answered first.
        let upto = f.writes;
        f.reported(upto, at(500, 2));
        assert_eq!(f.size_for(at(100, 1)), 500, "the getattr's answer is older");
        assert_eq!(f.size_for(at(500, 2)), 500);
        // Two reports in flight, answered in the other order.
        f.wrote(700);
        f.wrote(900);
        f.reported(f.writes, at(900, 4));
        f.reported(f.writes - 1, at(700, 3));
        assert_eq!((f.known_size, f.known_version), (900, 4), "the newer answer stays");
        assert_eq!(f.size_for(at(500, 2)), 900);
        // Another node cut the file after that: its answer is newer.
        assert_eq!(f.size_for(at(10, 5)), 10);
        // This node cuts it: an answer from before the cut is stale.
        f.truncated(50, 6);
        assert_eq!(f.size_for(at(10, 5)), 50);
        f.wrote(60);
        assert_eq!(f.size_for(at(50, 6)), 60);
    }

    /// A read past the node's end asks for the attributes only once the
    /// server has shown another node's change: a node's own report, or a
    /// read of a file nobody else changed, costs nothing.
    #[test]
    fn only_another_nodes_change_makes_a_read_past_the_end_revalidate() {
        let at = |size, version| ServerView { size, version };
        let mut f = NodeFile::new(at(6, 1), Time::ZERO);
        // A kernel page read of the whole small file asks past its end.
        assert!(!f.read_past_known_end(4096, 6));
        f.wrote(10);
        f.reported(f.writes, at(10, 2));
        assert!(!f.read_past_known_end(4096, 6), "its own report");
        // A getattr shows another node's append.
        f.learned(at(13, 3));
        assert!(f.read_past_known_end(4096, 6));
        assert!(!f.read_past_known_end(8, 6), "inside what this node has");
        let c = ConsistencyKind::CloseToOpen.build();
        assert_eq!(c.read_past_end(&f), vec![Action::FetchAttr]);
        let acts = c.revalidated(&mut f, Time::ZERO, at(13, 3));
        assert_eq!(acts.last(), Some(&Action::Adopt), "{acts:?}");
        for kind in ["session", "none", "posix"] {
            assert!(
                kind.parse::<ConsistencyKind>()
                    .unwrap()
                    .build()
                    .read_past_end(&f)
                    .is_empty(),
                "{kind}"
            );
        }
    }

    /// An append goes after the node's own unreported writes, and at the
    /// server's end when there are none: a size this node learned before
    /// another node cut the file is no floor.
    #[test]
    fn an_append_goes_after_the_nodes_unreported_writes_only() {
        let at = |size, version| ServerView { size, version };
        let mut f = NodeFile::new(at(100, 1), Time::ZERO);
        assert_eq!(f.append_floor(), 0);
        f.wrote(300);
        assert_eq!(f.append_floor(), 300);
        f.reported(f.writes, at(300, 2));
        assert_eq!((f.size, f.append_floor()), (300, 0));
        // Every plug-in with a guarantee between nodes places appends at
        // the server; `none` does not.
        for kind in ["close-to-open", "sprite", "nfs", "session", "posix", "sync-write"] {
            assert!(
                kind.parse::<ConsistencyKind>().unwrap().build().appends_at_server(),
                "{kind}"
            );
        }
        assert!(!ConsistencyKind::None.build().appends_at_server());
        assert!(!"seq-2".parse::<ConsistencyKind>().unwrap().build().appends_at_server());
    }

    /// The kernel keeps a file's pages across opens only while the node's
    /// validated version is the one they were filled at: this node's own
    /// reports carry them forward, another node's change, a truncate or a
    /// failed write-back does not.
    #[test]
    fn the_kernel_keeps_pages_of_a_file_unchanged_since_they_were_filled() {
        let view = |version| ServerView { size: 10, version };
        let mut f = NodeFile::new(view(1), Time::ZERO);
        assert!(!f.kernel_keeps(), "the first open: the kernel may hold anything");
        assert!(f.kernel_keeps(), "unchanged since");
        // This node writes and reports: version 2 is its own change.
        f.writes += 1;
        f.reported(1, view(2));
        assert!(f.kernel_keeps(), "its own writes are in the kernel's pages");
        // Another node reports (3), then this node (4): not only its own.
        f.writes += 1;
        f.reported(2, view(4));
        assert_eq!(f.version, 2);
        assert_eq!(revalidate(&mut f, Time::ZERO, view(4)).last(), Some(&Action::Adopt));
        f.adopt(view(4), Time::ZERO);
        assert!(!f.kernel_keeps(), "another node changed it");
        assert!(f.kernel_keeps());
        f.truncated(0, 5);
        assert!(!f.kernel_keeps(), "truncated");
        f.write_back_failed();
        assert!(!f.kernel_keeps(), "written bytes were lost");
        f.cached = false;
        assert!(!f.kernel_keeps() && !f.kernel_keeps(), "not cached: never kept");
        assert_eq!(close_to_open::CloseToOpen.kernel_cache(), KernelCache::UntilChanged);
    }

    /// A large file streams past the page cache until it is read in small
    /// pieces one after another; small reads at random do not count, and
    /// neither does a file whose kernel pages are current.
    #[test]
    fn small_sequential_reads_keep_a_large_files_pages() {
        use crate::page_cache::{SMALL_READ, SMALL_READS_KEEP, STREAM_FROM};
        let big = STREAM_FROM;
        let mut f = NodeFile::new(ServerView { size: big, version: 1 }, Time::ZERO);
        assert!(f.streams(big) && !f.streams(big - 1));
        for k in 0..1000u64 {
            f.note_read((k * 7919 % 4096) * 8192 + 4096, 4096);
        }
        assert!(f.streams(big), "random small reads: {}", f.small_reads);
        for k in 0..1000u64 {
            f.note_read(k * SMALL_READ, SMALL_READ);
        }
        assert!(f.streams(big), "reads of {SMALL_READ} bytes are not small");
        // A program's 1 MiB reads into a buffer 16 bytes past a page
        // boundary, each split by the kernel into 1 MiB less 16 bytes and
        // the 16 bytes left: the tails are not a program reading in small
        // pieces.
        let from = f.read_end;
        for k in 0..1000u64 {
            f.note_read(from + (k << 20), (1 << 20) - 16);
            f.note_read(from + ((k + 1) << 20) - 16, 16);
        }
        assert!(f.streams(big), "the tails of split reads: {}", f.small_reads);
        // The first small read after a large one may be a split's tail:
        // the run counts from the second.
        f.note_read(f.read_end, 1 << 20);
        let from = f.read_end;
        for k in 0..=u64::from(SMALL_READS_KEEP) {
            assert!(f.streams(big), "after {k} small sequential reads");
            f.note_read(from + k * 512, 512);
        }
        assert!(!f.streams(big), "read in small pieces");
        f.note_read(f.read_end, 1);
        assert_eq!(f.small_reads, SMALL_READS_KEEP, "counted up to the bound");
        let mut g = NodeFile::new(ServerView { size: big, version: 1 }, Time::ZERO);
        assert!(!g.kernel_keeps());
        assert!(!g.streams(big), "the kernel's pages are current");
    }

    /// Up to four sequential readers interleaved are each told apart from
    /// a random reader; a fifth stream pushes the oldest out.
    #[test]
    fn interleaved_sequential_readers_continue_their_reads() {
        let mut f = NodeFile::new(
            ServerView {
                size: 1 << 30,
                version: 1,
            },
            Time::ZERO,
        );
        assert!(f.continues_a_read(0), "the start of the file");
        assert!(!f.continues_a_read(4096));
        let starts = [0u64, 1 << 20, 2 << 20, 3 << 20];
        for k in 0..100u64 {
            for s in starts {
                let at = s + k * 4096;
                assert!(k == 0 || f.continues_a_read(at), "stream {s} at {k}");
                f.note_read(at, 4096);
            }
        }
        assert!(!f.continues_a_read(777 << 12), "a random read");
        f.note_read(777 << 12, 4096);
        assert!(f.continues_a_read(778 << 12));
        assert!(!f.continues_a_read(100 * 4096), "the oldest stream went");
        assert!(f.continues_a_read((3 << 20) + 100 * 4096));
    }

    /// An open's attributes fetched before this node's own report was
    /// answered are stale: the open keeps the node's blocks and size
    /// instead of taking them for another node's change and adopting the
    /// size from before the report.
    #[test]
    fn an_answer_overtaken_by_the_nodes_own_report_is_not_a_change() {
        let at = |size, version| ServerView { size, version };
        let mut f = NodeFile::new(at(0, 1), Time::ZERO);
        f.wrote(200);
        f.reported(1, at(200, 2));
        for p in [
            ConsistencyKind::CloseToOpen,
            ConsistencyKind::Session,
            ConsistencyKind::NFS_DEFAULT,
            ConsistencyKind::SyncWrite,
        ] {
            let mut g = f.clone();
            let acts = p.build().post_open(&mut g, Time::ZERO, at(0, 1), true);
            assert!(!acts.contains(&Action::DropCached), "{p}: {acts:?}");
            assert_eq!((g.version, g.size_for(at(0, 1))), (2, 200), "{p}");
        }
        assert_eq!(f.newest(at(0, 1)), at(200, 2));
        assert_eq!(f.newest(at(300, 3)), at(300, 3), "a newer answer stands");
        f.adopt(at(0, 1), Time::ZERO);
        assert_eq!(
            (f.size, f.version, f.known_version),
            (200, 2, 2),
            "never adopts an older view"
        );
        // Another node's change between (version 3) is still one.
        f.learned(at(250, 4));
        let acts = revalidate(&mut f, Time::ZERO, at(200, 2));
        assert_eq!(acts.last(), Some(&Action::Adopt), "{acts:?}");
    }

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for k in ConsistencyKind::ALL {
            assert_eq!(k.name().parse::<ConsistencyKind>().unwrap(), k);
            assert_eq!(k.to_string().parse::<ConsistencyKind>().unwrap(), k);
            assert_eq!(k.build().kind(), k);
        }
        let e = "sprite2".parse::<ConsistencyKind>().unwrap_err().to_string();
        assert!(
            e.contains("close-to-open") && e.contains("posix") && e.contains("capfs(...)"),
            "{e}"
        );
        assert_eq!(e.matches("seq-1").count(), 1, "each name once: {e}");
        let k: ConsistencyKind = "nfs(timeout=10s)".parse().unwrap();
        assert_eq!(k.to_string(), "nfs(timeout=10s)");
        assert!("nfs(timeout=soon)".parse::<ConsistencyKind>().is_err());
        assert!("sprite(timeout=1s)".parse::<ConsistencyKind>().is_err());
        // CAPFS: the presets by name, parameters one by one.
        for (name, p) in capfs::CapfsParams::PRESETS {
            let k: ConsistencyKind = name.parse().unwrap();
            assert_eq!((k, k.to_string()), (ConsistencyKind::Capfs(p), name.to_string()));
            assert!(k.needs_cas());
        }
        let k: ConsistencyKind = "seq-2(hcache_coherence=off,force_commit=on)".parse().unwrap();
        assert_eq!(k.to_string(), "rel-1", "Table 1's rel-1 by its parameters");
        let k: ConsistencyKind = "capfs(use_hcache=on,num_hashes=64)".parse().unwrap();
        assert_eq!(
            k.to_string(),
            "capfs(use_hcache=on,hcache_coherence=off,force_commit=off,delay_commit=off,num_hashes=64)"
        );
        assert_eq!(k.to_string().parse::<ConsistencyKind>().unwrap(), k);
        assert!("seq-1(num_hashes=0)".parse::<ConsistencyKind>().is_err());
        assert!("seq-1(delay_commit=on)".parse::<ConsistencyKind>().is_err());
        let session = "for-1(delay_commit=on)".parse::<ConsistencyKind>().unwrap();
        assert!(matches!(session, ConsistencyKind::Capfs(p) if p.delay_commit && p.force_commit));
    }

    #[test]
    fn node_file_bookkeeping() {
        let mut f = NodeFile::new(ServerView { size: 10, version: 4 }, Time::ZERO);
        f.wrote(100);
        assert!(f.unreported());
        assert_eq!(f.size, 100);
        f.reported(1, ServerView { size: 100, version: 5 });
        assert_eq!((f.version, f.known_size, f.unreported()), (5, 100, false));
        f.wrote(200);
        f.write_back_failed();
        assert_eq!((f.size, f.unreported()), (100, false));
        // Another node's change in between: the version is not taken.
        f.wrote(300);
        f.reported(3, ServerView { size: 300, version: 7 });
        assert_eq!(f.version, 5);
    }
}
