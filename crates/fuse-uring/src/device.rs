//! Descriptors of a mount's /dev/fuse connection beside the one fuser
//! opened and keeps to itself: a duplicate (the io_uring queues are
//! registered on it) and a clone (`FUSE_DEV_IOC_CLONE`), a descriptor of
//! the same connection with a queue of requests in progress of its own,
//! so that several threads read requests at once, each answering those it
//! read on its own descriptor (as libfuse's `clone_fd` does).
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

/// `FUSE_DEV_IOC_CLONE`: `_IOR(229, 0, uint32_t)` in
/// `include/uapi/linux/fuse.h`; its argument is the descriptor to clone.
const CLONE: rustix::ioctl::Opcode = rustix::ioctl::opcode::read::<u32>(229, 0);

/// A duplicate of this process's descriptor `fd` (the mount's /dev/fuse
/// connection, which fuser keeps to itself).
pub fn dup_fd(fd: RawFd) -> io::Result<File> {
    // SAFETY: `fd` is only borrowed for the `dup`; if it was closed since
    // it was found, dup fails with EBADF.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    Ok(File::from(rustix::io::fcntl_dupfd_cloexec(fd, 0)?))
}

/// A new descriptor of the connection `session` belongs to: /dev/fuse
/// opened again and bound to it. Requests read from it must be answered
/// on it (the kernel looks a reply up among its own requests in progress).
pub fn clone_device(session: &impl AsFd) -> io::Result<File> {
    let dev = rustix::fs::open(
        "/dev/fuse",
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    let fd = session.as_fd().as_raw_fd() as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads a u32 (the descriptor) through its
    // argument, which `Setter` passes as a pointer to `fd`, alive for the call.
    unsafe { rustix::ioctl::ioctl(&dev, rustix::ioctl::Setter::<CLONE, u32>::new(fd)) }?;
    Ok(File::from(dev))
}
