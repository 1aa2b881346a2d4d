//! parcache-fuse: parcache as a FUSE file system, a front end of the node
//! client (DESIGN.md §2, "mount"). Every process on the node goes through
//! one [`Fs`], so they share the node cache, as the kernel-level local cache
//! of Vilayannur et al. 2003 is shared.
//!
//! fuser calls this code on its session thread; each request is handed to a
//! tokio task, so requests run concurrently and a slow one does not hold up
//! the rest. Inode numbers are the metadata server's handles (the root is 1
//! in both). A file's attributes and name are kept by the kernel under a
//! lease from the metadata server ([`leases`]): until another node changes
//! the file, whose change is answered only after the kernel here forgot
//! them; a `stat` anywhere after it sees it. A directory's are kept for a
//! second ([`DIR_TTL`]).

use fuser::{FileAttr, FileType, Filesystem, KernelConfig, Request, TimeOrNow};
use parcache_client::{Attr, FileKind, KernelCache, SetAttr, Timestamp};
use parcache_client::{Fs, FsError};
use parking_lot::Mutex;
use reply::{
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr,
};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::future::Future;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod dispatch;
mod farewell;
mod leases;
mod readers;
mod recorder;
mod reply;
mod ring;
pub use farewell::Farewell;
use leases::{KernelLeases, Ticket};
use parcache_core::TraceOp;
pub use recorder::Recorder;

pub use fuser::{BackgroundSession, MountOption};

/// How long the kernel may keep a directory's attributes and name (as
/// NFS's `acdirmin`): path walks and permission checks then cost no request
/// per directory. This node's own changes to a directory are seen at once;
/// another node's (a new mode, link count or mtime; a rename) within this.
const DIR_TTL: Duration = Duration::from_secs(1);

const FUSE_ASYNC_DIO: u64 = 1 << 15;
const FUSE_PARALLEL_DIROPS: u64 = 1 << 18;

/// Largest read and write the kernel sends at once (without it, buffered
/// writes arrive in 4 KiB pieces).
const MAX_IO: u32 = 1 << 20;

/// How far the kernel reads ahead of sequential reads on the mount, in
/// KiB: as far as one request carries. The kernel caps a FUSE mount's
/// read-ahead at its default (128 KiB) whatever `max_readahead` says, so
/// the mount raises it through sysfs (root only), as network file systems'
/// guides have their users do. Sequential reads then ask the node cache
/// for 1 MiB at a time, whose blocks are fetched from the data servers
/// together.
const READ_AHEAD_KIB: u32 = MAX_IO >> 10;

/// Threads reading /dev/fuse by default, fuser's and three on clones of
/// its descriptor: as many random readers' local reads at once as the
/// mount benchmark's four jobs make, two threads a CPU here.
pub const DEFAULT_READERS: usize = 4;

/// Sets the read-ahead of the FUSE mount at `mountpoint`
/// (`/sys/class/bdi/MAJOR:MINOR/read_ahead_kb`, the device found in
/// `/proc/self/mountinfo`); call it once the kernel's `INIT` is answered.
pub fn raise_read_ahead(mountpoint: &Path, kib: u32) -> std::io::Result<()> {
    let at = std::fs::canonicalize(mountpoint)?;
    // Bytes: a mount point elsewhere whose name is not UTF-8 must not hide this one.
    let dev = mount_device(&std::fs::read("/proc/self/mountinfo")?, &at)
        .ok_or_else(|| std::io::Error::other(format!("{} is not in /proc/self/mountinfo", at.display())))?;
    std::fs::write(format!("/sys/class/bdi/{dev}/read_ahead_kb"), kib.to_string())
}

/// This process's descriptors open on /dev/fuse.
fn fuse_devices() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let fd = e.file_name().to_str()?.parse::<i32>().ok()?;
        (std::fs::read_link(e.path()).ok()? == Path::new("/dev/fuse")).then_some(fd)
    })
    .collect()
}

/// A duplicate of the connection fuser opened and keeps to itself: the
/// one /dev/fuse descriptor of this process not in `before` (those open
/// before the mount).
fn session_device(before: &[i32]) -> std::io::Result<std::fs::File> {
    let new: Vec<i32> = fuse_devices().into_iter().filter(|fd| !before.contains(fd)).collect();
    match new[..] {
        [fd] => parcache_fuse_uring::dup_fd(fd),
        _ => Err(std::io::Error::other(format!(
            "{} new /dev/fuse descriptors in this process, not one",
            new.len()
        ))),
    }
}

/// Lets a local read (`parcache_client::local_part`) block a thread that
/// reads /dev/fuse only while another of the `readers` is free to take
/// the next request, or none waits on `session` (the connection): random
/// readers in several processes then have their reads made at once, each
/// on a reading thread of its own, and a lone reader's on the thread that
/// took its request, with no hand-over.
fn local_reads_wait_for_no_request(fs: &Fs, session: std::fs::File, idle: Arc<readers::Idle>, readers: usize) {
    fs.set_local_may_block(
        Box::new(move || {
            if idle.any() {
                return true;
            }
            let mut p = [rustix::event::PollFd::new(&session, rustix::event::PollFlags::IN)];
            let zero = rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 };
            matches!(rustix::event::poll(&mut p, Some(&zero)), Ok(0))
        }),
        readers,
    );
}

/// Starts the mount's readers of /dev/fuse beside fuser's thread
/// (`mount.readers` in all), each on a clone of `session` (the connection
/// fuser opened), once `INIT` is answered; returns how many read now,
/// fuser's included. One that cannot start is logged and left out:
/// fuser's thread serves on.
fn start_readers(mount: Mount, session: &std::fs::File, at: &Path) -> usize {
    let mut n = 1;
    for i in 1..mount.readers {
        let started = parcache_fuse_uring::clone_device(session).and_then(|dev| {
            let (m, idle) = (mount.clone(), mount.idle.clone());
            std::thread::Builder::new()
                .name(format!("fuse-reader-{i}"))
                .spawn(move || readers::serve(m, dev, idle))
        });
        match started {
            Ok(_) => n += 1,
            Err(e) => {
                tracing::warn!(
                    "{}: {n} thread(s) read /dev/fuse, not {}: {e}",
                    at.display(),
                    mount.readers
                );
                break;
            }
        }
    }
    n
}

/// Starts a thread per CPU serving the mount's requests over FUSE's
/// io_uring queues ([`ring`]), registered on `session`, the connection
/// fuser opened ([`session_device`]). Once the kernel agreed
/// to the queues it holds every request until each CPU's queue is
/// registered, so a failure here leaves the mount unusable: the caller
/// unmounts.
fn start_queues(mount: Mount, session: std::io::Result<std::fs::File>, at: &Path) -> std::io::Result<()> {
    let fail =
        |e: String| std::io::Error::other(format!("{}: FUSE's io_uring queues could not start: {e}", at.display()));
    let fuse = Arc::new(session.map_err(|e| fail(e.to_string()))?);
    let cpus = parcache_fuse_uring::possible_cpus().map_err(|e| fail(e.to_string()))?;
    let (tx, rx) = std::sync::mpsc::channel();
    for q in 0..cpus {
        let (m, f, tx) = (mount.clone(), fuse.clone(), tx.clone());
        std::thread::Builder::new()
            .name(format!("fuse-queue-{q}"))
            .spawn(move || ring::serve(m, f, q as u16, tx))
            .map_err(|e| fail(e.to_string()))?;
    }
    drop(tx);
    for _ in 0..cpus {
        rx.recv()
            .map_err(|_| fail("a queue's thread ended".into()))?
            .map_err(|e| fail(e.to_string()))?;
    }
    tracing::info!("{}: requests served over FUSE's io_uring queues ({cpus})", at.display());
    Ok(())
}

/// Where a mount takes its requests from ([`Mount::with_fuse_uring`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FuseQueues {
    /// /dev/fuse only, read by [`Mount::with_fuse_readers`] threads: the
    /// default, since on Linux
    /// 6.18 a request over the queues was lost now and then under
    /// concurrent random reads (the kernel queued it and never handed it
    /// to the mount; docs/mount.md, "FUSE over io_uring").
    #[default]
    Off,
    /// FUSE's io_uring queues, one per CPU, where the kernel offers them
    /// (root set `enable_uring` of the `fuse` module; Linux 6.14+);
    /// /dev/fuse, with a warning, otherwise.
    On,
}

impl FuseQueues {
    /// Whether the mount asks the kernel for the queues at all.
    fn asked(self) -> bool {
        self == FuseQueues::On
    }
}

/// One line of `/proc/mounts`: what is mounted, where, and its type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub source: String,
    pub at: PathBuf,
    pub fstype: String,
}

/// The source a parcache mount shows in the mount tables, followed by
/// `:ID`, the id of the cluster it serves.
pub const MOUNT_SOURCE: &str = "parcache";

impl MountEntry {
    /// Whether this is a parcache mount: type `fuse.parcache`, or, where
    /// the kernel shows no subtype, `fuse` with a parcache source.
    pub fn is_parcache(&self) -> bool {
        let source = self.source.split(':').next().unwrap_or_default();
        self.fstype == "fuse.parcache" || (source == MOUNT_SOURCE && self.fstype.starts_with("fuse"))
    }

    /// The id of the cluster a parcache mount serves, if its source names
    /// one (a mount whose start could not learn it does not).
    pub fn cluster(&self) -> Option<&str> {
        self.source
            .strip_prefix(MOUNT_SOURCE)?
            .strip_prefix(':')
            .filter(|_| self.is_parcache())
    }
}

/// The mounts of a `/proc/mounts` text, in order, read as bytes: a mount
/// point need not be UTF-8, and one that is not must not hide the others
/// (read as a string, the whole table was lost). Octal escapes undone.
pub fn mount_table(text: &[u8]) -> Vec<MountEntry> {
    text.split(|&b| b == b'\n')
        .filter_map(|l| {
            let mut f = l.split(|&b| b == b' ');
            let (source, at, fstype) = (f.next()?, f.next()?, f.next()?);
            Some(MountEntry {
                source: String::from_utf8_lossy(&unescape(source)).into_owned(),
                at: PathBuf::from(std::ffi::OsString::from_vec(unescape(at))),
                fstype: String::from_utf8_lossy(fstype).into_owned(),
            })
        })
        .collect()
}

/// A field of the kernel's mount tables with its `\ooo` escapes undone.
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(d.iter().fold(0u8, |v, c| v.wrapping_mul(8).wrapping_add(c - b'0')));
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

/// The device (`MAJOR:MINOR`) of the last mount at `at` in a
/// `/proc/self/mountinfo` text.
fn mount_device(mountinfo: &[u8], at: &Path) -> Option<String> {
    mountinfo.split(|&b| b == b'\n').rev().find_map(|l| {
        // mount id, parent id, MAJOR:MINOR, root, mount point, ...
        let mut f = l.split(|&b| b == b' ');
        let dev = f.nth(2)?;
        let point = unescape(f.nth(1)?);
        (point == at.as_os_str().as_bytes()).then(|| String::from_utf8_lossy(dev).into_owned())
    })
}

/// The mounted file system.
#[derive(Clone)]
pub struct Mount {
    fs: Arc<Fs>,
    rt: tokio::runtime::Handle,
    /// Attributes of open files (their layouts), by handle.
    open: Arc<Mutex<HashMap<u64, (Attr, u32)>>>,
    /// Open directories' listings, by the handle `opendir` gave: taken
    /// whole (in pages from the metadata server) when read from the start,
    /// so offsets stay valid however large the directory.
    dirs: Arc<Mutex<HashMap<u64, Arc<Vec<Listed>>>>>,
    /// The next directory handle (shared by every transport's threads).
    next_dir: Arc<AtomicU64>,
    /// `--record`: the trace of the operations that reach the mount.
    recorder: Option<Arc<Recorder>>,
    /// Directories' attributes as this node's creates left them.
    created_in: Arc<Mutex<CreatedIn>>,
    /// What the kernel keeps under the metadata server's leases.
    leases: Arc<KernelLeases>,
    /// Buffers of reads' answers, kept for the next reads.
    read_bufs: Arc<ReadBuffers>,
    /// Whether the kernel maps files opened for direct I/O through its page
    /// cache (`FUSE_DIRECT_IO_ALLOW_MMAP`, Linux 6.6): then opens for
    /// reading and writing may bypass the page cache too.
    direct_mmap: Arc<AtomicBool>,
    /// Whether to ask the kernel for FUSE's io_uring queues ([`ring`]).
    want_uring: FuseQueues,
    /// The kernel agreed to the queues at `INIT`.
    uring: Arc<AtomicBool>,
    /// `INIT` was answered (the queues may be registered).
    initialized: Arc<AtomicBool>,
    /// Threads reading /dev/fuse, fuser's included ([`readers`]).
    readers: usize,
    /// The other readers waiting for a request now.
    idle: Arc<readers::Idle>,
    /// The last work at the session's end, shared with the process's stop.
    farewell: Arc<Farewell>,
}

/// Buffers of reads' answers, kept for the next reads: a fresh buffer for
/// each large read cost the mount a zeroing and a page fault per 4 KiB (a
/// seventh of its CPU in a sequential read from the data servers' caches).
/// [`Fs::read_into`] writes every byte it answers with, so nothing a buffer
/// held before leaves in an answer.
#[derive(Default)]
struct ReadBuffers(Mutex<Vec<Vec<u8>>>);

/// Read buffers kept at most (each as large as the largest read it served).
const READ_BUFFERS: usize = 8;

impl ReadBuffers {
    /// A buffer of at least `len` bytes, for its first `len`: one that
    /// holds as many already if there is one, zeroed only where it never
    /// held anything. A buffer keeps its length: cut to each read's, a
    /// read of 16 bytes (the rest of a 1 MiB read the kernel split in two)
    /// left a buffer that the next 1 MiB read zeroed whole, a thirtieth of
    /// the mount's CPU in a cold read by two programs (issue 14).
    fn take(&self, len: usize) -> Vec<u8> {
        let mut b = {
            let mut kept = self.0.lock();
            match kept.iter().rposition(|b| b.len() >= len) {
                Some(i) => kept.swap_remove(i),
                None => kept.pop().unwrap_or_default(),
            }
        };
        if b.len() < len {
            b.resize(len, 0);
        }
        b
    }

    fn give(&self, b: Vec<u8>) {
        let mut kept = self.0.lock();
        if kept.len() < READ_BUFFERS {
            kept.push(b);
        }
    }
}

/// The attributes of directories this node just created files in, with
/// when: the kernel asks for a directory's attributes again after each
/// create in it (its permission check on the next path walk), and this
/// answers within [`DIR_TTL`], the time the kernel would have kept them
/// itself, without a round trip. Any other change this node makes to any
/// directory empties it (`generation` then tells a create in flight not
/// to put back what it learnt before).
#[derive(Default)]
struct CreatedIn {
    dirs: HashMap<u64, (Attr, Instant)>,
    generation: u64,
}

impl CreatedIn {
    /// Keeps directory `dir`'s attributes after this node's change of it
    /// (`attr`, from the server's answer), unless another change began
    /// since `generation` was read.
    fn learn(&mut self, generation: u64, dir: u64, attr: Option<Attr>) {
        if let Some(a) = attr.filter(|_| self.generation == generation) {
            self.dirs.insert(dir, (a, Instant::now()));
        }
    }

    /// A directory's attributes if a create here left them within
    /// [`DIR_TTL`], with the time they have left.
    fn fresh(&mut self, ino: u64) -> Option<(Attr, Duration)> {
        let (a, at) = self.dirs.get(&ino)?;
        match DIR_TTL.checked_sub(at.elapsed()) {
            Some(left) if !left.is_zero() => Some((a.clone(), left)),
            _ => {
                self.dirs.remove(&ino);
                None
            }
        }
    }
}

/// Who made a request: what the kernel's request header says of its
/// process, whichever transport brought it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caller {
    uid: u32,
    gid: u32,
    pid: u32,
}

impl Caller {
    fn of(req: &Request<'_>) -> Caller {
        Caller {
            uid: req.uid(),
            gid: req.gid(),
            pid: req.pid(),
        }
    }

    fn uid(&self) -> u32 {
        self.uid
    }

    fn gid(&self) -> u32 {
        self.gid
    }

    fn pid(&self) -> u32 {
        self.pid
    }
}

/// One entry of a listing: handle, kind, name.
type Listed = (u64, FileType, std::ffi::OsString);

impl Mount {
    /// A mount served by `fs`, running requests on `rt`.
    pub fn new(fs: Arc<Fs>, rt: tokio::runtime::Handle) -> Self {
        Mount {
            farewell: Farewell::new(fs.clone()),
            fs,
            rt,
            open: Arc::new(Mutex::new(HashMap::new())),
            dirs: Arc::new(Mutex::new(HashMap::new())),
            next_dir: Arc::new(AtomicU64::new(1)),
            recorder: None,
            created_in: Arc::new(Mutex::new(CreatedIn::default())),
            leases: Arc::new(KernelLeases::default()),
            read_bufs: Arc::default(),
            direct_mmap: Arc::default(),
            want_uring: FuseQueues::Off,
            uring: Arc::default(),
            initialized: Arc::default(),
            readers: DEFAULT_READERS,
            idle: Arc::default(),
        }
    }

    /// The mount's last work (leave the tier, push dirty data, give up
    /// leases), which the session's end does unless the process began it
    /// first: a process that stops the mount itself runs it too, to learn
    /// its outcome, and waits for it if the session's end began it.
    pub fn farewell(&self) -> Arc<Farewell> {
        self.farewell.clone()
    }

    /// Whether to serve requests over FUSE's io_uring queues
    /// (`enable_uring` of the `fuse` module, Linux 6.14+). By default
    /// ([`FuseQueues::Off`]) every request comes over /dev/fuse.
    pub fn with_fuse_uring(mut self, queues: FuseQueues) -> Self {
        self.want_uring = queues;
        self
    }

    /// How many threads read requests from /dev/fuse (at least 1, fuser's;
    /// [`DEFAULT_READERS`] unless set): the others read clones of its
    /// descriptor ([`readers`]). Not over the io_uring queues, whose
    /// threads are one per CPU.
    pub fn with_fuse_readers(mut self, n: usize) -> Self {
        self.readers = n.max(1);
        self
    }

    /// Records every file operation into `recorder` (`mount --record`).
    pub fn with_recorder(mut self, recorder: Arc<Recorder>) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// Mounts at `mountpoint` and serves in the background until the
    /// returned session is dropped (which unmounts).
    pub fn spawn(self, mountpoint: &Path) -> std::io::Result<BackgroundSession> {
        // The source the mount tables show: `parcache:ID`, ID the cluster's,
        // so that a tool can tell a file here from another cluster's file
        // with the same handle (`parcache cp`'s check for a copy onto itself).
        let fsname = match self.rt.block_on(self.fs.cluster()) {
            Ok(id) => format!("{MOUNT_SOURCE}:{id}"),
            Err(e) => {
                tracing::warn!("the cluster's id is unknown ({e}); the mount's source is {MOUNT_SOURCE}");
                MOUNT_SOURCE.to_string()
            }
        };
        let opts = [
            MountOption::FSName(fsname),
            MountOption::Subtype("parcache".into()),
            MountOption::DefaultPermissions,
            MountOption::AllowOther,
            MountOption::RW,
        ];
        let mut this = self;
        if this.want_uring.asked() && !parcache_fuse_uring::rings_allowed() {
            tracing::info!(
                "{}: requests over /dev/fuse: this process may not make io_uring rings",
                mountpoint.display()
            );
            this.want_uring = FuseQueues::Off;
        }
        let (fs, leases, rt) = (this.fs.clone(), this.leases.clone(), this.rt.clone());
        let (queues, agreed, initialized) = (this.clone(), this.uring.clone(), this.initialized.clone());
        let idle = this.idle.clone();
        let before = fuse_devices();
        let session = fuser::spawn_mount2(this, mountpoint, &opts)?;
        // From here on the kernel keeps files' attributes and names under
        // leases, and forgets them when they are called back.
        let _ = leases.notifier.set(session.notifier());
        let _in_runtime = rt.enter();
        fs.lease_kernel_cache(Arc::new(move |handle| leases.forget(handle)));
        // The kernel sets the read-ahead while it handles the answer to its
        // `INIT` (a value written before is lost), and holds every request
        // until then: a `statfs`, which always reaches the mount, returns
        // after it.
        // With the queues agreed, the kernel holds every request until
        // each CPU's queue is registered: start them before any. Either
        // way nothing but fuser's thread may read /dev/fuse before `INIT`
        // is answered.
        let t = Instant::now();
        while !initialized.load(Ordering::Acquire) && t.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let connection = session_device(&before);
        if queues.want_uring.asked() && agreed.load(Ordering::Relaxed) {
            start_queues(queues, connection, mountpoint)?;
        } else {
            if queues.want_uring.asked() {
                tracing::warn!(
                    "{}: the kernel does not offer FUSE over io_uring (Linux 6.14+, with {} set to Y by root): requests come over /dev/fuse",
                    mountpoint.display(),
                    "/sys/module/fuse/parameters/enable_uring"
                );
            }
            match connection {
                Ok(connection) => {
                    let n = start_readers(queues, &connection, mountpoint);
                    local_reads_wait_for_no_request(&fs, connection, idle, n);
                }
                Err(e) => tracing::warn!(
                    "{}: only fuser's thread reads /dev/fuse (the connection's descriptor was not found: {e})",
                    mountpoint.display()
                ),
            }
        }
        let _ = rustix::fs::statvfs(mountpoint);
        match raise_read_ahead(mountpoint, READ_AHEAD_KIB) {
            Ok(()) => {}
            Err(e) => tracing::info!(
                "{}: the kernel's read-ahead stays at its default (128 KiB): {e}",
                mountpoint.display()
            ),
        }
        Ok(session)
    }

    /// Answers a request: the work is polled once here, on the thread
    /// that read the request, and handed to the runtime only if it has to
    /// wait (for a server, a lock, a write-back). An answer from this
    /// node's caches (a write into the node cache, a cached read, an open
    /// after its lookup, a close of a file read) then costs no hand-over
    /// to another thread, which on this machine took longer than the work;
    /// one that waits has its request sent before the hand-over, which
    /// happens when its answer wakes it ([`parcache_driver::handover`]).
    fn run<F: Future<Output = ()> + Send + 'static>(&self, f: F) {
        parcache_driver::handover::run_here(&self.rt, f);
    }

    /// Answers a request with much data to copy on the runtime's threads,
    /// so that the thread reading requests reads the next meanwhile.
    fn run_spawned<F: Future<Output = ()> + Send + 'static>(&self, f: F) {
        self.rt.spawn(f);
    }

    /// This node is about to change a directory (or a file's links or
    /// attributes): no directory's attributes are answered from
    /// [`CreatedIn`] until fetched again.
    fn dirs_change(&self) {
        let mut c = self.created_in.lock();
        c.dirs.clear();
        c.generation += 1;
    }

    /// This node is about to change the attributes of `ino` (a file's
    /// mode, owner or times; no name): only its own attributes, if it is a
    /// directory, are no longer answered from [`CreatedIn`]. A program that
    /// sets a new file's attributes before closing it (`tar x`, `cp -a`,
    /// `rsync`) then still finds its directory's attributes here at its
    /// next path walk.
    fn attrs_change(&self, ino: u64) {
        let mut c = self.created_in.lock();
        c.dirs.remove(&ino);
        c.generation += 1;
    }

    /// Runs `op` and answers with success or its errno.
    fn done(&self, op: impl Future<Output = Result<(), FsError>> + Send + 'static, reply: ReplyEmpty) {
        self.run(async move {
            match op.await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    /// Runs `op` and answers with the entry it yields (the file named
    /// `name` in directory `parent`) or its errno.
    fn entry(
        &self,
        parent: u64,
        name: Vec<u8>,
        op: impl Future<Output = Result<Attr, FsError>> + Send + 'static,
        reply: ReplyEntry,
    ) {
        let fs = self.fs.clone();
        let leases = self.leases.clone();
        let t = leases.ticket(&fs);
        self.run(async move {
            match op.await {
                Ok(a) => {
                    let attr = file_attr(&fs, &a);
                    leases.reply_with(t, &a, Some((parent, &name)), DIR_TTL, |ttl| reply.entry(ttl, &attr, 0))
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    /// A ticket for a request whose answered attributes the kernel keeps.
    fn ticket(&self) -> (Arc<KernelLeases>, Ticket) {
        (self.leases.clone(), self.leases.ticket(&self.fs))
    }
}

/// Fetches `pages` pages of directory `dir`'s files after `after` ahead
/// of their lookups, in the background (`ReadDirPlus`: each file's
/// attributes, policies and small content under a lease, as its lookup
/// would get them), until the directory ends or
/// [`KernelLeases::got_ahead`] keeps no more.
fn files_ahead(fs: &Arc<Fs>, leases: &Arc<KernelLeases>, dir: u64, mut after: Option<Vec<u8>>, pages: u32) {
    let (fs, leases) = (fs.clone(), leases.clone());
    tokio::spawn(async move {
        let mut ended = false;
        for _ in 0..pages {
            let (t, changes) = (leases.ticket(&fs), fs.metadata_changes());
            match fs.read_dir_plus(dir, after.clone()).await {
                Ok((page, more)) => {
                    // Not kept (stale already): this page again at the
                    // next fetch.
                    let Some(room) = leases.got_ahead(dir, t, changes, page) else {
                        break;
                    };
                    match more {
                        Some(last) => after = Some(last),
                        None => {
                            ended = true;
                            break;
                        }
                    }
                    if !room {
                        break;
                    }
                }
                Err(e) => {
                    tracing::debug!("fetching the files of directory {dir} ahead: {e}");
                    ended = true;
                    break;
                }
            }
        }
        leases.fetched_ahead(dir, after, ended);
    });
}

/// Starts learning directory `dir`'s names under a lease on them, in the
/// background (unless they are known or were tried lately), so that the
/// lookups of names not there (each create's) need no request.
fn watch_names(fs: &Arc<Fs>, leases: &Arc<KernelLeases>, dir: u64) {
    let Some(t) = leases.start_watch(dir, fs.leasing()) else {
        return;
    };
    let (fs, leases) = (fs.clone(), leases.clone());
    tokio::spawn(async move {
        let listing = match fs.watch_dir(dir, leases::WATCH_MOST).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!("watching the names of directory {dir}: {e}");
                None
            }
        };
        leases.learn_names(dir, t, listing);
    });
}

/// Reads and writes of at most this many bytes (one node cache block)
/// are answered on the thread that read them when they need not wait
/// ([`Mount::run`]); larger ones on the runtime's.
const INLINE_MAX: usize = 64 << 10;

/// The errno a failed operation answers; an I/O error (the program sees
/// only EIO) is logged with its cause.
fn errno(e: &FsError) -> i32 {
    let n = e.errno();
    if n == libc_eio() {
        tracing::warn!("answering EIO: {e}");
    }
    n
}

fn libc_eio() -> i32 {
    5
}

fn time(t: Timestamp) -> SystemTime {
    if t.secs >= 0 {
        UNIX_EPOCH + Duration::new(t.secs as u64, t.nanos)
    } else {
        UNIX_EPOCH
    }
}

fn stamp(t: TimeOrNow) -> Timestamp {
    let st = match t {
        TimeOrNow::SpecificTime(s) => s,
        TimeOrNow::Now => SystemTime::now(),
    };
    let d = st.duration_since(UNIX_EPOCH).unwrap_or_default();
    Timestamp {
        secs: d.as_secs() as i64,
        nanos: d.subsec_nanos(),
    }
}

fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
        FileKind::Socket => FileType::Socket,
    }
}

/// The special file kind a `mknod` mode asks for (`None`: a regular file).
fn special(mode: u32) -> Option<FileKind> {
    match mode & 0o170000 {
        0o010000 => Some(FileKind::Fifo),
        0o020000 => Some(FileKind::CharDevice),
        0o060000 => Some(FileKind::BlockDevice),
        0o140000 => Some(FileKind::Socket),
        _ => None,
    }
}

/// The kernel's view of a file: the size includes this node's writes not
/// yet reported to the metadata server.
fn file_attr(fs: &Fs, a: &Attr) -> FileAttr {
    let size = fs.size_of(a);
    FileAttr {
        ino: a.handle,
        size,
        blocks: size.div_ceil(512),
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        crtime: time(a.ctime),
        kind: kind(a.kind),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 64 << 10,
        flags: 0,
    }
}

const O_ACCMODE: i32 = 0o3;
const O_WRONLY: i32 = 0o1;

/// Whether open flags ask for writing.
fn writes(flags: i32) -> bool {
    flags & O_ACCMODE != 0
}

const O_APPEND: i32 = 0o2000;

/// `FUSE_WRITE_CACHE`: a write of pages the kernel cached (a shared
/// writable mapping's, written back), not of a `write(2)`.
const FUSE_WRITE_CACHE: u32 = 1;

/// Whether a write request is a `write(2)` through a descriptor opened (or
/// set with `fcntl`) with `O_APPEND`: the kernel sends the descriptor's
/// flags with each write. Its offset is the end of the file as this node's
/// kernel knows it, which another node's appends may have moved
/// ([`Fs::append`]).
fn appends(write_flags: u32, flags: i32) -> bool {
    flags & O_APPEND != 0 && write_flags & FUSE_WRITE_CACHE == 0
}

/// Whether open flags ask for writing only (nothing can be read or mapped
/// through the open).
fn write_only(flags: i32) -> bool {
    flags & O_ACCMODE == O_WRONLY
}

/// `FUSE_DIRECT_IO_ALLOW_MMAP` (protocol 7.39; fuser has no name for it):
/// the kernel maps a file opened for direct I/O through its page cache,
/// shared writable mappings too, and drops the pages a direct write
/// changes.
const FUSE_DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;

/// Notes one more open description of a file, with its newest attributes.
fn remember(open: &Mutex<HashMap<u64, (Attr, u32)>>, a: Attr) {
    let mut open = open.lock();
    let e = open.entry(a.handle).or_insert((a.clone(), 0));
    e.0 = a;
    e.1 += 1;
}

/// How the kernel is to treat an open file, as the file's consistency
/// plug-in says: its page cache bypassed (`sprite`, `posix`, `nfs`: every
/// read and write must reach the node), dropped at an open that finds the
/// file changed by another node (`close-to-open`, `session`), or kept
/// across opens (`none`). The file's `page-cache` setting may bypass it
/// besides: by default an open for writing (`writer`: see
/// [`Mount::writer`]) and an open for reading only of a large file
/// (`reader`: see [`Mount::reader`]). The close of an open for reading
/// only (`read_only`) sends the mount nothing ([`FOPEN_NOFLUSH`]).
async fn open_flags(fs: &Fs, a: &Attr, writer: bool, reader: bool, read_only: bool) -> Result<u32, FsError> {
    let noflush = if read_only { FOPEN_NOFLUSH } else { 0 };
    Ok(noflush
        | match fs.kernel_cache(a, writer, reader).await? {
            KernelCache::Bypass => fuser::consts::FOPEN_DIRECT_IO,
            KernelCache::UntilOpen | KernelCache::UntilChanged => 0,
            KernelCache::Keep => fuser::consts::FOPEN_KEEP_CACHE,
        })
}

/// `FOPEN_NOFLUSH` (protocol 7.35; fuser has no name for it): the kernel
/// sends no `FLUSH` at a close(2) of this open. A close pushes what was
/// written through its open (close-to-open); nothing can be written
/// through an open for reading only, so its close need not wait for a
/// round trip to the mount (one of the five a small file's read costs).
const FOPEN_NOFLUSH: u32 = 1 << 5;

/// A name as the metadata server keeps it: its bytes.
fn name_of(name: &OsStr) -> Result<Vec<u8>, i32> {
    Ok(name.as_bytes().to_vec())
}

impl Mount {
    /// Whether an open (with `flags`) is one for writing that may bypass
    /// the page cache: one for writing only, or for reading and writing
    /// where the kernel can still map it ([`Mount::direct_mmap`]; without
    /// that, a shared writable `mmap` of a direct open fails with `ENODEV`).
    fn writer(&self, flags: i32) -> bool {
        write_only(flags) || (writes(flags) && self.direct_mmap.load(Ordering::Relaxed))
    }

    /// Whether an open (with `flags`) is one for reading only that may
    /// bypass the page cache (a large file's, under `page-cache=auto`):
    /// only where the kernel can still map it, since without that a shared
    /// `mmap` of a direct open fails with `ENODEV`, read-only ones too.
    fn reader(&self, flags: i32) -> bool {
        !writes(flags) && self.direct_mmap.load(Ordering::Relaxed)
    }

    /// The attributes of an open file, or from the metadata server.
    fn attr_of(&self, ino: u64) -> impl Future<Output = Result<Attr, FsError>> + Send + 'static {
        let known = self.open.lock().get(&ino).map(|(a, _)| a.clone());
        let fs = self.fs.clone();
        async move {
            match known {
                Some(a) => Ok(a),
                None => fs.getattr(ino).await,
            }
        }
    }
}

/// The requests, whichever transport brought them: fuser's session over
/// /dev/fuse (the [`Filesystem`] methods below call these) or a queue per
/// CPU over io_uring ([`ring`]). Their arguments are fuser's.
#[allow(clippy::too_many_arguments)]
impl Mount {
    /// The kernel dropped the inode (`FORGET`): its names need no callback
    /// any more.
    pub(crate) fn forgotten(&self, ino: u64) {
        self.leases.dropped(ino);
    }

    pub(crate) fn lookup(&mut self, _req: &Caller, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let fs = self.fs.clone();
        let name = match name_of(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        if name.len() <= parcache_client::NAME_MAX && self.leases.absent(parent, &name) {
            // This node holds a lease on the directory's names and knows
            // them all: a create's lookup costs no request. (A name too
            // long is the server's to refuse.)
            return reply.error(ENOENT);
        }
        let rec = self.recorder.clone();
        if let Some((a, policies, content, t, changes)) = self.leases.take_ahead(parent, &name, fs.metadata_changes()) {
            // Got ahead with the directory's other files, and the server
            // would still answer the same: no request.
            fs.looked_up(&a, &name, content);
            if let Some(r) = rec {
                r.learn(parent, &name, a.handle);
            }
            self.leases.looked(t, changes, &a, policies);
            let attr = file_attr(&fs, &a);
            return self
                .leases
                .reply_with(t, &a, Some((parent, &name)), DIR_TTL, |ttl| reply.entry(ttl, &attr, 0));
        }
        // Taken before the lookup is sent: the open that usually follows
        // may take its answer ([`KernelLeases::take_looked`]).
        let leases = self.leases.clone();
        let (t, changes) = (leases.ticket(&fs), fs.metadata_changes());
        self.entry(
            parent,
            name.clone(),
            async move {
                let found = fs.lookup_with_policies(parent, &name).await;
                if found.as_ref().is_err_and(|e| errno(e) == ENOENT) {
                    // Names are being made here, most likely.
                    watch_names(&fs, &leases, parent);
                }
                let (a, policies) = found?;
                if let Some(r) = rec {
                    r.learn(parent, &name, a.handle);
                }
                if a.kind == FileKind::File {
                    if let Some((after, pages)) = leases.found_at_server(parent, fs.leasing()) {
                        // Many files of this directory are being read or
                        // `stat`ed, most likely.
                        files_ahead(&fs, &leases, parent, after, pages);
                    }
                }
                leases.looked(t, changes, &a, policies);
                Ok(a)
            },
            reply,
        );
    }

    pub(crate) fn getattr(&mut self, _req: &Caller, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        let fs = self.fs.clone();
        if let Some((a, left)) = self.created_in.lock().fresh(ino) {
            return reply.attr(&left, &file_attr(&fs, &a));
        }
        // Right after a setattr of this node's (the kernel's own getattr
        // before a `chown`): the metadata server would answer the same.
        if let Some((a, t)) = self.leases.take_set(ino, fs.metadata_changes()) {
            fs.seen(&a);
            let attr = file_attr(&fs, &a);
            return self
                .leases
                .reply_with(t, &a, None, DIR_TTL, |ttl| reply.attr(ttl, &attr));
        }
        let (leases, t) = self.ticket();
        self.run(async move {
            match fs.getattr(ino).await {
                Ok(a) => {
                    let attr = file_attr(&fs, &a);
                    leases.reply_with(t, &a, None, DIR_TTL, |ttl| reply.attr(ttl, &attr))
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    pub(crate) fn setattr(
        &mut self,
        _req: &Caller,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        self.attrs_change(ino);
        let fs = self.fs.clone();
        let attr = size.map(|_| self.attr_of(ino));
        let open = self.open.clone();
        // Setting a file open here to a given modification time: its
        // unreported writes go first (`Fs::before_times`), or their report
        // would stamp the time of the close over it. (A time of now may
        // as well be the report's.)
        let given = matches!(mtime, Some(TimeOrNow::SpecificTime(_)));
        let written = given
            .then(|| self.open.lock().get(&ino).map(|(a, _)| a.clone()))
            .flatten();
        let (leases, t) = self.ticket();
        self.run(async move {
            let r = async {
                let mut a = None;
                if let (Some(size), Some(attr)) = (size, attr) {
                    let t = fs.truncate(&attr.await?, size).await?;
                    a = Some(t);
                    if let Some(e) = open.lock().get_mut(&ino) {
                        e.0 = a.clone().expect("set above");
                    }
                }
                if mode.is_some() || uid.is_some() || gid.is_some() || atime.is_some() || mtime.is_some() {
                    let set = SetAttr {
                        mode,
                        uid,
                        gid,
                        size: None,
                        atime: atime.map(stamp),
                        mtime: mtime.map(stamp),
                    };
                    if let Some(w) = &written {
                        fs.before_times(w).await?;
                    }
                    let before = fs.metadata_changes();
                    let set = fs.setattr(ino, set).await?;
                    if size.is_none() {
                        leases.set(t, before, &set);
                    }
                    a = Some(set);
                }
                match a {
                    Some(a) => Ok(a),
                    None => fs.getattr(ino).await,
                }
            };
            match r.await {
                Ok(a) => {
                    let attr = file_attr(&fs, &a);
                    leases.reply_with(t, &a, None, DIR_TTL, |ttl| reply.attr(ttl, &attr))
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    pub(crate) fn mkdir(&mut self, req: &Caller, parent: u64, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        self.dirs_change();
        let fs = self.fs.clone();
        let name = match name_of(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let (uid, gid) = (req.uid(), req.gid());
        let rec = self.recorder.clone();
        let adding = self.leases.adding(parent, &name);
        self.entry(
            parent,
            name.clone(),
            async move {
                let _adding = adding;
                let a = owned(&fs, fs.mkdir_at(parent, &name, mode & !umask).await?, uid, gid).await?;
                if let Some(r) = rec {
                    r.learn(parent, &name, a.handle);
                }
                Ok(a)
            },
            reply,
        );
    }

    pub(crate) fn unlink(&mut self, _req: &Caller, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        self.dirs_change();
        let fs = self.fs.clone();
        let name = match name_of(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        // As after a create: the kernel asks for the directory's attributes
        // at the next path walk; the server gave them with the unlink.
        let created_in = self.created_in.clone();
        let generation = created_in.lock().generation;
        let leases = self.leases.clone();
        // Answered before the metadata server has it where this node holds
        // the directory alone (`parcache_client::Fs::unlink_behind`).
        self.done(
            async move {
                let dir = match fs.unlink_behind(parent, &name).await? {
                    Some(dir) => dir,
                    None => Some(fs.unlink_in(parent, &name).await?),
                };
                leases.removed(parent, &name);
                created_in.lock().learn(generation, parent, dir);
                Ok(())
            },
            reply,
        );
    }

    pub(crate) fn rmdir(&mut self, _req: &Caller, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        self.dirs_change();
        let fs = self.fs.clone();
        let name = match name_of(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let leases = self.leases.clone();
        // As after an unlink: the kernel asks for the directory's
        // attributes at the next path walk; the server gave them.
        let created_in = self.created_in.clone();
        let generation = created_in.lock().generation;
        self.done(
            async move {
                let dir = fs.rmdir_at(parent, &name).await?;
                leases.removed(parent, &name);
                created_in.lock().learn(generation, parent, dir);
                Ok(())
            },
            reply,
        );
    }

    pub(crate) fn rename(
        &mut self,
        _req: &Caller,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        self.dirs_change();
        const RENAME_NOREPLACE: u32 = 1;
        let fs = self.fs.clone();
        let (name, newname) = match (name_of(name), name_of(newname)) {
            (Ok(a), Ok(b)) => (a, b),
            _ => return reply.error(22),
        };
        let rec = self.recorder.clone();
        let adding = self.leases.adding(newparent, &newname);
        let leases = self.leases.clone();
        self.run(async move {
            let _adding = adding;
            if flags & RENAME_NOREPLACE != 0 && fs.lookup(newparent, &newname).await.is_ok() {
                return reply.error(17);
            }
            match fs.rename_at(parent, &name, newparent, &newname).await {
                Ok(()) => {
                    leases.removed(parent, &name);
                    if let Some(r) = rec {
                        if let Ok(a) = fs.lookup(newparent, &newname).await {
                            r.learn(newparent, &newname, a.handle);
                        }
                    }
                    reply.ok()
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    pub(crate) fn open(&mut self, req: &Caller, ino: u64, flags: i32, reply: ReplyOpen) {
        let fs = self.fs.clone();
        let open = self.open.clone();
        let rec = self.recorder.clone().map(|r| (r, Instant::now(), req.pid()));
        let leases = self.leases.clone();
        let (writer, reader) = (self.writer(flags), self.reader(flags));
        self.run(async move {
            let r = async {
                // The lookup just before answered what a getattr would
                // now, if nothing changed since: no request.
                let a = match leases.take_looked(ino, fs.metadata_changes()) {
                    Some((a, policies)) => {
                        fs.open_known(&a, &policies)?;
                        a
                    }
                    None => fs.getattr_to_open(ino).await?,
                };
                let a = fs.open(&a, writes(flags)).await?;
                let how = open_flags(&fs, &a, writer, reader, !writes(flags)).await?;
                Ok::<_, FsError>((a, how))
            };
            match r.await {
                Ok((a, how)) => {
                    let mut fh = 0;
                    if let Some((r, t, pid)) = rec {
                        fh = r.opened(pid);
                        r.log(t, pid, a.handle, TraceOp::Open, 0, u64::from(writes(flags)));
                    }
                    remember(&open, a);
                    reply.opened(fh, how)
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    pub(crate) fn create(
        &mut self,
        req: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        const O_EXCL: i32 = 0o200;
        let fs = self.fs.clone();
        let open = self.open.clone();
        let name = match name_of(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let (uid, gid) = (req.uid(), req.gid());
        let rec = self.recorder.clone().map(|r| (r, Instant::now(), req.pid()));
        let created_in = self.created_in.clone();
        let generation = created_in.lock().generation;
        let (leases, t) = self.ticket();
        let adding = leases.adding(parent, &name);
        let (writer, reader) = (self.writer(flags), self.reader(flags));
        self.run(async move {
            let _adding = adding;
            let entry = name.clone();
            let r = async {
                let (a, dir) = fs
                    .create_owned(parent, &name, mode & !umask, flags & O_EXCL != 0, Some((uid, gid)))
                    .await?;
                created_in.lock().learn(generation, parent, dir);
                if let Some((r, _, _)) = &rec {
                    r.learn(parent, &name, a.handle);
                }
                let a = owned(&fs, a, uid, gid).await?;
                let a = fs.open(&a, writes(flags)).await?;
                let how = open_flags(&fs, &a, writer, reader, !writes(flags)).await?;
                Ok::<_, FsError>((a, how))
            };
            match r.await {
                Ok((a, how)) => {
                    let mut fh = 0;
                    if let Some((r, t, pid)) = rec {
                        fh = r.opened(pid);
                        r.log(t, pid, a.handle, TraceOp::Open, 0, u64::from(writes(flags)));
                    }
                    remember(&open, a.clone());
                    let attr = file_attr(&fs, &a);
                    leases.reply_with(t, &a, Some((parent, &entry)), DIR_TTL, |ttl| {
                        reply.created(ttl, &attr, 0, fh, how)
                    })
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    pub(crate) fn read(
        &mut self,
        req: &Caller,
        ino: u64,
        fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let fs = self.fs.clone();
        let attr = self.attr_of(ino);
        let rec = self.recorder.clone().map(|r| (r, Instant::now(), req.pid()));
        let reply = match reply {
            // Over a queue: the bytes are read straight into the request's
            // entry, where the kernel takes them from, on the queue's
            // thread (the program's CPU) unless the read has to wait.
            reply::Out::Raw(reply::RawReply::Ring(mut answer)) => {
                return self.run(async move {
                    let size = (size as usize).min(answer.buf().len());
                    let r = async {
                        fs.read_into(&attr.await?, offset.max(0) as u64, &mut answer.buf()[..size])
                            .await
                    };
                    let sent = match r.await {
                        Ok(n) => {
                            if let Some((r, t, pid)) = rec {
                                r.log(t, r.opener(fh, pid), ino, TraceOp::Read, offset.max(0) as u64, n as u64);
                            }
                            answer.send(0, n)
                        }
                        Err(e) => answer.send(-errno(&e), 0),
                    };
                    if let Err(e) = sent {
                        tracing::warn!("a FUSE answer over io_uring was lost: {e}");
                    }
                });
            }
            dev => dev,
        };
        let run = if size as usize <= INLINE_MAX {
            Self::run
        } else {
            Self::run_spawned
        };
        let bufs = self.read_bufs.clone();
        run(self, async move {
            let mut buf = bufs.take(size as usize);
            let r = async {
                fs.read_into(&attr.await?, offset.max(0) as u64, &mut buf[..size as usize])
                    .await
            };
            match r.await {
                Ok(n) => {
                    if let Some((r, t, pid)) = rec {
                        r.log(t, r.opener(fh, pid), ino, TraceOp::Read, offset.max(0) as u64, n as u64);
                    }
                    reply.data(&buf[..n])
                }
                Err(e) => reply.error(errno(&e)),
            }
            bufs.give(buf);
        });
    }

    pub(crate) fn write(
        &mut self,
        req: &Caller,
        ino: u64,
        fh: u64,
        offset: i64,
        data: Vec<u8>,
        write_flags: u32,
        flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        let fs = self.fs.clone();
        let attr = self.attr_of(ino);
        let rec = self.recorder.clone().map(|r| (r, Instant::now(), req.pid()));
        let run = if data.len() <= INLINE_MAX {
            Self::run
        } else {
            Self::run_spawned
        };
        let append = appends(write_flags, flags);
        // Only an append can go elsewhere than the kernel said.
        let leases = append.then(|| self.leases.clone());
        let at = offset.max(0) as u64;
        run(self, async move {
            let r = async {
                let a = attr.await?;
                if append {
                    fs.append(&a, at, &data).await
                } else {
                    fs.write_at(&a, at, &data).await.map(|()| at)
                }
            };
            match r.await {
                Ok(went) => {
                    if let Some((r, t, pid)) = rec {
                        r.log(t, r.opener(fh, pid), ino, TraceOp::Write, went, data.len() as u64);
                    }
                    reply.written(data.len() as u32);
                    if let Some(leases) = leases.filter(|_| went != at) {
                        // The kernel took the end to be `at` (another node
                        // appended since it last learned the size): its
                        // size and any pages it holds of the file are
                        // stale. Dropped after the answer, off this thread
                        // (a write through the page cache holds its pages
                        // locked until the answer comes).
                        tokio::task::spawn_blocking(move || {
                            if let Some(n) = leases.notifier.get() {
                                let _ = n.inval_inode(ino, 0, 0);
                            }
                        });
                    }
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    /// Every close(2) of a descriptor, duplicates included (a fork and exec
    /// elsewhere in the program sends these too, at any moment): under
    /// close-to-open the file's dirty blocks go down and its size reaches
    /// the metadata server.
    pub(crate) fn flush(&mut self, _req: &Caller, ino: u64, _fh: u64, _lock_owner: u64, reply: ReplyEmpty) {
        let fs = self.fs.clone();
        let attr = self.attr_of(ino);
        self.done(async move { fs.flush(&attr.await?).await }, reply);
    }

    pub(crate) fn release(
        &mut self,
        req: &Caller,
        ino: u64,
        fh: u64,
        flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let a = {
            let mut open = self.open.lock();
            match open.get_mut(&ino) {
                Some(e) if e.1 <= 1 => open.remove(&ino).map(|(a, _)| a),
                Some(e) => {
                    e.1 -= 1;
                    Some(e.0.clone())
                }
                None => None,
            }
        };
        let Some(a) = a else {
            return reply.ok();
        };
        let fs = self.fs.clone();
        let rec = self.recorder.clone().map(|r| (r, Instant::now(), req.pid()));
        self.done(
            async move {
                fs.release(&a, writes(flags)).await?;
                if let Some((r, t, pid)) = rec {
                    r.log(t, r.closed(fh, pid), a.handle, TraceOp::Close, 0, 0);
                }
                Ok(())
            },
            reply,
        );
    }

    pub(crate) fn fsync(&mut self, req: &Caller, ino: u64, fh: u64, _datasync: bool, reply: ReplyEmpty) {
        let fs = self.fs.clone();
        let attr = self.attr_of(ino);
        let rec = self.recorder.clone().map(|r| (r, Instant::now(), req.pid()));
        self.done(
            async move {
                fs.fsync(&attr.await?).await?;
                if let Some((r, t, pid)) = rec {
                    r.log(t, r.opener(fh, pid), ino, TraceOp::Fsync, 0, 0);
                }
                Ok(())
            },
            reply,
        );
    }

    pub(crate) fn opendir(&mut self, _req: &Caller, _ino: u64, _flags: i32, reply: ReplyOpen) {
        let fh = self.next_dir.fetch_add(1, Ordering::Relaxed);
        reply.opened(fh, 0);
    }

    pub(crate) fn releasedir(&mut self, _req: &Caller, _ino: u64, fh: u64, _flags: i32, reply: ReplyEmpty) {
        self.dirs.lock().remove(&fh);
        reply.ok();
    }

    pub(crate) fn readdir(&mut self, _req: &Caller, ino: u64, fh: u64, offset: i64, mut reply: ReplyDirectory) {
        let fs = self.fs.clone();
        let dirs = self.dirs.clone();
        let have = if offset > 0 {
            dirs.lock().get(&fh).cloned()
        } else {
            None
        };
        self.run(async move {
            let listing = match have {
                Some(l) => l,
                None => match fs.readdir_handle(ino).await {
                    Ok(entries) => {
                        let dots = [
                            (ino, FileType::Directory, ".".into()),
                            (ino, FileType::Directory, "..".into()),
                        ];
                        let all: Vec<Listed> = dots
                            .into_iter()
                            .chain(entries.into_iter().map(|e| {
                                let name = std::ffi::OsString::from_vec(e.name);
                                (e.handle, kind(e.kind), name)
                            }))
                            .collect();
                        let all = Arc::new(all);
                        dirs.lock().insert(fh, all.clone());
                        all
                    }
                    Err(e) => return reply.error(errno(&e)),
                },
            };
            for (i, (h, k, n)) in listing.iter().enumerate().skip(offset.max(0) as usize) {
                if reply.add(*h, i as i64 + 1, *k, n) {
                    break;
                }
            }
            reply.ok()
        });
    }

    pub(crate) fn mknod(
        &mut self,
        req: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.dirs_change();
        let fs = self.fs.clone();
        let name = match name_of(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let (uid, gid) = (req.uid(), req.gid());
        let perm = mode & !umask & 0o7777;
        let adding = self.leases.adding(parent, &name);
        self.entry(
            parent,
            name.clone(),
            async move {
                let _adding = adding;
                let a = match special(mode) {
                    Some(k) => fs.mknod_at(parent, &name, perm, k, rdev).await?,
                    None => fs.create_at(parent, &name, perm, true).await?,
                };
                owned(&fs, a, uid, gid).await
            },
            reply,
        );
    }

    /// `fallocate`: mode 0 makes sure the range exists (the file grows to
    /// cover it; the bytes read as zeros), `FALLOC_FL_KEEP_SIZE` alone has
    /// nothing to do (space is not reserved ahead); other modes (punching
    /// holes, collapsing ranges) are not supported.
    pub(crate) fn fallocate(
        &mut self,
        _req: &Caller,
        ino: u64,
        _fh: u64,
        offset: i64,
        length: i64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        const FALLOC_FL_KEEP_SIZE: i32 = 1;
        const EOPNOTSUPP: i32 = 95;
        if offset < 0 || length <= 0 {
            return reply.error(22);
        }
        match mode {
            0 => {}
            FALLOC_FL_KEEP_SIZE => return reply.ok(),
            _ => return reply.error(EOPNOTSUPP),
        }
        let end = (offset as u64).saturating_add(length as u64);
        let fs = self.fs.clone();
        let attr = self.attr_of(ino);
        let open = self.open.clone();
        self.done(
            async move {
                let a = attr.await?;
                if let Some(t) = fs.extend(&a, end).await? {
                    if let Some(e) = open.lock().get_mut(&ino) {
                        e.0 = t;
                    }
                }
                Ok(())
            },
            reply,
        );
    }

    /// `SEEK_DATA` and `SEEK_HOLE` (cp asks them to copy sparse files): the
    /// whole file is data, as on a file system that does not track holes.
    pub(crate) fn lseek(&mut self, _req: &Caller, ino: u64, _fh: u64, offset: i64, whence: i32, reply: ReplyLseek) {
        const SEEK_DATA: i32 = 3;
        const SEEK_HOLE: i32 = 4;
        const ENXIO: i32 = 6;
        if offset < 0 || !matches!(whence, SEEK_DATA | SEEK_HOLE) {
            return reply.error(22);
        }
        let fs = self.fs.clone();
        let attr = self.attr_of(ino);
        self.run(async move {
            let size = match attr.await {
                Ok(a) => fs.size_of(&a),
                Err(e) => return reply.error(errno(&e)),
            };
            match whence {
                _ if offset as u64 >= size => reply.error(ENXIO),
                SEEK_DATA => reply.offset(offset),
                _ => reply.offset(size as i64),
            }
        });
    }

    /// `copy_file_range`: the bytes pass through this node's cache (up to
    /// 16 MiB per call; callers loop on a short count).
    pub(crate) fn copy_file_range(
        &mut self,
        req: &Caller,
        ino_in: u64,
        fh_in: u64,
        offset_in: i64,
        ino_out: u64,
        _fh_out: u64,
        offset_out: i64,
        len: u64,
        _flags: u32,
        reply: ReplyWrite,
    ) {
        const MOST: u64 = 16 << 20;
        if offset_in < 0 || offset_out < 0 {
            return reply.error(22);
        }
        let fs = self.fs.clone();
        let (src, dst) = (self.attr_of(ino_in), self.attr_of(ino_out));
        let rec = self.recorder.clone();
        let pid = rec.as_ref().map_or(0, |r| r.opener(fh_in, req.pid()));
        self.run_spawned(async move {
            let r = async {
                let (src, dst) = (src.await?, dst.await?);
                let mut done = 0u64;
                while done < len.min(MOST) {
                    let piece = (len.min(MOST) - done).min(MAX_IO as u64);
                    let (at_in, at_out) = (offset_in as u64 + done, offset_out as u64 + done);
                    let t = Instant::now();
                    let d = fs.read_at(&src, at_in, piece).await?;
                    if d.is_empty() {
                        break;
                    }
                    if let Some(r) = &rec {
                        r.log(t, pid, ino_in, TraceOp::Read, at_in, d.len() as u64);
                    }
                    let t = Instant::now();
                    fs.write_at(&dst, at_out, &d).await?;
                    if let Some(r) = &rec {
                        r.log(t, pid, ino_out, TraceOp::Write, at_out, d.len() as u64);
                    }
                    done += d.len() as u64;
                }
                Ok::<_, FsError>(done)
            };
            match r.await {
                Ok(n) => reply.written(n as u32),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    /// `fsyncdir`: the metadata server commits durably.
    pub(crate) fn fsyncdir(&mut self, _req: &Caller, ino: u64, _fh: u64, _datasync: bool, reply: ReplyEmpty) {
        let fs = self.fs.clone();
        self.done(async move { fs.fsync_dir(ino).await }, reply);
    }

    /// No ioctls are served: answered ENOTTY at once, as a local file
    /// system answers one it does not know (and not logged per call).
    pub(crate) fn ioctl(
        &mut self,
        _req: &Caller,
        _ino: u64,
        _fh: u64,
        _flags: u32,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(25);
    }

    pub(crate) fn symlink(&mut self, req: &Caller, parent: u64, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        self.dirs_change();
        let fs = self.fs.clone();
        let (name, target) = match name_of(link_name) {
            Ok(n) => (n, target.as_os_str().as_bytes().to_vec()),
            Err(e) => return reply.error(e),
        };
        let (uid, gid) = (req.uid(), req.gid());
        let adding = self.leases.adding(parent, &name);
        self.entry(
            parent,
            name.clone(),
            async move {
                let _adding = adding;
                owned(&fs, fs.symlink_at(parent, &name, &target).await?, uid, gid).await
            },
            reply,
        );
    }

    pub(crate) fn readlink(&mut self, _req: &Caller, ino: u64, reply: ReplyData) {
        let fs = self.fs.clone();
        self.run(async move {
            match fs.readlink(ino).await {
                Ok(t) => reply.data(&t),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    pub(crate) fn link(&mut self, _req: &Caller, ino: u64, newparent: u64, newname: &OsStr, reply: ReplyEntry) {
        self.dirs_change();
        let fs = self.fs.clone();
        let name = match name_of(newname) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let adding = self.leases.adding(newparent, &name);
        self.entry(
            newparent,
            name.clone(),
            async move {
                let _adding = adding;
                fs.link_at(ino, newparent, &name).await
            },
            reply,
        );
    }

    pub(crate) fn setxattr(
        &mut self,
        _req: &Caller,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.dirs_change();
        let Some(name) = xattr_name(name) else {
            return reply.error(ENOTSUP);
        };
        let fs = self.fs.clone();
        let value = value.to_vec();
        match name.strip_prefix(XATTR_PREFIX).map(str::to_string) {
            Some(key) => {
                let Ok(v) = std::str::from_utf8(&value).map(|v| v.trim_end_matches(['\0', '\n']).to_string()) else {
                    return reply.error(22);
                };
                self.run(async move {
                    match fs.set_policy_handle(ino, &key, &v).await {
                        Ok(_) => reply.ok(),
                        Err(e) => {
                            tracing::warn!("setxattr {XATTR_PREFIX}{key}={v}: {e}");
                            reply.error(errno(&e))
                        }
                    }
                });
            }
            None => self.done(
                async move { fs.set_xattr(ino, &name, &value, flags as u32).await },
                reply,
            ),
        }
    }

    pub(crate) fn getxattr(&mut self, _req: &Caller, ino: u64, name: &OsStr, size: u32, reply: ReplyXattr) {
        let Some(name) = xattr_name(name).filter(|n| n.starts_with("user.")) else {
            // Answered here: the kernel asks for `security.capability`
            // before every write to a file (to clear it), and only
            // `user.*` names are kept.
            return reply.error(ENODATA);
        };
        let fs = self.fs.clone();
        self.run(async move {
            let got = match name.strip_prefix(XATTR_PREFIX) {
                // The effective value: set, inherited or the default.
                Some(key) => policy_values(&fs, ino).await.and_then(|vals| {
                    vals.into_iter()
                        .find(|(k, _, _)| k == key)
                        .map(|(_, v, _)| v.into_bytes())
                        .ok_or(FsError::Remote {
                            path: name.clone(),
                            code: parcache_client::ErrorCode::NoData,
                            message: "no such policy".into(),
                        })
                }),
                None => fs.get_xattr(ino, &name).await,
            };
            match got {
                Ok(v) => xattr_reply(reply, size, &v),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    /// The file's `user.*` attributes and the policies set on it (not
    /// inherited ones nor defaults, so `cp -a` and `tar --xattrs` do not
    /// pin them on copies; `getfattr -n` reads any policy).
    pub(crate) fn listxattr(&mut self, _req: &Caller, ino: u64, size: u32, reply: ReplyXattr) {
        let fs = self.fs.clone();
        self.run(async move {
            let r = async {
                let mut names = Vec::new();
                for k in fs.list_xattr(ino).await? {
                    names.extend_from_slice(k.as_bytes());
                    names.push(0);
                }
                for (k, _, inherited) in fs.policy_origins(ino).await? {
                    if !inherited {
                        names.extend_from_slice(XATTR_PREFIX.as_bytes());
                        names.extend_from_slice(k.as_bytes());
                        names.push(0);
                    }
                }
                Ok::<_, FsError>(names)
            };
            match r.await {
                Ok(names) => xattr_reply(reply, size, &names),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    /// `removexattr user.parcache.KEY` returns the file to the default policy.
    pub(crate) fn removexattr(&mut self, _req: &Caller, ino: u64, name: &OsStr, reply: ReplyEmpty) {
        self.dirs_change();
        let Some(name) = xattr_name(name) else {
            return reply.error(ENODATA);
        };
        let fs = self.fs.clone();
        match name.strip_prefix(XATTR_PREFIX).map(str::to_string) {
            Some(key) => self.done(
                async move { fs.unset_policy_handle(ino, &key).await.map(|_| ()) },
                reply,
            ),
            None => self.done(async move { fs.remove_xattr(ino, &name).await }, reply),
        }
    }

    pub(crate) fn statfs(&mut self, _req: &Caller, _ino: u64, reply: ReplyStatfs) {
        let fs = self.fs.clone();
        self.run(async move {
            match fs.statfs().await {
                Ok(s) => {
                    let bs = 4096u64;
                    reply.statfs(
                        s.capacity_bytes / bs,
                        s.free_bytes / bs,
                        s.free_bytes / bs,
                        s.files,
                        u32::MAX as u64,
                        bs as u32,
                        255,
                        bs as u32,
                    )
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }
}

impl Filesystem for Mount {
    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), i32> {
        let _ = config.set_max_write(MAX_IO);
        if let Err(max) = config.set_max_readahead(MAX_IO) {
            let _ = config.set_max_readahead(max);
        }
        // Lookups and creates in one directory run concurrently; direct
        // I/O (sprite files) is asynchronous too. Each only if the kernel
        // has it.
        for cap in [FUSE_PARALLEL_DIROPS, FUSE_ASYNC_DIO] {
            let _ = config.add_capabilities(cap);
        }
        self.direct_mmap.store(
            config.add_capabilities(FUSE_DIRECT_IO_ALLOW_MMAP).is_ok(),
            Ordering::Relaxed,
        );
        if self.want_uring.asked() {
            let offered = config
                .add_capabilities(parcache_fuse_uring::wire::FUSE_OVER_IO_URING)
                .is_ok();
            self.uring.store(offered, Ordering::Relaxed);
        }
        self.initialized.store(true, Ordering::Release);
        Ok(())
    }

    fn destroy(&mut self) {
        if let Some(r) = &self.recorder {
            r.flush();
        }
        // Its errors are logged where it runs; the process learns them.
        let _ = self.farewell.run(&self.rt);
    }

    /// The kernel dropped the inode: its names need no callback any more.
    fn forget(&mut self, _req: &Request<'_>, ino: u64, _nlookup: u64) {
        self.forgotten(ino);
    }

    fn lookup(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, reply: fuser::ReplyEntry) {
        Mount::lookup(self, &Caller::of(req), parent, name, reply.into())
    }

    fn getattr(&mut self, req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: fuser::ReplyAttr) {
        Mount::getattr(self, &Caller::of(req), ino, _fh, reply.into())
    }

    fn setattr(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: fuser::ReplyAttr,
    ) {
        Mount::setattr(
            self,
            &Caller::of(req),
            ino,
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            _ctime,
            _fh,
            _crtime,
            _chgtime,
            _bkuptime,
            _flags,
            reply.into(),
        )
    }

    fn mkdir(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, mode: u32, umask: u32, reply: fuser::ReplyEntry) {
        Mount::mkdir(self, &Caller::of(req), parent, name, mode, umask, reply.into())
    }

    fn unlink(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, reply: fuser::ReplyEmpty) {
        Mount::unlink(self, &Caller::of(req), parent, name, reply.into())
    }

    fn rmdir(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, reply: fuser::ReplyEmpty) {
        Mount::rmdir(self, &Caller::of(req), parent, name, reply.into())
    }

    fn rename(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: fuser::ReplyEmpty,
    ) {
        Mount::rename(
            self,
            &Caller::of(req),
            parent,
            name,
            newparent,
            newname,
            flags,
            reply.into(),
        )
    }

    fn open(&mut self, req: &Request<'_>, ino: u64, flags: i32, reply: fuser::ReplyOpen) {
        Mount::open(self, &Caller::of(req), ino, flags, reply.into())
    }

    fn create(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: fuser::ReplyCreate,
    ) {
        Mount::create(self, &Caller::of(req), parent, name, mode, umask, flags, reply.into())
    }

    fn read(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: fuser::ReplyData,
    ) {
        Mount::read(
            self,
            &Caller::of(req),
            ino,
            fh,
            offset,
            size,
            _flags,
            _lock_owner,
            reply.into(),
        )
    }

    fn write(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        data: &[u8],
        write_flags: u32,
        flags: i32,
        _lock_owner: Option<u64>,
        reply: fuser::ReplyWrite,
    ) {
        Mount::write(
            self,
            &Caller::of(req),
            ino,
            fh,
            offset,
            data.to_vec(),
            write_flags,
            flags,
            _lock_owner,
            reply.into(),
        )
    }

    fn flush(&mut self, req: &Request<'_>, ino: u64, _fh: u64, _lock_owner: u64, reply: fuser::ReplyEmpty) {
        Mount::flush(self, &Caller::of(req), ino, _fh, _lock_owner, reply.into())
    }

    fn release(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        fh: u64,
        flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: fuser::ReplyEmpty,
    ) {
        Mount::release(
            self,
            &Caller::of(req),
            ino,
            fh,
            flags,
            _lock_owner,
            _flush,
            reply.into(),
        )
    }

    fn fsync(&mut self, req: &Request<'_>, ino: u64, fh: u64, _datasync: bool, reply: fuser::ReplyEmpty) {
        Mount::fsync(self, &Caller::of(req), ino, fh, _datasync, reply.into())
    }

    fn opendir(&mut self, req: &Request<'_>, _ino: u64, _flags: i32, reply: fuser::ReplyOpen) {
        Mount::opendir(self, &Caller::of(req), _ino, _flags, reply.into())
    }

    fn releasedir(&mut self, req: &Request<'_>, _ino: u64, fh: u64, _flags: i32, reply: fuser::ReplyEmpty) {
        Mount::releasedir(self, &Caller::of(req), _ino, fh, _flags, reply.into())
    }

    fn readdir(&mut self, req: &Request<'_>, ino: u64, fh: u64, offset: i64, reply: fuser::ReplyDirectory) {
        Mount::readdir(self, &Caller::of(req), ino, fh, offset, reply.into())
    }

    fn mknod(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: fuser::ReplyEntry,
    ) {
        Mount::mknod(self, &Caller::of(req), parent, name, mode, umask, rdev, reply.into())
    }

    fn fallocate(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        length: i64,
        mode: i32,
        reply: fuser::ReplyEmpty,
    ) {
        Mount::fallocate(self, &Caller::of(req), ino, _fh, offset, length, mode, reply.into())
    }

    fn lseek(&mut self, req: &Request<'_>, ino: u64, _fh: u64, offset: i64, whence: i32, reply: fuser::ReplyLseek) {
        Mount::lseek(self, &Caller::of(req), ino, _fh, offset, whence, reply.into())
    }

    fn copy_file_range(
        &mut self,
        req: &Request<'_>,
        ino_in: u64,
        fh_in: u64,
        offset_in: i64,
        ino_out: u64,
        _fh_out: u64,
        offset_out: i64,
        len: u64,
        _flags: u32,
        reply: fuser::ReplyWrite,
    ) {
        Mount::copy_file_range(
            self,
            &Caller::of(req),
            ino_in,
            fh_in,
            offset_in,
            ino_out,
            _fh_out,
            offset_out,
            len,
            _flags,
            reply.into(),
        )
    }

    fn fsyncdir(&mut self, req: &Request<'_>, ino: u64, _fh: u64, _datasync: bool, reply: fuser::ReplyEmpty) {
        Mount::fsyncdir(self, &Caller::of(req), ino, _fh, _datasync, reply.into())
    }

    fn ioctl(
        &mut self,
        req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        _flags: u32,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        Mount::ioctl(
            self,
            &Caller::of(req),
            _ino,
            _fh,
            _flags,
            _cmd,
            _in_data,
            _out_size,
            reply.into(),
        )
    }

    fn symlink(&mut self, req: &Request<'_>, parent: u64, link_name: &OsStr, target: &Path, reply: fuser::ReplyEntry) {
        Mount::symlink(self, &Caller::of(req), parent, link_name, target, reply.into())
    }

    fn readlink(&mut self, req: &Request<'_>, ino: u64, reply: fuser::ReplyData) {
        Mount::readlink(self, &Caller::of(req), ino, reply.into())
    }

    fn link(&mut self, req: &Request<'_>, ino: u64, newparent: u64, newname: &OsStr, reply: fuser::ReplyEntry) {
        Mount::link(self, &Caller::of(req), ino, newparent, newname, reply.into())
    }

    fn setxattr(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: fuser::ReplyEmpty,
    ) {
        Mount::setxattr(self, &Caller::of(req), ino, name, value, flags, _position, reply.into())
    }

    fn getxattr(&mut self, req: &Request<'_>, ino: u64, name: &OsStr, size: u32, reply: fuser::ReplyXattr) {
        Mount::getxattr(self, &Caller::of(req), ino, name, size, reply.into())
    }

    fn listxattr(&mut self, req: &Request<'_>, ino: u64, size: u32, reply: fuser::ReplyXattr) {
        Mount::listxattr(self, &Caller::of(req), ino, size, reply.into())
    }

    fn removexattr(&mut self, req: &Request<'_>, ino: u64, name: &OsStr, reply: fuser::ReplyEmpty) {
        Mount::removexattr(self, &Caller::of(req), ino, name, reply.into())
    }

    fn statfs(&mut self, req: &Request<'_>, _ino: u64, reply: fuser::ReplyStatfs) {
        Mount::statfs(self, &Caller::of(req), _ino, reply.into())
    }
}

/// The extended attributes that show and set a file's policies:
/// `user.parcache.write`, `…replacement`, `…prefetch`, `…consistency`,
/// `…stripe_unit`, `…stripe_width`.
pub const XATTR_PREFIX: &str = "user.parcache.";

const ENOTSUP: i32 = 95;
const ENOENT: i32 = 2;
const ENODATA: i32 = 61;

/// An extended attribute's name, if it is one this mount stores (text).
fn xattr_name(name: &OsStr) -> Option<String> {
    name.to_str().map(str::to_string)
}

/// A file's effective policies: (key, value, where it comes from).
async fn policy_values(fs: &Fs, ino: u64) -> Result<Vec<(String, String, &'static str)>, FsError> {
    fs.effective_policies(ino).await
}

/// Answers a getxattr or listxattr: the size when asked for it (0), the
/// bytes when they fit, ERANGE when they do not.
fn xattr_reply(reply: ReplyXattr, size: u32, bytes: &[u8]) {
    if size == 0 {
        reply.size(bytes.len() as u32)
    } else if bytes.len() > size as usize {
        reply.error(34)
    } else {
        reply.data(bytes)
    }
}

/// New files and directories belong to the caller, as on a local file system.
async fn owned(fs: &Fs, a: Attr, uid: u32, gid: u32) -> Result<Attr, FsError> {
    if a.uid == uid && a.gid == gid {
        return Ok(a);
    }
    let set = SetAttr {
        uid: Some(uid),
        gid: Some(gid),
        ..SetAttr::default()
    };
    fs.setattr(a.handle, set).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short read between long ones neither shrinks a kept buffer nor
    /// makes the next long read zero one anew: the long reads get back
    /// the memory they had, as long as they left it.
    #[test]
    fn read_buffers_keep_their_length_across_a_short_read() {
        let bufs = ReadBuffers::default();
        let mut long = bufs.take(1 << 20);
        long.fill(7);
        let at = long.as_ptr();
        bufs.give(long);
        let short = bufs.take(16);
        assert!(short.len() >= 16);
        bufs.give(short);
        let again = bufs.take(1 << 20);
        assert_eq!(again.as_ptr(), at, "the long buffer is taken again");
        assert_eq!(again.len(), 1 << 20);
        assert!(again.iter().all(|&b| b == 7), "kept, not zeroed anew");
        // Two at once: the second is new, and as long as asked.
        let other = bufs.take(1 << 20);
        assert_eq!(other.len(), 1 << 20);
        assert_ne!(other.as_ptr(), at);
    }

    #[test]
    fn the_mount_device_is_found_by_its_escaped_mount_point() {
        let info = b"\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
81 22 0:39 / /tmp/pc/mnt rw,nosuid,nodev,relatime shared:44 - fuse.parcache parcache rw,user_id=0
90 22 0:41 / /tmp/a\\040b rw,relatime shared:50 - fuse.parcache parcache rw
92 22 0:43 / /tmp/m\xff\\040x rw,relatime shared:52 - fuse.parcache parcache rw
91 22 0:42 / /tmp/pc/mnt rw,relatime shared:51 - fuse.parcache parcache rw
";
        // The last mount on a path is the one in use.
        assert_eq!(mount_device(info, Path::new("/tmp/pc/mnt")).as_deref(), Some("0:42"));
        assert_eq!(mount_device(info, Path::new("/tmp/a b")).as_deref(), Some("0:41"));
        assert_eq!(mount_device(info, Path::new("/tmp/pc")), None);
        // A name that is not UTF-8.
        let odd = std::ffi::OsStr::from_bytes(b"/tmp/m\xff x");
        assert_eq!(mount_device(info, Path::new(odd)).as_deref(), Some("0:43"));
    }

    #[test]
    fn the_mount_table_reads_names_that_are_not_utf8_and_undoes_escapes() {
        let text = b"/dev/vda / ext4 rw 0 0\nparcache /tmp/m\xff\\040x fuse.parcache rw 0 0\nparcache /tmp/a\\134b fuse rw 0 0\n";
        let t = mount_table(text);
        assert_eq!(t.len(), 3);
        assert_eq!(t[1].at, Path::new(std::ffi::OsStr::from_bytes(b"/tmp/m\xff x")));
        assert_eq!(
            (t[1].source.as_str(), t[1].fstype.as_str()),
            ("parcache", "fuse.parcache")
        );
        assert_eq!(t[2].at, Path::new("/tmp/a\\b"));
    }

    #[test]
    fn a_parcache_mount_names_its_cluster_in_its_source() {
        let text = b"parcache:3f9a0c /a fuse.parcache rw 0 0\n\
parcache:77 /b fuse rw 0 0\nparcache /c fuse.parcache rw 0 0\nparcache:3f /d ext4 rw 0 0\n\
other /e fuse.sshfs rw 0 0\n";
        let t = mount_table(text);
        let seen: Vec<(bool, Option<&str>)> = t.iter().map(|e| (e.is_parcache(), e.cluster())).collect();
        assert_eq!(
            seen,
            [
                (true, Some("3f9a0c")),
                (true, Some("77")),
                // A source without an id: parcache, cluster unknown.
                (true, None),
                // Not FUSE, or another FUSE file system.
                (false, None),
                (false, None),
            ]
        );
    }
}
