//! One FUSE request queue over io_uring: the entries a server registers
//! with the kernel for one CPU's requests, each a header buffer and a
//! payload buffer the kernel fills with a request and reads the reply
//! from. A request made on CPU `qid` goes to queue `qid`, so a thread
//! serving it on that CPU is woken there: no wake-up of another CPU, which
//! on a virtual machine costs more than the request (Documentation/
//! filesystems/fuse-io-uring.rst in Linux; issue 14).
#![allow(unsafe_code)]

use crate::wire::{self, Header};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;

/// An entry's header buffer, page-aligned as the kernel pins it.
#[repr(C, align(4096))]
struct HeaderPage([u8; 4096]);

/// `struct iovec`, as the kernel reads it from the registering SQE.
#[repr(C)]
struct IoVec {
    base: *mut u8,
    len: usize,
}

/// One entry: its buffers and the iovecs naming them. Boxed, so its
/// address (which the kernel keeps from the registration on) never moves.
struct Entry {
    header: Box<HeaderPage>,
    payload: Box<[u8]>,
    iov: [IoVec; 2],
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

/// A queue's entries and its ring (see the module's comment). Every
/// method runs on the thread that serves the queue.
pub struct Queue {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    /// The /dev/fuse connection the queue serves; kept open while the
    /// kernel may still write into the entries.
    fuse: Arc<File>,
    qid: u16,
    /// Boxed: the kernel holds each entry's address from its registration.
    #[allow(clippy::vec_box)]
    entries: Vec<Box<Entry>>,
    /// Entries holding a request, not yet answered.
    ready: std::collections::VecDeque<usize>,
    /// The connection ended: the kernel writes into no entry any more.
    ended: bool,
}

impl Drop for Queue {
    /// A queue dropped before its connection ended leaves its entries'
    /// memory allocated (a few MiB, once): the kernel could still write a
    /// request into it.
    fn drop(&mut self) {
        if !self.ended {
            std::mem::forget(std::mem::take(&mut self.entries));
        }
    }
}

/// Where a queue stands after a wait.
pub enum Next {
    /// Entry `i` holds a request.
    Request(usize),
    /// The connection ended (unmounted or aborted).
    Ended,
}

impl Queue {
    /// Registers `depth` entries for CPU `qid`'s requests on connection
    /// `fuse`, each with a payload buffer of `payload` bytes (at least the
    /// connection's largest write or read: the kernel refuses less). The
    /// kernel starts sending requests over the queues once every CPU's
    /// queue has an entry; until then they come over /dev/fuse.
    pub fn register(fuse: Arc<File>, qid: u16, depth: usize, payload: usize) -> io::Result<Queue> {
        let ring =
            IoUring::<squeue::Entry128, cqueue::Entry>::builder().build((depth as u32).max(1).next_power_of_two())?;
        let mut q = Queue {
            ring,
            fuse,
            qid,
            entries: Vec::with_capacity(depth),
            ready: Default::default(),
            ended: false,
        };
        for i in 0..depth {
            let mut e = Box::new(Entry {
                header: Box::new(HeaderPage([0; 4096])),
                payload: vec![0u8; payload].into_boxed_slice(),
                iov: [
                    IoVec {
                        base: std::ptr::null_mut(),
                        len: 0,
                    },
                    IoVec {
                        base: std::ptr::null_mut(),
                        len: 0,
                    },
                ],
            });
            e.iov = [
                IoVec {
                    base: e.header.0.as_mut_ptr(),
                    len: e.header.0.len(),
                },
                IoVec {
                    base: e.payload.as_mut_ptr(),
                    len: e.payload.len(),
                },
            ];
            q.entries.push(e);
            let sqe = opcode::UringCmd80::new(types::Fd(q.fuse.as_raw_fd()), wire::CMD_REGISTER)
                .cmd(wire::command(qid, 0))
                .addr(Some(q.entries[i].iov.as_ptr() as u64))
                .build()
                .user_data(i as u64);
            q.push(with_len(sqe, 2))?;
        }
        q.ring.submit()?;
        Ok(q)
    }

    fn push(&mut self, sqe: squeue::Entry128) -> io::Result<()> {
        // SAFETY: the SQE points at an entry's iovecs and buffers (or at
        // nothing), which are boxed, owned by this queue and freed only once
        // the connection ended (see `Drop`), so the kernel never writes
        // into freed memory.
        unsafe { self.ring.submission().push(&sqe) }.map_err(|_| io::Error::other("the queue's ring is full"))
    }

    /// Sends the replies given since the last call and waits for the next
    /// request.
    pub fn wait(&mut self) -> io::Result<Next> {
        loop {
            if let Some(i) = self.ready.pop_front() {
                return Ok(Next::Request(i));
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INTR.raw_os_error()) => continue,
                Err(e) => return Err(e),
            }
            let done: Vec<(usize, i32)> = self
                .ring
                .completion()
                .map(|c| (c.user_data() as usize, c.result()))
                .collect();
            for (i, res) in done {
                match res {
                    0.. => self.ready.push_back(i),
                    _ if res == -rustix::io::Errno::NOTCONN.raw_os_error()
                        || res == -rustix::io::Errno::NODEV.raw_os_error() =>
                    {
                        self.ended = true;
                        return Ok(Next::Ended);
                    }
                    _ => return Err(io::Error::from_raw_os_error(-res)),
                }
            }
        }
    }

    /// The request entry `i` holds ([`Next::Request`]); None if its
    /// lengths do not fit the entry (then answer it with `EIO`).
    pub fn request(&self, i: usize) -> Option<Request<'_>> {
        let e = &self.entries[i];
        let header = Header::read(&e.header.0);
        let op = header.op_len()?;
        let payload = e.payload.get(..header.payload as usize)?;
        Some(Request {
            header,
            op: &e.header.0[wire::OP_IN_AT..wire::OP_IN_AT + op],
            payload,
        })
    }

    /// Answers entry `i`'s request with `error` (a negative errno, or 0)
    /// and the bytes of `body` (copied into the entry), and gives the
    /// entry back for the next request; sent at the next [`Queue::wait`].
    pub fn reply(&mut self, i: usize, error: i32, body: &[&[u8]]) -> io::Result<()> {
        let e = &mut self.entries[i];
        let header = Header::read(&e.header.0);
        let len: usize = body.iter().map(|b| b.len()).sum();
        let (error, len) = if len > e.payload.len() {
            (-rustix::io::Errno::IO.raw_os_error(), 0)
        } else {
            (error, len)
        };
        if error == 0 {
            let mut at = 0;
            for b in body {
                e.payload[at..at + b.len()].copy_from_slice(b);
                at += b.len();
            }
        }
        wire::write_reply(&mut e.header.0, header.unique, error, if error == 0 { len } else { 0 });
        let sqe = opcode::UringCmd80::new(types::Fd(self.fuse.as_raw_fd()), wire::CMD_COMMIT_AND_FETCH)
            .cmd(wire::command(self.qid, header.commit))
            .build()
            .user_data(i as u64);
        self.push(sqe)
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
