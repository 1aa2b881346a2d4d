//! The 2003 discretionary caching results (Vilayannur et al. 2003 §4–5) in
//! the model of `crate::vilayannur03`: out-of-core array sweeps through a
//! local cache (400 KB) and a global cache, with the paper's own request
//! costs (Table 1 and 2). `docs/reproduction/vilayannur03.md` says what the
//! model leaves out and where we differ.

use super::{Check, Output, Rows, RunOptions, Scenario};
use crate::plot::{Panel, Series};
use crate::vilayannur03::costs::Costs;
use crate::vilayannur03::model::{run as run_model, Measured, Params, Scheme};
use crate::vilayannur03::workload::{generate, Kernel, Order};
use serde::Serialize;

pub const SCENARIOS: [Scenario; 3] = [
    Scenario {
        name: "vilayannur03-problem",
        description: "2003 Fig. 2: a tomcatv-like out-of-core sweep against problem size, global cache 20 MB and 200 MB: no cache, cache everything, file hints, segment hints",
    },
    Scenario {
        name: "vilayannur03-cache",
        description: "2003 Fig. 3: the same sweep at problem size 1500 against global cache size, 10–400 MB",
    },
    Scenario {
        name: "vilayannur03-runtime",
        description: "2003 Fig. 4 and 5: runtime bypass (thresholds 3, 20, 50, harvest) against caching everything, on row, column and tiled sweeps and on random access (poor locality), global cache 20 MB",
    },
];

/// Local cache: 400 KB (Fig. 2), in 4 KiB blocks.
const LOCAL_BLOCKS: usize = 100;
/// Iterations of the kernel.
const ITERATIONS: usize = 3;
const SIZES: [u64; 6] = [600, 900, 1200, 1500, 1800, 2100];
const GLOBAL_MIB: [usize; 6] = [10, 20, 50, 100, 200, 400];
const RUNTIME_SIZES: [u64; 3] = [900, 1500, 2100];
const SCHEMES: [Scheme; 4] = [
    Scheme::NoCache,
    Scheme::CacheAll,
    Scheme::FileHints,
    Scheme::SegmentHints,
];
const RUNTIME_SCHEMES: [Scheme; 5] = [
    Scheme::NoCache,
    Scheme::CacheAll,
    Scheme::Runtime(3),
    Scheme::Runtime(20),
    Scheme::Runtime(50),
];
const KERNELS: [Kernel; 4] = [
    Kernel::Tomcatv(Order::Row),
    Kernel::Tomcatv(Order::Column),
    Kernel::Tomcatv(Order::Tiled),
    Kernel::Random,
];

/// One measured point.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub kernel: String,
    pub n: u64,
    pub global_mib: usize,
    pub scheme: String,
    #[serde(flatten)]
    pub m: Measured,
}

fn plan(name: &str) -> Option<Vec<(Kernel, u64, usize, Scheme)>> {
    let row = Kernel::Tomcatv(Order::Row);
    Some(match name {
        "vilayannur03-problem" => [20, 200]
            .into_iter()
            .flat_map(|g| SIZES.into_iter().flat_map(move |n| SCHEMES.map(|s| (row, n, g, s))))
            .collect(),
        "vilayannur03-cache" => GLOBAL_MIB
            .into_iter()
            .flat_map(|g| SCHEMES.map(|s| (row, 1500, g, s)))
            .collect(),
        "vilayannur03-runtime" => KERNELS
            .into_iter()
            .flat_map(|k| {
                RUNTIME_SIZES
                    .into_iter()
                    .flat_map(move |n| RUNTIME_SCHEMES.map(|s| (k, n, 20, s)))
            })
            .collect(),
        _ => return None,
    })
}

pub fn runs(name: &str) -> Option<usize> {
    plan(name).map(|p| p.len())
}

pub fn run(name: &str, opts: &RunOptions, done: &(dyn Fn() + Sync)) -> Option<Output> {
    let plan = plan(name)?;
    let rows = crate::parallel::map(
        &plan,
        opts.threads,
        |&(k, n, g, s)| {
            let w = generate(k, n, ITERATIONS, opts.seed);
            let p = Params {
                scheme: s,
                local_blocks: LOCAL_BLOCKS,
                global_blocks: g * 256,
                costs: Costs::paper(),
            };
            Row {
                kernel: k.to_string(),
                n,
                global_mib: g,
                scheme: s.to_string(),
                m: run_model(&p, &w),
            }
        },
        done,
    );
    let mut text = format!(
        "7 arrays of n x n doubles, {ITERATIONS} iterations of 3 nests; local cache 400 KB; 4 KiB blocks, 4-block segments\n\n{:<15} {:>5} {:>6} {:<14} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8}\n",
        "kernel", "n", "global", "scheme", "seconds", "local", "g-hits", "g-miss", "direct", "kept-out"
    );
    for r in &rows {
        text.push_str(&format!(
            "{:<15} {:>5} {:>4}MB {:<14} {:>9.1} {:>8} {:>8} {:>8} {:>8} {:>8}\n",
            r.kernel,
            r.n,
            r.global_mib,
            r.scheme,
            r.m.seconds,
            r.m.local_hits,
            r.m.global_hits,
            r.m.global_misses,
            r.m.direct,
            r.m.kept_out
        ));
    }
    let series = |label: String, pick: &dyn Fn(&Row) -> Option<(f64, f64)>| Series {
        label,
        points: rows.iter().filter_map(pick).collect(),
    };
    let by_n = |title: String, kernel: String, g: usize, schemes: &[Scheme]| Panel {
        title,
        x_label: "problem size n (arrays of n x n doubles)".into(),
        y_label: "I/O time, s".into(),
        series: schemes
            .iter()
            .map(|s| {
                let (s, k) = (s.to_string(), kernel.clone());
                series(s.clone(), &|r: &Row| {
                    (r.scheme == s && r.kernel == k && r.global_mib == g).then_some((r.n as f64, r.m.seconds))
                })
            })
            .collect(),
        reference: None,
    };
    let (panels, checks) = match name {
        "vilayannur03-problem" => (
            vec![
                by_n("(a) global cache 20 MB".into(), "tomcatv-row".into(), 20, &SCHEMES),
                by_n("(b) global cache 200 MB".into(), "tomcatv-row".into(), 200, &SCHEMES),
            ],
            problem_checks(&rows),
        ),
        "vilayannur03-cache" => (
            vec![Panel {
                title: "problem size 1500".into(),
                x_label: "global cache (log2 MB)".into(),
                y_label: "I/O time, s".into(),
                series: SCHEMES
                    .iter()
                    .map(|s| {
                        let s = s.to_string();
                        series(s.clone(), &|r: &Row| {
                            (r.scheme == s).then_some(((r.global_mib as f64).log2(), r.m.seconds))
                        })
                    })
                    .collect(),
                reference: None,
            }],
            cache_checks(&rows),
        ),
        _ => (
            KERNELS
                .iter()
                .map(|k| by_n(k.to_string(), k.to_string(), 20, &RUNTIME_SCHEMES))
                .collect(),
            runtime_checks(&rows),
        ),
    };
    Some(Output {
        scenario: String::new(),
        description: String::new(),
        seed: opts.seed,
        rows: Rows::Vilayannur(rows),
        checks,
        notes: vec![
            "A model of the paper's cluster, not the real system: one node, request times from the paper's Table 1 and 2 (one I/O server), the core's local cache, global cache, segment bits and runtime bypass. The kernel is tomcatv-like, not tomcatv; the compiler's hints are computed from the program's requests. docs/reproduction/vilayannur03.md has the details.".into(),
        ],
        figure: Some((name.to_string(), panels)),
        text,
    })
}

fn secs(rows: &[Row], kernel: &str, n: u64, g: usize, scheme: &str) -> f64 {
    rows.iter()
        .find(|r| r.kernel == kernel && r.n == n && r.global_mib == g && r.scheme == scheme)
        .map_or(f64::NAN, |r| r.m.seconds)
}

fn problem_checks(rows: &[Row]) -> Vec<Check> {
    let at = |n, g, s| secs(rows, "tomcatv-row", n, g, s);
    let big = *SIZES.last().expect("sizes");
    let (none, all, file, seg) = (
        at(big, 20, "no-cache"),
        at(big, 20, "cache-all"),
        at(big, 20, "file-hints"),
        at(big, 20, "segment-hints"),
    );
    let gain = |n| 1.0 - at(n, 20, "segment-hints") / at(n, 20, "no-cache");
    let seg_beats_file: Vec<u64> = SIZES
        .into_iter()
        .filter(|&n| at(n, 20, "segment-hints") <= at(n, 20, "file-hints"))
        .collect();
    let all_beats_none_200: Vec<u64> = SIZES
        .into_iter()
        .filter(|&n| at(n, 200, "cache-all") < at(n, 200, "no-cache"))
        .collect();
    vec![
        Check {
            claim: "caching everything loses to caching nothing at large problem sizes (Fig. 2a, 20 MB)".into(),
            pass: all > none,
            detail: format!("n = {big}: cache everything {all:.1} s, no cache {none:.1} s"),
        },
        Check {
            claim: "file-level hints beat caching everything but still lose to caching nothing (Fig. 2a)".into(),
            pass: file <= all && file > none,
            detail: format!("n = {big}: file hints {file:.1} s against {all:.1} and {none:.1} s"),
        },
        Check {
            claim: "segment hints beat caching nothing, more as the problem grows (Fig. 2a)".into(),
            pass: seg < none && gain(big) >= gain(SIZES[SIZES.len() - 3]),
            detail: format!(
                "n = {big}: {seg:.1} s against {none:.1} s; gain over no cache {:.1} % at n = {}, {:.1} % at n = {big}",
                gain(SIZES[SIZES.len() - 3]) * 100.0,
                SIZES[SIZES.len() - 3],
                gain(big) * 100.0
            ),
        },
        Check {
            claim: "segment hints beat file hints (Fig. 2a)".into(),
            pass: seg_beats_file.len() == SIZES.len(),
            detail: format!("at or below file hints at n = {seg_beats_file:?} of {SIZES:?}"),
        },
        Check {
            claim: "with a 200 MB global cache caching everything beats caching nothing (Fig. 2b)".into(),
            pass: all_beats_none_200.len() == SIZES.len(),
            detail: format!("faster at n = {all_beats_none_200:?} of {SIZES:?}"),
        },
    ]
}

fn cache_checks(rows: &[Row]) -> Vec<Check> {
    let at = |g, s| secs(rows, "tomcatv-row", 1500, g, s);
    let gain = |g| 1.0 - at(g, "segment-hints") / at(g, "cache-all");
    let (small, large) = (GLOBAL_MIB[0], *GLOBAL_MIB.last().expect("sizes"));
    vec![
        Check {
            claim: "selective caching gains most over caching everything with small global caches (Fig. 3)".into(),
            pass: gain(small) > gain(large),
            detail: format!(
                "segment hints against cache everything: {:.1} % at {small} MB, {:.1} % at {large} MB",
                gain(small) * 100.0,
                gain(large) * 100.0
            ),
        },
        Check {
            claim: "caching everything becomes the better choice only with large global caches (Fig. 3)".into(),
            pass: at(large, "cache-all") <= at(large, "segment-hints") * 1.02
                && at(small, "cache-all") > at(small, "segment-hints"),
            detail: format!(
                "cache everything {:.1} / {:.1} s, segment hints {:.1} / {:.1} s at {small} / {large} MB",
                at(small, "cache-all"),
                at(large, "cache-all"),
                at(small, "segment-hints"),
                at(large, "segment-hints")
            ),
        },
    ]
}

fn runtime_checks(rows: &[Row]) -> Vec<Check> {
    let big = *RUNTIME_SIZES.last().expect("sizes");
    let at = |k: &Kernel, s: &str| secs(rows, &k.to_string(), big, 20, s);
    let gain = |k: &Kernel, s: &str| 1.0 - at(k, s) / at(k, "cache-all");
    let gains: Vec<String> = KERNELS
        .iter()
        .map(|k| {
            format!(
                "{k} {:.1} / {:.1} / {:.1} %",
                gain(k, "runtime(3)") * 100.0,
                gain(k, "runtime(20)") * 100.0,
                gain(k, "runtime(50)") * 100.0
            )
        })
        .collect();
    let best = |k: &Kernel| gain(k, "runtime(20)").max(gain(k, "runtime(50)"));
    let random = &Kernel::Random;
    let row = &Kernel::Tomcatv(Order::Row);
    vec![
        Check {
            claim: "runtime bypass with thresholds 20–50 cuts time over caching everything, by 4–33 % (Fig. 4, 5)"
                .into(),
            pass: KERNELS
                .iter()
                .all(|k| gain(k, "runtime(20)") > 0.0 && gain(k, "runtime(50)") > 0.0)
                && KERNELS.iter().all(|k| (0.04..=0.33).contains(&best(k))),
            detail: format!("at n = {big}, gain of thresholds 3 / 20 / 50: {}", gains.join("; ")),
        },
        Check {
            claim: "at larger problem sizes the higher threshold (20) beats the lower one (3) (Fig. 4)".into(),
            pass: at(row, "runtime(20)") <= at(row, "runtime(3)"),
            detail: format!(
                "{row} at n = {big}: threshold 20 {:.1} s, threshold 3 {:.1} s",
                at(row, "runtime(20)"),
                at(row, "runtime(3)")
            ),
        },
        Check {
            claim: "the benefit is largest for poor locality (Fig. 5: DB2, mining)".into(),
            pass: KERNELS[..3].iter().all(|k| best(random) > best(k)),
            detail: format!(
                "best gain: random {:.1} %, tomcatv row / column / tiled {:.1} / {:.1} / {:.1} %",
                best(random) * 100.0,
                best(&KERNELS[0]) * 100.0,
                best(&KERNELS[1]) * 100.0,
                best(&KERNELS[2]) * 100.0
            ),
        },
    ]
}
