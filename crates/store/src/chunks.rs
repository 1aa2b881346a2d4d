//! The chunk store: a content-addressed data server's chunks (Vilayannur et
//! al. 2005 §3.3), one local file per chunk under `chunks/`, named by the
//! blake3 hash of its bytes. Storing a chunk that is already there writes
//! nothing (identical chunks of any files are stored once); a chunk is
//! stored whole or not at all (written to a temporary name, then renamed),
//! and is durable at the next [`ChunkStore::sync`] (the data server's
//! `Sync`, which a client's fsync sends), as block writes are. Every read
//! checks the bytes against their name, so a corrupted chunk is an error,
//! never wrong data.

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
    /// Chunks were stored since the last sync.
    dirty: std::sync::atomic::AtomicBool,
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
            dirty: Default::default(),
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

    /// Stores `bytes` under their hash and returns it (durable at the next
    /// [`ChunkStore::sync`]). Returns `(hash, true)` if the chunk was new.
    pub fn put(&self, bytes: &[u8]) -> io::Result<(ChunkHash, bool)> {
        Ok(self.put_many(&[bytes])?[0])
    }

    /// Stores each of `chunks` under its hash: a new one is written to a
    /// temporary name and renamed into place (whole or not at all through
    /// a crash of the process); all are durable at the next
    /// [`ChunkStore::sync`]. A stored chunk of the wrong length (cut short
    /// by a crash of the machine before a sync) is stored again. Returns
    /// each chunk's hash and whether it was new.
    pub fn put_many(&self, chunks: &[&[u8]]) -> io::Result<Vec<(ChunkHash, bool)>> {
        let mut out = Vec::with_capacity(chunks.len());
        let mut seen = std::collections::HashSet::new();
        for bytes in chunks {
            let h = chunk_hash(bytes);
            let path = self.path(&h);
            let stored = std::fs::metadata(&path).is_ok_and(|m| m.len() == bytes.len() as u64);
            let new = !stored && seen.insert(h);
            out.push((h, new));
            if !new {
                continue;
            }
            let parent = path.parent().expect("under a directory");
            std::fs::create_dir_all(parent)?;
            // A unique temporary name: two writers of the same chunk at
            // once each write their own, and the second rename replaces
            // the first with identical bytes.
            let n = self.puts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let tmp = parent.join(format!("{}.{}-{n}.tmp", hex(&h), std::process::id()));
            self.dirty.store(true, std::sync::atomic::Ordering::SeqCst);
            let written = File::create(&tmp).and_then(|mut f| f.write_all(bytes));
            if let Err(e) = written.and_then(|_| std::fs::rename(&tmp, &path)) {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        }
        Ok(out)
    }

    /// Makes every chunk stored so far durable: one `syncfs` of the store's
    /// file system (data and renames together), if any was stored since
    /// the last sync.
    pub fn sync(&self) -> io::Result<()> {
        use std::sync::atomic::Ordering;
        if !self.dirty.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        let r = File::open(&self.dir).and_then(|d| rustix::fs::syncfs(d).map_err(io::Error::from));
        if r.is_err() {
            self.dirty.store(true, Ordering::SeqCst);
        }
        r
    }

    /// The chunks' bytes, each checked against its name; an error names
    /// the chunk.
    pub fn get_many(&self, hashes: &[ChunkHash]) -> io::Result<Vec<Vec<u8>>> {
        hashes
            .iter()
            .map(|h| {
                self.get(h).map_err(|e| match e.kind() {
                    io::ErrorKind::NotFound => io::Error::new(e.kind(), format!("chunk {} is not stored", hex(h))),
                    _ => e,
                })
            })
            .collect()
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
    /// (a younger chunk may belong to a commit still on its way); at most
    /// `limit` of them, in hash order, after `after`.
    pub fn list_older_than(
        &self,
        age: std::time::Duration,
        after: Option<ChunkHash>,
        limit: usize,
    ) -> io::Result<Vec<ChunkHash>> {
        let now = std::time::SystemTime::now();
        let mut out = Vec::new();
        for h in self.list()? {
            if after.is_some_and(|a| h <= a) {
                continue;
            }
            if out.len() == limit {
                break;
            }
            let Ok(m) = std::fs::metadata(self.path(&h)) else {
                continue; // removed since the listing
            };
            if now.duration_since(m.modified()?).unwrap_or_default() >= age {
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

    /// A batch: chunks new, repeated within it, and stored before; each
    /// stored once, no temporary left, all read back.
    #[test]
    fn a_batch_stores_each_new_chunk_once() {
        let d = dir("batch");
        let s = ChunkStore::open(&d).unwrap();
        let (a, b, c) = (vec![1u8; 4096], vec![2u8; 4096], b"stored before".to_vec());
        let (hc, _) = s.put(&c).unwrap();
        let got = s.put_many(&[&a, &b, &a, &c]).unwrap();
        let (ha, hb) = (chunk_hash(&a), chunk_hash(&b));
        assert_eq!(got, vec![(ha, true), (hb, true), (ha, false), (hc, false)]);
        assert_eq!(s.stats().unwrap().chunks, 3);
        assert_eq!(s.get_many(&[hb, ha]).unwrap(), vec![b, a.clone()]);
        let tmps = std::fs::read_dir(d.join("chunks"))
            .unwrap()
            .flat_map(|sub| std::fs::read_dir(sub.unwrap().path()).unwrap())
            .filter(|f| f.as_ref().unwrap().path().extension().is_some_and(|e| e == "tmp"))
            .count();
        assert_eq!(tmps, 0);
        s.sync().unwrap();
        // A chunk cut short (a machine crash before a sync) is stored again.
        std::fs::write(s.path(&ha), b"").unwrap();
        assert_eq!(s.put(&a).unwrap(), (ha, true));
        assert_eq!(s.get(&ha).unwrap(), a);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// The collection's listing comes in pages, in hash order, each after
    /// the last one's end, and every chunk once.
    #[test]
    fn chunks_list_in_pages() {
        let d = dir("pages");
        let s = ChunkStore::open(&d).unwrap();
        for i in 0..5u8 {
            s.put(&[i; 100]).unwrap();
        }
        let (mut after, mut all): (Option<ChunkHash>, Vec<ChunkHash>) = (None, vec![]);
        loop {
            let page = s.list_older_than(std::time::Duration::ZERO, after, 2).unwrap();
            all.extend(&page);
            after = page.last().copied();
            if page.len() < 2 {
                break;
            }
        }
        assert_eq!(all, s.list().unwrap());
        assert_eq!(all.len(), 5);
        let young = s
            .list_older_than(std::time::Duration::from_secs(3600), None, 10)
            .unwrap();
        assert!(young.is_empty(), "stored just now: not a candidate");
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
