//! FUSE over io_uring (Linux 6.14+): the kernel hands each request to a
//! queue of the CPU it was made on, and takes the reply from the same
//! entry, so a server thread bound to that CPU answers without waking
//! another one. On this project's 2-vCPU virtual machines a request's round
//! trip over /dev/fuse is 50-60 us, almost all of it waking the other CPU
//! and back; over a queue it is 9-10 us (`bench` `fuse-rtt`, issue 14).
//!
//! [`queue`] is the transport: a queue's entries registered with the
//! kernel, the requests they receive and the replies they send.
//! [`wire`] is the part of FUSE's wire format the entries carry. [`probe`]
//! is a file system of one file served over either transport, which
//! measures them and tests the queues against the kernel. [`device`]
//! opens more descriptors of a connection fuser opened: a duplicate to
//! register the queues on, clones for more threads reading /dev/fuse.
//! The mount (`parcache-fuse`) serves requests from all three.

pub mod device;
pub mod probe;
pub mod queue;
pub mod wire;

pub use device::{clone_device, dup_fd};
pub use queue::{Answer, Next, Queue, Replier, Request};

use std::io;

/// Whether the kernel may offer FUSE over io_uring: the `fuse` module's
/// `enable_uring` parameter (Linux 6.14+, `CONFIG_FUSE_IO_URING`); None
/// if this kernel has no such parameter.
pub fn uring_enabled() -> Option<bool> {
    let v = std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring").ok()?;
    Some(v.trim() == "Y" || v.trim() == "1")
}

/// The CPUs the kernel counts (`nr_cpu_ids`, from
/// `/sys/devices/system/cpu/possible`): it wants a queue for each.
pub fn possible_cpus() -> io::Result<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let last = s.trim().rsplit(['-', ',']).next().unwrap_or("0");
    last.parse::<usize>()
        .map(|n| n + 1)
        .map_err(|e| io::Error::other(format!("/sys/devices/system/cpu/possible: {e}")))
}

/// Whether this process may make io_uring rings (`kernel.io_uring_disabled`
/// and seccomp can forbid it even where FUSE offers its queues): a mount
/// asks the kernel for the queues only if it can serve them.
pub fn rings_allowed() -> bool {
    io_uring::IoUring::<io_uring::squeue::Entry128, io_uring::cqueue::Entry>::builder()
        .build(2)
        .is_ok()
}

/// The `fuse` module's `enable_uring` set to Y (root only) until dropped,
/// then put back as it was: for a test or benchmark that measures the
/// queues without leaving the machine changed.
pub struct UringEnabled {
    was: bool,
}

impl UringEnabled {
    const PARAM: &'static str = "/sys/module/fuse/parameters/enable_uring";

    /// None if this kernel has no FUSE over io_uring; an error if it could
    /// not be set (not root).
    pub fn set() -> io::Result<Option<UringEnabled>> {
        let Some(was) = uring_enabled() else { return Ok(None) };
        if !was {
            std::fs::write(Self::PARAM, "Y")?;
        }
        Ok(Some(UringEnabled { was }))
    }

    /// Whether it was already Y.
    pub fn was_set(&self) -> bool {
        self.was
    }
}

impl Drop for UringEnabled {
    fn drop(&mut self) {
        if !self.was {
            let _ = std::fs::write(Self::PARAM, "N");
        }
    }
}
