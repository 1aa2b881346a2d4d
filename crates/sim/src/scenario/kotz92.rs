//! The scenarios of Kotz & Ellis 1992: the caching table (§4.3) and
//! Figures 1–5 (§4.4). Parameters are the paper's (§4.1); see
//! `docs/reproduction/kotz92.md` for the comparison.

use super::{Check, Output, Rows, RunOptions, Scenario};
use crate::kotz92::{self as model, Compute, KotzParams, Overheads, Pattern, FIT_CELLS};
use crate::parallel;
use crate::plot::{Panel, Series};
use parcache_core::WritePolicyKind as W;
use serde::{Deserialize, Serialize};

pub const SCENARIOS: [Scenario; 6] = [
    Scenario {
        name: "kotz92-table",
        description: "1992 §4.3 table: lw1/seg/gw, 1- and ¼-block records, no cache vs write-back",
    },
    Scenario {
        name: "kotz92-fig1",
        description: "1992 Fig. 1: gw, cache size 20–200 buffers, four write policies",
    },
    Scenario {
        name: "kotz92-fig2",
        description: "1992 Fig. 2: gw with 30 ms compute, cache size 20–200, four write policies",
    },
    Scenario {
        name: "kotz92-fig3",
        description: "1992 Fig. 3: lw1 with and without compute, cache size 20–200",
    },
    Scenario {
        name: "kotz92-fig4",
        description: "1992 Fig. 4: seg, cache size 20–200 (all processes start on one disk)",
    },
    Scenario {
        name: "kotz92-fig5",
        description: "1992 Fig. 5: record size 0.25–10 blocks, 80 buffers, gw/lw1/seg",
    },
];

/// The policies the paper's figures compare.
const POLICIES: [W; 4] = [W::WriteThrough, W::WriteBack, W::WriteFree, W::WriteFull];
const SIZES: [usize; 10] = [20, 40, 60, 80, 100, 120, 140, 160, 180, 200];
/// Record sizes of Fig. 5: the paper's integral sizes (which divide 4000
/// blocks) and non-integral sizes between them.
pub const RECORD_SIZES: [f64; 18] = [
    0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.5, 4.0, 4.5, 5.0, 6.5, 7.5, 8.0, 9.5, 10.0,
];

/// The published table (§4.3), seconds.
const PAPER_TABLE: [(Pattern, [f64; 4]); 3] = [
    (Pattern::Lw1, [127.3, 16.4, 853.1, 55.7]),
    (Pattern::Seg, [6.9, 7.2, 63.3, 7.7]),
    (Pattern::Gw, [6.3, 6.1, 103.0, 8.7]),
];

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TableRow {
    pub pattern: Pattern,
    pub record_blocks: f64,
    /// "none" or "write-back".
    pub cache: String,
    pub seconds: f64,
    pub paper_seconds: f64,
    pub error_pct: f64,
    /// One of the two cells the overhead constants were fitted on.
    pub fitted: bool,
    pub disk_writes: u64,
    pub rewrite_mistakes: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FigureRow {
    pub pattern: Pattern,
    pub policy: String,
    pub buffers: usize,
    pub record_blocks: f64,
    pub compute_ms: f64,
    pub seconds: f64,
    pub ideal_seconds: f64,
    pub disk_writes: u64,
    pub rewrite_mistakes: u64,
    pub stalls: u64,
    pub mean_utilisation: f64,
}

fn base(seed: u64) -> KotzParams {
    KotzParams {
        seed,
        ..KotzParams::default()
    }
}

fn table_plan(seed: u64) -> Vec<KotzParams> {
    let mut v = vec![];
    for (pattern, _) in PAPER_TABLE {
        for (record_blocks, buffers) in [(1.0, 0), (1.0, 80), (0.25, 0), (0.25, 80)] {
            v.push(KotzParams {
                pattern,
                record_blocks,
                buffers,
                policy: W::WriteBack,
                ..base(seed)
            });
        }
    }
    v
}

fn figure_plan(name: &str, seed: u64) -> Option<Vec<KotzParams>> {
    let sweep = |pattern, compute: Option<Compute>| {
        let mut v = vec![];
        for policy in POLICIES {
            for buffers in SIZES {
                v.push(KotzParams {
                    pattern,
                    buffers,
                    policy,
                    compute,
                    ..base(seed)
                });
            }
        }
        v
    };
    Some(match name {
        "kotz92-fig1" => sweep(Pattern::Gw, None),
        "kotz92-fig2" => sweep(Pattern::Gw, Some(Compute::PAPER)),
        "kotz92-fig3" => [sweep(Pattern::Lw1, None), sweep(Pattern::Lw1, Some(Compute::PAPER))].concat(),
        "kotz92-fig4" => sweep(Pattern::Seg, None),
        "kotz92-fig5" => {
            let mut v = vec![];
            for pattern in [Pattern::Gw, Pattern::Lw1, Pattern::Seg] {
                for policy in POLICIES {
                    for record_blocks in RECORD_SIZES {
                        v.push(KotzParams {
                            pattern,
                            record_blocks,
                            buffers: 80,
                            policy,
                            ..base(seed)
                        });
                    }
                }
            }
            v
        }
        _ => return None,
    })
}

pub fn runs(name: &str) -> Option<usize> {
    if name == "kotz92-table" {
        return Some(table_plan(0).len());
    }
    figure_plan(name, 0).map(|p| p.len())
}

pub fn run(name: &str, opts: &RunOptions, done: &(dyn Fn() + Sync)) -> Option<Output> {
    let scenario = SCENARIOS.iter().find(|s| s.name == name)?;
    let mut out = if name == "kotz92-table" {
        run_table(opts, done)
    } else {
        run_figure(name, opts, done)?
    };
    out.scenario = scenario.name.to_string();
    out.description = scenario.description.to_string();
    out.seed = opts.seed;
    Some(out)
}

fn run_all(plan: &[KotzParams], opts: &RunOptions, done: &(dyn Fn() + Sync)) -> Vec<model::KotzResult> {
    parallel::map(
        plan,
        opts.threads,
        |p| model::run(p).expect("scenario parameters are valid"),
        done,
    )
}

fn constants_note() -> String {
    let o = Overheads::FITTED;
    format!(
        "model constants: request overhead {:.3} ms per call, buffer overhead {:.3} ms per block through the cache \
         fitted on {} {} {}-block ({} s) and {} {} {}-block ({} s); every other \
         value is a prediction",
        o.request_ms,
        o.buffer_ms,
        FIT_CELLS[0].0,
        FIT_CELLS[0].1,
        FIT_CELLS[0].2,
        FIT_CELLS[0].3,
        FIT_CELLS[1].0,
        FIT_CELLS[1].1,
        FIT_CELLS[1].2,
        FIT_CELLS[1].3
    )
}

fn run_table(opts: &RunOptions, done: &(dyn Fn() + Sync)) -> Output {
    let plan = table_plan(opts.seed);
    let results = run_all(&plan, opts, done);
    let mut rows = vec![];
    let mut checks = vec![];
    for (i, (p, r)) in plan.iter().zip(&results).enumerate() {
        let paper = PAPER_TABLE[i / 4].1[i % 4];
        let cache = if p.buffers == 0 { "none" } else { "write-back" };
        let fitted = FIT_CELLS
            .iter()
            .any(|c| c.0 == p.pattern.name() && c.1 == cache && c.2 == p.record_blocks);
        let error_pct = (r.seconds / paper - 1.0) * 100.0;
        if !fitted {
            checks.push(Check {
                claim: format!(
                    "{} {}-block {}: within 20% of {} s",
                    p.pattern, p.record_blocks, cache, paper
                ),
                pass: error_pct.abs() <= 20.0,
                detail: format!("{:.1} s ({:+.1}%)", r.seconds, error_pct),
            });
        }
        rows.push(TableRow {
            pattern: p.pattern,
            record_blocks: p.record_blocks,
            cache: cache.to_string(),
            seconds: round3(r.seconds),
            paper_seconds: paper,
            error_pct: (error_pct * 10.0).round() / 10.0,
            fitted,
            disk_writes: r.disk_writes,
            rewrite_mistakes: r.rewrite_mistakes,
        });
    }
    let mut text = String::from(
        "Total execution time, seconds: ours (paper, error). * = fitted cell\n\n\
         pattern | one-block no cache     | one-block cache        | quarter-block no cache | quarter-block cache\n\
         --------+------------------------+------------------------+------------------------+-----------------------\n",
    );
    for chunk in rows.chunks(4) {
        text.push_str(&format!("{:<7} ", chunk[0].pattern.name()));
        for r in chunk {
            let cell = format!(
                "{:.1} ({:.1}, {:+.1}%){}",
                r.seconds,
                r.paper_seconds,
                r.error_pct,
                if r.fitted { "*" } else { "" }
            );
            text.push_str(&format!("| {cell:<22} "));
        }
        text.push('\n');
    }
    Output {
        scenario: String::new(),
        description: String::new(),
        seed: opts.seed,
        rows: Rows::Table(rows),
        checks,
        notes: vec![constants_note()],
        figure: None,
        text,
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn run_figure(name: &str, opts: &RunOptions, done: &(dyn Fn() + Sync)) -> Option<Output> {
    let plan = figure_plan(name, opts.seed)?;
    let results = run_all(&plan, opts, done);
    let rows: Vec<FigureRow> = plan
        .iter()
        .zip(&results)
        .map(|(p, r)| FigureRow {
            pattern: p.pattern,
            policy: p.policy.name().to_string(),
            buffers: p.buffers,
            record_blocks: p.record_blocks,
            compute_ms: p.compute.map_or(0.0, |c| c.mean_ms),
            seconds: round3(r.seconds),
            ideal_seconds: r.ideal_seconds,
            disk_writes: r.disk_writes,
            rewrite_mistakes: r.rewrite_mistakes,
            stalls: r.stalls,
            mean_utilisation: (r.mean_utilisation * 1000.0).round() / 1000.0,
        })
        .collect();
    let fig5 = name == "kotz92-fig5";
    let x_of = |r: &FigureRow| {
        if fig5 {
            r.record_blocks
        } else {
            r.buffers as f64
        }
    };
    let x_label = if fig5 {
        "record size (blocks)"
    } else {
        "cache size (one-block buffers)"
    };
    let groups: Vec<(Pattern, f64)> = {
        let mut g: Vec<(Pattern, f64)> = vec![];
        for r in &rows {
            if !g.iter().any(|&(p, c)| p == r.pattern && c == r.compute_ms) {
                g.push((r.pattern, r.compute_ms));
            }
        }
        g
    };
    let panels: Vec<Panel> = groups
        .iter()
        .map(|&(pattern, compute)| {
            let sel: Vec<&FigureRow> = rows
                .iter()
                .filter(|r| r.pattern == pattern && r.compute_ms == compute)
                .collect();
            Panel {
                title: format!(
                    "{}{}",
                    pattern,
                    if compute > 0.0 {
                        format!(", compute {compute} ms")
                    } else {
                        String::from(", no compute")
                    }
                ),
                x_label: x_label.into(),
                y_label: "total time (s)".into(),
                series: POLICIES
                    .iter()
                    .map(|pol| Series {
                        label: pol.name().to_string(),
                        points: sel
                            .iter()
                            .filter(|r| r.policy == pol.name())
                            .map(|r| (x_of(r), r.seconds))
                            .collect(),
                    })
                    .collect(),
                reference: sel.first().map(|r| ("ideal".to_string(), r.ideal_seconds)),
            }
        })
        .collect();
    let mut text = String::new();
    for &(pattern, compute) in &groups {
        text.push_str(&format!(
            "{pattern}, compute {compute} ms — seconds\n{:>8}",
            if fig5 { "record" } else { "buffers" }
        ));
        for p in POLICIES {
            text.push_str(&format!(" {:>13}", p.name()));
        }
        text.push('\n');
        let mut xs: Vec<f64> = vec![];
        for x in rows
            .iter()
            .filter(|r| r.pattern == pattern && r.compute_ms == compute)
            .map(x_of)
        {
            if !xs.contains(&x) {
                xs.push(x);
            }
        }
        for x in xs {
            text.push_str(&format!("{x:>8}"));
            for p in POLICIES {
                let r = rows
                    .iter()
                    .find(|r| r.pattern == pattern && r.compute_ms == compute && r.policy == p.name() && x_of(r) == x)
                    .expect("full grid");
                text.push_str(&format!(" {:>13.2}", r.seconds));
            }
            text.push('\n');
        }
        text.push('\n');
    }
    let checks = figure_checks(name, &rows);
    let title = SCENARIOS
        .iter()
        .find(|s| s.name == name)
        .map(|s| s.description)
        .unwrap_or(name);
    Some(Output {
        scenario: String::new(),
        description: String::new(),
        seed: opts.seed,
        rows: Rows::Figure(rows),
        checks,
        notes: vec![constants_note()],
        figure: Some((title.to_string(), panels)),
        text,
    })
}

/// Seconds of one run of a figure's grid.
fn secs(rows: &[FigureRow], pattern: Pattern, policy: W, x: f64, compute: f64, fig5: bool) -> f64 {
    rows.iter()
        .find(|r| {
            r.pattern == pattern
                && r.policy == policy.name()
                && r.compute_ms == compute
                && if fig5 {
                    r.record_blocks == x
                } else {
                    r.buffers as f64 == x
                }
        })
        .map(|r| r.seconds)
        .unwrap_or(f64::NAN)
}

fn check(claim: impl Into<String>, pass: bool, detail: impl Into<String>) -> Check {
    Check {
        claim: claim.into(),
        pass,
        detail: detail.into(),
    }
}

/// The shapes REPRODUCE.md describes for each figure, tested on our rows.
fn figure_checks(name: &str, rows: &[FigureRow]) -> Vec<Check> {
    let mut v = vec![];
    let s = |pat, pol, x, c| secs(rows, pat, pol, x, c, name == "kotz92-fig5");
    match name {
        "kotz92-fig1" | "kotz92-fig2" => {
            let c = if name == "kotz92-fig2" { 30.0 } else { 0.0 };
            let wb: Vec<f64> = SIZES
                .iter()
                .map(|&n| s(Pattern::Gw, W::WriteBack, n as f64, c))
                .collect();
            let best: Vec<f64> = SIZES
                .iter()
                .map(|&n| {
                    [W::WriteThrough, W::WriteFree, W::WriteFull]
                        .iter()
                        .map(|&p| s(Pattern::Gw, p, n as f64, c))
                        .fold(f64::MAX, f64::min)
                })
                .collect();
            let slower = wb.iter().zip(&best).filter(|(a, b)| a > b).count();
            v.push(check(
                "gw: write-back is the slowest policy",
                slower * 2 > SIZES.len(),
                format!("slowest at {slower} of {} cache sizes", SIZES.len()),
            ));
            let full80 = s(Pattern::Gw, W::WriteFull, 80.0, c);
            let full200 = s(Pattern::Gw, W::WriteFull, 200.0, c);
            v.push(check(
                "gw: 40–80 buffers is the most useful size (more buys under 5%)",
                full80 <= full200 * 1.05,
                format!("write-full {full80:.2} s at 80, {full200:.2} s at 200"),
            ));
            if c > 0.0 {
                let free = s(Pattern::Gw, W::WriteFree, 80.0, c);
                v.push(check(
                    "gw with compute: write-free is slower than write-full (its write waits for the compute phase)",
                    free > full80,
                    format!("write-free {free:.2} s, write-full {full80:.2} s at 80 buffers"),
                ));
            }
        }
        "kotz92-fig3" => {
            let gains: Vec<(W, f64, f64)> = POLICIES
                .iter()
                .map(|&p| (p, s(Pattern::Lw1, p, 20.0, 0.0), s(Pattern::Lw1, p, 200.0, 0.0)))
                .collect();
            v.push(check(
                "lw1: larger caches help (more disks used at once through delayed writes)",
                gains.iter().any(|g| g.2 < 0.9 * g.1) && gains.iter().all(|g| g.2 <= g.1 * 1.01),
                gains
                    .iter()
                    .map(|g| format!("{} {:.1}→{:.1} s", g.0.name(), g.1, g.2))
                    .collect::<Vec<_>>()
                    .join(", "),
            ));
            let a = s(Pattern::Lw1, W::WriteFull, 20.0, 30.0);
            let b = s(Pattern::Lw1, W::WriteFull, 200.0, 30.0);
            v.push(check(
                "lw1 with compute: cache size matters little when 120 s of compute dominates",
                (a - b).abs() / b < 0.1,
                format!("write-full {a:.1} s at 20, {b:.1} s at 200"),
            ));
        }
        "kotz92-fig4" => {
            let a = s(Pattern::Seg, W::WriteFull, 20.0, 0.0);
            let b = s(Pattern::Seg, W::WriteFull, 200.0, 0.0);
            v.push(check(
                "seg: larger caches help",
                b < a,
                format!("write-full {a:.1} s at 20, {b:.1} s at 200"),
            ));
        }
        "kotz92-fig5" => {
            let worst = RECORD_SIZES
                .iter()
                .map(|&x| (x, s(Pattern::Gw, W::WriteFull, x, 0.0)))
                .max_by(|a, b| (a.1 - 6.0).abs().total_cmp(&(b.1 - 6.0).abs()))
                .expect("sizes");
            v.push(check(
                "gw: write-full within 10% of the 6 s ideal at every record size",
                RECORD_SIZES
                    .iter()
                    .all(|&x| (s(Pattern::Gw, W::WriteFull, x, 0.0) / 6.0 - 1.0).abs() <= 0.10),
                format!("furthest: {:.2} s at {} blocks", worst.1, worst.0),
            ));
            for x in [0.25, 1.5] {
                let (t, f) = (
                    s(Pattern::Gw, W::WriteThrough, x, 0.0),
                    s(Pattern::Gw, W::WriteFull, x, 0.0),
                );
                v.push(check(
                    format!("gw: write-through at least 2x slower than write-full at {x} blocks"),
                    t >= 2.0 * f,
                    format!("{t:.2} s vs {f:.2} s ({:.1}x)", t / f),
                ));
            }
            let (t, f) = (
                s(Pattern::Gw, W::WriteFree, 0.25, 0.0),
                s(Pattern::Gw, W::WriteThrough, 0.25, 0.0),
            );
            v.push(check(
                "gw: write-free better than write-through at small records",
                t < f,
                format!("{t:.2} s vs {f:.2} s at 0.25"),
            ));
            for pol in [W::WriteThrough, W::WriteBack, W::WriteFree] {
                let (dips, total) = dips(|x| s(Pattern::Gw, pol, x, 0.0));
                v.push(check(
                    format!("gw: {} dips at integral record sizes", pol.name()),
                    dips == total,
                    format!("faster than both non-integral neighbours at {dips} of {total} integral sizes"),
                ));
            }
            let slowest = RECORD_SIZES
                .iter()
                .filter(|x| x.fract() != 0.0)
                .filter(|&&x| {
                    let t = s(Pattern::Seg, W::WriteThrough, x, 0.0);
                    [W::WriteBack, W::WriteFree, W::WriteFull]
                        .iter()
                        .all(|&p| s(Pattern::Seg, p, x, 0.0) < t)
                })
                .count();
            let nonint = RECORD_SIZES.iter().filter(|x| x.fract() != 0.0).count();
            v.push(check(
                "seg: write-through is the slowest at non-integral record sizes",
                slowest == nonint,
                format!("slowest at {slowest} of {nonint}"),
            ));
            let mistakes: u64 = rows
                .iter()
                .filter(|r| r.pattern == Pattern::Seg && r.policy != W::WriteThrough.name())
                .map(|r| r.rewrite_mistakes)
                .sum();
            v.push(check(
                "seg: the policies other than write-through make no rewrite mistakes",
                mistakes == 0,
                format!("{mistakes} rewrite mistakes in all their runs"),
            ));
        }
        _ => {}
    }
    v
}

/// At how many integral record sizes (with non-integral neighbours on both
/// sides) the time is below both neighbours.
fn dips(t: impl Fn(f64) -> f64) -> (usize, usize) {
    let mut dips = 0;
    let mut total = 0;
    for w in RECORD_SIZES.windows(3) {
        if w[1].fract() == 0.0 && w[0].fract() != 0.0 && w[2].fract() != 0.0 {
            total += 1;
            if t(w[1]) < t(w[0]) && t(w[1]) < t(w[2]) {
                dips += 1;
            }
        }
    }
    (dips, total)
}
