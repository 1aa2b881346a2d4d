//! The driver against an in-memory level below (real I/O is tested by the
//! client's and the servers' cross-process tests).

use super::*;
use parcache_core::{PrefetchKind, ReplacementKind};
use proptest::prelude::*;
use std::time::Duration;

/// Files in memory; optionally slow, optionally failing.
#[derive(Default)]
struct Mem {
    files: Mutex<HashMap<FileId, Vec<u8>>>,
    fail: AtomicBool,
    writes: std::sync::atomic::AtomicU64,
    block_size: u32,
    delay_us: u64,
}

impl Mem {
    fn new(block_size: u32) -> Self {
        Mem {
            block_size,
            ..Default::default()
        }
    }
    fn file(&self, f: FileId) -> Vec<u8> {
        self.files.lock().get(&f).cloned().unwrap_or_default()
    }
}

impl Below for Mem {
    async fn write(&self, key: BlockKey, pieces: Vec<(u32, Bytes)>) -> Result<(), BelowError> {
        if self.delay_us > 0 {
            tokio::time::sleep(Duration::from_micros(self.delay_us)).await;
        }
        if self.fail.load(Ordering::SeqCst) {
            return Err(BelowError::io("disk on fire"));
        }
        self.writes.fetch_add(1, Ordering::SeqCst);
        let mut files = self.files.lock();
        let f = files.entry(key.file).or_default();
        for (at, data) in pieces {
            let off = (key.index * self.block_size as u64 + at as u64) as usize;
            if f.len() < off + data.len() {
                f.resize(off + data.len(), 0);
            }
            f[off..off + data.len()].copy_from_slice(&data);
        }
        Ok(())
    }
    async fn fetch(&self, key: BlockKey) -> Result<Bytes, BelowError> {
        if self.delay_us > 0 {
            tokio::time::sleep(Duration::from_micros(self.delay_us)).await;
        }
        if self.fail.load(Ordering::SeqCst) {
            return Err(BelowError::io("disk on fire"));
        }
        let f = self.file(key.file);
        let off = (key.index * self.block_size as u64) as usize;
        let end = f.len().min(off + self.block_size as usize);
        Ok(Bytes::copy_from_slice(if off < end { &f[off..end] } else { &[] }))
    }
}

fn cfg(buffers: usize, write: WritePolicyKind, repl: ReplacementKind, prefetch: PrefetchKind) -> CacheConfig {
    CacheConfig {
        buffers,
        block_size: 64,
        replacement: repl,
        write,
        prefetch,
        aux_buffers: 0,
        syncer: None,
        fill_partial_writes: false,
    }
}

/// A driver over `below` with `buffers` LRU buffers, no prefetch, 2 lanes.
fn simple(buffers: usize, write: WritePolicyKind, below: &Arc<Mem>) -> Driver<Arc<Mem>> {
    Driver::new(
        cfg(buffers, write, ReplacementKind::Lru, PrefetchKind::None),
        2,
        below.clone(),
    )
    .unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    Write {
        file: FileId,
        off: u64,
        len: usize,
        seed: u8,
    },
    Read {
        file: FileId,
        off: u64,
        len: usize,
    },
    Flush {
        file: FileId,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..3, 0u64..1000, 1usize..300, any::<u8>()).prop_map(|(file, off, len, seed)| Op::Write { file, off, len, seed }),
        3 => (0u64..3, 0u64..1200, 1usize..300).prop_map(|(file, off, len)| Op::Read { file, off, len }),
        1 => (0u64..3).prop_map(|file| Op::Flush { file }),
    ]
}

fn bytes_of(seed: u8, off: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((off as usize + i) as u8).wrapping_mul(31))
        .collect()
}

/// Runs ops in batches of concurrent ones against the driver and a model.
/// Ops in one batch touch different files, so the model's order is theirs.
async fn run(c: CacheConfig, lanes: usize, ops: Vec<Op>) {
    let below = Arc::new(Mem::new(c.block_size));
    let d = Driver::new(c, lanes, below.clone()).unwrap();
    let mut model: HashMap<FileId, Vec<u8>> = HashMap::new();
    for batch in ops.chunks(3) {
        let mut seen = std::collections::HashSet::new();
        let batch: Vec<&Op> = batch
            .iter()
            .filter(|o| {
                let f = match o {
                    Op::Write { file, .. } | Op::Read { file, .. } | Op::Flush { file } => *file,
                };
                seen.insert(f)
            })
            .collect();
        let futs = batch.iter().map(|o| {
            let d = &d;
            let model = &model;
            async move {
                match o {
                    Op::Write { file, off, len, seed } => {
                        d.write(*file, *off, &bytes_of(*seed, *off, *len)).await.unwrap();
                    }
                    Op::Read { file, off, len } => {
                        let mut out = vec![0xAA; *len];
                        d.read(*file, *off, &mut out).await.unwrap();
                        let m = model.get(file).cloned().unwrap_or_default();
                        for (i, b) in out.iter().enumerate() {
                            let want = m.get(*off as usize + i).copied().unwrap_or(0);
                            assert_eq!(*b, want, "file {file} byte {}", *off as usize + i);
                        }
                    }
                    Op::Flush { file } => d.flush_file(*file).await.unwrap(),
                }
            }
        });
        join_all(futs).await;
        for o in batch {
            if let Op::Write { file, off, len, seed } = o {
                let m = model.entry(*file).or_default();
                let end = *off as usize + len;
                if m.len() < end {
                    m.resize(end, 0);
                }
                m[*off as usize..end].copy_from_slice(&bytes_of(*seed, *off, *len));
            }
        }
    }
    d.flush_all().await.unwrap();
    assert!(d.shared.lock().cache.is_clean());
    for (f, m) in &model {
        let got = below.file(*f);
        assert_eq!(&got[..m.len()], &m[..], "file {f} below after flush_all");
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    /// Every byte acknowledged reads back, and every byte reaches the level
    /// below after a flush, under every write policy, both replacement
    /// policies and every prefetch policy, with few buffers.
    #[test]
    fn no_acknowledged_byte_is_lost(
        ops in proptest::collection::vec(op(), 1..60),
        w in 0usize..7,
        toss in any::<bool>(),
        pf in 0usize..3,
        buffers in 3usize..10,
    ) {
        let write = WritePolicyKind::ALL[w];
        let repl = if toss { ReplacementKind::TossImmediately } else { ReplacementKind::Lru };
        let prefetch = [PrefetchKind::None, PrefetchKind::OneBlockAhead, PrefetchKind::FullFileOnOpen][pf];
        let c = cfg(buffers, write, repl, prefetch);
        rt().block_on(async {
            tokio::time::timeout(Duration::from_secs(2), run(c, 3, ops)).await.expect("no deadlock")
        });
    }
}

#[test]
fn write_through_returns_when_the_bytes_are_below() {
    rt().block_on(async {
        let below = Arc::new(Mem::new(64));
        let d = simple(4, WritePolicyKind::WriteThrough, &below);
        d.write(7, 10, b"hello").await.unwrap();
        assert_eq!(&below.file(7)[10..15], b"hello");
    });
}

#[test]
fn write_back_keeps_bytes_until_a_flush() {
    rt().block_on(async {
        let below = Arc::new(Mem::new(64));
        let d = simple(4, WritePolicyKind::WriteBack, &below);
        d.write(7, 0, b"hello").await.unwrap();
        assert!(below.file(7).is_empty());
        d.flush_file(7).await.unwrap();
        assert_eq!(&below.file(7)[..5], b"hello");
    });
}

/// A write-back LRU driver of `buffers` 64 KiB blocks over memory.
fn write_back_64k(buffers: usize) -> (Arc<Mem>, Driver<Arc<Mem>>) {
    let below = Arc::new(Mem::new(64 << 10));
    let mut c = cfg(
        buffers,
        WritePolicyKind::WriteBack,
        ReplacementKind::Lru,
        PrefetchKind::None,
    );
    c.block_size = 64 << 10;
    let d = Driver::new(c, 2, below.clone()).unwrap();
    (below, d)
}

/// A block written in part holds the pages its bytes need, not the whole
/// block (issue 14: a fresh 64 KiB buffer per new 4 KiB file); it reads
/// back whole, zeros past its bytes, and grows when written further.
#[test]
fn a_small_blocks_buffer_holds_only_the_pages_it_needs() {
    rt().block_on(async {
        let bs = 64 << 10;
        let (below, d) = write_back_64k(64);
        for f in 0..32u64 {
            d.write(f, 0, &[f as u8 + 1; 4000]).await.unwrap();
        }
        let held = |d: &Driver<Arc<Mem>>| -> usize { d.shared.lock().mem.iter().flatten().map(|v| v.capacity()).sum() };
        assert_eq!(held(&d), 32 * 4096, "32 blocks of 4,000 bytes");
        let mut out = vec![9u8; bs as usize];
        d.read(3, 0, &mut out).await.unwrap();
        assert!(out[..4000].iter().all(|&b| b == 4) && out[4000..].iter().all(|&b| b == 0));
        d.write(3, 60_000, b"tail").await.unwrap();
        d.read(3, 0, &mut out).await.unwrap();
        assert!(out[..4000].iter().all(|&b| b == 4) && &out[60_000..60_004] == b"tail");
        assert!(out[4000..60_000].iter().chain(&out[60_004..]).all(|&b| b == 0));
        assert_eq!(held(&d), 31 * 4096 + bs as usize);
        d.flush_file(3).await.unwrap();
        assert_eq!(below.file(3)[60_000..], *b"tail");
    });
}

/// Memory taken ahead goes only to buffers without any, a whole block
/// each, a batch at a time until none is left; bytes cached before and
/// after read back as written, and a block in a taken buffer reads zeros
/// past its bytes (the memory's own zeros are not its content).
#[test]
fn memory_taken_ahead_goes_to_empty_buffers_and_changes_no_byte() {
    rt().block_on(async {
        let bs = 64 << 10;
        let (below, d) = write_back_64k(16);
        for f in 0..3u64 {
            d.write(f, 0, &[f as u8 + 1; 4000]).await.unwrap();
        }
        assert_eq!(d.memory_bytes(), 3 * 4096, "three small blocks");
        assert_eq!(d.take_memory(5), 5 * bs as u64);
        assert_eq!(d.memory_bytes(), 3 * 4096 + 5 * bs as u64);
        let mut rounds = 0;
        while d.take_memory(4) > 0 {
            rounds += 1;
        }
        assert_eq!(rounds, 2, "8 buffers left, 4 at a time");
        assert_eq!(d.memory_bytes(), 3 * 4096 + 13 * bs as u64);
        assert_eq!(d.take_memory(100), 0, "nothing left to take");
        let mut out = vec![9u8; bs as usize];
        for f in 0..3u64 {
            d.read(f, 0, &mut out).await.unwrap();
            assert!(out[..4000].iter().all(|&b| b == f as u8 + 1) && out[4000..].iter().all(|&b| b == 0));
        }
        // New blocks land in taken buffers: read back whole, zeros past
        // their bytes, pushed down as written.
        for f in 10..20u64 {
            d.write(f, 100, &[f as u8; 300]).await.unwrap();
        }
        for f in 10..20u64 {
            d.read(f, 0, &mut out).await.unwrap();
            assert!(out[..100].iter().all(|&b| b == 0), "file {f}");
            assert!(out[100..400].iter().all(|&b| b == f as u8), "file {f}");
            assert!(out[400..].iter().all(|&b| b == 0), "file {f}");
        }
        d.flush_all().await.unwrap();
        for f in 10..20u64 {
            assert_eq!(below.file(f)[100..400], [f as u8; 300]);
        }
        assert!(d.memory_bytes() <= 16 * bs as u64);
    });
}

#[test]
fn the_syncer_pushes_dirty_data_within_its_interval() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let below = Arc::new(Mem::new(64));
        let mut c = cfg(4, WritePolicyKind::WriteBack, ReplacementKind::Lru, PrefetchKind::None);
        c.syncer = Some(parcache_core::Span::from_secs(30));
        let d = Driver::new(c, 2, below.clone()).unwrap();
        d.write(1, 0, b"late").await.unwrap();
        tokio::time::sleep(Duration::from_secs(29)).await;
        assert!(below.file(1).is_empty(), "too early");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(&below.file(1)[..4], b"late");
    });
}

#[test]
fn a_failed_write_is_reported_at_the_next_flush_of_its_file() {
    rt().block_on(async {
        let below = Arc::new(Mem::new(64));
        let d = simple(4, WritePolicyKind::WriteBack, &below);
        d.write(3, 0, b"x").await.unwrap();
        below.fail.store(true, Ordering::SeqCst);
        let e = d.flush_file(3).await.unwrap_err();
        assert!(e.message.contains("fire"));
        below.fail.store(false, Ordering::SeqCst);
        d.flush_file(3).await.unwrap();
    });
}

#[test]
fn a_failed_fetch_fails_the_read_and_the_next_one_works() {
    rt().block_on(async {
        let below = Arc::new(Mem::new(64));
        below.files.lock().insert(5, vec![9; 100]);
        let d = simple(2, WritePolicyKind::WriteBack, &below);
        below.fail.store(true, Ordering::SeqCst);
        let mut out = [0u8; 10];
        assert!(d.read(5, 0, &mut out).await.is_err());
        below.fail.store(false, Ordering::SeqCst);
        d.read(5, 0, &mut out).await.unwrap();
        assert_eq!(out, [9; 10]);
    });
}

#[test]
fn discard_drops_dirty_blocks_unwritten() {
    rt().block_on(async {
        let below = Arc::new(Mem::new(64));
        let d = simple(4, WritePolicyKind::WriteBack, &below);
        d.write(3, 0, &[1; 200]).await.unwrap();
        d.discard_file(3, 1).await;
        d.flush_all().await.unwrap();
        assert_eq!(below.file(3), vec![1; 64]);
    });
}

/// Many concurrent readers and writers on a multi-threaded runtime with a
/// slow level below: nothing deadlocks, nothing is lost.
#[test]
fn concurrent_access_on_many_threads() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut m = Mem::new(64);
        m.delay_us = 50;
        let below = Arc::new(m);
        for w in WritePolicyKind::ALL {
            let d = Arc::new(
                Driver::new(
                    cfg(6, w, ReplacementKind::TossImmediately, PrefetchKind::OneBlockAhead),
                    4,
                    below.clone(),
                )
                .unwrap(),
            );
            let tasks: Vec<_> = (0..8u64)
                .map(|f| {
                    let d = d.clone();
                    tokio::spawn(async move {
                        let file = 100 + f;
                        for i in 0..20u64 {
                            d.write(file, i * 50, &bytes_of(f as u8, i * 50, 50)).await.unwrap();
                        }
                        let mut out = vec![0; 1000];
                        d.read(file, 0, &mut out).await.unwrap();
                        assert_eq!(out, bytes_of(f as u8, 0, 1000), "{w}");
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
            d.flush_all().await.unwrap();
            for f in 0..8u64 {
                assert_eq!(below.file(100 + f)[..1000], bytes_of(f as u8, 0, 1000)[..], "{w}");
            }
            below.files.lock().clear();
        }
    });
}

#[test]
fn regression_small_write_back() {
    let ops = vec![
        Op::Write {
            file: 0,
            off: 0,
            len: 1,
            seed: 0,
        },
        Op::Write {
            file: 1,
            off: 275,
            len: 1,
            seed: 0,
        },
        Op::Read {
            file: 0,
            off: 0,
            len: 1,
        },
        Op::Read {
            file: 1,
            off: 256,
            len: 1,
        },
    ];
    let c = cfg(3, WritePolicyKind::WriteBack, ReplacementKind::Lru, PrefetchKind::None);
    rt().block_on(async {
        tokio::time::timeout(Duration::from_secs(2), run(c, 3, ops))
            .await
            .expect("no deadlock")
    });
}

/// A block written around the cache takes the place of a clean copy or
/// becomes one; a dirty copy refuses it (the write must go through the
/// cache), and a full cache of dirty blocks has no room for it.
#[test]
fn a_block_written_around_the_cache_replaces_only_a_clean_copy() {
    rt().block_on(async {
        let below = Arc::new(Mem::new(64));
        let d = simple(2, WritePolicyKind::WriteBack, &below);
        let key = |i| BlockKey::new(7, i);
        assert!(d.clean_or_absent(key(0)));
        assert_eq!(d.place_clean(key(0), &[1u8; 64]), Placed::Cached);
        assert_eq!(d.peek(key(0)).unwrap(), vec![1u8; 64]);
        // A clean copy (whole or not) gives way to the new bytes.
        assert_eq!(d.place_clean(key(0), &[2u8; 64]), Placed::Cached);
        assert_eq!(d.peek(key(0)).unwrap(), vec![2u8; 64]);
        d.write(7, 64 + 3, b"dirty").await.unwrap();
        assert!(!d.clean_or_absent(key(1)));
        assert_eq!(d.place_clean(key(1), &[3u8; 64]), Placed::Busy);
        d.write(7, 0, b"x").await.unwrap();
        assert_eq!(d.place_clean(key(2), &[4u8; 64]), Placed::NoRoom, "both buffers dirty");
        assert!(below.file(7).is_empty(), "nothing went down");
    });
}

/// A block in memory of its own is placed without a copy: the cache's
/// buffer takes that memory and gives back what it held. A dirty copy or a
/// cache full of dirty blocks refuses it, and it comes back as it was.
#[test]
fn a_block_placed_with_its_memory_is_not_copied() {
    rt().block_on(async {
        let below = Arc::new(Mem::new(64));
        let d = simple(2, WritePolicyKind::WriteBack, &below);
        let key = |i| BlockKey::new(7, i);
        assert_eq!(d.place_clean(key(0), &[1u8; 64]), Placed::Cached);
        let before = d.peek(key(0)).unwrap().as_ptr();
        let block = Block::from_slice(&[2u8; 64]);
        let at = block.as_ptr();
        let old = d.place_clean_block(key(0), block).expect("a clean copy gives way");
        let now = d.peek(key(0)).unwrap();
        assert_eq!(now.as_ptr(), at, "the cache holds the block's own memory");
        assert_eq!(&now[..], &[2u8; 64]);
        assert!(
            old.as_ptr() == before || old.capacity() == 0,
            "the memory given back is the buffer's own, or none"
        );
        d.write(7, 64 + 3, b"dirty").await.unwrap();
        let (why, back) = d.place_clean_block(key(1), Block::from_slice(&[3u8; 64])).unwrap_err();
        assert_eq!((why, &back[..]), (Placed::Busy, &[3u8; 64][..]));
        drop(now);
        d.write(7, 0, b"x").await.unwrap();
        let (why, back) = d.place_clean_block(key(2), Block::from_slice(&[4u8; 64])).unwrap_err();
        assert_eq!((why, &back[..]), (Placed::NoRoom, &[4u8; 64][..]), "both buffers dirty");
        assert!(below.file(7).is_empty(), "nothing went down");
    });
}

/// `read_pieces` answers as `read` does, within one block and across
/// several, one piece per block.
#[test]
fn read_pieces_matches_read() {
    rt().block_on(async {
        let below = Arc::new(Mem::new(64));
        let d = simple(4, WritePolicyKind::WriteBack, &below);
        let data: Vec<u8> = (0..200u8).collect();
        d.write(3, 0, &data).await.unwrap();
        for (off, len, n) in [(0u64, 64usize, 1), (10, 20, 1), (60, 100, 3), (0, 0, 0), (199, 1, 1)] {
            let got = d.read_pieces(3, off, len).await.unwrap();
            assert_eq!(got.len(), n, "{off}+{len}: pieces");
            assert_eq!(got.concat(), &data[off as usize..off as usize + len], "{off}+{len}");
        }
    });
}

/// A piece shares the cache's buffer: a write to the block while the piece
/// is still held changes the cache's copy only, and a write-back sends the
/// bytes as they were when it began.
#[test]
fn a_block_changed_while_a_piece_of_it_is_held_is_copied_first() {
    rt().block_on(async {
        let below = Arc::new(Mem::new(64));
        let d = simple(4, WritePolicyKind::WriteBack, &below);
        d.write(3, 0, &[1u8; 64]).await.unwrap();
        let held = d.read_pieces(3, 0, 64).await.unwrap();
        d.write(3, 8, &[2u8; 8]).await.unwrap();
        assert_eq!(held.concat(), vec![1u8; 64], "the piece kept the bytes it was given");
        let mut now = vec![0u8; 64];
        d.read(3, 0, &mut now).await.unwrap();
        let mut want = vec![1u8; 64];
        want[8..16].fill(2);
        assert_eq!(now, want);
        d.flush_all().await.unwrap();
        assert_eq!(below.file(3), want, "the write-back sent the block as written");
    });
}

/// Records the thread each write and fetch is first run on.
struct Threads(Mutex<Vec<std::thread::ThreadId>>);

impl Below for Threads {
    async fn write(&self, _key: BlockKey, _pieces: Vec<(u32, Bytes)>) -> Result<(), BelowError> {
        self.0.lock().push(std::thread::current().id());
        tokio::task::yield_now().await;
        Ok(())
    }
    async fn fetch(&self, _key: BlockKey) -> Result<Bytes, BelowError> {
        self.0.lock().push(std::thread::current().id());
        tokio::task::yield_now().await;
        Ok(Bytes::from(vec![7u8; 64]))
    }
}

#[test]
fn a_write_back_and_a_demand_fetch_start_on_the_thread_that_waits_for_them() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let below = Arc::new(Threads(Mutex::new(Vec::new())));
    let cache = cfg(8, WritePolicyKind::WriteBack, ReplacementKind::Lru, PrefetchKind::None);
    // `block_on` runs here, on no worker: I/O spawned would run on one.
    let here = std::thread::current().id();
    rt.block_on(async {
        let d = Driver::new(cache, 2, below.clone()).unwrap();
        d.write(1, 0, &[1u8; 64]).await.unwrap();
        d.flush_file(1).await.unwrap();
        let mut out = [0u8; 64];
        d.read(2, 0, &mut out).await.unwrap();
        assert_eq!(out, [7u8; 64]);
    });
    let seen = below.0.lock().clone();
    assert_eq!(seen.len(), 2, "one write-back and one fetch");
    assert!(
        seen.iter().all(|t| *t == here),
        "I/O was started on a runtime worker: {seen:?}"
    );
}

/// A level below that logs when each fetch starts and ends (`true`,
/// `false`); a fetch takes 1 to 16 ms by its block's index, so fetches
/// started together end one by one.
struct Logged {
    mem: Mem,
    log: Mutex<Vec<bool>>,
}

impl Below for Logged {
    async fn write(&self, key: BlockKey, pieces: Vec<(u32, Bytes)>) -> Result<(), BelowError> {
        self.mem.write(key, pieces).await
    }
    async fn fetch(&self, key: BlockKey) -> Result<Bytes, BelowError> {
        self.log.lock().push(true);
        tokio::time::sleep(Duration::from_millis(1 + key.index % 16)).await;
        let got = self.mem.fetch(key).await;
        self.log.lock().push(false);
        got
    }
}

/// A sequential reader's prefetches reach the level below in groups (a
/// data server's store queue reads each group as one run), not one at a
/// time as each earlier one ends: read-ahead tops its stream up half a
/// window at a time, and the driver starts prefetches only once half of
/// [`PREFETCH_DEPTH`] or fewer are in flight.
#[tokio::test(start_paused = true)]
async fn a_sequential_readers_prefetches_start_in_groups() {
    let blocks = 1000u64;
    let mem = Mem::new(64);
    mem.files.lock().insert(1, vec![9u8; (blocks * 64) as usize]);
    let below = Arc::new(Logged {
        mem,
        log: Mutex::new(Vec::new()),
    });
    let d = Driver::new(
        cfg(
            1024,
            WritePolicyKind::WriteBack,
            ReplacementKind::Lru,
            PrefetchKind::ReadAhead,
        ),
        2,
        below.clone(),
    )
    .unwrap();
    let mut out = [0u8; 64];
    for i in 0..blocks {
        d.read(1, i * 64, &mut out).await.unwrap();
        assert_eq!(out, [9u8; 64], "block {i}");
    }
    let log = below.log.lock().clone();
    // Each block once, and up to a window past the end (never opened
    // here, the file has no known end).
    let fetched = log.iter().filter(|s| **s).count() as u64;
    assert!((blocks..=blocks + 32).contains(&fetched), "{fetched} fetches");
    // Groups: runs of fetches started with none ending between them.
    let groups = log.split(|s| !*s).filter(|g| !g.is_empty()).count() as u64;
    assert!(
        groups <= blocks / 8,
        "{groups} groups of fetches for {blocks} blocks (534 when refilled one by one)"
    );
}

/// A level below that keeps what the cache evicts (`n-chance`'s last
/// copies, forwarded to a peer).
struct Forwarding {
    mem: Mem,
    evicted: Mutex<Vec<(BlockKey, Bytes)>>,
}

impl Below for Forwarding {
    async fn write(&self, key: BlockKey, pieces: Vec<(u32, Bytes)>) -> Result<(), BelowError> {
        self.mem.write(key, pieces).await
    }
    async fn fetch(&self, key: BlockKey) -> Result<Bytes, BelowError> {
        self.mem.fetch(key).await
    }
    fn wants_evictions(&self) -> bool {
        true
    }
    fn evicted(&self, key: BlockKey, data: Bytes) {
        self.evicted.lock().push((key, data));
    }
}

/// A write-through driver of two LRU buffers of 64 bytes over `below`.
fn two_write_through<B: Below>(below: Arc<B>) -> Driver<Arc<B>> {
    Driver::new(
        cfg(
            2,
            WritePolicyKind::WriteThrough,
            ReplacementKind::Lru,
            PrefetchKind::None,
        ),
        2,
        below,
    )
    .unwrap()
}

/// An evicted block goes out with its own bytes, whatever takes its
/// buffer next: a forwarded copy taken in, a clean block placed, a
/// write, a fetch. (The buffer's new bytes went out under the old key:
/// three `n-chance` mounts with 1 MiB caches read blocks of other files
/// in 34 of 300 rounds of rewrites.)
#[tokio::test]
async fn an_evicted_block_carries_its_own_bytes_whatever_takes_its_buffer() {
    const BS: usize = 64;
    let mem = Mem::new(BS as u32);
    mem.files
        .lock()
        .insert(1, (0..8 * BS).map(|i| (i / BS) as u8 + 1).collect());
    let below = Arc::new(Forwarding {
        mem,
        evicted: Mutex::new(Vec::new()),
    });
    let d = two_write_through(below.clone());
    let mut buf = [0u8; BS];
    // Blocks 0 and 1 fetched; each later step evicts the oldest.
    d.read(1, 0, &mut buf).await.unwrap();
    d.read(1, BS as u64, &mut buf).await.unwrap();
    assert!(d.adopt(BlockKey::new(2, 0), &[0xa0; BS]), "a forwarded copy taken in");
    assert_eq!(d.place_clean(BlockKey::new(3, 0), &[0xb0; BS]), Placed::Cached);
    d.write(4, 0, &[0xc0; BS]).await.unwrap();
    d.read(1, 5 * BS as u64, &mut buf).await.unwrap();
    d.read(1, 6 * BS as u64, &mut buf).await.unwrap();
    let evicted = below.evicted.lock().clone();
    let want = |k: &BlockKey| -> Vec<u8> {
        match k.file {
            1 => vec![k.index as u8 + 1; BS],
            2 => vec![0xa0; BS],
            3 => vec![0xb0; BS],
            _ => vec![0xc0; BS],
        }
    };
    assert!(evicted.len() >= 4, "{evicted:?}");
    for (k, data) in &evicted {
        assert_eq!(
            &data[..],
            &want(k)[..],
            "block {k:?} went out with another block's bytes"
        );
    }
}

/// A level below that fills the buffer the cache lends, recording the
/// memory it was lent (its address, 0 for none).
struct Lending {
    mem: Mem,
    lent: Mutex<Vec<usize>>,
}

impl Below for Lending {
    async fn write(&self, key: BlockKey, pieces: Vec<(u32, Bytes)>) -> Result<(), BelowError> {
        self.mem.write(key, pieces).await
    }
    async fn fetch(&self, key: BlockKey) -> Result<Bytes, BelowError> {
        self.mem.fetch(key).await
    }
    async fn fetch_into(&self, key: BlockKey, mut buf: Block, _prefetch: bool) -> (Block, Result<usize, BelowError>) {
        self.lent
            .lock()
            .push(if buf.capacity() > 0 { buf.as_ptr() as usize } else { 0 });
        let d = match self.mem.fetch(key).await {
            Ok(d) => d,
            Err(e) => return (buf, Err(e)),
        };
        // Stale bytes past what the block has must not show.
        buf.stale(self.mem.block_size as usize).fill(0xEE);
        buf[..d.len()].copy_from_slice(&d);
        (buf, Ok(d.len()))
    }
}

/// A fetch fills the memory of the block it replaces, lent to the level
/// below (the copy out of a connection's buffer saved, issue 14), unless
/// a piece of that block is still held, whose bytes then stay as they
/// were; a block shorter than a buffer reads as zeros past its end
/// whatever the lent memory held.
#[test]
fn a_fetch_fills_the_memory_of_the_block_it_replaces() {
    rt().block_on(async {
        const BS: usize = 64;
        let mem = Mem::new(BS as u32);
        let mut file: Vec<u8> = (0..4 * BS).map(|i| (i / BS) as u8 + 1).collect();
        file.truncate(3 * BS + 10);
        mem.files.lock().insert(1, file.clone());
        let below = Arc::new(Lending {
            mem,
            lent: Mutex::new(Vec::new()),
        });
        let d = two_write_through(below.clone());
        let mut buf = [0u8; BS];
        d.read(1, 0, &mut buf).await.unwrap();
        let at0 = d.read_pieces(1, 0, BS).await.unwrap()[0].as_ptr() as usize;
        d.read(1, BS as u64, &mut buf).await.unwrap();
        assert_eq!(*below.lent.lock(), vec![0, 0], "new buffers lend no memory");
        // Block 2 replaces block 0 (least recently used), in its memory.
        d.read(1, 2 * BS as u64, &mut buf).await.unwrap();
        assert_eq!(buf, [3u8; BS]);
        assert_eq!(
            *below.lent.lock().last().unwrap(),
            at0,
            "block 2 went into block 0's memory"
        );
        // Block 1 is evicted next while a piece of it is held: its memory
        // is not lent, and the piece keeps its bytes.
        let held = d.read_pieces(1, BS as u64, BS).await.unwrap();
        d.read(1, 2 * BS as u64, &mut buf).await.unwrap();
        d.read(1, 3 * BS as u64, &mut buf[..10]).await.unwrap();
        assert_ne!(*below.lent.lock().last().unwrap(), held[0].as_ptr() as usize);
        assert_eq!(&held[0][..], &[2u8; BS]);
        // Block 3 has 10 bytes: the rest reads as zeros.
        let mut whole = [9u8; BS];
        d.read(1, 3 * BS as u64, &mut whole).await.unwrap();
        assert_eq!(&whole[..10], &[4u8; 10]);
        assert!(whole[10..].iter().all(|&b| b == 0), "{whole:?}");
    });
}
