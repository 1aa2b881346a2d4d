//! The mount's requests over FUSE's io_uring queues (Linux 6.14+), one
//! per CPU, each served by a thread bound to its CPU: a program's request
//! and its answer then wake no other CPU, which on this project's virtual
//! machines took 50-60 us per request against 9 over a queue
//! (`parcache-fuse-uring`, `bench` `fuse-rtt`; issue 14).
//!
//! fuser still mounts and answers `INIT` (where the mount asks for the
//! queues), forgets and interrupts over /dev/fuse. Every other request
//! comes over a queue: its arguments are read as fuser would read them
//! from /dev/fuse ([`crate::dispatch`]) and handed to the same [`Mount`]
//! methods, whose answers ([`crate::reply`]) are written into the
//! queue's entry.
//!
//! Requests of different CPUs start at once, as any multi-threaded FUSE
//! server's do: the mount's code holds no assumption of a single
//! reading thread (starting them one at a time hid two races that showed
//! over /dev/fuse too, rarely: a close's size report covering a write
//! still landing, and a late `FORGET` dropping a name given again).

use crate::dispatch::{dispatch, Via, WRITE};
use crate::Mount;
use parcache_fuse_uring::{Next, Queue};
use std::fs::File;
use std::io;
use std::sync::Arc;

/// Entries per queue: requests of one CPU answered at once (each entry
/// holds a payload buffer of the largest request, 1 MiB).
const DEPTH: usize = 4;

/// Bytes of each entry's payload buffer: the largest write or read and a
/// page for what goes with it.
const PAYLOAD: usize = crate::MAX_IO as usize + 4096;

const EIO: i32 = 5;

/// Serves queue `qid` with `mount` on this thread until the connection
/// ends; `ready` learns whether the queue was registered.
pub(crate) fn serve(mut mount: Mount, fuse: Arc<File>, qid: u16, ready: std::sync::mpsc::Sender<io::Result<()>>) {
    let mut cpus = rustix::thread::CpuSet::new();
    cpus.set(qid as usize);
    // A CPU that is not online cannot take the thread; its queue (which
    // gets no requests then) is served wherever the scheduler puts it.
    let _ = rustix::thread::sched_setaffinity(None, &cpus);
    let mut q = match Queue::register(fuse, qid, DEPTH, PAYLOAD) {
        Ok(q) => {
            let _ = ready.send(Ok(()));
            q
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let replier = q.replier();
    // The request's arguments, copied out of the entry before it is
    // answered (the answer is written into the same entry).
    let mut args = Vec::with_capacity(PAYLOAD);
    loop {
        let i = match q.wait() {
            Ok(Next::Request(i)) => i,
            Ok(Next::Ended) => return,
            Err(e) => {
                tracing::error!("FUSE queue {qid}: {e}; its requests wait for the unmount");
                return;
            }
        };
        let Some(r) = q.request(i) else {
            let _ = replier.reply(i, -EIO, &[]);
            continue;
        };
        let (h, op_len) = (r.header, r.op.len());
        args.clear();
        args.extend_from_slice(r.op);
        // A write's bytes are copied once, into what the mount keeps.
        let written = (h.opcode == WRITE).then(|| r.payload.to_vec());
        if written.is_none() {
            args.extend_from_slice(r.payload);
        }
        dispatch(
            &mut mount,
            &h,
            &args[..op_len],
            &args[op_len..],
            written,
            Via::Ring(&replier, i),
        );
    }
}
