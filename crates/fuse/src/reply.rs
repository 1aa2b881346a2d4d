//! A request's answer, over whichever transport brought the request:
//! fuser's reply (over /dev/fuse) or an entry of an io_uring queue
//! ([`crate::ring`]), whose bytes are laid out here as the kernel reads
//! them (`include/uapi/linux/fuse.h`: `fuse_entry_out`, `fuse_attr_out`,
//! `fuse_open_out`, `fuse_write_out`, `fuse_kstatfs`, `fuse_getxattr_out`,
//! `fuse_lseek_out`, `fuse_dirent`). The mount's methods answer through
//! these types with the same calls as fuser's.

use fuser::{FileAttr, FileType};
use parcache_fuse_uring::Answer;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The answer to one request: fuser's reply (to a request fuser read), or
/// one laid out here ([`RawReply`]).
pub(crate) enum Out<R> {
    Dev(R),
    Raw(RawReply),
}

impl<R> From<R> for Out<R> {
    fn from(r: R) -> Self {
        Out::Dev(r)
    }
}

/// An answer whose bytes are laid out here: into a request's entry in an
/// io_uring queue, or written to the cloned /dev/fuse descriptor the
/// request was read from ([`crate::readers`]), by its id. Answered `EIO`
/// if dropped unanswered (as fuser does).
pub(crate) enum RawReply {
    Ring(Answer),
    Device(DeviceAnswer),
}

/// A /dev/fuse descriptor answers are written to, each with one `writev`
/// (the kernel takes an answer whole).
#[derive(Clone)]
pub(crate) struct Device(pub(crate) std::sync::Arc<std::fs::File>);

/// `struct fuse_out_header`: len, error, unique.
const OUT_HEADER: usize = parcache_fuse_uring::wire::OUT_HEADER;

/// The answer to request `unique`, read from `device`.
pub(crate) struct DeviceAnswer {
    device: Device,
    unique: u64,
    sent: bool,
}

impl DeviceAnswer {
    pub(crate) fn new(device: Device, unique: u64) -> DeviceAnswer {
        DeviceAnswer {
            device,
            unique,
            sent: false,
        }
    }

    /// Sends `error` (a negative errno or 0), then `body`.
    fn send(mut self, error: i32, body: &[&[u8]]) -> std::io::Result<()> {
        self.sent = true;
        self.write(error, body)
    }

    fn write(&self, error: i32, body: &[&[u8]]) -> std::io::Result<()> {
        let len = OUT_HEADER + body.iter().map(|b| b.len()).sum::<usize>();
        let mut h = [0u8; OUT_HEADER];
        h[0..4].copy_from_slice(&(len as u32).to_le_bytes());
        h[4..8].copy_from_slice(&error.to_le_bytes());
        h[8..16].copy_from_slice(&self.unique.to_le_bytes());
        let mut iov = Vec::with_capacity(body.len() + 1);
        iov.push(std::io::IoSlice::new(&h));
        iov.extend(body.iter().filter(|b| !b.is_empty()).map(|b| std::io::IoSlice::new(b)));
        rustix::io::writev(&*self.device.0, &iov)?;
        Ok(())
    }
}

impl Drop for DeviceAnswer {
    fn drop(&mut self) {
        if !self.sent {
            tracing::warn!("FUSE request {} was not answered; answered EIO", self.unique);
            if let Err(e) = self.write(-5, &[]) {
                RawReply::lost(e);
            }
        }
    }
}

impl RawReply {
    /// An answer into a queue's entry.
    pub(crate) fn ring(answer: Answer) -> RawReply {
        RawReply::Ring(answer)
    }

    fn lost(e: std::io::Error) {
        tracing::warn!("a FUSE answer was lost: {e}");
    }

    pub(crate) fn error(self, errno: i32) {
        let r = match self {
            RawReply::Ring(a) => a.send(-errno, 0),
            RawReply::Device(d) => d.send(-errno, &[]),
        };
        if let Err(e) = r {
            Self::lost(e);
        }
    }

    pub(crate) fn ok(self, body: &[&[u8]]) {
        let r = match self {
            RawReply::Ring(mut a) => {
                let buf = a.buf();
                let len: usize = body.iter().map(|b| b.len()).sum();
                if len > buf.len() {
                    return RawReply::Ring(a).error(5);
                }
                let mut at = 0;
                for b in body {
                    buf[at..at + b.len()].copy_from_slice(b);
                    at += b.len();
                }
                a.send(0, len)
            }
            RawReply::Device(d) => d.send(0, body),
        };
        if let Err(e) = r {
            Self::lost(e);
        }
    }
}

pub(crate) type ReplyEntry = Out<fuser::ReplyEntry>;
pub(crate) type ReplyAttr = Out<fuser::ReplyAttr>;
pub(crate) type ReplyEmpty = Out<fuser::ReplyEmpty>;
pub(crate) type ReplyOpen = Out<fuser::ReplyOpen>;
pub(crate) type ReplyCreate = Out<fuser::ReplyCreate>;
pub(crate) type ReplyData = Out<fuser::ReplyData>;
pub(crate) type ReplyWrite = Out<fuser::ReplyWrite>;
pub(crate) type ReplyStatfs = Out<fuser::ReplyStatfs>;
pub(crate) type ReplyXattr = Out<fuser::ReplyXattr>;
pub(crate) type ReplyLseek = Out<fuser::ReplyLseek>;
pub(crate) type ReplyIoctl = Out<fuser::ReplyIoctl>;

/// `ReplyDirectory`: fuser's, or the listing built here (`size` bytes at
/// most).
pub(crate) enum ReplyDirectory {
    Dev(fuser::ReplyDirectory),
    Raw(RawReply, Vec<u8>, usize),
}

impl From<fuser::ReplyDirectory> for ReplyDirectory {
    fn from(r: fuser::ReplyDirectory) -> Self {
        ReplyDirectory::Dev(r)
    }
}

macro_rules! error {
    ($($t:ty),*) => {$(
        impl Out<$t> {
            pub(crate) fn error(self, errno: i32) {
                match self {
                    Out::Dev(r) => r.error(errno),
                    Out::Raw(r) => r.error(errno),
                }
            }
        }
    )*};
}
error!(
    fuser::ReplyEntry,
    fuser::ReplyAttr,
    fuser::ReplyEmpty,
    fuser::ReplyOpen,
    fuser::ReplyCreate,
    fuser::ReplyData,
    fuser::ReplyWrite,
    fuser::ReplyStatfs,
    fuser::ReplyXattr,
    fuser::ReplyLseek,
    fuser::ReplyIoctl
);

/// Little-endian bytes of a reply, field by field.
#[derive(Default)]
struct Bytes(Vec<u8>);

impl Bytes {
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    fn ttl(self, d: &Duration) -> (u64, u32) {
        let _ = self;
        (d.as_secs(), d.subsec_nanos())
    }
}

/// Seconds and nanoseconds since the epoch, before it negative (as fuser
/// sends them).
fn time(t: SystemTime) -> (u64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs(), d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            let (s, n) = (d.as_secs() as i64, d.subsec_nanos());
            if n == 0 {
                ((-s) as u64, 0)
            } else {
                ((-s - 1) as u64, 1_000_000_000 - n)
            }
        }
    }
}

/// The file type's bits of a mode (`S_IFMT`).
fn type_bits(k: FileType) -> u32 {
    match k {
        FileType::NamedPipe => 0o010000,
        FileType::CharDevice => 0o020000,
        FileType::Directory => 0o040000,
        FileType::BlockDevice => 0o060000,
        FileType::RegularFile => 0o100000,
        FileType::Symlink => 0o120000,
        FileType::Socket => 0o140000,
    }
}

/// `struct fuse_attr` (88 bytes).
fn attr(b: Bytes, a: &FileAttr) -> Bytes {
    let (at, an) = time(a.atime);
    let (mt, mn) = time(a.mtime);
    let (ct, cn) = time(a.ctime);
    b.u64(a.ino)
        .u64(a.size)
        .u64(a.blocks)
        .u64(at)
        .u64(mt)
        .u64(ct)
        .u32(an)
        .u32(mn)
        .u32(cn)
        .u32(type_bits(a.kind) | a.perm as u32)
        .u32(a.nlink)
        .u32(a.uid)
        .u32(a.gid)
        .u32(a.rdev)
        .u32(a.blksize)
        .u32(a.flags)
}

/// `struct fuse_entry_out` (128 bytes).
fn entry_out(ttl: &Duration, a: &FileAttr, generation: u64) -> Bytes {
    let (s, n) = Bytes::default().ttl(ttl);
    let b = Bytes::default().u64(a.ino).u64(generation).u64(s).u64(s).u32(n).u32(n);
    attr(b, a)
}

impl Out<fuser::ReplyEntry> {
    pub(crate) fn entry(self, ttl: &Duration, a: &FileAttr, generation: u64) {
        match self {
            Out::Dev(r) => r.entry(ttl, a, generation),
            Out::Raw(r) => r.ok(&[&entry_out(ttl, a, generation).0]),
        }
    }
}

impl Out<fuser::ReplyAttr> {
    pub(crate) fn attr(self, ttl: &Duration, a: &FileAttr) {
        match self {
            Out::Dev(r) => r.attr(ttl, a),
            Out::Raw(r) => {
                let (s, n) = Bytes::default().ttl(ttl);
                r.ok(&[&attr(Bytes::default().u64(s).u32(n).u32(0), a).0])
            }
        }
    }
}

impl Out<fuser::ReplyEmpty> {
    pub(crate) fn ok(self) {
        match self {
            Out::Dev(r) => r.ok(),
            Out::Raw(r) => r.ok(&[]),
        }
    }
}

impl Out<fuser::ReplyOpen> {
    pub(crate) fn opened(self, fh: u64, flags: u32) {
        match self {
            Out::Dev(r) => r.opened(fh, flags),
            Out::Raw(r) => r.ok(&[&Bytes::default().u64(fh).u32(flags).u32(0).0]),
        }
    }
}

impl Out<fuser::ReplyCreate> {
    pub(crate) fn created(self, ttl: &Duration, a: &FileAttr, generation: u64, fh: u64, flags: u32) {
        match self {
            Out::Dev(r) => r.created(ttl, a, generation, fh, flags),
            Out::Raw(r) => {
                let open = Bytes::default().u64(fh).u32(flags).u32(0);
                r.ok(&[&entry_out(ttl, a, generation).0, &open.0])
            }
        }
    }
}

impl Out<fuser::ReplyData> {
    pub(crate) fn data(self, data: &[u8]) {
        match self {
            Out::Dev(r) => r.data(data),
            Out::Raw(r) => r.ok(&[data]),
        }
    }
}

impl Out<fuser::ReplyWrite> {
    pub(crate) fn written(self, size: u32) {
        match self {
            Out::Dev(r) => r.written(size),
            Out::Raw(r) => r.ok(&[&Bytes::default().u32(size).u32(0).0]),
        }
    }
}

impl Out<fuser::ReplyStatfs> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn statfs(
        self,
        blocks: u64,
        bfree: u64,
        bavail: u64,
        files: u64,
        ffree: u64,
        bsize: u32,
        namelen: u32,
        frsize: u32,
    ) {
        match self {
            Out::Dev(r) => r.statfs(blocks, bfree, bavail, files, ffree, bsize, namelen, frsize),
            Out::Raw(r) => {
                let mut b = Bytes::default()
                    .u64(blocks)
                    .u64(bfree)
                    .u64(bavail)
                    .u64(files)
                    .u64(ffree);
                b = b.u32(bsize).u32(namelen).u32(frsize).u32(0);
                b.0.resize(80, 0);
                r.ok(&[&b.0])
            }
        }
    }
}

impl Out<fuser::ReplyXattr> {
    /// The size an attribute's value (or the list of names) needs.
    pub(crate) fn size(self, size: u32) {
        match self {
            Out::Dev(r) => r.size(size),
            Out::Raw(r) => r.ok(&[&Bytes::default().u32(size).u32(0).0]),
        }
    }

    pub(crate) fn data(self, data: &[u8]) {
        match self {
            Out::Dev(r) => r.data(data),
            Out::Raw(r) => r.ok(&[data]),
        }
    }
}

impl Out<fuser::ReplyLseek> {
    pub(crate) fn offset(self, offset: i64) {
        match self {
            Out::Dev(r) => r.offset(offset),
            Out::Raw(r) => r.ok(&[&Bytes::default().u64(offset as u64).0]),
        }
    }
}

/// Appends a `fuse_dirent` (ino, offset, name length, type, the name
/// padded to 8 bytes) to `buf` unless it would pass `max` bytes; true if
/// it did not fit.
fn dirent(buf: &mut Vec<u8>, max: usize, ino: u64, offset: i64, kind: FileType, name: &[u8]) -> bool {
    let len = (24 + name.len()).next_multiple_of(8);
    if buf.len() + len > max {
        return true;
    }
    buf.extend_from_slice(&ino.to_le_bytes());
    buf.extend_from_slice(&(offset as u64).to_le_bytes());
    buf.extend_from_slice(&(name.len() as u32).to_le_bytes());
    buf.extend_from_slice(&(type_bits(kind) >> 12).to_le_bytes());
    buf.extend_from_slice(name);
    buf.resize(buf.len().next_multiple_of(8), 0);
    false
}

impl ReplyDirectory {
    /// Adds an entry; true if it did not fit (the listing is full).
    pub(crate) fn add<T: AsRef<std::ffi::OsStr>>(&mut self, ino: u64, offset: i64, kind: FileType, name: T) -> bool {
        match self {
            ReplyDirectory::Dev(r) => r.add(ino, offset, kind, name),
            ReplyDirectory::Raw(_, buf, max) => {
                use std::os::unix::ffi::OsStrExt;
                dirent(buf, *max, ino, offset, kind, name.as_ref().as_bytes())
            }
        }
    }

    pub(crate) fn ok(self) {
        match self {
            ReplyDirectory::Dev(r) => r.ok(),
            ReplyDirectory::Raw(r, buf, _) => r.ok(&[&buf]),
        }
    }

    pub(crate) fn error(self, errno: i32) {
        match self {
            ReplyDirectory::Dev(r) => r.error(errno),
            ReplyDirectory::Raw(r, _, _) => r.error(errno),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> FileAttr {
        FileAttr {
            ino: 7,
            size: 4096,
            blocks: 8,
            atime: UNIX_EPOCH + Duration::new(100, 5),
            mtime: UNIX_EPOCH + Duration::new(200, 6),
            ctime: UNIX_EPOCH + Duration::new(300, 7),
            crtime: UNIX_EPOCH,
            kind: FileType::RegularFile,
            perm: 0o644,
            nlink: 1,
            uid: 1000,
            gid: 100,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    fn u64_at(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
    }

    /// `fuse_entry_out` is 128 bytes: node, generation, the two validities
    /// (seconds, then nanoseconds), then `fuse_attr` with its times and mode.
    /// The two ends of a socket pair: the first stands for a /dev/fuse
    /// descriptor answers are written to, the second reads what it got.
    fn device() -> (Device, std::os::unix::net::UnixStream) {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        (
            Device(std::sync::Arc::new(std::fs::File::from(std::os::fd::OwnedFd::from(a)))),
            b,
        )
    }

    fn received(b: &mut std::os::unix::net::UnixStream, len: usize) -> Vec<u8> {
        use std::io::Read;
        let mut v = vec![0u8; len];
        b.read_exact(&mut v).unwrap();
        v
    }

    /// An answer on a cloned descriptor is one write: the reply header
    /// (length, error, the request's id), then the body; one dropped
    /// unanswered says EIO, as fuser's do, so the program does not wait
    /// for ever.
    #[test]
    fn an_answer_on_a_device_names_its_request_and_says_eio_if_dropped() {
        let (d, mut b) = device();
        let data: Out<fuser::ReplyData> = Out::Raw(RawReply::Device(DeviceAnswer::new(d.clone(), 42)));
        data.data(b"hello");
        let got = received(&mut b, 21);
        assert_eq!((u32_at(&got, 0), u32_at(&got, 4), u64_at(&got, 8)), (21, 0, 42));
        assert_eq!(&got[16..], b"hello");
        let empty: Out<fuser::ReplyEmpty> = Out::Raw(RawReply::Device(DeviceAnswer::new(d.clone(), 43)));
        empty.error(2);
        let got = received(&mut b, 16);
        assert_eq!((u32_at(&got, 0), u32_at(&got, 4) as i32, u64_at(&got, 8)), (16, -2, 43));
        drop(DeviceAnswer::new(d, 44));
        let got = received(&mut b, 16);
        assert_eq!((u32_at(&got, 0), u32_at(&got, 4) as i32, u64_at(&got, 8)), (16, -5, 44));
    }

    #[test]
    fn an_entry_is_laid_out_as_the_kernel_reads_it() {
        let b = entry_out(&Duration::new(3, 500), &file(), 9).0;
        assert_eq!(b.len(), 128);
        assert_eq!(
            (u64_at(&b, 0), u64_at(&b, 8), u64_at(&b, 16), u64_at(&b, 24)),
            (7, 9, 3, 3)
        );
        assert_eq!((u32_at(&b, 32), u32_at(&b, 36)), (500, 500));
        let a = &b[40..];
        assert_eq!((u64_at(a, 0), u64_at(a, 8), u64_at(a, 16)), (7, 4096, 8));
        assert_eq!((u64_at(a, 24), u64_at(a, 32), u64_at(a, 40)), (100, 200, 300));
        assert_eq!((u32_at(a, 48), u32_at(a, 52), u32_at(a, 56)), (5, 6, 7));
        assert_eq!(u32_at(a, 60), 0o100644);
        assert_eq!((u32_at(a, 64), u32_at(a, 68), u32_at(a, 72)), (1, 1000, 100));
        assert_eq!(u32_at(a, 80), 4096);
    }

    #[test]
    fn a_time_before_the_epoch_counts_back_in_whole_seconds() {
        assert_eq!(time(UNIX_EPOCH - Duration::new(2, 0)), ((-2i64) as u64, 0));
        assert_eq!(
            time(UNIX_EPOCH - Duration::new(1, 250_000_000)),
            ((-2i64) as u64, 750_000_000)
        );
    }

    /// `fuse_dirent`s: ino, offset, name length, type, the name padded to
    /// 8 bytes; one that would pass the size asked for is refused.
    #[test]
    fn directory_entries_are_packed_to_eight_bytes_within_the_size() {
        let mut buf = Vec::new();
        assert!(!dirent(&mut buf, 64, 5, 1, FileType::Directory, b"a"));
        assert!(dirent(
            &mut buf,
            64,
            6,
            2,
            FileType::RegularFile,
            b"a-name-longer-than-the-rest"
        ));
        assert!(!dirent(&mut buf, 64, 6, 2, FileType::RegularFile, b"b"));
        assert_eq!(buf.len(), 64);
        assert_eq!(
            (u64_at(&buf, 0), u64_at(&buf, 8), u32_at(&buf, 16), u32_at(&buf, 20)),
            (5, 1, 1, 4)
        );
        assert_eq!(buf[24], b'a');
        assert_eq!((u64_at(&buf, 32), u32_at(&buf, 32 + 20)), (6, 8));
    }
}
