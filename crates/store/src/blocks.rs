//! The block store: a data server's stripes of each file, one local file per
//! handle under `objects/`. File names are the handle in hexadecimal, so no
//! request from the network can name a path outside the data directory.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

pub struct BlockStore {
    dir: PathBuf,
    /// Parts opened lately, so a part's next write, read or sync needs no
    /// `open` (which, with its `close`, cost a data server more than the
    /// page-cache write of a 64 KiB block did).
    open: Mutex<HashMap<u64, Arc<Part>>>,
    /// Whether reads go around the page cache (`O_DIRECT`): false once the
    /// file system refused it, or when the store was opened buffered.
    direct: AtomicBool,
    /// Whether aligned streamed writes go around the page cache: false
    /// once the file system refused one.
    direct_writes: AtomicBool,
    /// Aligned buffers for direct writes, kept for the next (their memory
    /// touched once: on this machine a page's first touch cost 30 µs).
    spare: Mutex<Vec<Vec<u8>>>,
    /// Bytes written around the page cache so far.
    written_direct: AtomicU64,
}

/// One open part: its file, and the same file opened for direct reads and
/// writes (on the first aligned one).
struct Part {
    file: File,
    direct: OnceLock<Option<File>>,
    /// What [`BlockStore::write_streamed`] wrote: the bytes whose writing
    /// to the disk it has not started (a range covering them; empty when
    /// none), and the range it started last.
    streamed: Mutex<(std::ops::Range<u64>, std::ops::Range<u64>)>,
    /// Held by a streamed write ([`BlockStore::write_streamed_then`]). Linux
    /// holds the file's lock for the whole of a direct write that extends
    /// it, and the writers waiting for it spun: 8 % of all CPU samples
    /// during a `parcache cp` of 1 GiB. Here they sleep instead: a futex
    /// mutex (std's), as parking_lot's yields the CPU up to seven times
    /// before it sleeps, and those `sched_yield` calls were 7 % of a data
    /// server's samples during that copy.
    writing: std::sync::Mutex<()>,
}

/// Bytes of a part written by [`BlockStore::write_streamed`] after which
/// their writing to the disk starts.
pub const WRITEBACK_START: u64 = 4 << 20;

/// Direct reads' alignment of offset, length and buffer (the page size,
/// which covers every logical block size Linux file systems use). A buffer
/// given to [`BlockStore::read_in`] with this much room beyond the length
/// read needs no growing to align the read.
pub const DIRECT_ALIGN: usize = 4096;
const ALIGN: usize = DIRECT_ALIGN;

/// Most parts a store keeps open; past it, it closes them all.
const OPEN_MAX: usize = 128;

/// A direct write's bytes are copied to an aligned buffer this large at
/// most, and written from it, a piece at a time.
const DIRECT_PIECE: usize = 1 << 20;

/// Aligned buffers a store keeps for direct writes, at most.
const SPARE_MAX: usize = 4;

impl BlockStore {
    /// Opens (creating if needed) the store under `data_dir/objects`.
    pub fn open(data_dir: &Path) -> io::Result<BlockStore> {
        let dir = data_dir.join("objects");
        std::fs::create_dir_all(&dir)?;
        Ok(BlockStore {
            dir,
            open: Mutex::new(HashMap::new()),
            direct: AtomicBool::new(true),
            direct_writes: AtomicBool::new(true),
            spare: Mutex::new(Vec::new()),
            written_direct: AtomicU64::new(0),
        })
    }

    /// Makes reads go through the page cache (or around it, `direct`).
    pub fn set_direct_reads(&self, direct: bool) {
        self.direct.store(direct, Ordering::Relaxed);
    }

    fn path(&self, handle: u64) -> PathBuf {
        self.dir.join(format!("{handle:016x}"))
    }

    /// The part's open file, from the open parts or opened (and kept) now;
    /// `None` if it has none and `create` is false. Opened under the lock,
    /// so a removal (which holds it too) never leaves a removed part open.
    fn file(&self, handle: u64, create: bool) -> io::Result<Option<Arc<Part>>> {
        let mut open = self.open.lock();
        if let Some(f) = open.get(&handle) {
            return Ok(Some(f.clone()));
        }
        let Some(f) = self.open_file(handle, create)? else {
            return Ok(None);
        };
        if open.len() >= OPEN_MAX {
            open.clear();
        }
        let f = Arc::new(Part {
            file: f,
            direct: OnceLock::new(),
            streamed: Mutex::new((0..0, 0..0)),
            writing: std::sync::Mutex::new(()),
        });
        open.insert(handle, f.clone());
        Ok(Some(f))
    }

    fn open_file(&self, handle: u64, create: bool) -> io::Result<Option<File>> {
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(self.path(handle))
        {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == io::ErrorKind::NotFound && !create => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes `data` at `offset` of the handle's part (not yet durable).
    pub fn write(&self, handle: u64, offset: u64, data: &[u8]) -> io::Result<()> {
        self.file(handle, true)?
            .expect("created")
            .file
            .write_all_at(data, offset)
    }

    /// Writes as [`BlockStore::write`] does, for a stream of whole blocks
    /// (a data server's direct writes): once a part holds
    /// [`WRITEBACK_START`] bytes written this way since the last start,
    /// their writing to the disk starts, without waiting for it, and the
    /// pages of the range started before (on the disk by then) leave the
    /// page cache. The disk then works while the bytes still arriving are
    /// copied, the sync that follows a stream finds little left to write,
    /// and the page cache does not grow by every byte streamed (a
    /// growing page cache had slowed each later file: issue 14, the
    /// twenty-fourth session in `bench/README.md`).
    ///
    /// Not when the store reads through the page cache
    /// ([`BlockStore::set_direct_reads`]), which then keeps its pages.
    /// Both are `POSIX_FADV_DONTNEED`: Linux starts the writeback of the
    /// range's dirty pages and drops its clean ones, which the store never
    /// reads again through the page cache (its reads are direct and the
    /// server's own cache keeps blocks). Durability is unchanged: only a
    /// sync makes bytes durable; the disk may take them earlier, as the
    /// kernel's own writeback may.
    ///
    /// Aligned writes go around the page cache (`O_DIRECT`), from an
    /// aligned copy in a buffer kept for the next: on this machine a page
    /// cache page's first touch faults on the host, and buffered writes
    /// with `fsync` ran at 150–633 MB/s against 1.8–3.0 GB/s direct
    /// (issue 14, the fifty-first session in `bench/README.md`). A part
    /// written both ways stays coherent: Linux writes back and drops the
    /// pages of the range a direct write covers.
    pub fn write_streamed(&self, handle: u64, offset: u64, data: &[u8]) -> io::Result<()> {
        self.write_streamed_then(handle, offset, &mut vec![data], |_| ())
    }

    /// As [`BlockStore::write_streamed`], for bytes in several pieces
    /// (`items`) written one after another from `offset` on (blocks that
    /// landed in buffers of their own): around the page cache with one
    /// vectored write where each piece lies on a boundary and is a
    /// multiple of it long, so none is copied into an aligned buffer
    /// first. Once they are written, `then` is given them while the
    /// part's next streamed write waits: what it updates (a data server's
    /// cache) sees the part's writes in the order the part got them.
    pub fn write_streamed_then<T: AsRef<[u8]>, R>(
        &self,
        handle: u64,
        offset: u64,
        items: &mut Vec<T>,
        then: impl FnOnce(&mut Vec<T>) -> R,
    ) -> io::Result<R> {
        let part = self.file(handle, true)?.expect("created");
        let _turn = part.writing.lock().unwrap_or_else(|e| e.into_inner());
        let pieces: Vec<&[u8]> = items.iter().map(AsRef::as_ref).collect();
        self.write_streamed_pieces(handle, &part, offset, &pieces)?;
        drop(pieces);
        Ok(then(items))
    }

    /// The write of [`BlockStore::write_streamed_then`], the part's turn held.
    fn write_streamed_pieces(&self, handle: u64, part: &Part, offset: u64, pieces: &[&[u8]]) -> io::Result<()> {
        if !self.direct.load(Ordering::Relaxed) {
            // Reads go through the page cache (`--page-cache-reads`, or a
            // file system without direct I/O): keep its pages.
            return write_all_pieces(&part.file, pieces, offset);
        }
        let len: usize = pieces.iter().map(|p| p.len()).sum();
        let aligned = offset.is_multiple_of(ALIGN as u64) && pieces.iter().all(|p| p.len().is_multiple_of(ALIGN));
        if aligned && self.direct_writes.load(Ordering::Relaxed) {
            if let Some(f) = self.direct_file(handle, part) {
                let written = self.write_direct(f, offset, pieces);
                match written {
                    Ok(()) => return Ok(()),
                    // The file system takes the open but not the write:
                    // nothing was written that a buffered write would not
                    // write again.
                    Err(e) if e == rustix::io::Errno::INVAL => self.refused(&self.direct_writes, "writes", e),
                    Err(e) => return Err(e.into()),
                }
            }
        }
        write_all_pieces(&part.file, pieces, offset)?;
        let start = {
            let (unstarted, started) = &mut *part.streamed.lock();
            let end = offset + len as u64;
            *unstarted = if unstarted.is_empty() {
                offset..end
            } else {
                unstarted.start.min(offset)..unstarted.end.max(end)
            };
            if unstarted.end - unstarted.start >= WRITEBACK_START {
                let now = std::mem::replace(unstarted, 0..0);
                Some((std::mem::replace(started, now.clone()), now))
            } else {
                None
            }
        };
        if let Some((before, r)) = start {
            // The range started before is likely on the disk by now:
            // its pages, clean, go. Advice only: a file system that takes
            // none (tmpfs) loses nothing by it.
            for r in [before, r] {
                if let Some(len) = std::num::NonZeroU64::new(r.end.saturating_sub(r.start)) {
                    let _ = rustix::fs::fadvise(&part.file, r.start, Some(len), rustix::fs::Advice::DontNeed);
                }
            }
        }
        Ok(())
    }

    /// Reads up to `len` bytes at `offset`; short at the end, empty if absent.
    /// Holes read as zeros. An aligned read goes around the page cache
    /// (`O_DIRECT`): the device writes into the answer's buffer, where a
    /// buffered read would copy every byte out of the page cache, which
    /// cost a data server half its CPU on cold sequential reads (issue 14).
    /// The server's own cache is the one that keeps blocks in memory.
    pub fn read(&self, handle: u64, offset: u64, len: u64) -> io::Result<Bytes> {
        let (buf, at) = self.read_in(handle, offset, len, Vec::new())?;
        Ok(Bytes::from(buf).slice(at))
    }

    /// Reads as [`BlockStore::read`] does, into `buf` (one used before, say:
    /// its bytes may be stale, and it grows if it must), which it returns
    /// with where in it the answer lies.
    pub fn read_in(
        &self,
        handle: u64,
        offset: u64,
        len: u64,
        mut buf: Vec<u8>,
    ) -> io::Result<(Vec<u8>, std::ops::Range<usize>)> {
        let Some(part) = self.file(handle, false)? else {
            return Ok((buf, 0..0));
        };
        let aligned = offset.is_multiple_of(ALIGN as u64) && len.is_multiple_of(ALIGN as u64);
        if aligned && self.direct.load(Ordering::Relaxed) {
            if let Some(f) = self.direct_file(handle, &part) {
                match read_direct(f, offset, len as usize, &mut buf) {
                    Ok(at) => return Ok((buf, at)),
                    // The file system takes the open but not the read.
                    Err(e) if e == rustix::io::Errno::INVAL => self.refused(&self.direct, "reads", e),
                    Err(e) => return Err(e.into()),
                }
            }
        }
        // Into the buffer's spare capacity until the end of the part: no
        // zeroing of bytes about to be read, and no `stat` for the size.
        buf.clear();
        buf.reserve(len as usize);
        read_into(&part.file, offset, len as usize, &mut buf)?;
        let n = buf.len();
        Ok((buf, 0..n))
    }

    /// Reads as [`BlockStore::read_in`] does, from `offset` into `bufs` in
    /// turn (a cache's block buffers, [`DIRECT_ALIGN`]-aligned and a
    /// multiple of it long: the store reads straight into them, no copy,
    /// issue 14), with one read for all of them, around the page cache
    /// where it can. Returns how many bytes it read: short at the part's
    /// end (each buffer's bytes past it are stale), 0 if it is absent.
    pub fn read_pages(&self, handle: u64, offset: u64, bufs: &mut [&mut [u8]]) -> io::Result<usize> {
        let Some(part) = self.file(handle, false)? else {
            return Ok(0);
        };
        let aligned = offset.is_multiple_of(ALIGN as u64)
            && bufs
                .iter()
                .all(|b| b.len().is_multiple_of(ALIGN) && b.as_ptr().align_offset(ALIGN) == 0);
        if aligned && self.direct.load(Ordering::Relaxed) {
            if let Some(f) = self.direct_file(handle, &part) {
                match read_vectored(f, offset, bufs, true) {
                    Ok(n) => return Ok(n),
                    // The file system takes the open but not the read.
                    Err(e) if e == rustix::io::Errno::INVAL => self.refused(&self.direct, "reads", e),
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(read_vectored(&part.file, offset, bufs, false)?)
    }

    /// The file system took a part's `O_DIRECT` open but refused `what`
    /// ("reads" or "writes") through it: those go through the page cache
    /// from now on (`flag` says which).
    fn refused(&self, flag: &AtomicBool, what: &str, e: rustix::io::Errno) {
        tracing::info!(
            "{}: direct {what} refused ({e}); {what} go through the page cache",
            self.dir.display()
        );
        flag.store(false, Ordering::Relaxed);
    }

    /// Writes `pieces` (each a multiple of [`ALIGN`] long, as `at`) one
    /// after another to `f`, opened `O_DIRECT`: from where they are if each
    /// lies on a boundary (a request's payload as the frame reader places
    /// it, or blocks that landed), otherwise from an aligned copy, a
    /// [`DIRECT_PIECE`] at a time.
    fn write_direct(&self, f: &File, at: u64, pieces: &[&[u8]]) -> Result<(), rustix::io::Errno> {
        if pieces.iter().all(|p| p.as_ptr().align_offset(ALIGN) == 0) {
            write_direct_at(f, pieces, at)?;
            let len: usize = pieces.iter().map(|p| p.len()).sum();
            self.written_direct.fetch_add(len as u64, Ordering::Relaxed);
            return Ok(());
        }
        let buf = self.spare.lock().pop();
        let mut buf = buf.unwrap_or_else(|| vec![0u8; DIRECT_PIECE + ALIGN]);
        let pad = buf.as_ptr().align_offset(ALIGN);
        let mut to = at;
        let r = pieces
            .iter()
            .flat_map(|p| p.chunks(DIRECT_PIECE))
            .try_for_each(|piece| {
                let out = &mut buf[pad..pad + piece.len()];
                out.copy_from_slice(piece);
                write_direct_at(f, &[&*out], to)?;
                to += piece.len() as u64;
                self.written_direct.fetch_add(piece.len() as u64, Ordering::Relaxed);
                Ok(())
            });
        let mut spare = self.spare.lock();
        if spare.len() < SPARE_MAX {
            spare.push(buf);
        }
        r
    }

    /// Takes the memory of the buffers direct writes copy into now (every
    /// page touched), so the first writes cost no page fault: a data
    /// server that takes its cache's memory at start takes these too.
    pub fn take_write_memory(&self) {
        let mut spare = self.spare.lock();
        while spare.len() < SPARE_MAX {
            let mut buf = vec![0u8; DIRECT_PIECE + ALIGN];
            // A new buffer's zeros are the kernel's untouched pages.
            buf.fill(1);
            spare.push(buf);
        }
    }

    /// Bytes written around the page cache since the store was opened.
    pub fn written_direct(&self) -> u64 {
        self.written_direct.load(Ordering::Relaxed)
    }

    /// The part opened for direct reads and writes; `None` if the file
    /// system refuses `O_DIRECT` (then the store reads and writes through
    /// the page cache from now on).
    fn direct_file<'a>(&self, handle: u64, part: &'a Part) -> Option<&'a File> {
        part.direct
            .get_or_init(|| {
                let opened = rustix::fs::open(
                    self.path(handle),
                    rustix::fs::OFlags::RDWR | rustix::fs::OFlags::DIRECT | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                );
                match opened {
                    Ok(fd) => Some(File::from(fd)),
                    Err(e) => {
                        if e == rustix::io::Errno::INVAL {
                            tracing::info!(
                                "{}: O_DIRECT refused; reading through the page cache",
                                self.dir.display()
                            );
                            self.direct.store(false, Ordering::Relaxed);
                        }
                        None
                    }
                }
            })
            .as_ref()
    }

    /// The part's file (its absolute path, device and inode), for a
    /// program on this machine that reads it itself; `None` if the part
    /// has no file.
    pub fn part_file(&self, handle: u64) -> io::Result<Option<(PathBuf, u64, u64)>> {
        use std::os::unix::fs::MetadataExt;
        let path = match std::fs::canonicalize(self.path(handle)) {
            Ok(p) => p,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        match std::fs::metadata(&path) {
            Ok(m) => Ok(Some((path, m.dev(), m.ino()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Size of the handle's part (0 if absent).
    pub fn len(&self, handle: u64) -> io::Result<u64> {
        Ok(self.stored(handle)?.unwrap_or(0))
    }

    /// Size of the handle's part, `None` if it has none.
    pub fn stored(&self, handle: u64) -> io::Result<Option<u64>> {
        match std::fs::metadata(self.path(handle)) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn truncate(&self, handle: u64, len: u64) -> io::Result<()> {
        self.file(handle, true)?.expect("created").file.set_len(len)
    }

    /// Grows the handle's part to at least `len` bytes, never shrinking it,
    /// even with writes landing at the same time (fallocate of its last
    /// byte: the kernel extends the size atomically).
    pub fn extend(&self, handle: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let part = self.file(handle, true)?.expect("created");
        let f = &part.file;
        match rustix::fs::fallocate(f, rustix::fs::FallocateFlags::empty(), len - 1, 1) {
            Ok(()) => Ok(()),
            Err(rustix::io::Errno::OPNOTSUPP) if f.metadata()?.len() < len => f.set_len(len),
            Err(rustix::io::Errno::OPNOTSUPP) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    pub fn remove(&self, handle: u64) -> io::Result<()> {
        let mut open = self.open.lock();
        open.remove(&handle);
        match std::fs::remove_file(self.path(handle)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// The handles of parts last written at least `age` ago, in order,
    /// after `after`, at most `limit` of them: the candidates a collection
    /// asks the metadata server about (a younger part may belong to a
    /// file whose create is on its way).
    pub fn list_older_than(&self, age: std::time::Duration, after: Option<u64>, limit: usize) -> io::Result<Vec<u64>> {
        let mut all = Vec::new();
        for f in std::fs::read_dir(&self.dir)? {
            let name = f?.file_name();
            let handle = name
                .to_str()
                .filter(|n| n.len() == 16)
                .and_then(|n| u64::from_str_radix(n, 16).ok());
            if let Some(h) = handle.filter(|&h| after.is_none_or(|a| h > a)) {
                all.push(h);
            }
        }
        all.sort_unstable();
        let now = std::time::SystemTime::now();
        let mut out = Vec::new();
        for h in all {
            if out.len() == limit {
                break;
            }
            let Ok(m) = std::fs::metadata(self.path(h)) else {
                continue; // removed since the listing
            };
            if now.duration_since(m.modified()?).unwrap_or_default() >= age {
                out.push(h);
            }
        }
        Ok(out)
    }

    /// Makes the handle's part durable.
    pub fn sync(&self, handle: u64) -> io::Result<()> {
        if let Some(p) = self.file(handle, false)? {
            p.file.sync_all()?;
        }
        Ok(())
    }

    /// Makes the directory's entries (creations, removals) durable.
    pub fn sync_dir(&self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }
}

/// Reads up to `len` bytes at `at` of `f` into `buf`'s spare capacity
/// (after what it holds), stopping at the end of the file.
fn read_into(f: &File, at: u64, len: usize, buf: &mut Vec<u8>) -> io::Result<()> {
    let start = buf.len();
    while buf.len() - start < len {
        let pos = at + (buf.len() - start) as u64;
        match rustix::io::pread(f, rustix::buffer::spare_capacity(buf), pos) {
            Ok(0) => break,
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    // The spare capacity may hold more than `len`.
    buf.truncate(start + len);
    Ok(())
}

/// Fills `bufs` in turn from `at` of `f` with `preadv` (one system call,
/// and for a direct read one request to the disk, however many buffers),
/// until they are full or the file ends; returns the bytes read. A
/// `direct` read that ends unaligned has reached the end of the file.
fn read_vectored(f: &File, at: u64, bufs: &mut [&mut [u8]], direct: bool) -> Result<usize, rustix::io::Errno> {
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    let mut got = 0;
    while got < total {
        let mut skip = got;
        let mut iov = Vec::with_capacity(bufs.len());
        for b in bufs.iter_mut() {
            if skip >= b.len() {
                skip -= b.len();
                continue;
            }
            iov.push(std::io::IoSliceMut::new(&mut b[skip..]));
            skip = 0;
        }
        match rustix::io::preadv(f, &mut iov, at + got as u64) {
            Ok(0) => break,
            Ok(n) => {
                got += n;
                if direct && !n.is_multiple_of(ALIGN) {
                    break;
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Writes all of `pieces` (each aligned, as `at`), one after another, at
/// `at` of `f`, opened `O_DIRECT`, with one vectored write where the
/// kernel takes it all. A write ends short only where the disk filled: it
/// goes on from an aligned end (the next write says why it stopped), and
/// an unaligned one, which could not go on directly, is the disk being
/// full.
fn write_direct_at(f: &File, pieces: &[&[u8]], at: u64) -> Result<(), rustix::io::Errno> {
    let total: usize = pieces.iter().map(|p| p.len()).sum();
    let mut done = 0;
    while done < total {
        let iov = io_slices(pieces, done);
        match rustix::io::pwritev(f, &iov, at + done as u64) {
            Ok(n) if n > 0 && (n == total - done || n.is_multiple_of(ALIGN)) => done += n,
            Ok(_) => return Err(rustix::io::Errno::NOSPC),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The pieces' bytes from the `skip`th on, as a vectored write takes them.
fn io_slices<'a>(pieces: &[&'a [u8]], mut skip: usize) -> Vec<std::io::IoSlice<'a>> {
    let mut iov = Vec::with_capacity(pieces.len());
    for p in pieces {
        if skip >= p.len() {
            skip -= p.len();
            continue;
        }
        iov.push(std::io::IoSlice::new(&p[skip..]));
        skip = 0;
    }
    iov
}

/// Writes the pieces one after another from `at` on, through the page
/// cache.
fn write_all_pieces(f: &File, pieces: &[&[u8]], at: u64) -> io::Result<()> {
    let mut to = at;
    for p in pieces {
        f.write_all_at(p, to)?;
        to += p.len() as u64;
    }
    Ok(())
}

/// Reads up to `len` bytes (a multiple of [`ALIGN`]) at `at` (aligned) of
/// `f`, opened `O_DIRECT`, into an aligned stretch of `buf`, which grows to
/// hold it (a new buffer is zeroed first: cheap beside the page-cache copy
/// this saves, and it needs no unsafe code); where the bytes read lie.
fn read_direct(f: &File, at: u64, len: usize, buf: &mut Vec<u8>) -> Result<std::ops::Range<usize>, rustix::io::Errno> {
    buf.reserve((len + ALIGN).saturating_sub(buf.len()));
    let pad = buf.as_ptr().align_offset(ALIGN);
    buf.resize(pad + len, 0);
    let mut got = 0;
    while got < len {
        match rustix::io::pread(f, &mut buf[pad + got..pad + len], at + got as u64) {
            Ok(0) => break,
            Ok(n) => {
                got += n;
                // A direct read ends short only at the end of the file (an
                // unaligned tail, which a next read would be refused).
                if !n.is_multiple_of(ALIGN) {
                    break;
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(pad..pad + got)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_reads_truncates_and_removes() {
        let d = std::env::temp_dir().join(format!("parcache-blocks-{}", std::process::id()));
        let s = BlockStore::open(&d).unwrap();
        assert_eq!(&s.read(5, 0, 10).unwrap()[..], b"");
        s.write(5, 4, b"abcd").unwrap();
        assert_eq!(&s.read(5, 0, 100).unwrap()[..], b"\0\0\0\0abcd");
        assert_eq!(&s.read(5, 6, 1).unwrap()[..], b"c");
        s.truncate(5, 5).unwrap();
        assert_eq!(s.len(5).unwrap(), 5);
        s.extend(5, 3).unwrap();
        assert_eq!(s.len(5).unwrap(), 5, "extend never shrinks");
        s.extend(5, 9000).unwrap();
        assert_eq!(s.len(5).unwrap(), 9000);
        assert_eq!(&s.read(5, 0, 6).unwrap()[..], b"\0\0\0\0a\0");
        s.sync(5).unwrap();
        s.remove(5).unwrap();
        s.remove(5).unwrap();
        assert_eq!(s.len(5).unwrap(), 0);
        // A part written again after its removal is a new file, not the
        // removed one still open.
        s.write(5, 0, b"new").unwrap();
        assert_eq!(std::fs::read(s.path(5)).unwrap(), b"new");
        s.remove(5).unwrap();
        // Past the most parts kept open, all still work.
        for h in 0..OPEN_MAX as u64 + 10 {
            s.write(100 + h, 0, &h.to_le_bytes()).unwrap();
        }
        for h in 0..OPEN_MAX as u64 + 10 {
            assert_eq!(&s.read(100 + h, 0, 8).unwrap()[..], h.to_le_bytes());
            s.remove(100 + h).unwrap();
        }
        // Listing for collection: parts in handle order, after a given
        // one, old enough, a page at a time; other names are no parts.
        for h in [7, 3, 0x1_0000_0000] {
            s.write(h, 0, b"x").unwrap();
        }
        std::fs::write(d.join("objects").join("notes"), b"").unwrap();
        let all = std::time::Duration::ZERO;
        assert_eq!(s.list_older_than(all, None, 10).unwrap(), [3, 7, 0x1_0000_0000]);
        assert_eq!(s.list_older_than(all, Some(3), 1).unwrap(), [7]);
        assert_eq!(
            s.list_older_than(all, Some(0x1_0000_0000), 10).unwrap(),
            Vec::<u64>::new()
        );
        let hour = std::time::Duration::from_secs(3600);
        assert_eq!(
            s.list_older_than(hour, None, 10).unwrap(),
            Vec::<u64>::new(),
            "all just written"
        );
        for h in [7, 3, 0x1_0000_0000] {
            s.remove(h).unwrap();
        }
        // Streamed writes past the start of their writing to the disk
        // (and the dropping of the range before) read back whole.
        let piece: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 253) as u8).collect();
        let n = 3 * WRITEBACK_START / piece.len() as u64 + 1;
        for k in (0..n).rev() {
            s.write_streamed(9, k * piece.len() as u64, &piece).unwrap();
        }
        for k in 0..n {
            assert_eq!(
                &s.read(9, k * piece.len() as u64, piece.len() as u64).unwrap()[..],
                &piece[..],
                "piece {k}"
            );
        }
        s.remove(9).unwrap();
        // Every handle, even the extremes, stays inside objects/.
        assert!(s.path(u64::MAX).starts_with(d.join("objects")));
        assert_eq!(s.path(u64::MAX).file_name().unwrap(), "ffffffffffffffff");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A scratch directory named for `tag`, with two stores in it: one
    /// that goes around the page cache where it may, and one that never
    /// does.
    fn direct_and_buffered(tag: &str) -> (PathBuf, [BlockStore; 2]) {
        let d = std::env::temp_dir().join(format!("parcache-blocks-{tag}-{}", std::process::id()));
        let stores = [
            BlockStore::open(&d.join("direct")).unwrap(),
            BlockStore::open(&d.join("buffered")).unwrap(),
        ];
        stores[1].set_direct_reads(false);
        (d, stores)
    }

    /// Aligned streamed writes go around the page cache (where the file
    /// system allows) and read back as buffered ones do, mixed with
    /// buffered writes over the same bytes, unaligned streamed writes and
    /// a truncate; a store reading through the page cache writes through
    /// it too.
    #[test]
    fn direct_writes_read_back_as_buffered_writes() {
        let (d, stores) = direct_and_buffered("dwrite");
        let mut model = Vec::new();
        let mut put = |at: usize, bytes: &[u8]| {
            if model.len() < at + bytes.len() {
                model.resize(at + bytes.len(), 0);
            }
            model[at..at + bytes.len()].copy_from_slice(bytes);
        };
        let block: Vec<u8> = (0..65_536u32).map(|i| (i * 13 + i / 509) as u8).collect();
        let big: Vec<u8> = (0..(DIRECT_PIECE + 3 * 65_536) as u32).map(|i| (i / 7) as u8).collect();
        // A source already on a boundary, as the frame reader places a
        // request's payload: written from where it is.
        let mut on_boundary = vec![0u8; big.len() + ALIGN];
        let pad = on_boundary.as_ptr().align_offset(ALIGN);
        on_boundary[pad..pad + big.len()].copy_from_slice(&big);
        let placed = &on_boundary[pad..pad + big.len()];
        let mut aligned = 0;
        for s in &stores {
            // Past the end first (a hole before it), then a run of more
            // than one piece, then a buffered write inside a direct block,
            // then a direct write over buffered bytes.
            s.write_streamed(2, 4 * 65_536, &block).unwrap();
            s.write_streamed(2, 0, &big[..4 * 65_536]).unwrap();
            s.write_streamed(2, 8 * 65_536, &big).unwrap();
            s.write(2, 70_000, b"buffered bytes").unwrap();
            s.write(2, 5 * 65_536 + 100, &block[..5000]).unwrap();
            s.write_streamed(2, 5 * 65_536, &block).unwrap();
            s.write_streamed(2, 100, &block[..1000]).unwrap();
            s.write_streamed(2, 30 * 65_536, placed).unwrap();
        }
        for (at, bytes) in [
            (4 * 65_536, &block[..]),
            (0, &big[..4 * 65_536]),
            (8 * 65_536, &big[..]),
            (70_000, &b"buffered bytes"[..]),
            (5 * 65_536 + 100, &block[..5000]),
            (5 * 65_536, &block[..]),
            (100, &block[..1000]),
            (30 * 65_536, placed),
        ] {
            put(at, bytes);
            if at % ALIGN == 0 && bytes.len() % ALIGN == 0 {
                aligned += bytes.len() as u64;
            }
        }
        // In pieces: blocks of their own (each on a boundary: one vectored
        // write from where they are), pieces off a boundary (copied), and
        // pieces of unaligned lengths (through the page cache).
        let landed = [
            parcache_mem::Block::from_slice(&block),
            parcache_mem::Block::from_slice(&big[..65_536]),
            parcache_mem::Block::from_slice(&big[65_536..3 * 65_536]),
        ];
        let landed: Vec<&[u8]> = landed.iter().map(|b| &b[..]).collect();
        let off = &on_boundary[pad + 1..pad + 1 + 2 * 65_536];
        let off: [&[u8]; 2] = [&off[..65_536], &off[65_536..]];
        let odd: [&[u8]; 3] = [&block[..1000], &big[..3000], &block[7..8]];
        for s in &stores {
            for (at, pieces) in [
                (40 * 65_536, &landed[..]),
                (50 * 65_536, &off[..]),
                (60 * 65_536 + 7, &odd[..]),
            ] {
                // `then` gets the pieces back once they are written.
                let end = at + pieces.iter().map(|p| p.len() as u64).sum::<u64>();
                let n = s
                    .write_streamed_then(2, at, &mut pieces.to_vec(), |items| {
                        assert!(
                            s.read(2, 0, 1 << 30).unwrap().len() as u64 >= end,
                            "written before `then`"
                        );
                        items.len()
                    })
                    .unwrap();
                assert_eq!(n, pieces.len());
            }
        }
        for (at, pieces) in [
            (40 * 65_536, &landed[..]),
            (50 * 65_536, &off[..]),
            (60 * 65_536 + 7, &odd[..]),
        ] {
            let bytes = pieces.concat();
            put(at, &bytes);
            if at % ALIGN == 0 {
                aligned += bytes.len() as u64;
            }
        }
        for s in &stores {
            let got = s.read(2, 0, model.len() as u64 + 65_536).unwrap();
            assert!(got[..] == model[..], "{}", s.dir.display());
            s.truncate(2, 3 * 65_536 + 10).unwrap();
            s.write_streamed(2, 3 * 65_536, &block).unwrap();
            let got = s.read(2, 0, 1 << 30).unwrap();
            assert_eq!(got.len(), 4 * 65_536);
            assert!(got[3 * 65_536..] == block[..]);
            assert!(got[..3 * 65_536] == model[..3 * 65_536]);
        }
        if stores[0].direct_writes.load(Ordering::Relaxed) {
            assert_eq!(
                stores[0].written_direct(),
                aligned + 65_536,
                "went around the page cache"
            );
        }
        assert_eq!(stores[1].written_direct(), 0, "a store reading through the page cache");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Aligned reads (around the page cache where the file system allows)
    /// answer what buffered reads answer: bytes just written and not yet
    /// synced, holes as zeros, short at an unaligned end, empty past it,
    /// and a write after a read is seen by the next.
    #[test]
    fn direct_reads_answer_as_buffered_reads() {
        let (d, stores) = direct_and_buffered("direct");
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        for s in &stores {
            s.write(1, 0, &data[..70_000]).unwrap();
            s.write(1, 150_000, &data[150_000..]).unwrap();
        }
        let reads = [
            (0u64, 65_536u64),
            (65_536, 65_536),
            (131_072, 65_536),
            (196_608, 65_536),
            (262_144, 4096),
            (4096, 8192),
        ];
        let expect = |off: u64, len: u64| -> Vec<u8> {
            let mut whole = data.clone();
            whole[70_000..150_000].fill(0);
            let end = (off + len).min(whole.len() as u64);
            whole.get(off as usize..end as usize).unwrap_or(&[]).to_vec()
        };
        for s in &stores {
            for (off, len) in reads {
                assert_eq!(&s.read(1, off, len).unwrap()[..], &expect(off, len)[..], "{off}+{len}");
            }
            // Into blocks' own pages, several with one read: the same
            // bytes, the count short at the end; an absent part reads none.
            for (off, blocks) in [(0u64, 4usize), (131_072, 2), (196_608, 1), (262_144, 2), (4096, 1)] {
                let mut mem: Vec<parcache_mem::Block> = (0..blocks).map(|_| parcache_mem::Block::new()).collect();
                let mut bufs: Vec<&mut [u8]> = mem.iter_mut().map(|b| &mut b.pages_mut(65_536)[..65_536]).collect();
                let n = s.read_pages(1, off, &mut bufs).unwrap();
                let want = expect(off, blocks as u64 * 65_536);
                assert_eq!(n, want.len(), "{off}: {blocks} blocks");
                let got: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).take(n).collect();
                assert_eq!(got, want, "{off}: {blocks} blocks");
            }
            let mut b = parcache_mem::Block::new();
            assert_eq!(
                s.read_pages(99, 0, &mut [&mut b.pages_mut(65_536)[..65_536]]).unwrap(),
                0
            );
            // A rewrite after a read is what the next read sees.
            s.write(1, 65_536, b"rewritten").unwrap();
            let got = s.read(1, 65_536, 65_536).unwrap();
            assert_eq!(&got[..9], b"rewritten");
            assert_eq!(&got[9..], &expect(65_545, 65_527)[..]);
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
