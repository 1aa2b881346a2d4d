//! A request's arguments read from its bytes and handed to the mount's
//! method for its opcode, as fuser's session would: for the requests
//! fuser does not read itself, those over an io_uring queue ([`crate::ring`])
//! and those the mount's other /dev/fuse readers take ([`crate::readers`]).
//! The layout is `include/uapi/linux/fuse.h`'s at protocol 7.36, as fuser
//! negotiates it (no extended setxattr, no readdirplus).

use crate::reply::{Device, DeviceAnswer, Out, RawReply, ReplyDirectory};
use crate::{Caller, Mount};
use fuser::TimeOrNow;
use parcache_fuse_uring::{wire::Header, Replier};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `FUSE_WRITE`.
pub(crate) const WRITE: u32 = 16;

const ENOSYS: i32 = 38;
const EINVAL: i32 = 22;

/// Where a request's answer goes.
#[derive(Clone, Copy)]
pub(crate) enum Via<'a> {
    /// Its entry of an io_uring queue.
    Ring(&'a Replier, usize),
    /// The /dev/fuse descriptor it was read from, by the request's id.
    Device(&'a Device, u64),
}

impl Via<'_> {
    fn raw(self) -> RawReply {
        match self {
            Via::Ring(r, entry) => RawReply::ring(r.answer(entry)),
            Via::Device(d, unique) => RawReply::Device(DeviceAnswer::new(d.clone(), unique)),
        }
    }

    fn to<R>(self) -> Out<R> {
        Out::Raw(self.raw())
    }

    fn directory(self, size: usize) -> ReplyDirectory {
        ReplyDirectory::Raw(self.raw(), Vec::new(), size)
    }

    /// Answers with `errno` (0: success, nothing more).
    fn errno(self, errno: i32) {
        match errno {
            0 => self.raw().ok(&[]),
            e => self.raw().error(e),
        }
    }
}

/// Little-endian fields of a request's opcode header, in order.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn u32(&mut self) -> Option<u32> {
        let (v, rest) = self.0.split_first_chunk::<4>()?;
        self.0 = rest;
        Some(u32::from_le_bytes(*v))
    }

    fn u64(&mut self) -> Option<u64> {
        let (v, rest) = self.0.split_first_chunk::<8>()?;
        self.0 = rest;
        Some(u64::from_le_bytes(*v))
    }
}

/// The NUL-terminated names at the front of `b`: the first, and what
/// follows its NUL.
fn name(b: &[u8]) -> Option<(&OsStr, &[u8])> {
    let end = b.iter().position(|&c| c == 0)?;
    Some((OsStr::from_bytes(&b[..end]), &b[end + 1..]))
}

fn time(secs: u64, nsecs: u32) -> SystemTime {
    let secs = secs as i64;
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs)
    } else {
        UNIX_EPOCH - Duration::new(secs.unsigned_abs(), 0) + Duration::from_nanos(nsecs as u64)
    }
}

/// Hands request `h` (its opcode's header `op`, then `payload`; a write's
/// bytes in `written` instead) to the mount's method for its opcode, as
/// fuser's session would, to be answered `via`; a request it cannot read
/// is answered `EINVAL`, one the mount does not serve `ENOSYS` (as fuser
/// answers it, `INTERRUPT` too).
pub(crate) fn dispatch(m: &mut Mount, h: &Header, op: &[u8], payload: &[u8], written: Option<Vec<u8>>, via: Via<'_>) {
    let who = Caller {
        uid: h.uid,
        gid: h.gid,
        pid: h.pid,
    };
    let (unique, node) = (h.unique, h.node);
    // The answer, made only once the arguments are read.
    let s = || via;
    let mut f = Fields(op);
    // The opcode's header and the names after it (over a queue the
    // header is apart from the payload; the names are in the payload).
    let served = (|| -> Option<()> {
        match h.opcode {
            1 => m.lookup(&who, node, name(payload)?.0, s().to()),
            3 => {
                let (flags, _, fh) = (f.u32()?, f.u32()?, f.u64()?);
                m.getattr(&who, node, (flags & 1 != 0).then_some(fh), s().to())
            }
            4 => {
                let valid = f.u32()?;
                let _pad = f.u32()?;
                let (fh, size, _lock, atime, mtime, ctime) =
                    (f.u64()?, f.u64()?, f.u64()?, f.u64()?, f.u64()?, f.u64()?);
                let (atimensec, mtimensec, ctimensec) = (f.u32()?, f.u32()?, f.u32()?);
                let (mode, _unused4, uid, gid) = (f.u32()?, f.u32()?, f.u32()?, f.u32()?);
                let has = |bit: u32| valid & bit != 0;
                let when = |set: u32, now: u32, t: u64, n: u32| {
                    has(set).then(|| {
                        if has(now) {
                            TimeOrNow::Now
                        } else {
                            TimeOrNow::SpecificTime(time(t, n))
                        }
                    })
                };
                m.setattr(
                    &who,
                    node,
                    has(1).then_some(mode),
                    has(2).then_some(uid),
                    has(4).then_some(gid),
                    has(8).then_some(size),
                    when(16, 128, atime, atimensec),
                    when(32, 256, mtime, mtimensec),
                    has(1024).then(|| time(ctime, ctimensec)),
                    has(64).then_some(fh),
                    None,
                    None,
                    None,
                    None,
                    s().to(),
                )
            }
            5 => m.readlink(&who, node, s().to()),
            6 => {
                let (link, rest) = name(payload)?;
                let (target, _) = name(rest)?;
                m.symlink(&who, node, link, Path::new(target), s().to())
            }
            8 => {
                let (mode, rdev, umask) = (f.u32()?, f.u32()?, f.u32()?);
                m.mknod(&who, node, name(payload)?.0, mode, umask, rdev, s().to())
            }
            9 => {
                let (mode, umask) = (f.u32()?, f.u32()?);
                m.mkdir(&who, node, name(payload)?.0, mode, umask, s().to())
            }
            10 => m.unlink(&who, node, name(payload)?.0, s().to()),
            11 => m.rmdir(&who, node, name(payload)?.0, s().to()),
            12 | 45 => {
                let newdir = f.u64()?;
                let flags = if h.opcode == 45 { f.u32()? } else { 0 };
                let (old, rest) = name(payload)?;
                let (new, _) = name(rest)?;
                m.rename(&who, node, old, newdir, new, flags, s().to())
            }
            13 => {
                let old = f.u64()?;
                m.link(&who, old, node, name(payload)?.0, s().to())
            }
            14 => m.open(&who, node, f.u32()? as i32, s().to()),
            15 => {
                let (fh, offset, size, read_flags, lock, flags) =
                    (f.u64()?, f.u64()?, f.u32()?, f.u32()?, f.u64()?, f.u32()?);
                let lock = (read_flags & 2 != 0).then_some(lock);
                m.read(&who, node, fh, offset as i64, size, flags as i32, lock, s().to())
            }
            WRITE => {
                let (fh, offset, size, write_flags, lock, flags) =
                    (f.u64()?, f.u64()?, f.u32()?, f.u32()?, f.u64()?, f.u32()?);
                let mut data = written?;
                if data.len() < size as usize {
                    return None;
                }
                data.truncate(size as usize);
                let lock = (write_flags & 2 != 0).then_some(lock);
                m.write(
                    &who,
                    node,
                    fh,
                    offset as i64,
                    data,
                    write_flags,
                    flags as i32,
                    lock,
                    s().to(),
                )
            }
            17 => m.statfs(&who, node, s().to()),
            18 | 29 => {
                let (fh, flags, release_flags, lock) = (f.u64()?, f.u32()?, f.u32()?, f.u64()?);
                if h.opcode == 29 {
                    m.releasedir(&who, node, fh, flags as i32, s().to())
                } else {
                    let lock = (release_flags & 2 != 0).then_some(lock);
                    m.release(&who, node, fh, flags as i32, lock, release_flags & 1 != 0, s().to())
                }
            }
            20 | 30 => {
                let (fh, fsync_flags) = (f.u64()?, f.u32()?);
                if h.opcode == 30 {
                    m.fsyncdir(&who, node, fh, fsync_flags & 1 != 0, s().to())
                } else {
                    m.fsync(&who, node, fh, fsync_flags & 1 != 0, s().to())
                }
            }
            21 => {
                let (size, flags) = (f.u32()?, f.u32()?);
                let (n, value) = name(payload)?;
                m.setxattr(&who, node, n, value.get(..size as usize)?, flags as i32, 0, s().to())
            }
            22 => {
                let size = f.u32()?;
                m.getxattr(&who, node, name(payload)?.0, size, s().to())
            }
            23 => m.listxattr(&who, node, f.u32()?, s().to()),
            24 => m.removexattr(&who, node, name(payload)?.0, s().to()),
            25 => {
                let (fh, _unused, _pad, lock) = (f.u64()?, f.u32()?, f.u32()?, f.u64()?);
                m.flush(&who, node, fh, lock, s().to())
            }
            27 => m.opendir(&who, node, f.u32()? as i32, s().to()),
            28 => {
                let (fh, offset, size) = (f.u64()?, f.u64()?, f.u32()?);
                m.readdir(&who, node, fh, offset as i64, via.directory(size as usize))
            }
            35 => {
                let (flags, mode, umask) = (f.u32()?, f.u32()?, f.u32()?);
                m.create(&who, node, name(payload)?.0, mode, umask, flags as i32, s().to())
            }
            39 => {
                let (fh, flags, cmd, _arg, in_size, out_size) =
                    (f.u64()?, f.u32()?, f.u32()?, f.u64()?, f.u32()?, f.u32()?);
                let data = payload.get(..in_size as usize)?;
                m.ioctl(&who, node, fh, flags, cmd, data, out_size, s().to())
            }
            43 => {
                let (fh, offset, length, mode) = (f.u64()?, f.u64()?, f.u64()?, f.u32()?);
                m.fallocate(&who, node, fh, offset as i64, length as i64, mode as i32, s().to())
            }
            46 => {
                let (fh, offset, whence) = (f.u64()?, f.u64()?, f.u32()?);
                m.lseek(&who, node, fh, offset as i64, whence as i32, s().to())
            }
            47 => {
                let (fh_in, off_in, node_out, fh_out, off_out, len, flags) =
                    (f.u64()?, f.u64()?, f.u64()?, f.u64()?, f.u64()?, f.u64()?, f.u64()?);
                m.copy_file_range(
                    &who,
                    node,
                    fh_in,
                    off_in as i64,
                    node_out,
                    fh_out,
                    off_out as i64,
                    len,
                    flags as u32,
                    s().to(),
                )
            }
            // DESTROY: fuser's session runs the mount's last work when it ends.
            38 => via.errno(0),
            _ => via.errno(ENOSYS),
        }
        Some(())
    })();
    if served.is_none() {
        // The closure returns None only before it built a reply (its
        // arguments are read first), so the request is unanswered.
        tracing::warn!(
            "FUSE request {unique} (opcode {}) could not be read; answered EINVAL",
            h.opcode
        );
        via.errno(EINVAL);
    }
}
