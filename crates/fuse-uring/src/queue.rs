//! One FUSE request queue over io_uring: the entries a server registers
//! with the kernel for one CPU's requests, each a header buffer and a
//! payload buffer the kernel fills with a request and reads the reply
//! from. A request made on CPU `qid` goes to queue `qid`, so a thread
//! serving it on that CPU is woken there: no wake-up of another CPU, which
//! on a virtual machine costs more than the request (Documentation/
//! filesystems/fuse-io-uring.rst in Linux; issue 14).
//!
//! The queue's thread waits, reads requests and submits every command to
//! the ring. A reply may come from any thread ([`Replier`]): one from
//! another thread puts its commit in the ring and wakes the queue's thread
//! (an eventfd the ring polls), which submits it. A command belongs to the
//! thread that submitted it: when a runtime thread that had submitted a
//! commit itself ended (a blocking-pool thread idle for 10 s), the kernel
//! cancelled the entry's next fetch and a program's request waited for
//! ever (found with fio under a lazy unmount; the queue's thread lives as
//! long as the connection).
#![allow(unsafe_code)]

use crate::wire::{self, Header};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::alloc::Layout;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

/// The ring's `user_data` of the eventfd's poll (entries use their index).
const WAKE: u64 = u64::MAX;

/// Bytes of an entry's header buffer: a page, as the kernel pins it.
const HEADER_BUF: usize = 4096;

/// `struct iovec`, as the kernel reads it from the registering SQE.
#[repr(C)]
struct IoVec {
    base: *mut u8,
    len: usize,
}

/// One entry's memory, allocated by hand: the kernel writes into it
/// whenever it holds the entry, so no Rust reference may own it.
struct Entry {
    header: *mut u8,
    payload: *mut u8,
    payload_len: usize,
    /// The two iovecs naming the buffers, at a fixed address (the kernel
    /// reads them at registration).
    iov: Box<[IoVec; 2]>,
}

impl Entry {
    fn new(payload_len: usize) -> io::Result<Entry> {
        let alloc = |len: usize| {
            // SAFETY: the layout's size is not zero (a page, or a payload
            // of at least a page).
            let p = unsafe { std::alloc::alloc_zeroed(Layout::from_size_align(len, 4096).map_err(io::Error::other)?) };
            if p.is_null() {
                Err(io::Error::from(io::ErrorKind::OutOfMemory))
            } else {
                Ok(p)
            }
        };
        let payload_len = payload_len.max(4096);
        let (header, payload) = (alloc(HEADER_BUF)?, alloc(payload_len)?);
        Ok(Entry {
            header,
            payload,
            payload_len,
            iov: Box::new([
                IoVec {
                    base: header,
                    len: HEADER_BUF,
                },
                IoVec {
                    base: payload,
                    len: payload_len,
                },
            ]),
        })
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        // SAFETY: allocated in `Entry::new` with these layouts; dropped
        // only once the kernel writes into no entry (see `Shared`'s Drop).
        unsafe {
            std::alloc::dealloc(self.header, Layout::from_size_align_unchecked(HEADER_BUF, 4096));
            std::alloc::dealloc(self.payload, Layout::from_size_align_unchecked(self.payload_len, 4096));
        }
    }
}

/// What the queue's thread and its repliers share.
struct Shared {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    /// Serializes pushes to the submission queue (the queue's thread and
    /// repliers on other threads).
    sq: Mutex<()>,
    /// The /dev/fuse connection the queue serves.
    fuse: Arc<File>,
    /// Written by a replier on another thread to wake the queue's thread.
    wake: OwnedFd,
    qid: u16,
    entries: Vec<Entry>,
    /// The connection ended: the kernel writes into no entry any more.
    ended: AtomicBool,
    /// The queue's thread, the one that submits (a reply made on it needs
    /// no wake-up).
    thread: ThreadId,
}

// SAFETY: the entries' raw buffers are touched by one party at a time: the
// kernel between a command's submission and its completion, the queue's
// thread from a completion until it hands the request on, then the one
// replier of that request until it submits the commit. The ring's
// submission side is behind `sq`; its completion side is read by the
// queue's thread alone.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl Drop for Shared {
    /// Entries whose connection has not ended stay allocated (a few MiB,
    /// once): the kernel could still write a request into them.
    fn drop(&mut self) {
        if !self.ended.load(Ordering::Acquire) {
            std::mem::forget(std::mem::take(&mut self.entries));
        }
    }
}

impl Shared {
    /// The command registering entry `i`.
    fn register(&self, i: usize) -> squeue::Entry128 {
        let sqe = opcode::UringCmd80::new(types::Fd(self.fuse.as_raw_fd()), wire::CMD_REGISTER)
            .cmd(wire::command(self.qid, 0))
            .addr(Some(self.entries[i].iov.as_ptr() as u64))
            .build()
            .user_data(i as u64);
        with_len(sqe, 2)
    }

    /// The ring's poll of the queue's eventfd (armed again when it ends).
    fn wake_poll(&self) -> squeue::Entry128 {
        let poll = opcode::PollAdd::new(
            types::Fd(self.wake.as_raw_fd()),
            rustix::event::PollFlags::IN.bits() as u32,
        )
        .multi(true)
        .build()
        .user_data(WAKE);
        poll.into()
    }

    fn push(&self, sqe: squeue::Entry128) -> io::Result<()> {
        let _g = self.sq.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: pushes are serialized by `sq`; the SQE points at an
        // entry's iovecs (or at nothing), which live until the kernel is
        // done with them (see the Drops).
        unsafe { self.ring.submission_shared().push(&sqe) }.map_err(|_| io::Error::other("the queue's ring is full"))
    }
}

/// A request held by an entry of a [`Queue`], until its reply.
pub struct Request<'a> {
    pub header: Header,
    /// The opcode's own header (`fuse_read_in` for a `READ` …), empty for
    /// opcodes without one.
    pub op: &'a [u8],
    /// What follows it (a name, a write's bytes).
    pub payload: &'a [u8],
}

/// A queue's entries and its ring (see the module's comment); its
/// methods run on the thread that serves the queue.
pub struct Queue {
    shared: Arc<Shared>,
    /// Entries holding a request not yet handed on.
    ready: std::collections::VecDeque<usize>,
}

/// Where a queue stands after a wait.
pub enum Next {
    /// Entry `i` holds a request.
    Request(usize),
    /// The connection ended (unmounted or aborted).
    Ended,
}

/// Answers requests of one queue, from any thread.
#[derive(Clone)]
pub struct Replier(Arc<Shared>);

impl Queue {
    /// Registers `depth` entries for CPU `qid`'s requests on connection
    /// `fuse`, each with a payload buffer of `payload` bytes (at least the
    /// connection's largest write or read: the kernel refuses less), on
    /// the calling thread, which then serves the queue. The kernel sends
    /// requests over the queues once every CPU's queue has an entry; until
    /// then they come over /dev/fuse. An entry registered before the
    /// kernel has the answer to its `INIT` is registered again until it
    /// takes.
    pub fn register(fuse: Arc<File>, qid: u16, depth: usize, payload: usize) -> io::Result<Queue> {
        let depth = depth.max(1);
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_cqsize((2 * depth as u32 + 2).next_power_of_two())
            .build((depth as u32 + 1).next_power_of_two())?;
        let wake = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?;
        let entries = (0..depth)
            .map(|_| Entry::new(payload))
            .collect::<io::Result<Vec<_>>>()?;
        let shared = Arc::new(Shared {
            ring,
            sq: Mutex::new(()),
            fuse,
            wake,
            qid,
            entries,
            ended: AtomicBool::new(false),
            thread: std::thread::current().id(),
        });
        for i in 0..shared.entries.len() {
            shared.push(shared.register(i))?;
        }
        shared.push(shared.wake_poll())?;
        shared.ring.submit()?;
        Ok(Queue {
            shared,
            ready: Default::default(),
        })
    }

    /// A handle that answers this queue's requests from any thread.
    pub fn replier(&self) -> Replier {
        Replier(self.shared.clone())
    }

    /// Submits the commands given since the last call and waits for the
    /// next request.
    pub fn wait(&mut self) -> io::Result<Next> {
        loop {
            if let Some(i) = self.ready.pop_front() {
                return Ok(Next::Request(i));
            }
            match self.shared.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INTR.raw_os_error()) => continue,
                Err(e) => return Err(e),
            }
            // SAFETY: only this thread reads the completion queue.
            let done: Vec<(u64, i32, u32)> = unsafe { self.shared.ring.completion_shared() }
                .map(|c| (c.user_data(), c.result(), c.flags()))
                .collect();
            for (data, res, flags) in done {
                if data == WAKE {
                    // Commits pushed by other threads: submitted by the
                    // next wait.
                    let mut b = [0u8; 8];
                    let _ = rustix::io::read(&self.shared.wake, &mut b);
                    if !cqueue::more(flags) {
                        self.shared.push(self.shared.wake_poll())?;
                    }
                    continue;
                }
                match res {
                    0.. => self.ready.push_back(data as usize),
                    // Registered before the kernel took the answer to its
                    // INIT: again, a moment later.
                    _ if res == -rustix::io::Errno::AGAIN.raw_os_error()
                        && (data as usize) < self.shared.entries.len() =>
                    {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                        self.shared.push(self.shared.register(data as usize))?;
                    }
                    _ if res == -rustix::io::Errno::NOTCONN.raw_os_error()
                        || res == -rustix::io::Errno::NODEV.raw_os_error() =>
                    {
                        self.shared.ended.store(true, Ordering::Release);
                        return Ok(Next::Ended);
                    }
                    _ => return Err(io::Error::from_raw_os_error(-res)),
                }
            }
        }
    }

    /// The request entry `i` holds ([`Next::Request`]); None if its
    /// lengths do not fit the entry (then answer it with `EIO`). Read it
    /// before the request is answered.
    pub fn request(&self, i: usize) -> Option<Request<'_>> {
        let e = &self.shared.entries[i];
        // SAFETY: the entry holds a request (its completion was seen and it
        // is not answered yet): neither the kernel nor a replier writes it.
        let header = unsafe { std::slice::from_raw_parts(e.header, HEADER_BUF) };
        let h = Header::read(header);
        let op = h.op_len()?;
        if h.payload as usize > e.payload_len {
            return None;
        }
        // SAFETY: as above, and the length is within the buffer.
        let payload = unsafe { std::slice::from_raw_parts(e.payload, h.payload as usize) };
        Some(Request {
            header: h,
            op: &header[wire::OP_IN_AT..wire::OP_IN_AT + op],
            payload,
        })
    }
}

/// The answer to one request, owned until sent: its entry's payload
/// buffer can be written in place (a read's bytes land where the kernel
/// takes them from, with no copy). Answered `EIO` if dropped unsent.
pub struct Answer {
    replier: Replier,
    entry: usize,
    sent: bool,
}

impl Answer {
    /// The entry's payload buffer (the largest request's size).
    pub fn buf(&mut self) -> &mut [u8] {
        let e = &self.replier.0.entries[self.entry];
        // SAFETY: this answer is the request's one replier (see
        // `Replier::reply`): nobody else touches the entry until it is sent.
        unsafe { std::slice::from_raw_parts_mut(e.payload, e.payload_len) }
    }

    /// Sends the answer: `error` (a negative errno) alone, or 0 with the
    /// first `len` bytes of [`Answer::buf`].
    pub fn send(mut self, error: i32, len: usize) -> io::Result<()> {
        self.sent = true;
        self.replier.commit(self.entry, error, len)
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if !self.sent {
            let _ = self
                .replier
                .commit(self.entry, -rustix::io::Errno::IO.raw_os_error(), 0);
        }
    }
}

impl Replier {
    /// The answer to entry `i`'s request, to be written in place; the one
    /// way (with [`Replier::reply`]) to answer it, once.
    pub fn answer(&self, i: usize) -> Answer {
        Answer {
            replier: self.clone(),
            entry: i,
            sent: false,
        }
    }

    /// Answers entry `i`'s request with `error` (a negative errno, or 0)
    /// and the bytes of `body` (copied into the entry), and gives the
    /// entry back for the next request. Once per request, after its
    /// [`Queue::request`] is no longer read.
    pub fn reply(&self, i: usize, error: i32, body: &[&[u8]]) -> io::Result<()> {
        let s = &self.0;
        let e = s
            .entries
            .get(i)
            .ok_or_else(|| io::Error::other(format!("no entry {i} in queue {}", s.qid)))?;
        // SAFETY: the entry holds this request, whose one replier this is:
        // nobody else reads or writes it until the commit is submitted.
        let payload = unsafe { std::slice::from_raw_parts_mut(e.payload, e.payload_len) };
        let len: usize = body.iter().map(|b| b.len()).sum();
        if error != 0 || len > payload.len() {
            let error = if error != 0 {
                error
            } else {
                -rustix::io::Errno::IO.raw_os_error()
            };
            return self.commit(i, error, 0);
        }
        let mut at = 0;
        for b in body {
            payload[at..at + b.len()].copy_from_slice(b);
            at += b.len();
        }
        self.commit(i, 0, len)
    }

    /// Writes the reply's header (`len` bytes of payload already in place)
    /// and submits the commit of entry `i`, waking the queue's thread if
    /// this is another.
    fn commit(&self, i: usize, error: i32, len: usize) -> io::Result<()> {
        let s = &self.0;
        let e = s
            .entries
            .get(i)
            .ok_or_else(|| io::Error::other(format!("no entry {i} in queue {}", s.qid)))?;
        // SAFETY: as in `reply`: this replier alone touches the entry.
        let header = unsafe { std::slice::from_raw_parts_mut(e.header, HEADER_BUF) };
        let h = Header::read(header);
        let (error, len) = if error != 0 || len > e.payload_len {
            (
                if error != 0 {
                    error
                } else {
                    -rustix::io::Errno::IO.raw_os_error()
                },
                0,
            )
        } else {
            (0, len)
        };
        wire::write_reply(header, h.unique, error, len);
        let sqe = opcode::UringCmd80::new(types::Fd(s.fuse.as_raw_fd()), wire::CMD_COMMIT_AND_FETCH)
            .cmd(wire::command(s.qid, h.commit))
            .build()
            .user_data(i as u64);
        s.push(sqe)?;
        if std::thread::current().id() != s.thread {
            rustix::io::write(&s.wake, &1u64.to_ne_bytes())?;
        }
        Ok(())
    }
}

/// Sets an SQE's `len` (at byte 24 of `struct io_uring_sqe`), which FUSE's
/// registration reads as the number of iovecs and `UringCmd80` leaves 0.
fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);
    // SAFETY: `Entry128` is `repr(C)` over the kernel's 128-byte SQE, a C
    // struct without padding, so every byte is initialized and any bytes
    // are a valid SQE.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&len.to_le_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}
