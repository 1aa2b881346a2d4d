//! The durable write log: an append-only log of writes, replayed at start-up
//! (DESIGN.md §2, "the modern form of the papers' non-volatile RAM").
//!
//! Record format: `u32 body length | u32 CRC-32 of the body | body`, where
//! the body is `u8 kind | u64 handle | u64 a | data`. Replay reads records in
//! order and stops at the first one that is short, too long or fails its
//! checksum; that tail is cut off with a warning, so a torn or corrupt end
//! (a crash in the middle of a write) never hides earlier records. A record
//! is acknowledged only after the sync that covers it.

use crate::media::Media;
use std::io;

/// One logged change to a server's part of a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    Write {
        handle: u64,
        offset: u64,
        data: bytes::Bytes,
    },
    Truncate {
        handle: u64,
        len: u64,
    },
    Remove {
        handle: u64,
    },
    /// Grow the part to at least `len` bytes (never shrinks it).
    Extend {
        handle: u64,
        len: u64,
    },
    /// A node's durable write cache: bytes written at `offset` of file
    /// `handle`, the node's `seq`-th write (Biswas et al. 1993 §2.2).
    NodeWrite {
        seq: u64,
        handle: u64,
        offset: u64,
        data: bytes::Bytes,
    },
    /// A node's durable write cache: block `index` of file `handle` is on
    /// the data servers, durably, as of the writes numbered below `upto`.
    NodeClean {
        handle: u64,
        index: u64,
        upto: u64,
    },
}

impl Entry {
    pub fn handle(&self) -> u64 {
        match *self {
            Entry::Write { handle, .. }
            | Entry::Truncate { handle, .. }
            | Entry::Remove { handle }
            | Entry::Extend { handle, .. }
            | Entry::NodeWrite { handle, .. }
            | Entry::NodeClean { handle, .. } => handle,
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        // The node's kinds carry a third number before their data.
        let (kind, handle, a, b, data): (u8, u64, u64, Option<u64>, &[u8]) = match self {
            Entry::Write { handle, offset, data } => (1, *handle, *offset, None, &data[..]),
            Entry::Truncate { handle, len } => (2, *handle, *len, None, &[]),
            Entry::Remove { handle } => (3, *handle, 0, None, &[]),
            Entry::Extend { handle, len } => (4, *handle, *len, None, &[]),
            Entry::NodeWrite {
                seq,
                handle,
                offset,
                data,
            } => (5, *handle, *offset, Some(*seq), &data[..]),
            Entry::NodeClean { handle, index, upto } => (6, *handle, *index, Some(*upto), &[]),
        };
        let body_len = 1 + 8 + 8 + if b.is_some() { 8 } else { 0 } + data.len();
        let start = out.len();
        out.extend_from_slice(&(body_len as u32).to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.push(kind);
        out.extend_from_slice(&handle.to_le_bytes());
        out.extend_from_slice(&a.to_le_bytes());
        if let Some(b) = b {
            out.extend_from_slice(&b.to_le_bytes());
        }
        out.extend_from_slice(data);
        let crc = crc32fast::hash(&out[start + 8..]);
        out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decodes the record at the start of `buf`: the entry and its size.
    fn decode(buf: &[u8]) -> Option<(Entry, usize)> {
        let len = u32::from_le_bytes(buf.get(0..4)?.try_into().ok()?) as usize;
        let crc = u32::from_le_bytes(buf.get(4..8)?.try_into().ok()?);
        let body = buf.get(8..8usize.checked_add(len)?)?;
        if len < 17 || crc32fast::hash(body) != crc {
            return None;
        }
        let handle = u64::from_le_bytes(body[1..9].try_into().ok()?);
        let a = u64::from_le_bytes(body[9..17].try_into().ok()?);
        let e = match body[0] {
            1 => Entry::Write {
                handle,
                offset: a,
                data: bytes::Bytes::copy_from_slice(&body[17..]),
            },
            2 if len == 17 => Entry::Truncate { handle, len: a },
            3 if len == 17 => Entry::Remove { handle },
            4 if len == 17 => Entry::Extend { handle, len: a },
            5 if len >= 25 => Entry::NodeWrite {
                seq: u64::from_le_bytes(body[17..25].try_into().ok()?),
                handle,
                offset: a,
                data: bytes::Bytes::copy_from_slice(&body[25..]),
            },
            6 if len == 25 => Entry::NodeClean {
                handle,
                index: a,
                upto: u64::from_le_bytes(body[17..25].try_into().ok()?),
            },
            _ => return None,
        };
        Some((e, 8 + len))
    }
}

/// What replay found.
#[derive(Debug, Default)]
pub struct Replay {
    pub entries: Vec<Entry>,
    /// Bytes of torn or corrupt tail that were cut off.
    pub truncated_bytes: u64,
}

/// An open log on some [`Media`].
pub struct Wal<M: Media> {
    media: M,
    /// Bytes known durable (covered by a sync).
    synced: u64,
    /// Bytes appended.
    len: u64,
    buf: Vec<u8>,
}

impl<M: Media> Wal<M> {
    /// Opens the log and replays it, cutting off a bad tail.
    pub fn open(mut media: M) -> io::Result<(Wal<M>, Replay)> {
        let bytes = media.read_all()?;
        let mut pos = 0;
        let mut entries = Vec::new();
        while let Some((e, n)) = Entry::decode(&bytes[pos..]) {
            entries.push(e);
            pos += n;
        }
        let bad = (bytes.len() - pos) as u64;
        if bad > 0 {
            tracing::warn!(
                "write log: {bad} bytes of torn or corrupt tail after the last valid record (offset {pos}) cut off"
            );
            media.truncate(pos as u64)?;
        }
        let wal = Wal {
            media,
            synced: pos as u64,
            len: pos as u64,
            buf: Vec::new(),
        };
        Ok((
            wal,
            Replay {
                entries,
                truncated_bytes: bad,
            },
        ))
    }

    /// Appends an entry; it is durable after the next [`Wal::sync`].
    pub fn append(&mut self, e: &Entry) -> io::Result<()> {
        self.buf.clear();
        e.encode(&mut self.buf);
        match self.media.append(&self.buf) {
            Ok(()) => {
                self.len += self.buf.len() as u64;
                Ok(())
            }
            Err(err) => {
                // Cut back to the end of the last whole record: entries
                // appended before this one (buffered writes already
                // acknowledged) stay for the next sync.
                self.cut_back(self.len);
                Err(err)
            }
        }
    }

    /// Makes every appended entry durable.
    pub fn sync(&mut self) -> io::Result<()> {
        match self.media.sync() {
            Ok(()) => {
                self.synced = self.len;
                Ok(())
            }
            Err(err) => {
                self.rollback();
                Err(err)
            }
        }
    }

    /// After a failed sync, cut the log back to its last durable record so
    /// it stays consistent; the failed entries are reported to their
    /// writers (and to the next `fsync`) as not written.
    fn rollback(&mut self) {
        self.cut_back(self.synced);
    }

    fn cut_back(&mut self, to: u64) {
        if let Err(e) = self.media.truncate(to) {
            tracing::error!("write log: cannot cut back to {to} bytes after a failed write: {e}");
        }
        self.len = to;
    }

    /// Bytes in the log.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Atomically replaces the log by `live` entries (after write-back made
    /// the others redundant).
    pub fn compact(&mut self, live: &[Entry]) -> io::Result<()> {
        let mut buf = Vec::new();
        for e in live {
            e.encode(&mut buf);
        }
        self.media.replace(&buf)?;
        self.len = buf.len() as u64;
        self.synced = self.len;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::{CrashMedia, CrashMode};

    fn w(handle: u64, offset: u64, data: &[u8]) -> Entry {
        Entry::Write {
            handle,
            offset,
            data: bytes::Bytes::copy_from_slice(data),
        }
    }

    #[test]
    fn synced_entries_survive_a_crash_and_unsynced_ones_do_not() {
        let m = CrashMedia::new();
        let (mut log, r) = Wal::open(m.clone()).unwrap();
        assert!(r.entries.is_empty());
        log.append(&w(1, 0, b"hello")).unwrap();
        log.append(&Entry::Truncate { handle: 1, len: 3 }).unwrap();
        log.sync().unwrap();
        log.append(&w(2, 9, b"lost")).unwrap();
        m.crash(CrashMode::DropUnsynced);
        let (_, r) = Wal::open(m.clone()).unwrap();
        assert_eq!(
            r.entries,
            vec![w(1, 0, b"hello"), Entry::Truncate { handle: 1, len: 3 }]
        );
    }

    #[test]
    fn a_torn_or_corrupt_tail_is_cut_off() {
        for mode in [
            CrashMode::Torn { keep: 10 },
            CrashMode::TornCorrupt {
                keep: 30,
                garbage: 0xAA,
            },
        ] {
            let m = CrashMedia::new();
            let (mut log, _) = Wal::open(m.clone()).unwrap();
            log.append(&w(1, 0, b"kept")).unwrap();
            log.sync().unwrap();
            log.append(&w(1, 4, b"torn record with a long body")).unwrap();
            m.crash(mode);
            let (mut log, r) = Wal::open(m.clone()).unwrap();
            assert_eq!(r.entries, vec![w(1, 0, b"kept")]);
            assert!(r.truncated_bytes > 0);
            // The log is usable after the cut.
            log.append(&w(3, 0, b"next")).unwrap();
            log.sync().unwrap();
            let (_, r) = Wal::open(m).unwrap();
            assert_eq!(r.entries, vec![w(1, 0, b"kept"), w(3, 0, b"next")]);
        }
    }

    #[test]
    fn a_failed_append_on_a_full_disk_keeps_the_entries_before_it() {
        // A buffered write is acknowledged before the sync that makes it
        // durable; a later append failing with ENOSPC must not cut it out
        // of the log, or the next sync would report it durable when it is not.
        let m = CrashMedia::new();
        let (mut log, _) = Wal::open(m.clone()).unwrap();
        log.append(&w(1, 0, b"durable")).unwrap();
        log.sync().unwrap();
        log.append(&w(1, 7, b"buffered, acknowledged")).unwrap();
        m.set_capacity(Some(m.durable_len() + 60));
        let err = log.append(&w(2, 0, &[7u8; 100])).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(28));
        log.sync().unwrap();
        m.crash(CrashMode::DropUnsynced);
        let (_, r) = Wal::open(m).unwrap();
        assert_eq!(r.entries, vec![w(1, 0, b"durable"), w(1, 7, b"buffered, acknowledged")]);
    }

    #[test]
    fn the_node_kinds_round_trip() {
        let m = CrashMedia::new();
        let (mut log, _) = Wal::open(m.clone()).unwrap();
        let es = vec![
            Entry::NodeWrite {
                seq: 7,
                handle: 3,
                offset: 65536,
                data: bytes::Bytes::from_static(b"nv bytes"),
            },
            Entry::NodeWrite {
                seq: 8,
                handle: 3,
                offset: 0,
                data: bytes::Bytes::new(),
            },
            Entry::NodeClean {
                handle: 3,
                index: 1,
                upto: 8,
            },
        ];
        for e in &es {
            log.append(e).unwrap();
        }
        log.sync().unwrap();
        m.crash(CrashMode::DropUnsynced);
        let (_, r) = Wal::open(m).unwrap();
        assert_eq!(r.entries, es);
    }

    #[test]
    fn compaction_keeps_only_the_live_entries() {
        let m = CrashMedia::new();
        let (mut log, _) = Wal::open(m.clone()).unwrap();
        for i in 0..10 {
            log.append(&w(1, i, b"x")).unwrap();
        }
        log.sync().unwrap();
        log.compact(&[w(1, 9, b"x")]).unwrap();
        m.crash(CrashMode::DropUnsynced);
        let (_, r) = Wal::open(m).unwrap();
        assert_eq!(r.entries, vec![w(1, 9, b"x")]);
    }
}
