//! Local reads: a node on the same machine as a data server reads that
//! server's part files itself on a random reader's block miss, as HDFS's
//! short-circuit local reads do. A 4 KiB random cold read through a mount
//! then costs the disk's read and FUSE's two wake-ups, not also a trip to
//! the data server's process and back (two more wake-ups of the other CPU
//! on this machine, about half of such a read: issue 14).
//!
//! The data server says where a part's file is (`Request::LocalPart`),
//! with the blocks its write log holds bytes of since its last checkpoint:
//! every byte it would answer with for the other blocks is in the file,
//! and those blocks are read through it. Bytes logged after that answer are
//! ones this node need not see until its consistency plug-in drops the
//! file's cached blocks (a changed version at open under close-to-open, a
//! callback, `nfs`'s timeout): the answer is as good as a copy of every
//! block of the part cached at that moment, and lives as long as one.
//! So it is forgotten whenever the node cache drops any block of the file
//! ([`parcache_driver::Below::discarded`]), and whenever this node sends
//! the file a write, truncate or extension (its own write may be logged).
//! An answer that arrives after such a forget is not kept.
//!
//! The node checks the data server's boot id against its own and the
//! file it opened against the device and inode the server gave (another
//! mount namespace may have another file at that path); a server whose
//! files it cannot open or check is asked no more. Sequential readers'
//! fetches and prefetches go to the data servers as before (their merged
//! reads, spread over every server, are faster than one file read here).
//!
//! A random reader's read of a few pages of a block the node cache lacks
//! reads only those pages from the part's file, around the node cache
//! ([`LocalParts::read_pages`]): a 4 KiB direct read here costs half a
//! 64 KiB one (a random cold read through a mount: 10.1–10.6k reads a
//! second with the whole block read, 16.8–17.7k with 4 KiB, issue 14).
//! A block read so twice lately is read whole, into the node cache, at
//! its next such miss (admitted at its third touch, as a doorkeeper admits
//! only what it has seen before; [`AROUND_READS`]): a random reader's hot
//! blocks still end up in the node cache, its cold ones cost no 64 KiB
//! read each. Where the node cannot read the part's file, the data server
//! is asked for the pages alone (`ReadPages`, [`crate::data::DataPath`]).

use parcache_proto::{Block, LocalFile, Request, Response};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::data::DataPath;

/// Most part files kept open; past it, all are closed (and asked for
/// again at their next miss). Well under the usual limit of 1,024
/// descriptors a process, which a node's sockets and files share.
const OPEN_MAX: usize = 256;

/// A direct read's offset, length and buffer must be aligned to this.
const ALIGN: u64 = 4096;

/// The pages `len` bytes at `off` lie in: their first byte and the end.
pub(crate) fn page_span(off: u64, len: u64) -> (u64, u64) {
    (off / ALIGN * ALIGN, (off + len).div_ceil(ALIGN) * ALIGN)
}

/// Fills `out` from `got`, the bytes of the pages `out` lies in (`from`
/// bytes into them), short at the part's end: zeros past it (a hole at the
/// file's end).
pub(crate) fn copy_out(out: &mut [u8], got: &[u8], from: usize) {
    let from = from.min(got.len());
    let have = (got.len() - from).min(out.len());
    out[..have].copy_from_slice(&got[from..from + have]);
    out[have..].fill(0);
}

/// Blocks remembered as read around the node cache (counting toward
/// [`AROUND_READS`]): 4,096, a 256 MiB file's worth of 64 KiB blocks, in
/// about 100 KiB.
const AROUND_KEPT: usize = 4096;

/// Whether a thread may block on a local read now (see
/// [`LocalParts::set_may_block`]).
pub type MayBlock = Box<dyn Fn() -> bool + Send + Sync>;

/// The node's local reads: which data servers run on its machine, and
/// the part files it may read.
pub(crate) struct LocalParts {
    enabled: bool,
    /// This machine's boot id (empty: local reads off).
    boot: String,
    /// Data servers whose parts this node cannot read itself.
    elsewhere: Mutex<Vec<bool>>,
    grants: Mutex<Grants>,
    /// Local reads in progress (at most `at_once`: see [`LocalParts::read`]).
    reading: AtomicUsize,
    at_once: AtomicUsize,
    may_block: std::sync::OnceLock<MayBlock>,
    /// The memory reads of a few pages land in before they are copied
    /// out (a direct read needs aligned memory; the program's may not
    /// be), kept for the next (one for each read that may run at once).
    pages: Mutex<Vec<Block>>,
    /// Blocks read around the node cache ([`LocalParts::read_pages`]).
    around: Mutex<Around>,
    reads: AtomicU64,
    read_bytes: AtomicU64,
    refused: AtomicU64,
    short: AtomicU64,
    server_pages: AtomicU64,
}

/// Blocks (file, index) read around the node cache lately, with how many
/// times each was since it was last read whole, oldest first (each once).
#[derive(Default)]
struct Around {
    set: HashMap<(u64, u64), u32>,
    order: std::collections::VecDeque<(u64, u64)>,
}

/// Reads around the node cache a block may have before its next miss
/// reads it whole: its third random touch lately. Under uniform random
/// reads of a file four times the node cache (the benchmark), a
/// block seen twice is seen a third time before the cache would drop it
/// about one time in four, too seldom to pay for a 64 KiB read in place of
/// 4 KiB (about 50 µs more here); a block a reader keeps coming back to
/// is seen three times soon enough.
const AROUND_READS: u32 = 2;

#[derive(Default)]
struct Grants {
    /// Moves at every forget: an answer asked for before one is not kept.
    generation: u64,
    /// Per file, per data server: its part's file, or refused (read
    /// through the data server until the file's next forget).
    files: HashMap<u64, Vec<(u32, Grant)>>,
    open: usize,
}

#[derive(Clone)]
enum Grant {
    Open(Arc<Part>),
    Refused,
}

/// A part's file open here, and what of it is read through the server.
struct Part {
    file: File,
    /// The server's block size.
    block: u64,
    /// Its blocks the file may lack bytes of (logged), in order.
    logged: Vec<u64>,
}

impl Part {
    /// Whether `len` bytes at `off` touch a logged block.
    fn logged(&self, off: u64, len: u64) -> bool {
        let (first, last) = (off / self.block, (off + len.max(1) - 1) / self.block);
        let at = self.logged.partition_point(|&b| b < first);
        self.logged.get(at).is_some_and(|&b| b <= last)
    }
}

/// What opening a part's file here found.
enum Opened {
    File(Part),
    /// Not now (removed meanwhile).
    Refused,
    /// Not from this node (no permission, another file at that path).
    Elsewhere(String),
}

/// Counters of local reads ([`crate::Fs::node_stats`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct LocalReadStats {
    /// Block reads made from a data server's part file on this machine.
    pub reads: u64,
    pub bytes: u64,
    /// Block reads sent to a data server on this machine because its
    /// write log held bytes of them (or of their part, when it could not
    /// name the blocks) that its part's file may lack.
    pub refused: u64,
    /// Of `reads`, those of only the pages a random reader asked for, not
    /// the whole block, around the node cache ([`LocalParts::read_pages`]).
    pub short: u64,
    /// Reads around the node cache a data server answered with only the
    /// pages asked for (`ReadPages`), where this node could not read them
    /// itself (another machine's server, or a local read not possible
    /// then).
    pub server_pages: u64,
}

impl LocalParts {
    pub(crate) fn new(enabled: bool, servers: usize) -> LocalParts {
        LocalParts {
            enabled,
            boot: if enabled {
                parcache_proto::boot_id()
            } else {
                String::new()
            },
            elsewhere: Mutex::new(vec![false; servers]),
            grants: Mutex::default(),
            reading: AtomicUsize::new(0),
            at_once: AtomicUsize::new(1),
            may_block: std::sync::OnceLock::new(),
            pages: Mutex::default(),
            around: Mutex::default(),
            reads: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            short: AtomicU64::new(0),
            server_pages: AtomicU64::new(0),
        }
    }

    /// Whether a fetch from data server `server` may be read here.
    pub(crate) fn may_try(&self, server: u32) -> bool {
        self.enabled && !self.boot.is_empty() && !self.elsewhere.lock().get(server as usize).copied().unwrap_or(true)
    }

    /// Tells when the thread asking for a local read may make it itself,
    /// and how many may be in progress at once. A mount says: when another
    /// of its threads reading requests is free or no request waits; as
    /// many as it has such threads. Unset: always, one at a time.
    pub(crate) fn set_may_block(&self, f: MayBlock, at_once: usize) {
        if self.may_block.set(f).is_ok() {
            self.at_once.store(at_once.max(1), Ordering::SeqCst);
        }
    }

    pub(crate) fn stats(&self) -> LocalReadStats {
        LocalReadStats {
            reads: self.reads.load(Ordering::Relaxed),
            bytes: self.read_bytes.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            short: self.short.load(Ordering::Relaxed),
            server_pages: self.server_pages.load(Ordering::Relaxed),
        }
    }

    /// Whether block `index` of `handle`, which the node cache lacks, may
    /// be read around it: not if it was so read [`AROUND_READS`] times
    /// lately (it is read whole into the node cache this time, and counts
    /// from naught again).
    pub(crate) fn admits_around(&self, handle: u64, index: u64) -> bool {
        let mut a = self.around.lock();
        match a.set.get_mut(&(handle, index)) {
            Some(n) if *n >= AROUND_READS => {
                *n = 0;
                false
            }
            _ => true,
        }
    }

    /// Notes block `index` of `handle` as read around the node cache once
    /// more ([`LocalParts::admits_around`]).
    fn noted_around(&self, handle: u64, index: u64) {
        let mut a = self.around.lock();
        match a.set.entry((handle, index)) {
            std::collections::hash_map::Entry::Occupied(mut n) => *n.get_mut() += 1,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(1);
                a.order.push_back((handle, index));
            }
        }
        while a.order.len() > AROUND_KEPT {
            if let Some(k) = a.order.pop_front() {
                a.set.remove(&k);
            }
        }
    }

    /// A read around the node cache answered by a data server (its
    /// `ReadPages`): noted as [`LocalParts::read_pages`] notes its own.
    pub(crate) fn read_at_server(&self, handle: u64, index: u64) {
        self.server_pages.fetch_add(1, Ordering::Relaxed);
        self.noted_around(handle, index);
    }

    /// Reads `out.len()` bytes at `off` of the part of file `handle` on
    /// data server `server` from its file: only the pages they lie in,
    /// around the node cache, as [`LocalParts::read`] reads a block (on
    /// this thread, as many at once as may be, not while a request waits
    /// that no other thread will take);
    /// `need` is where the part must reach at least, as there. Bytes past
    /// the file's end read as zeros. False (nothing written to `out`) if
    /// it may not; the read then goes the usual way. The block is noted
    /// ([`LocalParts::admits_around`]).
    pub(crate) async fn read_pages(
        &self,
        data: &DataPath,
        (server, handle): (u32, u64),
        (off, need): (u64, u64),
        index: u64,
        out: &mut [u8],
    ) -> bool {
        let (first, end) = page_span(off, out.len() as u64);
        let buf = self.pages.lock().pop().unwrap_or_default();
        let buf = match self.read(data, (server, handle), first, end - first, need, buf).await {
            Ok((buf, n)) => {
                copy_out(out, &buf[..n], (off - first) as usize);
                self.short.fetch_add(1, Ordering::Relaxed);
                self.noted_around(handle, index);
                self.give_pages(buf);
                return true;
            }
            Err(buf) => buf,
        };
        self.give_pages(buf);
        false
    }

    /// Forgets every part file of `handle` (see the module's comment).
    pub(crate) fn forget(&self, handle: u64) {
        if !self.enabled {
            return;
        }
        let mut g = self.grants.lock();
        g.generation += 1;
        if let Some(v) = g.files.remove(&handle) {
            g.open -= v.len();
        }
    }

    /// Reads `len` bytes at `off` of the part of file `handle` on data
    /// server `server` from its file, on this thread, if fewer local
    /// reads than may run at once are in progress and nothing else waits
    /// for the thread (a mount's: another of its threads reading /dev/fuse
    /// is free, or no request waits; [`LocalParts::set_may_block`]).
    /// Otherwise the fetch goes to the data server, whose read is as
    /// quick then and takes no thread here (a blocking thread per read
    /// made several random readers slower, and added up to eight threads
    /// to a mount). Reads from the file into `buf` (stale bytes), if this node may;
    /// gives `buf` back if not, or if the file is shorter than `need`
    /// (the data server then says why).
    pub(crate) async fn read(
        &self,
        data: &DataPath,
        (server, handle): (u32, u64),
        off: u64,
        len: u64,
        need: u64,
        buf: Block,
    ) -> Result<(Block, usize), Block> {
        if !off.is_multiple_of(ALIGN) || !len.is_multiple_of(ALIGN) || len == 0 {
            return Err(buf);
        }
        // Only so many at once, and in a mount only while no request
        // waits that no other thread takes: otherwise the data server's
        // read is as quick, and takes no thread here. Asked first, so such a fetch costs no
        // `LocalPart` request either.
        if !self.may_read_here() {
            return Err(buf);
        }
        let Some(part) = self.grant(data, server, handle).await else {
            return Err(buf);
        };
        if part.logged(off, len) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(buf);
        }
        let at_once = self.at_once.load(Ordering::SeqCst);
        if !self.may_read_here()
            || self
                .reading
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < at_once).then_some(n + 1))
                .is_err()
        {
            return Err(buf);
        }
        let r = read_block(&part.file, off, len, buf);
        self.reading.fetch_sub(1, Ordering::SeqCst);
        match r {
            Ok((buf, n)) if n as u64 == len || off + n as u64 >= need => {
                self.reads.fetch_add(1, Ordering::Relaxed);
                self.read_bytes.fetch_add(n as u64, Ordering::Relaxed);
                Ok((buf, n))
            }
            Ok((buf, _)) => Err(buf),
            Err((buf, e)) => {
                tracing::info!(
                    "handle {handle}: a local read of data server {server}'s part failed ({e}); asking the server"
                );
                self.drop_one(handle, server);
                Err(buf)
            }
        }
    }

    /// Whether a local read may be made on this thread now: fewer than
    /// may run at once are in progress, and nothing else waits for the
    /// thread.
    fn may_read_here(&self) -> bool {
        self.reading.load(Ordering::SeqCst) < self.at_once.load(Ordering::SeqCst)
            && self.may_block.get().is_none_or(|f| f())
    }

    /// Keeps a scratch block of [`LocalParts::read_pages`] for the next.
    fn give_pages(&self, buf: Block) {
        let mut kept = self.pages.lock();
        if kept.len() < self.at_once.load(Ordering::Relaxed) {
            kept.push(buf);
        }
    }

    /// The open part file of `handle` on `server`, asking the server for
    /// it if this node has no answer kept.
    async fn grant(&self, data: &DataPath, server: u32, handle: u64) -> Option<Arc<Part>> {
        let generation = {
            let g = self.grants.lock();
            match g.files.get(&handle).and_then(|v| v.iter().find(|(s, _)| *s == server)) {
                Some((_, Grant::Open(f))) => return Some(f.clone()),
                Some((_, Grant::Refused)) => {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                None => g.generation,
            }
        };
        let answer = data.call(server, &Request::LocalPart { handle }, &[]).await;
        let grant = match answer {
            Ok((Response::LocalPart { boot, file }, _)) if boot == self.boot => match file.map(|f| open(&f)) {
                Some(Opened::File(f)) => Grant::Open(Arc::new(f)),
                None | Some(Opened::Refused) => {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    Grant::Refused
                }
                Some(Opened::Elsewhere(why)) => {
                    self.not_here(server, &why);
                    return None;
                }
            },
            Ok((Response::LocalPart { .. }, _)) => {
                self.not_here(server, "it runs on another machine");
                return None;
            }
            // A server that does not know the request.
            Ok((Response::Error(e), _)) => {
                self.not_here(server, &e.message);
                return None;
            }
            Ok(_) | Err(_) => return None,
        };
        let mut g = self.grants.lock();
        if g.generation != generation {
            return None;
        }
        if g.open >= OPEN_MAX {
            g.files.clear();
            g.open = 0;
        }
        g.files.entry(handle).or_default().push((server, grant.clone()));
        g.open += 1;
        match grant {
            Grant::Open(f) => Some(f),
            Grant::Refused => None,
        }
    }

    fn not_here(&self, server: u32, why: &str) {
        tracing::info!("data server {server}: its parts are read through it, not from its files here ({why})");
        if let Some(e) = self.elsewhere.lock().get_mut(server as usize) {
            *e = true;
        }
    }

    /// Forgets the part file of `handle` on `server` alone.
    fn drop_one(&self, handle: u64, server: u32) {
        let mut g = self.grants.lock();
        let Some(v) = g.files.get_mut(&handle) else {
            return;
        };
        let before = v.len();
        v.retain(|(s, _)| *s != server);
        let gone = before - v.len();
        if v.is_empty() {
            g.files.remove(&handle);
        }
        g.open -= gone;
    }
}

/// Opens a part's file read-only, around the page cache where the file
/// system allows (the data server's own reads do too, and the node cache
/// keeps what it reads), and checks it is the one the server named.
fn open(f: &LocalFile) -> Opened {
    use rustix::fs::{Mode, OFlags};
    let path = std::path::PathBuf::from(std::ffi::OsString::from_vec(f.path.clone()));
    let flags = OFlags::RDONLY | OFlags::CLOEXEC;
    let fd = match rustix::fs::open(&path, flags | OFlags::DIRECT, Mode::empty()) {
        Err(rustix::io::Errno::INVAL) => rustix::fs::open(&path, flags, Mode::empty()),
        r => r,
    };
    let file = match fd {
        Ok(fd) => File::from(fd),
        Err(rustix::io::Errno::NOENT) => return Opened::Refused,
        Err(e) => return Opened::Elsewhere(format!("{}: {e}", path.display())),
    };
    match file.metadata() {
        Ok(m) if m.dev() == f.dev && m.ino() == f.ino && f.block > 0 => Opened::File(Part {
            file,
            block: f.block as u64,
            logged: f.logged.clone(),
        }),
        Ok(_) => Opened::Elsewhere(format!("{} here is not the server's file", path.display())),
        Err(e) => Opened::Elsewhere(format!("{}: {e}", path.display())),
    }
}

/// Reads `len` bytes at `off` of `f` into `buf`'s pages (page-aligned, as
/// a direct read needs); short at the file's end.
fn read_block(f: &File, off: u64, len: u64, mut buf: Block) -> Result<(Block, usize), (Block, std::io::Error)> {
    let r = f.read_at(buf.stale(len as usize), off);
    match r {
        Ok(n) => {
            buf.truncate(n);
            Ok((buf, n))
        }
        Err(e) => {
            buf.clear();
            Err((buf, e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("parcache-local-part-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn named(path: &std::path::Path, dev: u64, ino: u64) -> LocalFile {
        LocalFile {
            path: path.as_os_str().as_encoded_bytes().to_vec(),
            dev,
            ino,
            block: 65536,
            logged: vec![2, 5],
        }
    }

    /// A part's file is read only if it is the one the server named, and
    /// not for the blocks its log holds bytes of; a file gone meanwhile is
    /// refused for now, another file at the path (another mount
    /// namespace's) rules the server out.
    #[test]
    fn a_part_file_opens_only_if_it_is_the_servers() {
        let d = scratch("open");
        let p = d.join("part");
        let bytes: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        std::fs::write(&p, &bytes).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        let Opened::File(f) = open(&named(&p, m.dev(), m.ino())) else {
            panic!("the server's own file was not opened");
        };
        // The blocks the server's log holds bytes of are read through it.
        const K: u64 = 65536;
        let touched: Vec<bool> = [
            (0, K),
            (K, K + 1),
            (2 * K + 100, 10),
            (3 * K, 2 * K),
            (3 * K, 3 * K),
            (6 * K, K),
        ]
        .iter()
        .map(|&(o, l)| f.logged(o, l))
        .collect();
        assert_eq!(touched, [false, true, true, false, true, false]);
        // Short at the end; a block's pages are aligned for a direct read.
        let (b, n) = read_block(&f.file, 4096, 8192, Block::new()).unwrap_or_else(|(_, e)| panic!("{e}"));
        assert_eq!((n, &b[..]), (10_000 - 4096, &bytes[4096..]));
        assert!(matches!(open(&named(&p, m.dev(), m.ino() + 1)), Opened::Elsewhere(_)));
        assert!(matches!(
            open(&named(&d.join("gone"), m.dev(), m.ino())),
            Opened::Refused
        ));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A forget drops a file's part files, and moves the generation so an
    /// answer asked for before it is not kept.
    #[test]
    fn a_forget_drops_a_files_part_files() {
        let d = scratch("forget");
        let p = d.join("part");
        std::fs::write(&p, b"x").unwrap();
        let l = LocalParts::new(true, 2);
        {
            let mut g = l.grants.lock();
            let f = Arc::new(Part {
                file: File::open(&p).unwrap(),
                block: 65536,
                logged: Vec::new(),
            });
            g.files.insert(7, vec![(0, Grant::Open(f)), (1, Grant::Refused)]);
            g.files.insert(8, vec![(0, Grant::Refused)]);
            g.open = 3;
        }
        let before = l.grants.lock().generation;
        l.forget(7);
        let g = l.grants.lock();
        assert_eq!((g.open, g.files.len(), g.generation), (1, 1, before + 1));
        drop(g);
        l.drop_one(8, 0);
        assert_eq!(l.grants.lock().open, 0);
        let off = LocalParts::new(false, 2);
        assert!(!off.may_try(0), "off: no server is tried");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A scratch directory (`name`) whose part file holds `bytes`, lent to
    /// a node's local reads as file 7's part on server 0, with `logged`
    /// blocks; the directory, a data path and the local reads.
    fn lent(name: &str, bytes: &[u8], logged: Vec<u64>) -> (std::path::PathBuf, Arc<DataPath>, LocalParts) {
        let d = scratch(name);
        let p = d.join("part");
        std::fs::write(&p, bytes).unwrap();
        let data = DataPath::new(Vec::new(), parcache_proto::Secret::generate(), 65536, true);
        let l = LocalParts::new(true, 1);
        let part = Arc::new(Part {
            file: File::open(&p).unwrap(),
            block: 65536,
            logged,
        });
        l.grants.lock().files.insert(7, vec![(0, Grant::Open(part))]);
        (d, data, l)
    }

    /// A part's file that is lent is read, into the block's buffer; while
    /// as many local reads as may run at once are in progress, or the
    /// thread may not block,
    /// the fetch goes to its data server instead.
    #[tokio::test]
    async fn reads_come_from_the_file_as_many_at_once_as_allowed() {
        let bytes: Vec<u8> = (0..3 * 65536u32).map(|i| (i % 253) as u8).collect();
        let (d, data, l) = lent("busy", &bytes, vec![2]);
        let (b, n) = l.read(&data, (0, 7), 65536, 65536, 0, Block::new()).await.unwrap();
        assert_eq!((n, &b[..]), (65536, &bytes[65536..2 * 65536]));
        assert!(
            l.read(&data, (0, 7), 2 * 65536, 65536, 0, Block::new()).await.is_err(),
            "a logged block"
        );
        l.reading.store(1, Ordering::SeqCst);
        assert!(
            l.read(&data, (0, 7), 0, 65536, 0, Block::new()).await.is_err(),
            "another in progress"
        );
        assert_eq!(l.reading.load(Ordering::SeqCst), 1);
        l.reading.store(0, Ordering::SeqCst);
        assert!(l.read(&data, (0, 7), 0, 65536, 0, Block::new()).await.is_ok());
        let wait = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let w = wait.clone();
        l.set_may_block(Box::new(move || !w.load(Ordering::SeqCst)), 2);
        assert!(
            l.read(&data, (0, 7), 0, 65536, 0, Block::new()).await.is_err(),
            "a request waits"
        );
        wait.store(false, Ordering::SeqCst);
        assert!(l.read(&data, (0, 7), 0, 65536, 0, Block::new()).await.is_ok());
        assert_eq!(l.reading.load(Ordering::SeqCst), 0);
        // Two may run at once now: one in progress leaves room for one.
        l.reading.store(1, Ordering::SeqCst);
        assert!(l.read(&data, (0, 7), 0, 65536, 0, Block::new()).await.is_ok());
        l.reading.store(2, Ordering::SeqCst);
        assert!(
            l.read(&data, (0, 7), 0, 65536, 0, Block::new()).await.is_err(),
            "two in progress"
        );
        l.reading.store(0, Ordering::SeqCst);
        let st = l.stats();
        assert_eq!((st.reads, st.bytes, st.refused), (4, 4 * 65536, 1));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A read of a few pages reads only them, at any offset, and notes
    /// the block: its third miss is admitted whole, the one after that
    /// may go around again.
    #[tokio::test]
    async fn a_few_pages_are_read_around_the_cache_once_per_block() {
        let bytes: Vec<u8> = (0..2 * 65536u32 + 300).map(|i| (i % 251) as u8).collect();
        let (d, data, l) = lent("pages", &bytes, vec![]);
        // 100 bytes across a page boundary of block 1.
        assert!(l.admits_around(7, 1));
        let mut out = vec![0u8; 100];
        assert!(l.read_pages(&data, (0, 7), (65536 + 4050, 0), 1, &mut out).await);
        assert_eq!(out, bytes[65536 + 4050..65536 + 4150]);
        let st = l.stats();
        assert_eq!((st.reads, st.bytes, st.short), (1, 8192, 1), "two pages read");
        assert!(l.admits_around(7, 1), "its second miss goes around too");
        assert!(l.read_pages(&data, (0, 7), (65536 + 8000, 0), 1, &mut out).await);
        assert_eq!(out, bytes[65536 + 8000..65536 + 8100]);
        assert!(!l.admits_around(7, 1), "its third reads the block whole");
        assert!(l.admits_around(7, 1), "then it may go around again");
        // The file's last bytes: the read stops at its end.
        let mut out = vec![9u8; 200];
        let at = 2 * 65536 + 200;
        assert!(l.read_pages(&data, (0, 7), (at, at + 100), 2, &mut out).await);
        assert_eq!(&out[..100], &bytes[at as usize..]);
        assert!(out[100..].iter().all(|&b| b == 0), "zeros past the end");
        // Wholly past the file's end, in its last page: zeros.
        let mut out = vec![9u8; 50];
        assert!(l.read_pages(&data, (0, 7), (at + 150, 0), 2, &mut out).await);
        assert!(out.iter().all(|&b| b == 0), "zeros past the end");
        // Not while another local read is in progress: nothing written.
        l.reading.store(1, Ordering::SeqCst);
        let mut out = vec![1u8; 10];
        assert!(!l.read_pages(&data, (0, 7), (0, 0), 0, &mut out).await);
        assert_eq!(out, vec![1u8; 10]);
        assert!(l.admits_around(7, 0), "a refused read notes nothing");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
