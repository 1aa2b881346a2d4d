//! The 1996 PACA results (Cortes, Girona & Labarta 1996 §7) in the model of
//! `crate::paca96`: 50 nodes, one disk, the paper's costs; the read shapes
//! REPRODUCE.md lists, on the Sprite-derived block trace.
//! `docs/reproduction/paca96.md` says what the trace lacks and where we
//! differ.

use super::{Check, Output, Rows, RunOptions, Scenario};
use crate::paca96::model::{run as run_model, Algo, Measured, Params};
use crate::paca96::trace;
use crate::plot::{Panel, Series};
use parcache_core::cooperative::CooperativeKind;
use serde::Serialize;

pub const SCENARIOS: [Scenario; 2] = [
    Scenario {
        name: "paca96-sprite",
        description: "1996 Fig. 1 and 4 (reads): the Sprite-derived block trace on 50 nodes, no cache, private caches, greedy, n-chance and lru-interleaved, 256 KiB–64 MiB per node",
    },
    Scenario {
        name: "paca96-bandwidth",
        description: "1996 Fig. 3 (reads): lru-interleaved against n-chance as local bandwidth grows from 1 to 12 times the remote, 1 and 16 MiB per node",
    },
];

/// Local bandwidth over remote bandwidth (Fig. 3's axis); local stays 320 Mbit/s.
pub(crate) const RATIOS: [f64; 7] = [1.0, 2.0, 3.0, 4.0, 5.0, 8.0, 12.0];
/// Cache sizes of the bandwidth sweep, KiB: under capacity pressure, and the base.
const SWEEP_KIB: [u64; 2] = [1024, 16384];

pub(crate) const ALGOS: [Algo; 5] = [
    Algo::NoCache,
    Algo::Cache(CooperativeKind::None),
    Algo::Cache(CooperativeKind::NChance { n: 0 }),
    Algo::Cache(CooperativeKind::NChance { n: 2 }),
    Algo::Cache(CooperativeKind::LruInterleaved),
];

/// Local cache per node, MiB (Fig. 4 varies it; 16 is the base).
const CACHE_KIB: [u64; 5] = [256, 1024, 4096, 16384, 65536];
/// The trace's 48 clients (§7.1).
const CLIENTS: usize = 48;
/// Consecutive references dealt to one client (the trace names none).
const RUN: usize = 64;
/// Measured from hour 15 of 48 (§7.1): the first 15/48 of the trace warm
/// the caches.
const WARM_NUM: usize = 15;
const WARM_DEN: usize = 48;

/// One measured point.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub algorithm: String,
    pub cache_kib: u64,
    pub read_ms: f64,
    pub local_hits: u64,
    pub remote_hits: u64,
    pub misses: u64,
    pub forwards: u64,
    pub critical_forwards: u64,
    /// Local over remote bandwidth (2.06 in the paper's base).
    pub bandwidth_ratio: f64,
    /// The session workload's extra columns (none for the block trace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub critical_cleans: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefetches: Option<u64>,
}

pub(crate) fn row(algo: Algo, kib: u64, ratio: f64, m: &Measured) -> Row {
    Row {
        algorithm: algo.to_string(),
        cache_kib: kib,
        bandwidth_ratio: ratio,
        read_ms: m.mean_read_ms(),
        local_hits: m.local_hits,
        remote_hits: m.remote_hits,
        misses: m.misses,
        forwards: m.forwards,
        critical_forwards: m.critical_forwards,
        prefetch: None,
        write_ms: None,
        critical_cleans: None,
        prefetches: None,
    }
}

pub fn runs(name: &str) -> Option<usize> {
    match name {
        "paca96-sprite" => Some(ALGOS.len() * CACHE_KIB.len()),
        "paca96-bandwidth" => Some(2 * RATIOS.len() * SWEEP_KIB.len()),
        _ => None,
    }
}

pub fn run(name: &str, opts: &RunOptions, done: &(dyn Fn() + Sync)) -> Option<Output> {
    let sweep = match name {
        "paca96-sprite" => false,
        "paca96-bandwidth" => true,
        _ => return None,
    };
    let refs = trace::sprite();
    let warm_up = refs.len() * WARM_NUM / WARM_DEN;
    let streams = crate::paca96::model::reads(&trace::by_client(refs, CLIENTS, RUN), warm_up);
    let base_ratio = {
        let c = crate::paca96::model::Costs::default();
        c.local_bps / c.remote_bps
    };
    let plan: Vec<(Algo, u64, f64)> = if sweep {
        [ALGOS[4], ALGOS[3]]
            .into_iter()
            .flat_map(|a| {
                SWEEP_KIB
                    .iter()
                    .flat_map(move |&kib| RATIOS.iter().map(move |&r| (a, kib, r)))
            })
            .collect()
    } else {
        ALGOS
            .into_iter()
            .flat_map(|a| CACHE_KIB.iter().map(move |&kib| (a, kib, base_ratio)))
            .collect()
    };
    let rows = crate::parallel::map(
        &plan,
        opts.threads,
        |&(a, kib, ratio)| {
            let mut p = Params::base(a, opts.seed);
            p.cache_blocks = (kib << 10) as usize / p.costs.block as usize;
            p.costs.remote_bps = p.costs.local_bps / ratio;
            row(a, kib, ratio, &run_model(&p, &streams))
        },
        done,
    );
    let checks = if sweep { bandwidth_checks(&rows) } else { checks(&rows) };
    let mut text = format!(
        "{} references to {} blocks, {CLIENTS} clients (runs of {RUN}), measured after the first {warm_up}\n\n",
        refs.len(),
        refs.iter().collect::<std::collections::HashSet<_>>().len()
    );
    text.push_str(&format!(
        "{:<16} {:>6} {:>6} {:>9} {:>9} {:>9} {:>8} {:>9} {:>9}\n",
        "algorithm", "KiB", "L/R", "read ms", "local", "remote", "misses", "forwards", "critical"
    ));
    for r in &rows {
        text.push_str(&format!(
            "{:<16} {:>6} {:>6.2} {:>9.3} {:>9} {:>9} {:>8} {:>9} {:>9}\n",
            r.algorithm,
            r.cache_kib,
            r.bandwidth_ratio,
            r.read_ms,
            r.local_hits,
            r.remote_hits,
            r.misses,
            r.forwards,
            r.critical_forwards
        ));
    }
    let series = |label: String, pick: &dyn Fn(&Row) -> Option<(f64, f64)>| Series {
        label,
        points: rows.iter().filter_map(pick).collect(),
    };
    let figure = if sweep {
        Panel {
            title: "lru-interleaved's read gain over n-chance".into(),
            x_label: "local bandwidth / remote bandwidth".into(),
            y_label: "ms per 8 KiB read".into(),
            series: [ALGOS[4], ALGOS[3]]
                .iter()
                .flat_map(|a| SWEEP_KIB.iter().map(move |&k| (a.to_string(), k)))
                .map(|(a, k)| {
                    series(format!("{a}, {k} KiB"), &|r: &Row| {
                        (r.algorithm == a && r.cache_kib == k).then_some((r.bandwidth_ratio, r.read_ms))
                    })
                })
                .collect(),
            reference: None,
        }
    } else {
        Panel {
            title: "average read time".into(),
            x_label: "local cache per node (log2 KiB: 8 = 256 KiB, 14 = 16 MiB)".into(),
            y_label: "ms per 8 KiB read".into(),
            series: ALGOS
                .iter()
                .map(|a| {
                    let a = a.to_string();
                    series(a.clone(), &|r: &Row| {
                        (r.algorithm == a).then_some(((r.cache_kib as f64).log2(), r.read_ms))
                    })
                })
                .collect(),
            reference: None,
        }
    };
    Some(Output {
        scenario: String::new(),
        description: String::new(),
        seed: opts.seed,
        rows: Rows::Paca(rows),
        checks,
        notes: vec![
            "A model of the paper's machine, not the real system. The trace is the LIRS set's Sprite block trace: reads only, no clients, no times; each run of 64 consecutive references goes to one of 48 clients in turn. Costs and simplifications are in docs/reproduction/paca96.md.".into(),
        ],
        figure: Some((name.to_string(), vec![figure])),
        text,
    })
}

fn ms(rows: &[Row], algo: &str, kib: u64) -> f64 {
    rows.iter()
        .find(|r| r.algorithm == algo && r.cache_kib == kib)
        .map_or(f64::NAN, |r| r.read_ms)
}

fn checks(rows: &[Row]) -> Vec<Check> {
    let base = 16384;
    let (li, nc, gr, no, none) = (
        ms(rows, "lru-interleaved", base),
        ms(rows, "n-chance(n=2)", base),
        ms(rows, "greedy", base),
        ms(rows, "no-cache", base),
        ms(rows, "none", base),
    );
    let gain = |a: f64, b: f64| (b / a - 1.0) * 100.0;
    let small = 256;
    let (li1, nc1, gr1) = (
        ms(rows, "lru-interleaved", small),
        ms(rows, "n-chance(n=2)", small),
        ms(rows, "greedy", small),
    );
    vec![
        Check {
            claim: "both cooperative algorithms nearly double read bandwidth over greedy and no cache (Fig. 1, 16 MiB per node)".into(),
            pass: gr.min(no) / li.max(nc) > 1.6,
            detail: format!(
                "lru-interleaved {li:.2}, n-chance {nc:.2}, greedy {gr:.2}, no cache {no:.2} ms (private caches {none:.2}): greedy x{:.2} of the slower cooperative one. The trace's 7,075 blocks fit in seven nodes' caches, so at 16 MiB nothing is evicted and greedy has every hit n-chance has",
                gr / li.max(nc)
            ),
        },
        Check {
            claim: "lru-interleaved reads a little faster than n-chance (3.1 %, 16 MiB per node)".into(),
            pass: li < nc,
            detail: format!(
                "{:+.1} % bandwidth: without capacity pressure n-chance's local hits (a message and a local copy) beat lru-interleaved's remote ones",
                gain(li, nc)
            ),
        },
        Check {
            claim: "under capacity pressure (256 KiB per node, 12.5 MiB in all against the trace's 55 MiB) cooperation nearly doubles greedy's read bandwidth".into(),
            pass: gr1 / li1.max(nc1) > 1.4 && gr1 / li1 > 1.8,
            detail: format!(
                "lru-interleaved {li1:.2}, n-chance {nc1:.2}, greedy {gr1:.2} ms: x{:.2} and x{:.2}",
                gr1 / li1,
                gr1 / nc1
            ),
        },
        Check {
            claim: "with small local caches lru-interleaved is much better than n-chance (Fig. 4)".into(),
            pass: li1 < nc1 && gain(li1, nc1) > gain(li, nc),
            detail: format!(
                "at {small} KiB {:+.1} %, at {base} KiB {:+.1} % bandwidth over n-chance",
                gain(li1, nc1),
                gain(li, nc)
            ),
        },
    ]
}

/// The smallest ratio at which n-chance reads faster than lru-interleaved.
fn crossover(rows: &[Row], kib: u64) -> Option<f64> {
    RATIOS.iter().copied().find(|&r| {
        let at = |a: &str| {
            rows.iter()
                .find(|x| x.algorithm == a && x.cache_kib == kib && x.bandwidth_ratio == r)
                .map_or(f64::NAN, |x| x.read_ms)
        };
        at("n-chance(n=2)") < at("lru-interleaved")
    })
}

fn bandwidth_checks(rows: &[Row]) -> Vec<Check> {
    let show = |c: Option<f64>| c.map_or("none up to 12".to_string(), |r| format!("{r}"));
    let (small, base) = (crossover(rows, 1024), crossover(rows, 16384));
    vec![
        Check {
            claim: "lru-interleaved beats n-chance while local bandwidth < 5 x remote; past that n-chance wins (Fig. 3)".into(),
            pass: small.is_some_and(|r| (3.0..=8.0).contains(&r)),
            detail: format!(
                "n-chance first faster at local/remote = {} with 1 MiB per node, {} with 16 MiB (no capacity pressure there)",
                show(small),
                show(base)
            ),
        },
        Check {
            claim: "equal local and remote bandwidth is lru-interleaved's best case".into(),
            pass: crossover(rows, 1024) != Some(1.0),
            detail: "at local/remote = 1 lru-interleaved reads faster with 1 MiB per node".into(),
        },
    ]
}
