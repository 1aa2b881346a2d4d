//! The block store: a data server's stripes of each file, one local file per
//! handle under `objects/`. File names are the handle in hexadecimal, so no
//! request from the network can name a path outside the data directory.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub struct BlockStore {
    dir: PathBuf,
    /// Parts opened lately, so a part's next write, read or sync needs no
    /// `open` (which, with its `close`, cost a data server more than the
    /// page-cache write of a 64 KiB block did).
    open: Mutex<HashMap<u64, Arc<File>>>,
}

/// Most parts a store keeps open; past it, it closes them all.
const OPEN_MAX: usize = 128;

impl BlockStore {
    /// Opens (creating if needed) the store under `data_dir/objects`.
    pub fn open(data_dir: &Path) -> io::Result<BlockStore> {
        let dir = data_dir.join("objects");
        std::fs::create_dir_all(&dir)?;
        Ok(BlockStore {
            dir,
            open: Mutex::new(HashMap::new()),
        })
    }

    fn path(&self, handle: u64) -> PathBuf {
        self.dir.join(format!("{handle:016x}"))
    }

    /// The part's open file, from the open parts or opened (and kept) now;
    /// `None` if it has none and `create` is false. Opened under the lock,
    /// so a removal (which holds it too) never leaves a removed part open.
    fn file(&self, handle: u64, create: bool) -> io::Result<Option<Arc<File>>> {
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
        let f = Arc::new(f);
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
        self.file(handle, true)?.expect("created").write_all_at(data, offset)
    }

    /// Reads up to `len` bytes at `offset`; short at the end, empty if absent.
    /// Holes read as zeros.
    pub fn read(&self, handle: u64, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        let Some(f) = self.file(handle, false)? else {
            return Ok(Vec::new());
        };
        // Into the buffer's spare capacity until the end of the part: no
        // zeroing of bytes about to be read, and no `stat` for the size.
        let mut buf = Vec::with_capacity(len as usize);
        while (buf.len() as u64) < len {
            let at = offset + buf.len() as u64;
            match rustix::io::pread(&*f, rustix::buffer::spare_capacity(&mut buf), at) {
                Ok(0) => break,
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(buf)
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
        self.file(handle, true)?.expect("created").set_len(len)
    }

    /// Grows the handle's part to at least `len` bytes, never shrinking it,
    /// even with writes landing at the same time (fallocate of its last
    /// byte: the kernel extends the size atomically).
    pub fn extend(&self, handle: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let f = self.file(handle, true)?.expect("created");
        match rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), len - 1, 1) {
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

    /// Makes the handle's part durable.
    pub fn sync(&self, handle: u64) -> io::Result<()> {
        if let Some(f) = self.file(handle, false)? {
            f.sync_all()?;
        }
        Ok(())
    }

    /// Makes the directory's entries (creations, removals) durable.
    pub fn sync_dir(&self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_reads_truncates_and_removes() {
        let d = std::env::temp_dir().join(format!("parcache-blocks-{}", std::process::id()));
        let s = BlockStore::open(&d).unwrap();
        assert_eq!(s.read(5, 0, 10).unwrap(), b"");
        s.write(5, 4, b"abcd").unwrap();
        assert_eq!(s.read(5, 0, 100).unwrap(), b"\0\0\0\0abcd");
        assert_eq!(s.read(5, 6, 1).unwrap(), b"c");
        s.truncate(5, 5).unwrap();
        assert_eq!(s.len(5).unwrap(), 5);
        s.extend(5, 3).unwrap();
        assert_eq!(s.len(5).unwrap(), 5, "extend never shrinks");
        s.extend(5, 9000).unwrap();
        assert_eq!(s.len(5).unwrap(), 9000);
        assert_eq!(s.read(5, 0, 6).unwrap(), b"\0\0\0\0a\0");
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
            assert_eq!(s.read(100 + h, 0, 8).unwrap(), h.to_le_bytes());
            s.remove(100 + h).unwrap();
        }
        // Every handle, even the extremes, stays inside objects/.
        assert!(s.path(u64::MAX).starts_with(d.join("objects")));
        assert_eq!(s.path(u64::MAX).file_name().unwrap(), "ffffffffffffffff");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
