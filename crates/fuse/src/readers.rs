//! More threads reading the mount's requests from /dev/fuse, each on a
//! clone of fuser's descriptor (`FUSE_DEV_IOC_CLONE`, as libfuse's
//! multi-threaded loop with `clone_fd`): requests from several programs
//! are read and started at once, and a request that blocks its thread (a
//! random reader's local read, `parcache_client::local_part`) leaves
//! others readers to take the next ones. fuser's own thread reads too,
//! and keeps `INIT` (the readers start after it) and the session's end.
//!
//! Each request is handed to the same [`Mount`] methods as over the
//! io_uring queues ([`crate::dispatch`]), answered on the descriptor it
//! came from with fuser's own reply types.

use crate::dispatch::{dispatch, Via, WRITE};
use crate::reply::Device;
use crate::Mount;
use parcache_fuse_uring::wire::{Header, IN_HEADER};
use rustix::io::Errno;
use std::fs::File;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// `FUSE_FORGET`, `FUSE_BATCH_FORGET`: no answer.
const FORGET: u32 = 2;
const BATCH_FORGET: u32 = 42;

/// Bytes of a reader's buffer: the kernel refuses a read of /dev/fuse
/// that could not hold the largest write with its headers.
const BUFFER: usize = crate::MAX_IO as usize + 4096;

/// The readers besides fuser's that wait for a request now: a thread may
/// block on a request only while one does (or none waits).
#[derive(Default)]
pub(crate) struct Idle(AtomicUsize);

impl Idle {
    pub(crate) fn any(&self) -> bool {
        self.0.load(Ordering::SeqCst) > 0
    }
}

/// Reads requests from `dev` (a clone of the mount's connection) and
/// serves them with `mount` until the connection ends (the unmount).
pub(crate) fn serve(mut mount: Mount, dev: File, idle: Arc<Idle>) {
    let device = Device(Arc::new(dev));
    let mut buf = vec![0u8; BUFFER];
    loop {
        idle.0.fetch_add(1, Ordering::SeqCst);
        let r = rustix::io::read(&*device.0, &mut buf[..]);
        idle.0.fetch_sub(1, Ordering::SeqCst);
        let n = match r {
            Ok(n) => n,
            // As fuser's loop: a request interrupted before it was read
            // (ENOENT), a signal, nothing yet.
            Err(Errno::NOENT | Errno::INTR | Errno::AGAIN) => continue,
            // Unmounted.
            Err(Errno::NODEV) => return,
            Err(e) => {
                tracing::error!("a /dev/fuse reader stopped: {e}");
                return;
            }
        };
        serve_one(&mut mount, &device, &buf[..n]);
    }
}

/// One request as read from the device.
fn serve_one(mount: &mut Mount, device: &Device, b: &[u8]) {
    let Some(h) = Header::read_device(b) else {
        // Without a whole header there is no request id to answer.
        tracing::warn!(
            "a request of {} bytes from /dev/fuse could not be read; dropped",
            b.len()
        );
        return;
    };
    let body = &b[IN_HEADER..h.len as usize];
    let (op, payload) = body.split_at(body.len() - h.payload as usize);
    match h.opcode {
        FORGET => mount.forgotten(h.node),
        BATCH_FORGET => {
            // fuse_batch_forget_in (count, dummy), then count
            // fuse_forget_one (nodeid, nlookup).
            let count = u32::from_le_bytes(op[..4].try_into().expect("the table's 8 bytes")) as usize;
            for one in payload.chunks_exact(16).take(count) {
                mount.forgotten(u64::from_le_bytes(one[..8].try_into().expect("16 bytes")));
            }
        }
        WRITE => {
            let written = payload.to_vec();
            dispatch(mount, &h, op, &[], Some(written), Via::Device(device, h.unique));
        }
        _ => dispatch(mount, &h, op, payload, None, Via::Device(device, h.unique)),
    }
}
