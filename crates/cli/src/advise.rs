//! `parcache advise TRACE`: replay a trace under every combination of
//! policies its sharing allows, rank them, recommend per directory, and
//! optionally set the recommendations on a cluster (docs/advisor.md).

use crate::replay::{bytes, load, print_summary, ClusterArgs, Format};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use parcache_sim::plot::{self, Bar};
use parcache_sim::replay::advise::{self, Advice, RankBy, Search, Space};
use parcache_sim::replay::Choice;
use std::io::Write;
use std::path::PathBuf;

macro_rules! out {
    ($($t:tt)*) => { writeln!(std::io::stdout().lock(), $($t)*)? };
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Rank {
    /// The time processes waited on the file system, added up.
    IoTime,
    /// When the last operation finished.
    Elapsed,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum SearchArg {
    /// The full sweep, unless it would replay more than 2^30 blocks
    /// (the trace's blocks times its combinations); then greedy.
    Auto,
    /// Every combination.
    Full,
    /// Key by key from the default (a few dozen replays; docs/advisor.md).
    Greedy,
}

#[derive(Args)]
pub struct AdviseArgs {
    /// The trace (any format `parcache sim replay` reads).
    trace: PathBuf,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Try only these values of one policy, as `policy set` takes them
    /// (e.g. write=write-back,write-through); repeat for several keys.
    #[arg(long = "only", value_name = "KEY=V1,V2")]
    only: Vec<String>,
    /// Replay only the operations that start in this span of the trace
    /// (seconds, e.g. 0..60), for traces too long to sweep whole.
    #[arg(long, value_name = "START..END")]
    window: Option<String>,
    /// How to search the combinations.
    #[arg(long, value_enum, default_value_t = SearchArg::Auto)]
    search: SearchArg,
    /// Replays at once (default: every core). Results do not depend on it.
    #[arg(long)]
    threads: Option<usize>,
    /// Rows of the ranking to print (the default's row is always shown).
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// What ranks first.
    #[arg(long, value_enum, default_value_t = Rank::IoTime)]
    rank_by: Rank,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Draw the ranking (time and time until all data is on disk) as SVG.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Set each directory's recommended policies on this cluster directory
    /// (pc:/DIR): the traced directories, their common prefix replaced by
    /// DIR, are made if missing and get the policies (files made in them
    /// later inherit them); traced files that exist there get them too.
    #[arg(long, value_name = "pc:/DIR")]
    apply: Option<String>,
    #[command(flatten)]
    target: crate::fs::Target,
}

fn parse_window(w: &str) -> Result<(f64, f64)> {
    let (a, b) = w
        .split_once("..")
        .with_context(|| format!("--window {w}: write START..END in seconds, e.g. 0..60"))?;
    let num = |s: &str| -> Result<f64> {
        let v: f64 = s
            .trim()
            .parse()
            .with_context(|| format!("--window {w}: '{s}' is not a number of seconds"))?;
        if !v.is_finite() || v < 0.0 {
            bail!("--window {w}: '{s}' is not a time in the trace");
        }
        Ok(v)
    };
    let (a, b) = (num(a)?, num(b)?);
    if b <= a {
        bail!("--window {w}: the end must come after the start");
    }
    Ok((a, b))
}

pub fn advise(a: AdviseArgs) -> Result<()> {
    if let Some(dir) = &a.apply {
        // Refuse a bad target before a long sweep, not after it.
        if !dir.starts_with("pc:/") {
            bail!("--apply {dir}: a cluster directory is written pc:/DIR");
        }
        if a.target.data_dir().is_none() && !a.target.has_remote() {
            bail!("--apply {dir}: say which cluster with --data DIR (or --mds ADDR --secret-file FILE)");
        }
    }
    let cluster = a.cluster.model()?;
    let mut trace = load(&a.trace)?;
    if let Some(w) = &a.window {
        let (start, end) = parse_window(w)?;
        trace = trace.window(start, end);
        if !trace
            .ops
            .iter()
            .any(|o| matches!(o.kind, parcache_core::TraceOp::Read | parcache_core::TraceOp::Write))
        {
            bail!("--window {w}: no reads or writes of {} start in it", a.trace.display());
        }
    }
    let sharing = advise::sharing(&trace);
    let nodes = if cluster.nodes == 0 {
        trace.nodes.len()
    } else {
        cluster.nodes
    };
    let mut space = Space::for_trace(&sharing, nodes);
    for kv in &a.only {
        space.only(kv).map_err(|e| anyhow::anyhow!("--only {kv}: {e}"))?;
    }
    let choices = space.choices();
    let threads = a.threads.unwrap_or_else(parcache_sim::parallel::default_threads);
    if threads == 0 {
        bail!("--threads must be at least 1");
    }
    let search = match a.search {
        SearchArg::Auto => advise::auto_search(&trace, &space),
        SearchArg::Full => Search::Full,
        SearchArg::Greedy => Search::Greedy,
    };
    let by = match a.rank_by {
        Rank::IoTime => RankBy::IoTime,
        Rank::Elapsed => RankBy::Elapsed,
    };
    let blocks = advise::trace_blocks(&trace);
    let started = std::time::Instant::now();
    let progress = Progress::new(match search {
        Search::Full => {
            eprintln!(
                "advise: replaying {} combinations of {} ({} blocks each) on {threads} threads",
                choices.len(),
                a.trace.display(),
                blocks
            );
            Some(choices.len() as u64)
        }
        Search::Greedy => {
            eprintln!(
                "advise: {} combinations of {} blocks each are too many to replay all{}; \
                 searching key by key from the default (--search full to sweep all)",
                choices.len(),
                blocks,
                if a.search == SearchArg::Auto {
                    ""
                } else {
                    " (--search greedy)"
                },
            );
            None
        }
    });
    let runs = match search {
        Search::Full => advise::sweep(&trace, &cluster, &choices, threads, &|| progress.inc())?,
        Search::Greedy => advise::greedy(&trace, &cluster, &space, threads, by, &|| progress.inc())?,
    };
    progress.finish();
    let took = started.elapsed().as_secs_f64();
    let swept = runs.len();
    let advice = advise::advise(&trace, runs, by);
    if let Some(p) = &a.plot {
        draw(p, &a.trace, &advice, a.top)?;
    }
    match a.format {
        Format::Json => out!(
            "{}",
            serde_json::to_string_pretty(&json(&a, &trace, &advice, took, search, choices.len()))?
        ),
        Format::Table => {
            print_summary(&a.trace, &trace)?;
            let shares: Vec<String> = advice
                .sharing
                .iter()
                .map(|(s, n)| format!("{n} {}", s.name()))
                .collect();
            out!("  files: {}", shares.join(", "));
            out!(
                "swept {} in {took:.1} s on {threads} threads (consistency: {})",
                match search {
                    Search::Full => format!("{swept} combinations"),
                    Search::Greedy => format!("{swept} of {} combinations (greedy search)", choices.len()),
                },
                space
                    .consistency
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            print_ranking(&advice, a.top, by)?;
            print_dirs(&advice)?;
        }
    }
    if let Some(p) = &a.plot {
        eprintln!("plot written to {}", p.display());
    }
    if let Some(dir) = &a.apply {
        apply(&a.target, dir, &trace.files, &advice)?;
    }
    Ok(())
}

fn print_ranking(a: &Advice, top: usize, by: RankBy) -> Result<()> {
    let metric = |o: &parcache_sim::replay::Outcome| match by {
        RankBy::IoTime => o.io_time,
        RankBy::Elapsed => o.elapsed,
    };
    let base = metric(&a.ranked[a.default].outcome);
    out!("");
    out!(
        "{:>4} {:>10} {:>7} {:>10} {:>10} {:>10} {:>6} {:>6} {:>7} {:>8}  policies",
        "rank",
        "time s",
        "vs dflt",
        "I/O p-s",
        "on disk s",
        "to disk",
        "node%",
        "iod%",
        "remote",
        "rewrites"
    );
    let (mut shown, mut rank, mut hidden_same, mut unsafe_runs) = (0, 0, 0, 0);
    for (i, r) in a.ranked.iter().enumerate() {
        if !a.safe[i] {
            unsafe_runs += 1;
            if i != a.default {
                continue;
            }
        }
        if a.same_as[i].is_some() && i != a.default {
            hidden_same += 1;
            continue;
        }
        rank += 1;
        if shown >= top && i != a.default {
            continue;
        }
        shown += 1;
        let o = &r.outcome;
        let mark = match (i == a.default, a.safe[i]) {
            (true, true) => "  (parcache's default)",
            (true, false) => "  (parcache's default; NOT correct for this trace's sharing)",
            _ => "",
        };
        out!(
            "{rank:>4} {:>10.3} {:>6.2}x {:>10.3} {:>10.3} {:>10} {:>6.1} {:>6.1} {:>7} {:>8}  {}{mark}",
            o.elapsed,
            if base > 0.0 { metric(o) / base } else { 1.0 },
            o.io_time,
            o.drained,
            bytes(o.disk_write_bytes),
            o.node_hit_ratio * 100.0,
            o.server_hit_ratio * 100.0,
            o.remote_hits,
            o.rewrite_mistakes,
            r.choice
        );
    }
    if hidden_same > 0 {
        out!(
            "({hidden_same} further combination{} exactly the result of one above and {} not shown)",
            if hidden_same == 1 { " had" } else { "s had" },
            if hidden_same == 1 { "is" } else { "are" }
        );
    }
    if unsafe_runs > 0 {
        out!(
            "({unsafe_runs} combination{} a consistency some file's sharing forbids: left out of the ranking, \
             used only for the directories they suit)",
            if unsafe_runs == 1 { " uses" } else { "s use" }
        );
    }
    Ok(())
}

fn print_dirs(a: &Advice) -> Result<()> {
    out!("");
    out!("recommended per directory (the best run for its files among those their sharing allows):");
    for (dir, sharing) in &a.unadvised {
        out!(
            "  {dir} ({}): no combination swept keeps it correct; widen --only consistency=… (it needs one of: {})",
            sharing.name(),
            parcache_core::ConsistencyKind::ALL
                .iter()
                .filter(|c| sharing.allows(**c))
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for d in &a.dirs {
        let c = &a.ranked[d.best].choice;
        out!(
            "  {} ({} files, {}): {:.3} s of I/O, {:.3} s under the default",
            d.dir,
            d.files,
            d.sharing.name(),
            d.time,
            d.default_time
        );
        if d.dir.starts_with('/') {
            out!("      parcache policy set pc:{} {}", d.dir, c);
        } else {
            out!("      parcache policy set pc:/DIR {c}   (the trace names no directory)");
        }
    }
    Ok(())
}

fn json(
    a: &AdviseArgs,
    trace: &parcache_sim::trace::Trace,
    adv: &Advice,
    took: f64,
    search: Search,
    combinations: usize,
) -> serde_json::Value {
    let row = |i: usize| {
        let r = &adv.ranked[i];
        let mut o = serde_json::to_value(&r.outcome).expect("outcome serialises");
        o.as_object_mut().expect("an object").remove("file_time");
        serde_json::json!({
            "policies": settings(&r.choice),
            "correct_for_trace": adv.safe[i],
            "default": i == adv.default,
            "same_as": adv.same_as[i],
            "outcome": o,
        })
    };
    serde_json::json!({
        "trace": a.trace.display().to_string(),
        "summary": trace.summary(),
        "notes": trace.notes,
        "sharing": adv.sharing.iter().map(|(s, n)| (s.name().to_string(), *n)).collect::<std::collections::BTreeMap<_, _>>(),
        "sweep_seconds": took,
        "search": search,
        "combinations": combinations,
        "replayed": adv.ranked.len(),
        "unadvised": adv.unadvised.iter().map(|(d, s)| serde_json::json!({"dir": d, "sharing": s})).collect::<Vec<_>>(),
        "ranked": (0..adv.ranked.len()).map(row).collect::<Vec<_>>(),
        "directories": adv.dirs.iter().map(|d| serde_json::json!({
            "dir": d.dir,
            "files": d.files,
            "sharing": d.sharing,
            "policies": settings(&adv.ranked[d.best].choice),
            "io_seconds": d.time,
            "default_io_seconds": d.default_time,
        })).collect::<Vec<_>>(),
    })
}

/// The sweep's progress: a bar on a terminal; otherwise a line on stderr
/// at a tenth of the way at least 5 s after the last (and every 30 s), so
/// that a sweep in a batch job or a log is not silent for hours.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    len: Option<u64>,
    done: std::sync::atomic::AtomicU64,
    last: std::sync::Mutex<std::time::Instant>,
    started: std::time::Instant,
}

impl Progress {
    fn new(len: Option<u64>) -> Progress {
        use std::io::IsTerminal;
        let bar = std::io::stderr().is_terminal().then(|| {
            let (pb, template) = match len {
                Some(n) => (
                    indicatif::ProgressBar::new(n),
                    "replaying {pos}/{len} combinations {wide_bar} {elapsed} (eta {eta})",
                ),
                None => (
                    indicatif::ProgressBar::new_spinner(),
                    "{spinner} replayed {pos} combinations (greedy search) {elapsed}",
                ),
            };
            pb.set_style(indicatif::ProgressStyle::with_template(template).expect("a valid template"));
            pb.enable_steady_tick(std::time::Duration::from_millis(200));
            pb
        });
        Progress {
            bar,
            len,
            done: 0.into(),
            last: std::sync::Mutex::new(std::time::Instant::now()),
            started: std::time::Instant::now(),
        }
    }

    fn inc(&self) {
        let n = self.done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if let Some(pb) = &self.bar {
            pb.inc(1);
            return;
        }
        let mut last = self.last.lock().expect("progress lock");
        let tenth = self.len.is_some_and(|l| l >= 10 && n.is_multiple_of(l / 10));
        let since = last.elapsed().as_secs();
        if (tenth && since >= 5) || since >= 30 {
            *last = std::time::Instant::now();
            let of = self.len.map(|l| format!("/{l}")).unwrap_or_default();
            eprintln!(
                "advise: {n}{of} combinations replayed, {:.0} s",
                self.started.elapsed().as_secs_f64()
            );
        }
    }

    fn finish(&self) {
        if let Some(pb) = &self.bar {
            pb.finish_and_clear();
        }
    }
}

fn settings(c: &Choice) -> std::collections::BTreeMap<String, String> {
    c.settings().iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

fn draw(path: &std::path::Path, trace: &std::path::Path, a: &Advice, top: usize) -> Result<()> {
    let mut rows: Vec<usize> = (0..a.ranked.len())
        .filter(|&i| a.safe[i] && a.same_as[i].is_none())
        .take(top.max(1))
        .collect();
    if !rows.contains(&a.default) {
        rows.push(a.default);
    }
    let bars: Vec<Bar> = rows
        .iter()
        .map(|&i| {
            let r = &a.ranked[i];
            Bar {
                label: format!("{}{}", r.choice, if i == a.default { "  (default)" } else { "" }),
                value: r.outcome.elapsed,
                behind: r.outcome.drained,
            }
        })
        .collect();
    let name = trace
        .file_name()
        .map_or_else(|| trace.display().to_string(), |n| n.to_string_lossy().into_owned());
    plot::bars(
        path,
        &format!("parcache advise {name}"),
        "seconds",
        ("time (last operation done)", "until all data on disk"),
        &bars,
    )
    .map_err(|e| anyhow::anyhow!(e))
}

/// Where a traced directory goes under `root`: its path with the traced
/// directories' common prefix replaced by `root`.
fn map_dirs<'a>(root: &str, dirs: &[&'a str]) -> Vec<(&'a str, String)> {
    let parts = |d: &'a str| -> Vec<&'a str> { d.split('/').filter(|s| !s.is_empty() && *s != ".").collect() };
    let all: Vec<Vec<&str>> = dirs.iter().map(|d| parts(d)).collect();
    let mut common = all.first().map_or(0, Vec::len);
    for p in &all {
        common = common.min(p.iter().zip(&all[0]).take_while(|(a, b)| a == b).count());
    }
    let root = root.trim_end_matches('/');
    dirs.iter()
        .zip(&all)
        .map(|(d, p)| {
            let rest = p[common..].join("/");
            let to = if rest.is_empty() {
                root.to_string()
            } else {
                format!("{root}/{rest}")
            };
            (*d, if to.is_empty() { "/".to_string() } else { to })
        })
        .collect()
}

fn apply(target: &crate::fs::Target, dir: &str, files: &[String], a: &Advice) -> Result<()> {
    let root = dir.strip_prefix("pc:").expect("checked before the sweep");
    let dirs: Vec<&str> = a.dirs.iter().map(|d| d.dir.as_str()).collect();
    let mapped = map_dirs(root, &dirs);
    crate::daemon::runtime()?.block_on(async {
        let fs = target.connect().await?;
        for (d, (traced, to)) in a.dirs.iter().zip(&mapped) {
            // mkdir -p
            let mut at = String::new();
            for part in to.split('/').filter(|s| !s.is_empty()) {
                at.push('/');
                at.push_str(part);
                if fs.resolve(&at).await.is_err() {
                    fs.mkdir(&at, 0o755).await.with_context(|| format!("making pc:{at}"))?;
                }
            }
            let c = a.ranked[d.best].choice;
            let mut targets = vec![to.clone()];
            for f in files.iter().filter(|f| advise::dir_of(f) == **traced) {
                let name = f.rsplit('/').next().unwrap_or(f);
                let p = format!("{}/{name}", to.trim_end_matches('/'));
                if fs.resolve(&p).await.is_ok() {
                    targets.push(p);
                }
            }
            for t in &targets {
                for (k, v) in c.settings() {
                    fs.set_policy(t, k, &v)
                        .await
                        .with_context(|| format!("pc:{t}: setting {k}={v}"))?;
                }
            }
            outln!(
                "applied to pc:{to}{}: {c}",
                if targets.len() > 1 {
                    format!(" and {} existing files in it", targets.len() - 1)
                } else {
                    String::new()
                }
            )?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traced_directories_map_under_the_root() {
        let m = map_dirs("/runs", &["/lus/me/job/out", "/lus/me/job/in", "/lus/me/job"]);
        assert_eq!(m[0].1, "/runs/out");
        assert_eq!(m[1].1, "/runs/in");
        assert_eq!(m[2].1, "/runs");
        let m = map_dirs("/", &["."]);
        assert_eq!(m[0].1, "/");
        let m = map_dirs("/x/", &["/only/one"]);
        assert_eq!(m[0].1, "/x");
    }

    #[test]
    fn windows_are_checked() {
        assert_eq!(parse_window("0..60").unwrap(), (0.0, 60.0));
        assert!(parse_window("60..0").is_err());
        assert!(parse_window("a..b").unwrap_err().to_string().contains("'a'"));
        assert!(parse_window("10").is_err());
        assert!(parse_window("-1..3").is_err());
    }
}
