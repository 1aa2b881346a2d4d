//! Tests of the cache protocol and of each write policy's semantics, citing
//! the paper section each behaviour comes from.

use super::*;
use crate::block::ByteRange;
use crate::write::WritePolicyKind as W;
use proptest::prelude::*;

const BS: u32 = 1024;

fn cache(buffers: usize, repl: ReplacementKind, write: W) -> Cache {
    Cache::new(CacheConfig {
        buffers,
        block_size: BS,
        replacement: repl,
        write,
        prefetch: PrefetchKind::None,
        aux_buffers: 0,
        syncer: None,
        fill_partial_writes: false,
    })
    .unwrap()
}

fn k(i: u64) -> BlockKey {
    BlockKey::new(1, i)
}

fn r(a: u32, b: u32) -> ByteRange {
    ByteRange::new(a, b)
}

/// Two buffers, write-back, one auxiliary buffer for delayed clean.
fn write_back_with_one_aux_buffer() -> Cache {
    Cache::new(CacheConfig {
        aux_buffers: 1,
        ..cache(2, ReplacementKind::Lru, W::WriteBack).config().clone()
    })
    .unwrap()
}

/// Writes `range` of block `i` as process `p`; panics if it blocks.
fn write(c: &mut Cache, t: u64, p: ProcId, i: u64, range: ByteRange) {
    match c.begin(Time(t), p, k(i), Access::Write(range)).unwrap() {
        Begin::Ready(b) => c.end(Time(t), p, b, Access::Write(range)).unwrap(),
        Begin::Blocked => panic!("write of block {i} by {p} blocked"),
    }
}

fn effects(c: &mut Cache) -> Vec<Effect> {
    std::iter::from_fn(|| c.poll_effect()).collect()
}

fn written_blocks(es: &[Effect]) -> Vec<u64> {
    es.iter()
        .filter_map(|e| {
            if let Effect::Write { key, .. } = e {
                Some(key.index)
            } else {
                None
            }
        })
        .collect()
}

fn complete_writes(c: &mut Cache, t: u64, es: &[Effect]) {
    for e in es {
        if let Effect::Write { token, .. } = e {
            c.write_done(Time(t), *token);
        }
    }
}

/// 1992 §3.3.2: "WriteFull issues the disk write when the buffer is full",
/// i.e. when the last byte arrives, whatever order the pieces came in.
#[test]
fn write_full_writes_exactly_when_the_last_byte_arrives() {
    let mut c = cache(8, ReplacementKind::TossImmediately, W::WriteFull);
    write(&mut c, 1, 0, 0, r(512, 768));
    write(&mut c, 2, 1, 0, r(0, 256));
    write(&mut c, 3, 2, 0, r(768, 1024));
    assert!(
        written_blocks(&effects(&mut c)).is_empty(),
        "no write before the block is full"
    );
    write(&mut c, 4, 3, 0, r(256, 512));
    let es = effects(&mut c);
    assert_eq!(written_blocks(&es), vec![0]);
    assert!(matches!(
        &es[0],
        Effect::Write {
            whole: true,
            cause: WriteCause::Policy,
            ..
        }
    ));
}

/// 1992 §3.3.2: WriteThru "forces a disk write on every file write request".
#[test]
fn write_through_writes_every_request_and_blocks_rewrites_until_done() {
    let mut c = cache(8, ReplacementKind::TossImmediately, W::WriteThrough);
    write(&mut c, 1, 0, 0, r(0, 256));
    let es = effects(&mut c);
    assert_eq!(written_blocks(&es), vec![0]);
    assert!(matches!(&es[0], Effect::Write { whole: false, .. }));
    // The buffer is not usable until its write completes.
    assert_eq!(
        c.begin(Time(2), 1, k(0), Access::Write(r(256, 512))).unwrap(),
        Begin::Blocked
    );
    complete_writes(&mut c, 3, &es);
    assert_eq!(effects(&mut c), vec![Effect::Resume { proc: 1 }]);
    write(&mut c, 4, 1, 0, r(256, 512));
    assert_eq!(
        written_blocks(&effects(&mut c)),
        vec![0],
        "a second write of the same block: a rewrite"
    );
}

/// 1992 §3.3.2: WriteBack "delays the disk write until the buffer is needed
/// for another block".
#[test]
fn write_back_writes_only_when_a_buffer_is_needed() {
    let mut c = cache(4, ReplacementKind::TossImmediately, W::WriteBack);
    for i in 0..4 {
        write(&mut c, i, 0, i, r(0, BS));
    }
    assert!(written_blocks(&effects(&mut c)).is_empty());
    // Block 4 needs a buffer: every dirty candidate starts down, oldest
    // first, the requester's own MRU block (which it is leaving) last; the
    // access waits for the first to finish.
    assert_eq!(
        c.begin(Time(10), 0, k(4), Access::Write(r(0, BS))).unwrap(),
        Begin::Blocked
    );
    let es = effects(&mut c);
    assert_eq!(written_blocks(&es), vec![0, 1, 2, 3]);
    assert!(es.iter().all(|e| matches!(
        e,
        Effect::Write {
            cause: WriteCause::Need,
            ..
        }
    )));
    assert_eq!(c.stats().stalls, 1);
    complete_writes(&mut c, 11, &es[..1]);
    assert_eq!(effects(&mut c), vec![Effect::Resume { proc: 0 }]);
    write(&mut c, 12, 0, 4, r(0, BS));
    assert!(!c.contains(k(0)) && c.contains(k(4)));
}

/// 1992 §3.3.2, write-full "becomes write-back" only for old unfilled
/// buffers: while a full block already on its way down will free a buffer,
/// a process that needs one waits for it rather than writing an unfinished
/// block early (a rewrite mistake).
#[test]
fn an_unfinished_block_is_not_written_while_relief_is_on_its_way() {
    let mut c = cache(3, ReplacementKind::TossImmediately, W::WriteFull);
    write(&mut c, 1, 0, 0, r(0, BS));
    let full = effects(&mut c);
    assert_eq!(written_blocks(&full), vec![0]);
    write(&mut c, 2, 0, 1, r(0, 512));
    write(&mut c, 3, 1, 2, r(512, BS));
    assert_eq!(
        c.begin(Time(4), 0, k(3), Access::Write(r(0, BS))).unwrap(),
        Begin::Blocked
    );
    assert!(
        written_blocks(&effects(&mut c)).is_empty(),
        "block 1 is unfinished: wait for block 0's write"
    );
    complete_writes(&mut c, 5, &full);
    assert_eq!(effects(&mut c), vec![Effect::Resume { proc: 0 }]);
    write(&mut c, 6, 0, 3, r(0, BS));
    assert_eq!(c.stats().immediate_writes, 0);
    // With nothing on its way, the unfinished block must go (write-back behaviour).
    let mut c = cache(2, ReplacementKind::TossImmediately, W::WriteFull);
    write(&mut c, 1, 0, 0, r(0, 512));
    write(&mut c, 2, 1, 1, r(0, 512));
    assert_eq!(
        c.begin(Time(3), 0, k(2), Access::Write(r(0, BS))).unwrap(),
        Begin::Blocked
    );
    assert_eq!(written_blocks(&effects(&mut c)), vec![0]);
}

/// 1992 §3.3.2: WriteFree "issues a disk write when the buffer becomes
/// replaceable" — under toss-immediately, when its process moves on.
#[test]
fn write_free_writes_when_the_buffer_becomes_replaceable() {
    let mut c = cache(4, ReplacementKind::TossImmediately, W::WriteFree);
    write(&mut c, 1, 0, 0, r(0, BS));
    write(&mut c, 2, 1, 0, r(0, 10));
    assert!(
        written_blocks(&effects(&mut c)).is_empty(),
        "block 0 is still an MRU block"
    );
    write(&mut c, 3, 0, 1, r(0, BS));
    assert!(
        written_blocks(&effects(&mut c)).is_empty(),
        "process 1 still has block 0 as MRU"
    );
    write(&mut c, 4, 1, 2, r(0, BS));
    assert_eq!(written_blocks(&effects(&mut c)), vec![0]);
}

/// 1992 §3.3.1: the cache refuses more processes than buffers.
#[test]
fn toss_immediately_refuses_more_processes_than_buffers() {
    let mut c = cache(2, ReplacementKind::TossImmediately, W::WriteFull);
    write(&mut c, 1, 0, 0, r(0, 10));
    write(&mut c, 2, 1, 1, r(0, 10));
    let e = c.begin(Time(3), 2, k(2), Access::Write(r(0, 10))).unwrap_err();
    assert_eq!(
        e,
        AccessError::Policy(PolicyError::TooFewBuffers {
            buffers: 2,
            processes: 3
        })
    );
    // With LRU the same cache serves any number of processes.
    let mut c = cache(2, ReplacementKind::Lru, W::WriteFull);
    for p in 0..5 {
        write(&mut c, p as u64, p, p as u64 % 2, r(0, 10));
    }
}

/// 1993 §3: Sprite's daemon writes blocks dirty for longer than `age`.
#[test]
fn periodic_writes_blocks_older_than_age() {
    let kind = W::Periodic {
        interval: Span::from_secs(5),
        age: Span::from_secs(30),
    };
    let mut c = cache(8, ReplacementKind::Lru, kind);
    let s = 1_000_000_000u64;
    write(&mut c, 2 * s, 0, 0, r(0, BS));
    write(&mut c, 12 * s, 0, 1, r(0, BS));
    assert_eq!(c.poll_timeout(), Some(Time(15 * s)));
    c.handle_timeout(Time(30 * s));
    assert!(written_blocks(&effects(&mut c)).is_empty());
    c.handle_timeout(Time(35 * s));
    assert_eq!(written_blocks(&effects(&mut c)), vec![0]);
    c.handle_timeout(Time(45 * s));
    assert_eq!(written_blocks(&effects(&mut c)), vec![1]);
}

/// 1993 §3: past the high limit, the LRU dirty blocks go down until the
/// count is below the low limit.
#[test]
fn threshold_drains_lru_dirty_blocks_from_high_to_low() {
    let mut c = cache(
        10,
        ReplacementKind::Lru,
        W::Threshold {
            high_pct: 80,
            low_pct: 30,
        },
    );
    for i in 0..8 {
        write(&mut c, i, 0, i, r(0, BS));
    }
    assert!(written_blocks(&effects(&mut c)).is_empty(), "8 of 10 is not above 80%");
    write(&mut c, 9, 0, 8, r(0, BS));
    let es = effects(&mut c);
    assert_eq!(written_blocks(&es), vec![0, 1, 2, 3, 4, 5], "9 dirty, down to 3");
    assert!(es.iter().all(|e| matches!(
        e,
        Effect::Write {
            cause: WriteCause::Threshold,
            ..
        }
    )));
    // 10 dirty of which 6 are on their way: only 4 - 3 = 1 more must go.
    write(&mut c, 10, 0, 9, r(0, BS));
    assert_eq!(
        written_blocks(&effects(&mut c)),
        vec![6],
        "in-flight writes count toward the drain"
    );
}

/// 1993 §3: a full cache writes its LRU dirty block per arriving block, and
/// counts it as an immediate write.
#[test]
fn lru_writeback_writes_one_block_per_arrival() {
    let mut c = cache(4, ReplacementKind::Lru, W::LruWriteback);
    for i in 0..4 {
        write(&mut c, i, 0, i, r(0, BS));
    }
    assert_eq!(
        c.begin(Time(5), 0, k(4), Access::Write(r(0, BS))).unwrap(),
        Begin::Blocked
    );
    let es = effects(&mut c);
    assert_eq!(written_blocks(&es), vec![0]);
    assert_eq!(c.stats().immediate_writes, 1);
    complete_writes(&mut c, 6, &es);
    assert_eq!(effects(&mut c), vec![Effect::Resume { proc: 0 }]);
    write(&mut c, 7, 0, 4, r(0, BS));
}

/// 1996 §3: with auxiliary buffers, a dirty victim is copied aside and the
/// requester proceeds at once; the number of aux buffers bounds it.
#[test]
fn delayed_clean_is_bounded_by_aux_buffers() {
    let mut c = write_back_with_one_aux_buffer();
    write(&mut c, 1, 0, 0, r(0, BS));
    write(&mut c, 2, 0, 1, r(0, BS));
    write(&mut c, 3, 0, 2, r(0, BS));
    let es = effects(&mut c);
    assert!(matches!(&es[..], [Effect::Write { detached: true, key, .. }] if key.index == 0));
    assert_eq!(
        c.begin(Time(4), 0, k(3), Access::Write(r(0, BS))).unwrap(),
        Begin::Blocked,
        "aux buffer in use"
    );
    // No aux buffer left: the scan falls back to writing in place (write-back
    // starts every dirty buffer it passes) and the access waits.
    let es2 = effects(&mut c);
    assert_eq!(written_blocks(&es2), vec![1, 2]);
    complete_writes(&mut c, 5, &es);
    assert!(effects(&mut c).contains(&Effect::Resume { proc: 0 }));
}

/// A block whose last copy is on its way down from an auxiliary buffer is
/// not fetched (nor prefetched) until that write lands: the level below
/// would answer with the bytes from before it. Found by the 2003 bypass
/// test on real servers, where a read after an eviction returned old bytes.
#[test]
fn a_block_written_from_an_aux_buffer_is_fetched_only_after_the_write_lands() {
    let mut c = write_back_with_one_aux_buffer();
    write(&mut c, 1, 0, 0, r(0, BS));
    write(&mut c, 2, 0, 1, r(0, BS));
    write(&mut c, 3, 0, 2, r(0, BS));
    let es = effects(&mut c);
    assert!(matches!(&es[..], [Effect::Write { detached: true, key, .. }] if key.index == 0));
    // A free buffer, so nothing but the write in flight stops a fetch.
    assert!(c.discard_block(Time(4), k(1)));
    assert!(c.has_say(k(0)) && !c.contains(k(0)));
    assert_eq!(
        c.begin(Time(5), 1, k(0), Access::Read(r(0, 10))).unwrap(),
        Begin::Blocked
    );
    let es2 = effects(&mut c);
    assert!(
        !es2.iter().any(|e| matches!(e, Effect::Fetch { .. })),
        "fetched too early: {es2:?}"
    );
    complete_writes(&mut c, 6, &es);
    assert!(effects(&mut c).contains(&Effect::Resume { proc: 1 }));
    assert!(!c.has_say(k(0)));
    assert_eq!(
        c.begin(Time(7), 1, k(0), Access::Read(r(0, 10))).unwrap(),
        Begin::Blocked
    );
    let es3 = effects(&mut c);
    assert!(
        es3.iter()
            .any(|e| matches!(e, Effect::Fetch { key, .. } if key.index == 0)),
        "{es3:?}"
    );
}

#[test]
fn syncer_writes_everything_dirty_on_its_interval() {
    let mut c = Cache::new(CacheConfig {
        buffers: 4,
        block_size: BS,
        write: W::WriteBack,
        syncer: Some(Span::from_secs(30)),
        ..CacheConfig::default()
    })
    .unwrap();
    assert_eq!(c.poll_timeout(), None);
    write(&mut c, 1, 0, 0, r(0, 100));
    assert_eq!(c.poll_timeout(), Some(Time(30_000_000_000)));
    c.handle_timeout(Time(30_000_000_000));
    let es = effects(&mut c);
    assert!(matches!(
        &es[..],
        [Effect::Write {
            cause: WriteCause::Sync,
            ..
        }]
    ));
    complete_writes(&mut c, 30_000_000_001, &es);
    assert_eq!(c.poll_timeout(), None, "nothing dirty, no timer");
}

#[test]
fn reads_miss_fetch_and_then_hit() {
    let mut c = cache(4, ReplacementKind::Lru, W::WriteBack);
    assert_eq!(
        c.begin(Time(1), 0, k(0), Access::Read(r(0, 10))).unwrap(),
        Begin::Blocked
    );
    let es = effects(&mut c);
    let Effect::Fetch {
        token, prefetch: false, ..
    } = es[0]
    else {
        panic!("{es:?}")
    };
    c.fetch_done(Time(2), token);
    assert_eq!(effects(&mut c), vec![Effect::Resume { proc: 0 }]);
    let Begin::Ready(b) = c.begin(Time(3), 0, k(0), Access::Read(r(0, 10))).unwrap() else {
        panic!()
    };
    c.end(Time(3), 0, b, Access::Read(r(0, 10))).unwrap();
    assert_eq!(
        (c.stats().read_misses, c.stats().read_hits),
        (1, 0),
        "the read the fetch was made for is a miss, not a hit as well"
    );
    read_fetching(&mut c, 4, 0, r(0, 10));
    assert_eq!(
        (c.stats().read_misses, c.stats().read_hits),
        (1, 1),
        "a second read hits"
    );
}

/// A partly written block read outside its written bytes is fetched, and
/// the fetch is told which bytes to keep.
#[test]
fn fetch_into_a_partly_written_buffer_keeps_its_bytes() {
    let mut c = cache(4, ReplacementKind::Lru, W::WriteBack);
    write(&mut c, 1, 0, 0, r(100, 200));
    assert_eq!(
        c.begin(Time(2), 0, k(0), Access::Read(r(0, 300))).unwrap(),
        Begin::Blocked
    );
    let es = effects(&mut c);
    assert!(matches!(&es[..], [Effect::Fetch { keep, .. }] if keep.ranges() == [r(100, 200)]));
}

#[test]
fn one_block_ahead_prefetches_when_the_device_is_idle() {
    let mut c = Cache::new(CacheConfig {
        buffers: 4,
        block_size: BS,
        prefetch: PrefetchKind::OneBlockAhead,
        ..CacheConfig::default()
    })
    .unwrap();
    c.open(Time(0), 1, 10);
    assert_eq!(
        c.begin(Time(1), 0, k(0), Access::Read(r(0, BS))).unwrap(),
        Begin::Blocked
    );
    let Effect::Fetch { token, .. } = effects(&mut c)[0] else {
        panic!()
    };
    c.fetch_done(Time(2), token);
    effects(&mut c);
    let Begin::Ready(b) = c.begin(Time(3), 0, k(0), Access::Read(r(0, BS))).unwrap() else {
        panic!()
    };
    c.end(Time(3), 0, b, Access::Read(r(0, BS))).unwrap();
    assert_eq!(
        c.poll_prefetch(Time(4), &mut |_| false),
        None,
        "busy device: no prefetch"
    );
    let Some(Effect::Fetch {
        key,
        prefetch: true,
        token,
        ..
    }) = c.poll_prefetch(Time(4), &mut |_| true)
    else {
        panic!()
    };
    assert_eq!(key, k(1));
    c.fetch_done(Time(5), token);
    let Begin::Ready(b) = c.begin(Time(6), 0, k(1), Access::Read(r(0, BS))).unwrap() else {
        panic!()
    };
    c.end(Time(6), 0, b, Access::Read(r(0, BS))).unwrap();
    assert_eq!(c.stats().prefetch_hits, 1);
}

/// Reads blocks `order` of a 64-block file one after another, every fetch
/// and prefetch answered at once; returns (prefetches, prefetch hits).
fn read_blocks(prefetch: PrefetchKind, order: &[u64]) -> (u64, u64) {
    let mut c = Cache::new(CacheConfig {
        buffers: 32,
        block_size: BS,
        prefetch,
        ..CacheConfig::default()
    })
    .unwrap();
    c.open(Time(0), 1, 64);
    let mut t = 1;
    for &i in order {
        t += 1;
        let b = loop {
            match c.begin(Time(t), 0, k(i), Access::Read(r(0, BS))).unwrap() {
                Begin::Ready(b) => break b,
                Begin::Blocked => {
                    for e in effects(&mut c) {
                        if let Effect::Fetch { token, .. } = e {
                            c.fetch_done(Time(t), token);
                        }
                    }
                }
            }
        };
        c.end(Time(t), 0, b, Access::Read(r(0, BS))).unwrap();
        while let Some(Effect::Fetch { token, .. }) = c.poll_prefetch(Time(t), &mut |_| true) {
            c.fetch_done(Time(t), token);
        }
    }
    (c.stats().prefetches, c.stats().prefetch_hits)
}

/// Cortes et al. 1996 §7.4: one-block-ahead fetches a block nobody uses
/// after each random read; read-ahead fetches none, and keeps a sequential
/// reader's blocks coming as one-block-ahead does.
#[test]
fn read_ahead_fetches_nothing_for_random_reads_and_everything_for_sequential_ones() {
    let random = [40, 7, 22, 51, 3, 30, 12, 60, 18, 45];
    assert_eq!(read_blocks(PrefetchKind::OneBlockAhead, &random), (10, 0));
    assert_eq!(read_blocks(PrefetchKind::ReadAhead, &random), (0, 0));
    let sequential: Vec<u64> = (0..64).collect();
    assert_eq!(read_blocks(PrefetchKind::OneBlockAhead, &sequential), (63, 63));
    assert_eq!(read_blocks(PrefetchKind::ReadAhead, &sequential), (63, 63));
    // Starting mid-file, the second block in a row starts the stream.
    let mid: Vec<u64> = (20..40).collect();
    assert_eq!(
        read_blocks(PrefetchKind::ReadAhead, &mid),
        (23, 18),
        "and runs 4 to 8 blocks past its end (a window of a quarter of the 32 buffers, topped up half at a time)"
    );
}

#[test]
fn full_file_on_open_queues_every_block_and_never_evicts_dirty_data() {
    let mut c = Cache::new(CacheConfig {
        buffers: 3,
        block_size: BS,
        prefetch: PrefetchKind::FullFileOnOpen,
        ..CacheConfig::default()
    })
    .unwrap();
    write(&mut c, 0, 0, 100, r(0, 1));
    c.open(Time(1), 1, 5);
    let mut fetched = vec![];
    while let Some(Effect::Fetch { key, .. }) = c.poll_prefetch(Time(2), &mut |_| true) {
        fetched.push(key.index);
    }
    assert_eq!(fetched, vec![0, 1], "two free buffers; the dirty one is not taken");
    assert!(written_blocks(&effects(&mut c)).is_empty());
}

/// Opening a file larger than the cache queues no more blocks than the
/// cache holds: the rest would evict the first, and a 1 TiB volume's
/// every block once filled the memory of a trace replay.
#[test]
fn full_file_on_open_queues_no_more_than_the_cache_holds() {
    let mut c = Cache::new(CacheConfig {
        buffers: 3,
        block_size: BS,
        prefetch: PrefetchKind::FullFileOnOpen,
        ..CacheConfig::default()
    })
    .unwrap();
    c.open(Time(1), 1, 1 << 40);
    assert_eq!(c.prefetch_queue.len(), 3);
    let mut fetched = vec![];
    while let Some(Effect::Fetch { key, .. }) = c.poll_prefetch(Time(2), &mut |_| true) {
        fetched.push(key.index);
    }
    assert_eq!(fetched, vec![0, 1, 2]);
}

#[test]
fn out_of_block_ranges_and_unpinned_ends_are_refused() {
    let mut c = cache(4, ReplacementKind::Lru, W::WriteBack);
    assert!(matches!(
        c.begin(Time(0), 0, k(0), Access::Write(r(0, BS + 1))),
        Err(AccessError::OutOfBlock { end: 1025, .. })
    ));
    assert_eq!(
        c.end(Time(0), 0, BufId(0), Access::Write(r(0, 1))),
        Err(AccessError::NotPinned(0))
    );
}

#[test]
fn switching_policy_at_run_time_keeps_dirty_data() {
    let mut c = cache(8, ReplacementKind::Lru, W::WriteBack);
    for i in 0..6 {
        write(&mut c, i, 0, i, r(0, BS));
    }
    c.set_write_policy(W::Threshold {
        high_pct: 50,
        low_pct: 25,
    });
    assert_eq!(written_blocks(&effects(&mut c)), vec![0, 1, 2, 3]);
    assert_eq!(c.dirty_buffers(), 6);
}

/// Whole-block levels: a partial write into a block fetches it first, and
/// once filled the buffer goes down whole.
#[test]
fn partial_writes_fill_the_block_first_when_asked() {
    let mut c = Cache::new(CacheConfig {
        buffers: 4,
        block_size: BS,
        write: W::WriteThrough,
        fill_partial_writes: true,
        ..CacheConfig::default()
    })
    .unwrap();
    write(&mut c, 0, 0, 1, r(0, BS));
    assert!(
        matches!(&effects(&mut c)[..], [Effect::Write { whole: true, .. }]),
        "a whole-block write needs no fill"
    );
    assert_eq!(
        c.begin(Time(1), 0, k(0), Access::Write(r(0, 10))).unwrap(),
        Begin::Blocked
    );
    let es = effects(&mut c);
    let [Effect::Fetch { token, .. }] = es[..] else {
        panic!("{es:?}")
    };
    c.fetch_done(Time(2), token);
    assert_eq!(effects(&mut c), vec![Effect::Resume { proc: 0 }]);
    write(&mut c, 3, 0, 0, r(0, 10));
    assert!(matches!(&effects(&mut c)[..], [Effect::Write { whole: true, .. }]));
    assert_eq!(c.stats().fill_fetches, 1);
}

// ---- property tests: a model driver with byte contents ----

#[derive(Clone, Debug)]
enum Op {
    Write {
        p: u32,
        block: u64,
        start: u32,
        len: u32,
        seed: u8,
    },
    Read {
        p: u32,
        block: u64,
        start: u32,
        len: u32,
    },
    Complete(usize),
    Tick(u64),
    /// `flush_file` of file 1 or 2.
    FlushFile(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u32..3, 0u64..7, 0u32..BS, 1u32..BS, any::<u8>())
            .prop_map(|(p, block, start, len, seed)| Op::Write { p, block, start, len: len.min(BS - start).max(1).min(BS - start), seed }),
        2 => (0u32..3, 0u64..7, 0u32..BS, 1u32..BS)
            .prop_map(|(p, block, start, len)| Op::Read { p, block, start, len: len.min(BS - start) }),
        2 => (0usize..8).prop_map(Op::Complete),
        1 => (1u64..20).prop_map(Op::Tick),
        1 => (1u64..3).prop_map(Op::FlushFile),
    ]
}

fn any_write_policy() -> impl Strategy<Value = W> {
    prop_oneof![
        Just(W::WriteThrough),
        Just(W::WriteBack),
        Just(W::WriteFree),
        Just(W::WriteFull),
        Just(W::Periodic {
            interval: Span(5),
            age: Span(7)
        }),
        Just(W::Threshold {
            high_pct: 60,
            low_pct: 20
        }),
        Just(W::LruWriteback),
    ]
}

/// A driver that keeps real bytes: buffers, the level below, and I/O in flight.
struct Model {
    c: Cache,
    bufs: Vec<Vec<u8>>,
    disk: FxHashMap<BlockKey, Vec<u8>>,
    truth: FxHashMap<BlockKey, Vec<u8>>,
    pending: Vec<(Effect, Vec<u8>)>,
    resumed: Vec<ProcId>,
    now: u64,
}

impl Model {
    fn new(cfg: CacheConfig) -> Model {
        let n = cfg.buffers;
        Model {
            c: Cache::new(cfg).unwrap(),
            bufs: vec![vec![0; BS as usize]; n],
            disk: FxHashMap::default(),
            truth: FxHashMap::default(),
            pending: vec![],
            resumed: vec![],
            now: 0,
        }
    }

    fn drain(&mut self) {
        while let Some(e) = self.c.poll_effect() {
            match &e {
                Effect::Write { buf, .. } => {
                    let snap = self.bufs[buf.index()].clone();
                    self.pending.push((e, snap));
                }
                Effect::Fetch { .. } => self.pending.push((e, vec![])),
                Effect::Resume { proc } => self.resumed.push(*proc),
                Effect::Evicted { .. } => unreachable!("evictions are not reported here"),
            }
        }
    }

    fn complete(&mut self, i: usize) {
        if self.pending.is_empty() {
            return;
        }
        let (e, snap) = self.pending.remove(i % self.pending.len());
        self.now += 1;
        match e {
            Effect::Write { token, key, dirty, .. } => {
                let d = self.disk.entry(key).or_insert_with(|| vec![0; BS as usize]);
                for rg in dirty.ranges() {
                    d[rg.start as usize..rg.end as usize].copy_from_slice(&snap[rg.start as usize..rg.end as usize]);
                }
                self.c.write_done(Time(self.now), token);
            }
            Effect::Fetch {
                token, key, buf, keep, ..
            } => {
                let d = self.disk.get(&key).cloned().unwrap_or_else(|| vec![0; BS as usize]);
                let b = &mut self.bufs[buf.index()];
                let mut merged = d;
                for rg in keep.ranges() {
                    merged[rg.start as usize..rg.end as usize].copy_from_slice(&b[rg.start as usize..rg.end as usize]);
                }
                *b = merged;
                self.c.fetch_done(Time(self.now), token);
            }
            Effect::Resume { .. } | Effect::Evicted { .. } => unreachable!(),
        }
        self.drain();
    }

    /// Runs one access to completion, completing I/O while it is blocked.
    fn access(&mut self, p: u32, key: BlockKey, a: Access, seed: u8) -> Result<(), TestCaseError> {
        for _ in 0..10_000 {
            self.now += 1;
            self.resumed.retain(|&q| q != p);
            let begun = self.c.begin(Time(self.now), p, key, a).unwrap();
            // Effects first: a detached write must copy its bytes out before
            // the buffer is reused.
            self.drain();
            match begun {
                Begin::Ready(b) => {
                    let rg = a.range();
                    let (s, e) = (rg.start as usize, rg.end as usize);
                    match a {
                        Access::Write(_) => {
                            let bytes: Vec<u8> = (s..e).map(|i| seed.wrapping_add(i as u8) | 1).collect();
                            self.bufs[b.index()][s..e].copy_from_slice(&bytes);
                            self.truth.entry(key).or_insert_with(|| vec![0; BS as usize])[s..e].copy_from_slice(&bytes);
                        }
                        Access::Read(_) => {
                            let want = self.truth.get(&key).map(|t| t[s..e].to_vec()).unwrap_or(vec![0; e - s]);
                            prop_assert_eq!(
                                &self.bufs[b.index()][s..e],
                                &want[..],
                                "read of {:?} returned stale bytes",
                                key
                            );
                        }
                    }
                    self.c.end(Time(self.now), p, b, a).unwrap();
                    self.drain();
                    return Ok(());
                }
                Begin::Blocked => {
                    self.drain();
                    while !self.resumed.contains(&p) {
                        prop_assert!(!self.pending.is_empty(), "process {} blocked with no I/O in flight", p);
                        self.complete(0);
                    }
                }
            }
        }
        Err(TestCaseError::fail("access never completed"))
    }

    fn finish(&mut self) -> Result<(), TestCaseError> {
        self.c.flush(Time(self.now));
        self.drain();
        while !self.pending.is_empty() {
            self.complete(0);
        }
        prop_assert!(self.c.is_clean(), "dirty data left after flush");
        for (key, bytes) in &self.truth {
            let d = self.disk.get(key).cloned().unwrap_or_else(|| vec![0; BS as usize]);
            prop_assert_eq!(&d, bytes, "block {:?} on disk differs from what was written", key);
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Under every policy, with I/O completing in arbitrary orders: reads see
    /// the last bytes written, nothing deadlocks, and after a flush every
    /// written byte is on the level below and no dirty byte is left.
    #[test]
    fn no_written_byte_is_lost(write in any_write_policy(),
                               toss in any::<bool>(),
                               aux in 0usize..2,
                               prefetch in 0usize..PrefetchKind::ALL.len(),
                               fill in any::<bool>(),
                               ops in proptest::collection::vec(op(), 1..120)) {
        let mut m = Model::new(CacheConfig {
            buffers: 4,
            block_size: BS,
            replacement: if toss { ReplacementKind::TossImmediately } else { ReplacementKind::Lru },
            write,
            prefetch: PrefetchKind::ALL[prefetch],
            aux_buffers: aux,
            syncer: Some(Span(13)),
            fill_partial_writes: fill,
        });
        m.c.open(Time(0), 1, 7);
        // Odd blocks are another file's: a file's flush leaves the other's.
        let key = |b: u64| if b % 2 == 1 { BlockKey::new(2, b) } else { k(b) };
        for o in ops {
            match o {
                Op::Write { p, block, start, len, seed } =>
                    m.access(p, key(block), Access::Write(r(start, start + len)), seed)?,
                Op::Read { p, block, start, len } => m.access(p, key(block), Access::Read(r(start, start + len)), 0)?,
                Op::FlushFile(f) => {
                    while !m.pending.is_empty() {
                        m.complete(0);
                    }
                    m.c.flush_file(Time(m.now), f);
                    m.drain();
                    for (e, _) in &m.pending {
                        if let Effect::Write { key, .. } = e {
                            prop_assert_eq!(key.file, f, "the flush of file {} wrote {:?}", f, key);
                        }
                    }
                    while !m.pending.is_empty() {
                        m.complete(0);
                    }
                    prop_assert!(m.c.file_is_clean(f), "file {} dirty after its flush", f);
                }
                Op::Complete(i) => m.complete(i),
                Op::Tick(d) => {
                    m.now += d;
                    if m.c.poll_timeout().is_some_and(|t| t.0 <= m.now) {
                        m.c.handle_timeout(Time(m.now));
                        m.drain();
                    }
                    if let Some(e) = m.c.poll_prefetch(Time(m.now), &mut |_| true) {
                        m.pending.push((e, vec![]));
                    }
                }
            }
            prop_assert!(m.c.file_index_is_exact(), "the per-file index went wrong");
        }
        m.finish()?;
    }
}

/// A failed demand fetch frees the empty buffer it was filling and resumes
/// its waiter, who can start over; the next fetch of the block works.
#[test]
fn a_failed_fetch_frees_its_buffer_and_resumes_the_waiter() {
    let mut c = cache(1, ReplacementKind::Lru, W::WriteBack);
    assert_eq!(
        c.begin(Time(1), 0, k(0), Access::Read(r(0, 10))).unwrap(),
        Begin::Blocked
    );
    let es = effects(&mut c);
    let Some(Effect::Fetch { token, .. }) = es.first().cloned() else {
        panic!("expected a fetch, got {es:?}")
    };
    c.fetch_failed(Time(2), token);
    assert!(effects(&mut c).contains(&Effect::Resume { proc: 0 }));
    assert!(!c.contains(k(0)));
    assert_eq!(c.stats().fetch_failures, 1);
    // The only buffer is usable again, for another block.
    assert_eq!(
        c.begin(Time(3), 0, k(5), Access::Write(r(0, 4))).unwrap(),
        Begin::Ready(BufId(0))
    );
}

/// A failed fetch into a buffer that holds dirty bytes keeps them.
#[test]
fn a_failed_fetch_keeps_dirty_bytes() {
    let mut c = cache(2, ReplacementKind::Lru, W::WriteBack);
    write(&mut c, 1, 0, 0, r(0, 10));
    assert_eq!(
        c.begin(Time(2), 0, k(0), Access::Read(r(0, 100))).unwrap(),
        Begin::Blocked
    );
    let Some(Effect::Fetch { token, keep, .. }) = effects(&mut c).first().cloned() else {
        panic!("expected a fetch")
    };
    assert!(keep.covers(r(0, 10)));
    c.fetch_failed(Time(3), token);
    assert!(c.contains(k(0)));
    assert_eq!(c.dirty_buffers(), 1);
    c.flush(Time(4));
    assert_eq!(written_blocks(&effects(&mut c)), vec![0]);
}

/// Discarding a removed file drops its dirty blocks unwritten and frees
/// their buffers; blocks before `from` and other files stay.
#[test]
fn discard_file_drops_dirty_blocks_from_a_block_on() {
    let mut c = cache(4, ReplacementKind::Lru, W::WriteBack);
    write(&mut c, 1, 0, 0, r(0, 10));
    write(&mut c, 2, 0, 1, r(0, 10));
    write(&mut c, 3, 0, 2, r(0, 10));
    match c
        .begin(Time(4), 0, BlockKey::new(2, 0), Access::Write(r(0, 1)))
        .unwrap()
    {
        Begin::Ready(b) => c.end(Time(4), 0, b, Access::Write(r(0, 1))).unwrap(),
        Begin::Blocked => panic!("blocked"),
    }
    assert_eq!(c.discard_file(Time(5), 1, 1), 0);
    assert!(c.contains(k(0)) && !c.contains(k(1)) && !c.contains(k(2)));
    assert_eq!(c.stats().discarded, 2);
    assert_eq!(c.dirty_buffers(), 2);
    c.flush(Time(6));
    let mut w = written_blocks(&effects(&mut c));
    w.sort();
    assert_eq!(w, vec![0, 0], "file 1 block 0 and file 2 block 0");
}

/// A buffer being written down is not discarded; the caller learns so.
#[test]
fn discard_file_leaves_busy_buffers() {
    let mut c = cache(2, ReplacementKind::Lru, W::WriteThrough);
    write(&mut c, 1, 0, 0, r(0, 10));
    let es = effects(&mut c);
    assert_eq!(written_blocks(&es), vec![0]);
    assert_eq!(c.discard_file(Time(2), 1, 0), 1);
    complete_writes(&mut c, 3, &es);
    assert_eq!(c.discard_file(Time(4), 1, 0), 0);
    assert!(!c.contains(k(0)));
}

/// The cooperative tier's hooks (1996 §4): a clean, whole block replaced
/// is reported before its buffer is reused (a partial or dirty one is
/// not), a forwarded block is adopted as most recently used, and only a
/// clean, whole block is resident for a peer.
#[test]
fn evictions_are_reported_and_forwarded_blocks_adopted() {
    let mut c = cache(2, ReplacementKind::Lru, W::WriteBack);
    c.report_evictions(true);
    assert!(c.adopt(Time(0), k(0)).is_some(), "a free buffer takes it");
    assert!(c.resident(k(0)).is_some(), "adopted whole and clean");
    assert_eq!(c.adopt(Time(0), k(0)), None, "held already");
    write(&mut c, 1, 0, 1, r(0, 10));
    assert!(c.resident(k(1)).is_none(), "partial and dirty: not for peers");
    assert!(effects(&mut c).is_empty());
    // A third block: the clean, whole k(0) goes (LRU), and is reported.
    write(&mut c, 2, 0, 2, r(0, BS));
    let es = effects(&mut c);
    assert!(
        matches!(es.as_slice(), [Effect::Evicted { key, .. }] if *key == k(0)),
        "{es:?}"
    );
    // No clean buffer left (both dirty): nothing can be adopted.
    assert_eq!(c.adopt(Time(3), k(7)), None);
    // Without reporting, a replaced block leaves silently.
    let mut q = cache(1, ReplacementKind::Lru, W::WriteBack);
    q.adopt(Time(0), k(0)).unwrap();
    write(&mut q, 1, 0, 1, r(0, BS));
    assert!(effects(&mut q).is_empty());
}

/// A block another node's write made stale is forgotten, dirty bytes
/// unwritten; one in use is left alone. A prefetch decided elsewhere
/// (lru-interleaved's reader) is queued like the policy's own.
#[test]
fn blocks_are_discarded_one_at_a_time_and_prefetched_on_request() {
    let mut c = cache(4, ReplacementKind::Lru, W::WriteBack);
    write(&mut c, 0, 0, 1, r(0, BS));
    write(&mut c, 0, 0, 2, r(0, BS));
    assert_eq!(c.dirty_buffers(), 2);
    assert!(c.discard_block(Time(1), k(1)));
    assert!(!c.contains(k(1)) && c.contains(k(2)));
    assert_eq!(c.dirty_buffers(), 1, "the dropped block is not written");
    assert!(effects(&mut c).is_empty());
    assert!(c.discard_block(Time(1), k(9)), "a block not held: nothing to do");
    // In use (being read into): left alone.
    assert!(matches!(
        c.begin(Time(2), 1, k(3), Access::Read(r(0, BS))).unwrap(),
        Begin::Blocked
    ));
    assert!(!c.discard_block(Time(2), k(3)));
    // A prefetch asked for from outside is handed out when the device is idle.
    c.prefetch_block(Time(3), k(5));
    let got = c.poll_prefetch(Time(3), &mut |_| true);
    assert!(
        matches!(got, Some(Effect::Fetch { key, prefetch: true, .. }) if key == k(5)),
        "{got:?}"
    );
}

/// Reads `range` of block `i`, answering every fetch at once; returns the
/// fetches it took (none for a hit).
fn read_fetching(c: &mut Cache, t: u64, i: u64, range: ByteRange) -> Vec<IoToken> {
    let mut fetched = Vec::new();
    loop {
        match c.begin(Time(t), 0, k(i), Access::Read(range)).unwrap() {
            Begin::Ready(b) => {
                c.end(Time(t), 0, b, Access::Read(range)).unwrap();
                return fetched;
            }
            Begin::Blocked => {
                for e in effects(c) {
                    if let Effect::Fetch { token, .. } = e {
                        fetched.push(token);
                        c.fetch_done(Time(t), token);
                    }
                }
            }
        }
    }
}

/// `discard_clean` (drop-caches) forgets clean idle blocks only: a dirty
/// block and one being read stay, and the freed buffers serve new blocks.
#[test]
fn discard_clean_forgets_clean_idle_blocks_only() {
    let mut c = cache(4, ReplacementKind::Lru, W::WriteBack);
    write(&mut c, 1, 0, 0, r(0, BS));
    for i in [1, 2] {
        assert_eq!(read_fetching(&mut c, 2, i, r(0, 10)).len(), 1);
    }
    // Block 3 is being read: its fetch is still in flight.
    assert_eq!(
        c.begin(Time(3), 1, k(3), Access::Read(r(0, 10))).unwrap(),
        Begin::Blocked
    );
    let in_flight = effects(&mut c);
    assert!(in_flight
        .iter()
        .any(|e| matches!(e, Effect::Fetch { key, .. } if *key == k(3))));
    assert_eq!(c.discard_clean(Time(4)), 2, "blocks 1 and 2");
    assert!(
        c.contains(k(0)) && c.contains(k(3)),
        "the dirty block and the busy one stay"
    );
    assert!(!c.contains(k(1)) && !c.contains(k(2)));
    assert_eq!(read_fetching(&mut c, 5, 2, r(0, 10)).len(), 1, "a miss now");
}

/// A small file's content for a close that reports it instead of pushing
/// it: dirty bytes count as held (not for `clean_prefix`), a prefix with a
/// byte never written or fetched does not, nor one being written down.
#[test]
fn a_held_prefix_counts_dirty_bytes_and_none_under_io() {
    let mut c = cache(4, ReplacementKind::Lru, W::WriteBack);
    write(&mut c, 1, 0, 0, r(0, 100));
    assert!(c.held_prefix(k(0), 100).is_some());
    assert!(c.clean_prefix(k(0), 100).is_none(), "dirty bytes are not clean");
    assert!(c.held_prefix(k(0), 101).is_none(), "byte 100 was never written");
    assert!(c.held_prefix(k(1), 1).is_none(), "a block not here");
    c.flush_file(Time(2), 1);
    let es = effects(&mut c);
    assert!(!written_blocks(&es).is_empty(), "{es:?}");
    assert!(c.held_prefix(k(0), 100).is_none(), "being written down");
    complete_writes(&mut c, 3, &es);
    assert!(c.held_prefix(k(0), 100).is_some() && c.clean_prefix(k(0), 100).is_some());
}
