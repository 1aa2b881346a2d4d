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
            for node in batch_forgotten(op, payload) {
                mount.forgotten(node);
            }
        }
        WRITE => {
            let written = payload.to_vec();
            dispatch(mount, &h, op, &[], Some(written), Via::Device(device, h.unique));
        }
        _ => dispatch(mount, &h, op, payload, None, Via::Device(device, h.unique)),
    }
}

/// The inodes a `BATCH_FORGET` names: `fuse_batch_forget_in` (count,
/// dummy) in `op`, then `count` of `fuse_forget_one` (nodeid, nlookup) in
/// `payload`; no more than it holds whole.
fn batch_forgotten<'a>(op: &[u8], payload: &'a [u8]) -> impl Iterator<Item = u64> + 'a {
    let count = op.first_chunk::<4>().map_or(0, |c| u32::from_le_bytes(*c)) as usize;
    payload
        .chunks_exact(16)
        .take(count)
        .map(|one| u64::from_le_bytes(one[..8].try_into().expect("16 bytes")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_forget_names_as_many_inodes_as_it_counts_and_holds() {
        let one = |node: u64, n: u64| [node.to_le_bytes(), n.to_le_bytes()].concat();
        let payload = [one(7, 1), one(9, 3), one(11, 2)].concat();
        let op = |count: u32| [count.to_le_bytes(), [0; 4]].concat();
        assert_eq!(batch_forgotten(&op(2), &payload).collect::<Vec<_>>(), vec![7, 9]);
        assert_eq!(batch_forgotten(&op(3), &payload).collect::<Vec<_>>(), vec![7, 9, 11]);
        // A count past what came, a cut entry, a missing header: no more
        // than is there.
        assert_eq!(batch_forgotten(&op(5), &payload[..40]).collect::<Vec<_>>(), vec![7, 9]);
        assert_eq!(batch_forgotten(&[], &payload).count(), 0);
    }
}
