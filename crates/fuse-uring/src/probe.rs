//! A file system of one read-only file, served over /dev/fuse or over a
//! queue per CPU, to measure what one request costs each way on this
//! machine (`bench` `fuse-rtt`) and to test the queues against the kernel.
//! It answers from memory, so the figures are the transport's alone.
//! Mounting needs root (`mount(2)` with the connection's descriptor).

use crate::possible_cpus;
use crate::queue::{Next, Queue};
use crate::wire::{self, IN_HEADER, OUT_HEADER};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// The probe's one file, `FILE_NAME` in its root, of [`FILE_SIZE`] bytes;
/// the byte at offset `o` is `byte_at(o)`.
pub const FILE_NAME: &str = "file";
pub const FILE_SIZE: u64 = 1 << 30;
/// Largest read and write the probe takes (its payload buffers' size).
pub const MAX_IO: u32 = 1 << 20;

/// The probe file's byte at `offset`.
pub fn byte_at(offset: u64) -> u8 {
    (offset / 4096 % 251) as u8
}

/// How the probe takes its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// One thread reading /dev/fuse (as fuser's session loop does).
    Dev,
    /// As [`Transport::Uring`], every answer sent from a thread of its own
    /// that ends at once (as a runtime's idle threads end): what a server
    /// whose answers come from other threads must survive.
    UringAnsweredElsewhere,
    /// A queue per possible CPU over io_uring, each served by a thread
    /// bound to its CPU; /dev/fuse only for `INIT`, forgets and interrupts.
    Uring,
}

/// A mounted probe; unmounted (lazily) when stopped or dropped.
pub struct Probe {
    at: PathBuf,
    threads: Vec<JoinHandle<io::Result<()>>>,
    /// Requests answered over the queues.
    pub over_uring: Arc<AtomicU64>,
    /// Requests answered over /dev/fuse.
    pub over_dev: Arc<AtomicU64>,
    /// Whether the kernel accepted the queues (it offered io_uring).
    pub uring: bool,
    mounted: bool,
}

impl Probe {
    /// Mounts the probe at `at` (an existing directory) and serves it over
    /// `transport`; returns once the kernel's `INIT` is answered (and, for
    /// [`Transport::Uring`], every queue is registered).
    pub fn mount(at: &Path, transport: Transport) -> io::Result<Probe> {
        let fuse = Arc::new(std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse")?);
        let data = format!(
            "fd={},rootmode=40000,user_id=0,group_id=0,allow_other",
            fuse.as_raw_fd()
        );
        let data = std::ffi::CString::new(data).map_err(io::Error::other)?;
        rustix::mount::mount(
            "parcache-probe",
            at,
            "fuse.parcache-probe",
            rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV,
            Some(data.as_c_str()),
        )?;
        let mut p = Probe {
            at: at.to_path_buf(),
            threads: Vec::new(),
            over_uring: Arc::default(),
            over_dev: Arc::default(),
            uring: false,
            mounted: true,
        };
        let want = transport != Transport::Dev;
        let elsewhere = transport == Transport::UringAnsweredElsewhere;
        let (tx, rx) = std::sync::mpsc::channel();
        let (dev, count) = (fuse.clone(), p.over_dev.clone());
        p.threads
            .push(std::thread::spawn(move || serve_dev(&dev, want, &count, tx)));
        // The stat below waits for INIT's answer (the kernel holds every
        // request until then); its own answer may come over /dev/fuse.
        p.uring = rx
            .recv()
            .map_err(|_| io::Error::other("the probe's /dev/fuse thread ended before INIT"))?;
        if p.uring {
            let cpus = possible_cpus()?;
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            for q in 0..cpus {
                let (fuse, count, ready) = (fuse.clone(), p.over_uring.clone(), ready_tx.clone());
                p.threads.push(std::thread::spawn(move || {
                    serve_queue(fuse, q as u16, &count, ready, elsewhere)
                }));
            }
            for _ in 0..cpus {
                ready_rx
                    .recv()
                    .map_err(|_| io::Error::other("a queue thread ended before registering"))??;
            }
        }
        Ok(p)
    }

    /// The probe file's path.
    pub fn file(&self) -> PathBuf {
        self.at.join(FILE_NAME)
    }

    /// Unmounts and waits for every serving thread to end; the first error
    /// a thread met.
    pub fn stop(mut self) -> io::Result<()> {
        self.unmount();
        let mut first = Ok(());
        for t in std::mem::take(&mut self.threads) {
            let r = t
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("a probe thread panicked")));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    fn unmount(&mut self) {
        if std::mem::take(&mut self.mounted) {
            let _ = rustix::mount::unmount(&self.at, rustix::mount::UnmountFlags::DETACH);
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.unmount();
    }
}

/// The probe's answer to a request: None for one that has none (forgets,
/// interrupts), else a negative errno or 0 with the reply's body in `out`.
fn answer(opcode: u32, node: u64, op: &[u8], payload: &[u8], uring: bool, out: &mut Vec<u8>) -> Option<i32> {
    out.clear();
    let u32_at = |b: &[u8], at: usize| b.get(at..at + 4).map(|s| u32::from_le_bytes(s.try_into().expect("4")));
    let u64_at = |b: &[u8], at: usize| b.get(at..at + 8).map(|s| u64::from_le_bytes(s.try_into().expect("8")));
    let put32 = |out: &mut Vec<u8>, v: u32| out.extend_from_slice(&v.to_le_bytes());
    let put64 = |out: &mut Vec<u8>, v: u64| out.extend_from_slice(&v.to_le_bytes());
    let attr = |out: &mut Vec<u8>, ino: u64| {
        let (size, mode, nlink) = if ino == 1 {
            (0, 0o040755, 2)
        } else {
            (FILE_SIZE, 0o100444, 1)
        };
        for v in [ino, size, size.div_ceil(512), 0, 0, 0] {
            put64(out, v);
        }
        for v in [0, 0, 0, mode, nlink, 0, 0, 0, 4096, 0] {
            put32(out, v);
        }
    };
    match opcode {
        // INIT: protocol 7, the kernel's minor (at most 42); 1 MiB
        // requests; io_uring when asked for and offered.
        26 => {
            let (Some(minor), Some(ra), Some(flags)) = (u32_at(op, 4), u32_at(op, 8), u32_at(op, 12)) else {
                return Some(-22);
            };
            let flags2 = u32_at(op, 16).unwrap_or(0);
            const ASYNC_READ: u32 = 1;
            const MAX_PAGES: u32 = 1 << 22;
            const INIT_EXT: u32 = 1 << 30;
            let offered = flags & INIT_EXT != 0 && flags2 & ((wire::FUSE_OVER_IO_URING >> 32) as u32) != 0;
            let mut f2 = 0;
            if uring && offered {
                f2 = (wire::FUSE_OVER_IO_URING >> 32) as u32;
            }
            for v in [7, minor.min(42), ra, flags & (ASYNC_READ | MAX_PAGES | INIT_EXT)] {
                put32(out, v);
            }
            out.extend_from_slice(&12u16.to_le_bytes()); // max_background
            out.extend_from_slice(&9u16.to_le_bytes()); // congestion_threshold
            put32(out, MAX_IO); // max_write
            put32(out, 1); // time_gran
            out.extend_from_slice(&((MAX_IO / 4096) as u16).to_le_bytes()); // max_pages
            out.extend_from_slice(&0u16.to_le_bytes());
            put32(out, f2);
            out.resize(64, 0);
            Some(0)
        }
        // LOOKUP: the one name, kept a minute.
        1 => {
            // The name is the payload (over a queue) or all there is.
            let name = if payload.is_empty() { op } else { payload };
            let name = name.split(|&b| b == 0).next().unwrap_or_default();
            if node != 1 || name != FILE_NAME.as_bytes() {
                return Some(-2);
            }
            for v in [2, 0, 60, 0] {
                put64(out, v);
            }
            put64(out, 0);
            attr(out, 2);
            Some(0)
        }
        // GETATTR: never kept by the kernel (a request per stat).
        3 => {
            put64(out, 0);
            put64(out, 0);
            attr(out, node);
            Some(0)
        }
        // OPEN (direct I/O: every read is a request), OPENDIR.
        14 | 27 => {
            put64(out, 0);
            put32(out, if opcode == 14 { 1 } else { 0 });
            put32(out, 0);
            Some(0)
        }
        // READ: the file's bytes.
        15 => {
            let (Some(at), Some(size)) = (u64_at(op, 8), u32_at(op, 16)) else {
                return Some(-22);
            };
            let end = (at + size as u64).min(FILE_SIZE).max(at);
            // A page at a time: each page of the file is one byte repeated.
            let mut o = at;
            while o < end {
                let page_end = ((o / 4096 + 1) * 4096).min(end);
                out.resize(out.len() + (page_end - o) as usize, byte_at(o));
                o = page_end;
            }
            Some(0)
        }
        // STATFS
        17 => {
            out.resize(80, 0);
            Some(0)
        }
        // RELEASE, FLUSH, RELEASEDIR, ACCESS, READDIR (empty), DESTROY.
        18 | 25 | 29 | 34 | 28 | 38 => Some(0),
        // FORGET, INTERRUPT, BATCH_FORGET: no answer.
        2 | 36 | 42 => None,
        _ => Some(-38),
    }
}

/// Serves /dev/fuse until the connection ends. Tells `init` whether the
/// queues were agreed on once `INIT` is answered.
fn serve_dev(fuse: &File, uring: bool, count: &AtomicU64, init: std::sync::mpsc::Sender<bool>) -> io::Result<()> {
    let mut buf = vec![0u8; MAX_IO as usize + 8192];
    let (mut out, mut msg) = (Vec::new(), Vec::new());
    let mut init = Some(init);
    loop {
        let n = match (&mut &*fuse).read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NODEV.raw_os_error()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted || e.raw_os_error() == Some(2) => continue,
            Err(e) => return Err(e),
        };
        if n < IN_HEADER {
            return Err(io::Error::other(format!("a request of {n} bytes from /dev/fuse")));
        }
        let h = wire::Header::read(&{
            let mut h = [0u8; wire::REQ_HEADER];
            h[..IN_HEADER].copy_from_slice(&buf[..IN_HEADER]);
            h
        });
        let body = &buf[IN_HEADER..n];
        // Over /dev/fuse the opcode's header and the payload come in one;
        // the probe's answers read the header from the front of both.
        let Some(err) = answer(h.opcode, h.node, body, body, uring, &mut out) else {
            continue;
        };
        count.fetch_add(1, Ordering::Relaxed);
        let agreed = h.opcode == 26 && out.len() >= 36 && u32::from_le_bytes(out[32..36].try_into().expect("4")) != 0;
        let body = if err == 0 { &out[..] } else { &[][..] };
        msg.clear();
        msg.extend_from_slice(&((OUT_HEADER + body.len()) as u32).to_le_bytes());
        msg.extend_from_slice(&err.to_le_bytes());
        msg.extend_from_slice(&h.unique.to_le_bytes());
        msg.extend_from_slice(body);
        match (&mut &*fuse).write(&msg) {
            Ok(_) => {}
            // The request was interrupted and is gone.
            Err(e) if e.raw_os_error() == Some(2) => {}
            Err(e) => return Err(e),
        }
        if h.opcode == 26 {
            if let Some(tx) = init.take() {
                let _ = tx.send(agreed);
            }
        }
    }
}

/// Serves queue `qid` on its CPU until the connection ends.
fn serve_queue(
    fuse: Arc<File>,
    qid: u16,
    count: &AtomicU64,
    ready: std::sync::mpsc::Sender<io::Result<()>>,
    elsewhere: bool,
) -> io::Result<()> {
    let mut cpus = rustix::thread::CpuSet::new();
    cpus.set(qid as usize);
    // A CPU that is not online cannot take the thread; its queue then
    // serves from wherever the scheduler puts it.
    let _ = rustix::thread::sched_setaffinity(None, &cpus);
    let mut q = match Queue::register(fuse, qid, 2, MAX_IO as usize + 4096) {
        Ok(q) => {
            let _ = ready.send(Ok(()));
            q
        }
        Err(e) => {
            let _ = ready.send(Err(io::Error::new(e.kind(), format!("queue {qid}: {e}"))));
            return Err(e);
        }
    };
    let replier = q.replier();
    let mut out = Vec::new();
    loop {
        let i = match q.wait()? {
            Next::Ended => return Ok(()),
            Next::Request(i) => i,
        };
        let err = match q.request(i) {
            Some(r) => answer(r.header.opcode, r.header.node, r.op, r.payload, true, &mut out).unwrap_or(0),
            None => -rustix::io::Errno::IO.raw_os_error(),
        };
        count.fetch_add(1, Ordering::Relaxed);
        let body = if err == 0 { &out[..] } else { &[][..] };
        if elsewhere {
            let (r, body) = (replier.clone(), body.to_vec());
            std::thread::spawn(move || r.reply(i, err, &[&body]))
                .join()
                .map_err(|_| io::Error::other("an answering thread panicked"))??;
        } else {
            replier.reply(i, err, &[body])?;
        }
    }
}
