//! Tests of the 1992 model: closed-form results of the bare queueing model,
//! invariants under every policy, and determinism.

use parcache_core::{ReplacementKind, WritePolicyKind as W};
use parcache_sim::kotz92::{run, Compute, KotzParams, OverheadDist, Overheads, ParamError, Pattern};
use proptest::prelude::*;

fn bare(pattern: Pattern, buffers: usize) -> KotzParams {
    KotzParams {
        pattern,
        buffers,
        overheads: Overheads::ZERO,
        ..KotzParams::default()
    }
}

/// The anchor: lw1 without a cache, 4000 one-block records, 30 ms
/// disks and no overheads takes exactly 120 s.
#[test]
fn bare_lw1_without_cache_takes_exactly_120_s() {
    let r = run(&bare(Pattern::Lw1, 0)).unwrap();
    assert_eq!(r.seconds, 120.0);
    assert_eq!(r.disk_writes, 4000);
}

/// gw without a cache: 20 processes take records 0..19, one per disk, and
/// stay in step: 200 rounds of 30 ms.
#[test]
fn bare_gw_without_cache_is_the_ideal_6_s() {
    assert_eq!(run(&bare(Pattern::Gw, 0)).unwrap().seconds, 6.0);
}

/// seg without a cache: every process starts on disk 0 and they form a
/// pipeline, the last one entering it 19 services late: (200 + 19) × 30 ms.
#[test]
fn bare_seg_without_cache_is_a_pipeline() {
    let r = run(&bare(Pattern::Seg, 0)).unwrap();
    assert!((r.seconds - 6.57).abs() < 1e-9, "{}", r.seconds);
}

/// Quarter-block records without a cache: the first quarter of a block is a
/// plain write, the other three read the block first (read-modify-write).
#[test]
fn partial_blocks_without_cache_are_read_modify_writes() {
    let r = run(&KotzParams {
        record_blocks: 0.25,
        ..bare(Pattern::Lw1, 0)
    })
    .unwrap();
    assert_eq!(r.disk_writes, 16_000);
    assert_eq!(r.disk_reads, 12_000);
    assert!(
        (r.seconds - 4000.0 * (0.030 + 3.0 * 0.060)).abs() < 1e-6,
        "{}",
        r.seconds
    );
}

/// With compute, lw1's one process cannot beat its own compute time.
#[test]
fn lw1_with_compute_is_bounded_by_compute() {
    let p = KotzParams {
        compute: Some(Compute::PAPER),
        ..bare(Pattern::Lw1, 80)
    };
    let r = run(&p).unwrap();
    assert!(r.seconds >= 110.0 && r.seconds < 125.0, "{}", r.seconds);
}

#[test]
fn bad_parameters_are_refused_with_the_option_named() {
    let e = run(&KotzParams {
        buffers: 19,
        ..KotzParams::default()
    })
    .unwrap_err();
    assert!(matches!(e, ParamError::Policy { buffers: 19, .. }), "{e}");
    // LRU has no per-process minimum.
    run(&KotzParams {
        buffers: 5,
        replacement: ReplacementKind::Lru,
        ..KotzParams::default()
    })
    .unwrap();
}

#[test]
fn same_seed_same_result_different_seed_different_workload() {
    let p = KotzParams {
        compute: Some(Compute::PAPER),
        record_blocks: 0.75,
        ..KotzParams::default()
    };
    let a = serde_json::to_string(&run(&p).unwrap()).unwrap();
    let b = serde_json::to_string(&run(&p).unwrap()).unwrap();
    assert_eq!(a, b);
    let c = serde_json::to_string(&run(&KotzParams { seed: 8, ..p }).unwrap()).unwrap();
    assert_ne!(a, c);
}

fn any_policy() -> impl Strategy<Value = W> {
    prop_oneof![
        Just(W::WriteThrough),
        Just(W::WriteBack),
        Just(W::WriteFree),
        Just(W::WriteFull),
        Just(W::PERIODIC_DEFAULT),
        Just(W::Threshold {
            high_pct: 80,
            low_pct: 40
        }),
        Just(W::LruWriteback),
    ]
}

fn any_pattern() -> impl Strategy<Value = Pattern> {
    prop_oneof![Just(Pattern::Lw1), Just(Pattern::Seg), Just(Pattern::Gw)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Under every policy, pattern and record size: the run ends (no
    /// deadlock), every block reaches disk, no dirty byte is left (the model
    /// refuses to finish otherwise), and nothing beats the ideal time.
    #[test]
    fn every_block_reaches_disk_under_every_policy(
        pattern in any_pattern(), policy in any_policy(), quarters in 1u32..=24,
        buffers in 20usize..=120, compute in any::<bool>(), lru in any::<bool>(), seed in 0u64..1000,
    ) {
        let p = KotzParams {
            pattern, policy, buffers, seed,
            record_blocks: quarters as f64 / 4.0,
            compute: compute.then_some(Compute::PAPER),
            replacement: if lru { ReplacementKind::Lru } else { ReplacementKind::TossImmediately },
            blocks: 800, procs: 10, disks: 10,
            ..KotzParams::default()
        };
        let r = run(&p).unwrap();
        prop_assert_eq!(r.blocks_written, 800);
        prop_assert!(r.disk_writes >= 800);
        prop_assert!(r.seconds >= p.ideal_seconds() * 0.999, "{} < ideal {}", r.seconds, p.ideal_seconds());
    }

    /// 1992 §3.3.2: under write-full in gw, with room for each process's two
    /// unfinished blocks and the one it copies into (3 per process), every
    /// block goes to disk exactly once, at any record size.
    #[test]
    fn write_full_writes_every_block_exactly_once_in_gw(
        quarters in 1u32..=40, per_proc in 3usize..=10, compute in any::<bool>(),
        dist in prop_oneof![Just(OverheadDist::Constant), Just(OverheadDist::Exponential)], seed in 0u64..1000,
    ) {
        let p = KotzParams {
            pattern: Pattern::Gw, policy: W::WriteFull, buffers: 20 * per_proc, seed,
            record_blocks: quarters as f64 / 4.0, compute: compute.then_some(Compute::PAPER),
            overhead_dist: dist,
            ..KotzParams::default()
        };
        let r = run(&p).unwrap();
        prop_assert_eq!(r.rewrite_mistakes, 0);
        prop_assert_eq!(r.disk_writes, 4000);
        prop_assert_eq!(r.blocks_written, 4000);
    }
}
