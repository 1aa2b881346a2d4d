//! Crash consistency of the durable write log: no acknowledged entry is
//! lost, whatever the crash does to unsynced bytes.

use parcache_store::{CrashMedia, CrashMode, Entry, FileMedia, GroupLog, Media, Wal};
use proptest::prelude::*;
use std::io;

#[derive(Clone, Debug)]
enum Op {
    Append(u64, u64, Vec<u8>),
    Sync,
    Crash(CrashMode),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u64..4, 0u64..1000, proptest::collection::vec(any::<u8>(), 0..80)).prop_map(|(h, o, d)| Op::Append(h, o, d)),
        2 => Just(Op::Sync),
        1 => prop_oneof![
            Just(CrashMode::DropUnsynced),
            (0usize..200).prop_map(|keep| CrashMode::Torn { keep }),
            (0usize..200, any::<u8>()).prop_map(|(keep, garbage)| CrashMode::TornCorrupt { keep, garbage }),
        ].prop_map(Op::Crash),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// After any sequence of appends, syncs and crashes, replay returns every
    /// acknowledged entry, in order, and only entries that were appended: an
    /// exact prefix of the history since the last replay.
    #[test]
    fn acknowledged_entries_survive_every_crash(ops in proptest::collection::vec(op(), 1..60)) {
        let media = CrashMedia::new();
        let (mut log, _) = Wal::open(media.clone()).unwrap();
        let mut history: Vec<Entry> = vec![];
        let mut acked = 0;
        for o in ops {
            match o {
                Op::Append(h, off, d) => {
                    let e = Entry::Write { handle: h, offset: off, data: d.into() };
                    log.append(&e).unwrap();
                    history.push(e);
                }
                Op::Sync => {
                    log.sync().unwrap();
                    acked = history.len();
                }
                Op::Crash(mode) => {
                    media.crash(mode);
                    let (l, r) = Wal::open(media.clone()).unwrap();
                    log = l;
                    prop_assert!(r.entries.len() >= acked, "lost acknowledged entries: {} < {}", r.entries.len(), acked);
                    prop_assert_eq!(&r.entries[..], &history[..r.entries.len()], "replay is not a prefix of what was written");
                    history.truncate(r.entries.len());
                    acked = history.len();
                }
            }
        }
    }
}

/// Group commit: concurrent writers share syncs, and every acknowledged
/// entry survives a crash that drops everything unsynced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_shares_syncs_and_loses_nothing_acknowledged() {
    let media = CrashMedia::new();
    let (wal, _) = Wal::open(media.clone()).unwrap();
    let log = GroupLog::start(wal);
    let writers: Vec<_> = (0..400u64)
        .map(|i| {
            let log = log.clone();
            tokio::spawn(async move {
                log.append(Entry::Write {
                    handle: i,
                    offset: i,
                    data: vec![i as u8; 100].into(),
                })
                .await
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap().unwrap();
    }
    let syncs = media.syncs();
    assert!(syncs < 400, "{syncs} syncs for 400 appends: no grouping");
    media.crash(CrashMode::DropUnsynced);
    let (_, r) = Wal::open(media).unwrap();
    let mut handles: Vec<u64> = r.entries.iter().map(Entry::handle).collect();
    handles.sort();
    assert_eq!(handles, (0..400).collect::<Vec<_>>());
}

/// A real file: entries survive reopening; garbage appended by a crash in
/// the middle of a write is cut off with a warning, and the log goes on.
#[test]
fn a_real_log_file_replays_and_cuts_a_corrupt_tail() {
    let dir = std::env::temp_dir().join(format!("parcache-wal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("log");
    let e1 = Entry::Write {
        handle: 7,
        offset: 4096,
        data: b"durable".to_vec().into(),
    };
    {
        let (mut log, _) = Wal::open(FileMedia::open(&path).unwrap()).unwrap();
        log.append(&e1).unwrap();
        log.sync().unwrap();
    }
    let good_len = std::fs::metadata(&path).unwrap().len();
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&[0x55; 13]).unwrap();
    }
    let (mut log, r) = Wal::open(FileMedia::open(&path).unwrap()).unwrap();
    assert_eq!(r.entries, vec![e1.clone()]);
    assert_eq!(r.truncated_bytes, 13);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), good_len);
    let e2 = Entry::Remove { handle: 7 };
    log.append(&e2).unwrap();
    log.sync().unwrap();
    log.compact(std::slice::from_ref(&e2)).unwrap();
    drop(log);
    let (_, r) = Wal::open(FileMedia::open(&path).unwrap()).unwrap();
    assert_eq!(r.entries, vec![e2]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A disk that fills up after `room` bytes.
struct Full {
    inner: CrashMedia,
    room: usize,
    used: usize,
}

impl Media for Full {
    fn append(&mut self, buf: &[u8]) -> io::Result<()> {
        if self.used + buf.len() > self.room {
            // Part of the write lands before the disk fills.
            let part = self.room - self.used;
            self.inner.append(&buf[..part])?;
            self.used = self.room;
            return Err(io::Error::new(io::ErrorKind::StorageFull, "no space left on device"));
        }
        self.used += buf.len();
        self.inner.append(buf)
    }
    fn sync(&mut self) -> io::Result<()> {
        self.inner.sync()
    }
    fn read_all(&mut self) -> io::Result<Vec<u8>> {
        self.inner.read_all()
    }
    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.used = len as usize;
        self.inner.truncate(len)
    }
    fn replace(&mut self, content: &[u8]) -> io::Result<()> {
        self.used = content.len();
        self.inner.replace(content)
    }
}

/// A full disk: the writer is told (ENOSPC), the half-written record is
/// cut back, and the log replays exactly the acknowledged entries.
#[tokio::test]
async fn a_full_disk_is_reported_and_the_log_stays_consistent() {
    let inner = CrashMedia::new();
    let (wal, _) = Wal::open(Full {
        inner: inner.clone(),
        room: 300,
        used: 0,
    })
    .unwrap();
    let log = GroupLog::start(wal);
    let mut acked = vec![];
    let mut refused = 0;
    for i in 0..10u64 {
        let e = Entry::Write {
            handle: 1,
            offset: i * 50,
            data: vec![i as u8; 50].into(),
        };
        match log.append(e.clone()).await {
            Ok(()) => acked.push(e),
            Err(err) => {
                assert_eq!(err.kind(), io::ErrorKind::StorageFull);
                refused += 1;
            }
        }
    }
    assert!(refused > 0 && !acked.is_empty());
    inner.crash(CrashMode::DropUnsynced);
    let (_, r) = Wal::open(inner).unwrap();
    assert_eq!(r.entries, acked);
    assert_eq!(r.truncated_bytes, 0, "the failed record was cut back, not left torn");
}

/// Buffered appends are not durable until a sync: a crash before it drops
/// them, a crash after it keeps every one, and a sync costs one fsync
/// however many appends it covers.
#[tokio::test]
async fn buffered_appends_become_durable_at_the_next_sync() {
    let media = CrashMedia::new();
    let (wal, _) = Wal::open(media.clone()).unwrap();
    let log = GroupLog::start(wal);
    let entry = |i: u64| Entry::Write {
        handle: 3,
        offset: i * 10,
        data: vec![i as u8; 10].into(),
    };
    for i in 0..5 {
        log.append_buffered(entry(i)).await.unwrap();
    }
    assert_eq!(media.syncs(), 0, "buffered appends do not sync");
    let before = media.clone();
    log.sync().await.unwrap();
    assert_eq!(media.syncs(), 1, "one sync covers them all");
    log.append_buffered(entry(5)).await.unwrap();
    before.crash(CrashMode::DropUnsynced);
    let (_, r) = Wal::open(media).unwrap();
    assert_eq!(
        r.entries,
        (0..5).map(entry).collect::<Vec<_>>(),
        "the synced five, not the sixth"
    );
}
