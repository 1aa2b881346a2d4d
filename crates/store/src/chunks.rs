//! The chunk store: a content-addressed data server's chunks (Vilayannur et
//! al. 2005 §3.3), one local file per chunk under `chunks/`, named by the
//! blake3 hash of its bytes. Storing a chunk that is already there writes
//! nothing (identical chunks of any files are stored once); a chunk is
//! stored whole or not at all (written to a temporary name, synced, then
//! renamed), and every read checks the bytes against their name, so a
//! corrupted chunk is an error, never wrong data.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// A chunk's name: the blake3 hash of its bytes.
pub type ChunkHash = [u8; 32];

/// The hash naming `bytes`.
pub fn chunk_hash(bytes: &[u8]) -> ChunkHash {
    *blake3::hash(bytes).as_bytes()
}

pub struct ChunkStore {
    dir: PathBuf,
    /// Makes each put's temporary name unique (two puts of one chunk at
    /// once, from two writers, must not share a file).
    puts: std::sync::atomic::AtomicU64,
}

/// What the store holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChunkStats {
    pub chunks: u64,
    pub bytes: u64,
}

fn hex(h: &ChunkHash) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<ChunkHash> {
    if s.len() != 64 {
        return None;
    }
    let mut h = [0u8; 32];
    for (i, b) in h.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(h)
}

impl ChunkStore {
    /// Opens (creating if needed) the store under `data_dir/chunks`.
    /// Temporary files a crash left behind (chunks never renamed into
    /// place, so never acknowledged) are removed.
    pub fn open(data_dir: &Path) -> io::Result<ChunkStore> {
        let dir = data_dir.join("chunks");
        std::fs::create_dir_all(&dir)?;
        let store = ChunkStore {
            dir,
            puts: Default::default(),
        };
        for sub in std::fs::read_dir(&store.dir)? {
            let sub = sub?.path();
            if !sub.is_dir() {
                continue;
            }
            for f in std::fs::read_dir(&sub)? {
                let f = f?.path();
                if f.extension().is_some_and(|e| e == "tmp") {
                    std::fs::remove_file(&f)?;
                }
            }
        }
        Ok(store)
    }

    /// Chunks are spread over 256 directories by their first byte, so no
    /// directory grows past what a file system lists quickly.
    fn path(&self, h: &ChunkHash) -> PathBuf {
        let name = hex(h);
        self.dir.join(&name[..2]).join(name)
    }

    /// Whether the chunk is stored.
    pub fn contains(&self, h: &ChunkHash) -> bool {
        self.path(h).exists()
    }

    /// Stores `bytes` under their hash and returns it; durable when this
    /// returns. Returns `(hash, true)` if the chunk was new.
    pub fn put(&self, bytes: &[u8]) -> io::Result<(ChunkHash, bool)> {
        let h = chunk_hash(bytes);
        let path = self.path(&h);
        if path.exists() {
            return Ok((h, false));
        }
        let parent = path.parent().expect("under a directory");
        std::fs::create_dir_all(parent)?;
        // A unique temporary name: two writers of the same chunk at once
        // each write their own, and the second rename replaces the first
        // with identical bytes.
        let n = self.puts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = parent.join(format!("{}.{}-{n}.tmp", hex(&h), std::process::id()));
        let mut f = File::create(&tmp)?;
        let r = f.write_all(bytes).and_then(|_| f.sync_all());
        if let Err(e) = r {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, &path)?;
        File::open(parent)?.sync_all()?;
        Ok((h, true))
    }

    /// The chunk's bytes, checked against its name.
    pub fn get(&self, h: &ChunkHash) -> io::Result<Vec<u8>> {
        let bytes = std::fs::read(self.path(h))?;
        if chunk_hash(&bytes) != *h {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("chunk {} is corrupt: its bytes do not match its name", hex(h)),
            ));
        }
        Ok(bytes)
    }

    /// Removes a chunk (no recipe names it any more); absent is fine.
    pub fn remove(&self, h: &ChunkHash) -> io::Result<()> {
        match std::fs::remove_file(self.path(h)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Chunks stored at least `age` ago: a collection sweep's candidates
    /// (a younger chunk may belong to a commit still on its way).
    pub fn list_older_than(&self, age: std::time::Duration) -> io::Result<Vec<ChunkHash>> {
        let now = std::time::SystemTime::now();
        let mut out = Vec::new();
        for h in self.list()? {
            let m = std::fs::metadata(self.path(&h))?.modified()?;
            if now.duration_since(m).unwrap_or_default() >= age {
                out.push(h);
            }
        }
        Ok(out)
    }

    /// Every stored chunk.
    pub fn list(&self) -> io::Result<Vec<ChunkHash>> {
        let mut out = Vec::new();
        for sub in std::fs::read_dir(&self.dir)? {
            let sub = sub?.path();
            if !sub.is_dir() {
                continue;
            }
            for f in std::fs::read_dir(&sub)? {
                if let Some(h) = f?.file_name().to_str().and_then(unhex) {
                    out.push(h);
                }
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// How many chunks and bytes are stored: the physical size, against
    /// the logical size the recipes name.
    pub fn stats(&self) -> io::Result<ChunkStats> {
        let mut s = ChunkStats::default();
        for h in self.list()? {
            s.chunks += 1;
            s.bytes += std::fs::metadata(self.path(&h))?.len();
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("parcache-chunks-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn identical_chunks_are_stored_once_and_read_back_checked() {
        let d = dir("once");
        let s = ChunkStore::open(&d).unwrap();
        let data = vec![7u8; 16 << 10];
        let (h, new) = s.put(&data).unwrap();
        assert!(new);
        for _ in 0..3 {
            assert_eq!(s.put(&data).unwrap(), (h, false), "written four times, stored once");
        }
        let (other, _) = s.put(b"another chunk").unwrap();
        assert_eq!(s.get(&h).unwrap(), data);
        assert_eq!(
            s.stats().unwrap(),
            ChunkStats {
                chunks: 2,
                bytes: (16 << 10) + 13
            }
        );
        let mut all = vec![h, other];
        all.sort_unstable();
        assert_eq!(s.list().unwrap(), all);
        s.remove(&h).unwrap();
        s.remove(&h).unwrap();
        assert!(!s.contains(&h));
        assert_eq!(s.get(&h).unwrap_err().kind(), io::ErrorKind::NotFound);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Two writers storing the same chunk at once both succeed (a mount
    /// test found the second one failing: they shared a temporary name).
    #[test]
    fn the_same_chunk_put_at_once_by_many_writers() {
        let d = dir("race");
        let s = std::sync::Arc::new(ChunkStore::open(&d).unwrap());
        let data = vec![3u8; 16 << 10];
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (s, data) = (s.clone(), data.clone());
                std::thread::spawn(move || (0..50).map(|_| s.put(&data).map(|(h, _)| h)).collect::<Vec<_>>())
            })
            .collect();
        for t in threads {
            for r in t.join().unwrap() {
                assert_eq!(r.unwrap(), chunk_hash(&data));
            }
        }
        assert_eq!(s.stats().unwrap().chunks, 1);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_corrupt_chunk_is_an_error_and_a_crashed_put_leaves_nothing() {
        let d = dir("corrupt");
        let s = ChunkStore::open(&d).unwrap();
        let (h, _) = s.put(b"the bytes").unwrap();
        std::fs::write(s.path(&h), b"the bytez").unwrap();
        let e = s.get(&h).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("corrupt"), "{e}");
        // A put that crashed before its rename: a temporary file, which the
        // next open removes; the chunk is not there.
        let (g, _) = (chunk_hash(b"half"), ());
        let tmp = s.path(&g).with_extension("1.tmp");
        std::fs::create_dir_all(tmp.parent().unwrap()).unwrap();
        std::fs::write(&tmp, b"ha").unwrap();
        let s = ChunkStore::open(&d).unwrap();
        assert!(!tmp.exists() && !s.contains(&g));
        assert_eq!(s.list().unwrap(), vec![h]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
