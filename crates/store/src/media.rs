//! Where a log's bytes live: a real file, or a model of one that loses what
//! was not synced when the machine "crashes" (as turmoil-fs and redb's crash
//! backend do), used to prove that no acknowledged byte is lost.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// An append-only file as the log sees it.
pub trait Media: Send {
    /// Adds bytes at the end; they are not durable until [`Media::sync`].
    fn append(&mut self, buf: &[u8]) -> io::Result<()>;
    /// Makes everything appended so far durable.
    fn sync(&mut self) -> io::Result<()>;
    /// The whole current content.
    fn read_all(&mut self) -> io::Result<Vec<u8>>;
    /// Cuts the content to `len` bytes, durably.
    fn truncate(&mut self, len: u64) -> io::Result<()>;
    /// Atomically and durably replaces the whole content.
    fn replace(&mut self, content: &[u8]) -> io::Result<()>;
}

/// A log in a real file: appends with `write`, durability with `fdatasync`,
/// replacement by writing a temporary file, syncing it and renaming it over.
pub struct FileMedia {
    path: PathBuf,
    file: File,
}

impl FileMedia {
    pub fn open(path: &Path) -> io::Result<FileMedia> {
        let file = OpenOptions::new().read(true).append(true).create(true).open(path)?;
        Ok(FileMedia {
            path: path.to_path_buf(),
            file,
        })
    }
}

impl Media for FileMedia {
    fn append(&mut self, buf: &[u8]) -> io::Result<()> {
        self.file.write_all(buf)
    }
    fn sync(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn read_all(&mut self) -> io::Result<Vec<u8>> {
        let mut v = Vec::new();
        self.file.seek(SeekFrom::Start(0))?;
        self.file.read_to_end(&mut v)?;
        Ok(v)
    }
    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.file.set_len(len)?;
        self.file.sync_all()
    }
    fn replace(&mut self, content: &[u8]) -> io::Result<()> {
        let tmp = self.path.with_extension("tmp");
        {
            let mut f = File::create(&tmp)?;
            f.write_all(content)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            File::open(dir)?.sync_all()?;
        }
        self.file = OpenOptions::new().read(true).append(true).open(&self.path)?;
        Ok(())
    }
}

/// What a crash does to bytes that were written but not synced.
#[derive(Clone, Copy, Debug)]
pub enum CrashMode {
    /// They are lost.
    DropUnsynced,
    /// A prefix of them reached the disk (a torn write).
    Torn { keep: usize },
    /// A prefix reached the disk and its last byte is garbage.
    TornCorrupt { keep: usize, garbage: u8 },
}

#[derive(Default)]
struct CrashState {
    durable: Vec<u8>,
    pending: Vec<u8>,
    syncs: u64,
    /// Bytes the model disk holds at most (a full disk): an append past it
    /// fails with ENOSPC and writes nothing.
    capacity: Option<usize>,
}

/// A model disk for crash tests. Clones share the same disk, so a test can
/// crash it and open the log again.
#[derive(Clone, Default)]
pub struct CrashMedia {
    state: Arc<Mutex<CrashState>>,
}

impl CrashMedia {
    pub fn new() -> CrashMedia {
        CrashMedia::default()
    }
    /// The machine loses power: unsynced bytes go as `mode` says.
    pub fn crash(&self, mode: CrashMode) {
        let mut s = self.state.lock().expect("not poisoned");
        let pending = std::mem::take(&mut s.pending);
        match mode {
            CrashMode::DropUnsynced => {}
            CrashMode::Torn { keep } => {
                let k = keep.min(pending.len());
                s.durable.extend_from_slice(&pending[..k]);
            }
            CrashMode::TornCorrupt { keep, garbage } => {
                let k = keep.min(pending.len());
                s.durable.extend_from_slice(&pending[..k]);
                if k > 0 {
                    *s.durable.last_mut().expect("non-empty") = garbage;
                }
            }
        }
    }
    /// Makes the disk hold at most `bytes` (appends past it fail with ENOSPC).
    pub fn set_capacity(&self, bytes: Option<usize>) {
        self.state.lock().expect("not poisoned").capacity = bytes;
    }
    /// How many syncs have been made (to check group commit).
    pub fn syncs(&self) -> u64 {
        self.state.lock().expect("not poisoned").syncs
    }
    pub fn durable_len(&self) -> usize {
        self.state.lock().expect("not poisoned").durable.len()
    }
}

impl Media for CrashMedia {
    fn append(&mut self, buf: &[u8]) -> io::Result<()> {
        let mut s = self.state.lock().expect("not poisoned");
        if s.capacity
            .is_some_and(|c| s.durable.len() + s.pending.len() + buf.len() > c)
        {
            return Err(io::Error::from_raw_os_error(28));
        }
        s.pending.extend_from_slice(buf);
        Ok(())
    }
    fn sync(&mut self) -> io::Result<()> {
        let mut s = self.state.lock().expect("not poisoned");
        let p = std::mem::take(&mut s.pending);
        s.durable.extend_from_slice(&p);
        s.syncs += 1;
        Ok(())
    }
    fn read_all(&mut self) -> io::Result<Vec<u8>> {
        let s = self.state.lock().expect("not poisoned");
        let mut v = s.durable.clone();
        v.extend_from_slice(&s.pending);
        Ok(v)
    }
    fn truncate(&mut self, len: u64) -> io::Result<()> {
        let mut s = self.state.lock().expect("not poisoned");
        let p = std::mem::take(&mut s.pending);
        s.durable.extend_from_slice(&p);
        s.durable.truncate(len as usize);
        Ok(())
    }
    fn replace(&mut self, content: &[u8]) -> io::Result<()> {
        let mut s = self.state.lock().expect("not poisoned");
        s.pending.clear();
        s.durable = content.to_vec();
        Ok(())
    }
}
