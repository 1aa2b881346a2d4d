//! `parcache sim …`: scenarios, free-parameter runs and calibration.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use parcache_core::{ReplacementKind, WritePolicyKind};
use parcache_sim::kotz92::{self, Compute, KotzParams, OverheadDist, Overheads, Pattern};
use parcache_sim::parallel::default_threads;
use parcache_sim::scenario::{self, RunOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Prints to standard output, returning broken pipes as errors instead of panicking.
macro_rules! out {
    ($($t:tt)*) => { writeln!(std::io::stdout().lock(), $($t)*)? };
}

#[derive(Subcommand)]
pub enum SimCommand {
    /// List every scenario with a one-line description.
    List,
    /// Run a named scenario (see `sim list`), several by a pattern such as
    /// `kotz92-*` (one paper's), or `all` of them.
    Run(RunArgs),
    /// Run the Kotz & Ellis 1992 model with free parameters.
    Kotz(KotzArgs),
    /// Replay a real trace (Darshan DXT, parcache CSV/JSONL, block traces)
    /// through the policies on a modelled cluster.
    Replay(crate::replay::ReplayArgs),
    /// Measure this machine (memory copies, loopback TCP, the disk and its
    /// fsync, and with --data a running cluster's round trips) and write a
    /// cluster model for `replay`/`advise --cluster FILE.toml`.
    CalibrateCluster(crate::calibrate::CalibrateArgs),
    /// Refit the 1992 model's two overhead constants on their two published cells.
    Calibrate {
        /// Seed of the workload used for fitting.
        #[arg(long, default_value_t = KotzParams::default().seed)]
        seed: u64,
    },
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
}

#[derive(Args)]
pub struct RunArgs {
    /// Scenario name; `all`; or a pattern where `*` stands for any text
    /// (`kotz92-*`: the 1992 paper's scenarios), whose results and plots
    /// go to `--out` as with `all`.
    name: String,
    /// Output format on standard output.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Also draw the scenario's figure to this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// With `all` or a pattern: directory for the results and plots.
    #[arg(long, value_name = "DIR", default_value = "results")]
    out: PathBuf,
    /// Seed of the workloads (same seed, same numbers).
    #[arg(long, default_value_t = KotzParams::default().seed)]
    seed: u64,
    /// Threads to run simulations on (results do not depend on it).
    #[arg(long, default_value_t = default_threads())]
    threads: usize,
}

#[derive(Args)]
pub struct KotzArgs {
    /// Access pattern: lw1, seg or gw.
    #[arg(long, default_value = "gw")]
    pattern: Pattern,
    /// Record size in blocks (fractions allowed, e.g. 0.25).
    #[arg(long, default_value_t = 1.0)]
    record_blocks: f64,
    /// Cache buffers of one block each; 0 means no cache.
    #[arg(long, default_value_t = 80)]
    buffers: usize,
    /// Write policy (write-through, write-back, write-free, write-full,
    /// periodic(interval=5s,age=30s), threshold(high=90%,low=50%), lru-writeback).
    #[arg(long, default_value = "write-back")]
    policy: WritePolicyKind,
    /// Replacement policy (toss-immediately or lru).
    #[arg(long, default_value = "toss-immediately")]
    replacement: ReplacementKind,
    #[arg(long, default_value_t = 20)]
    disks: u32,
    #[arg(long, default_value_t = 20)]
    procs: u32,
    /// Blocks in the file.
    #[arg(long, default_value_t = 4000)]
    blocks: u64,
    #[arg(long, default_value_t = 1024)]
    block_size: u32,
    /// Mean compute delay after each record (exponential); 0 for none.
    #[arg(long, default_value_t = 0.0)]
    compute_ms: f64,
    /// Truncation of the compute delay.
    #[arg(long, default_value_t = 150.0)]
    compute_max_ms: f64,
    /// Disk service time per request.
    #[arg(long, default_value_t = 30.0)]
    disk_ms: f64,
    /// CPU time per file-system call (calibrated; 0 for the bare queueing model).
    #[arg(long, default_value_t = Overheads::FITTED.request_ms)]
    request_overhead_ms: f64,
    /// CPU time per block through the cache (calibrated; 0 for the bare model).
    #[arg(long, default_value_t = Overheads::FITTED.buffer_ms)]
    buffer_overhead_ms: f64,
    /// How per-call CPU times vary: exponential (around the mean) or constant.
    #[arg(long, default_value = "exponential")]
    overhead_dist: OverheadDist,
    #[arg(long, default_value_t = KotzParams::default().seed)]
    seed: u64,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

pub fn run(cmd: SimCommand) -> Result<()> {
    match cmd {
        SimCommand::List => {
            for s in scenario::list() {
                out!("{:<14} {}", s.name, s.description);
            }
            out!(
                "{:<14} every scenario above, with results and plots written to a directory",
                "all"
            );
            Ok(())
        }
        SimCommand::Run(a) => run_scenarios(a),
        SimCommand::Kotz(a) => run_kotz(a),
        SimCommand::Replay(a) => crate::replay::replay(a),
        SimCommand::CalibrateCluster(a) => crate::calibrate::calibrate(a),
        SimCommand::Calibrate { seed } => {
            let f = kotz92::fit(seed);
            out!("fitted on lw1 one-block records (seed {seed}):");
            out!(
                "  request overhead: {:.3} ms  (no cache: {:.2} s, paper 127.3 s)",
                f.overheads.request_ms,
                f.fitted_seconds[0]
            );
            out!(
                "  buffer overhead:  {:.3} ms  (write-back cache: {:.2} s, paper 16.4 s)",
                f.overheads.buffer_ms,
                f.fitted_seconds[1]
            );
            let built = Overheads::FITTED;
            out!(
                "built-in constants: {:.3} ms, {:.3} ms",
                built.request_ms,
                built.buffer_ms
            );
            Ok(())
        }
    }
}

fn bar(len: usize, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len as u64);
    pb.set_style(
        ProgressStyle::with_template("{msg:>14} [{bar:40}] {pos}/{len} runs ({elapsed}, eta {eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

fn run_scenarios(a: RunArgs) -> Result<()> {
    if a.threads == 0 {
        bail!("--threads must be at least 1");
    }
    let opts = RunOptions {
        seed: a.seed,
        threads: a.threads,
    };
    if a.name == "all" || a.name.contains('*') {
        if a.plot.is_some() {
            bail!(
                "--plot draws one scenario's figure; '{}' runs several, whose plots go to --out {}",
                a.name,
                a.out.display()
            );
        }
        if a.format == Format::Json {
            bail!(
                "--format json prints one scenario; '{}' runs several, whose JSON goes to --out {}",
                a.name,
                a.out.display()
            );
        }
        let chosen = select(&a.name);
        if chosen.is_empty() {
            bail!("no scenario matches '{}' (see `parcache sim list`)", a.name);
        }
        return run_all(&a, &opts, &chosen);
    }
    let s = scenario::find(&a.name)?;
    let pb = bar(scenario::runs(s.name)?, s.name);
    let out = scenario::run(s.name, &opts, &|| pb.inc(1))?;
    pb.finish_and_clear();
    match a.format {
        Format::Table => write!(std::io::stdout().lock(), "{}", out.table())?,
        Format::Json => out!("{}", out.json()),
    }
    if let Some(path) = &a.plot {
        out.plot(path)?;
        eprintln!("plot written to {}", path.display());
    }
    Ok(())
}

/// The scenarios `all` or a pattern names, in `sim list`'s order.
fn select(pattern: &str) -> Vec<scenario::Scenario> {
    let pattern = if pattern == "all" { "*" } else { pattern };
    scenario::list()
        .into_iter()
        .filter(|s| matches(pattern, s.name))
        .collect()
}

/// Whether `name` matches `pattern`, where `*` stands for any text.
fn matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, rest)) => {
            let Some(tail) = name.strip_prefix(head) else {
                return false;
            };
            (0..=tail.len())
                .filter(|&i| tail.is_char_boundary(i))
                .any(|i| matches(rest, &tail[i..]))
        }
    }
}

fn run_all(a: &RunArgs, opts: &RunOptions, all: &[scenario::Scenario]) -> Result<()> {
    let dir: &Path = &a.out;
    std::fs::create_dir_all(dir).with_context(|| format!("creating output directory {}", dir.display()))?;
    let total: usize = all.iter().map(|s| scenario::runs(s.name).unwrap_or(0)).sum();
    let pb = bar(total, &a.name);
    let mut summary = vec![];
    for s in all {
        pb.set_message(s.name);
        let out = scenario::run(s.name, opts, &|| pb.inc(1))?;
        let write = |name: String, body: String| -> Result<()> {
            let p = dir.join(name);
            std::fs::write(&p, body).with_context(|| format!("writing {}", p.display()))
        };
        write(format!("{}.json", s.name), out.json())?;
        write(format!("{}.txt", s.name), out.table())?;
        if out.has_plot() {
            out.plot(&dir.join(format!("{}.svg", s.name)))?;
        }
        let missed = out.checks.iter().filter(|c| !c.pass).count();
        summary.push(format!("{:<14} {} checks, {} missed", s.name, out.checks.len(), missed));
    }
    pb.finish_and_clear();
    for line in summary {
        out!("{line}");
    }
    out!("results and plots in {}", dir.display());
    Ok(())
}

fn run_kotz(a: KotzArgs) -> Result<()> {
    let p = KotzParams {
        pattern: a.pattern,
        record_blocks: a.record_blocks,
        buffers: a.buffers,
        policy: a.policy,
        replacement: a.replacement,
        disks: a.disks,
        procs: a.procs,
        blocks: a.blocks,
        block_size: a.block_size,
        compute: (a.compute_ms > 0.0).then_some(Compute {
            mean_ms: a.compute_ms,
            max_ms: a.compute_max_ms,
        }),
        disk_ms: a.disk_ms,
        overheads: Overheads {
            request_ms: a.request_overhead_ms,
            buffer_ms: a.buffer_overhead_ms,
        },
        overhead_dist: a.overhead_dist,
        seed: a.seed,
    };
    let r = kotz92::run(&p)?;
    match a.format {
        Format::Json => {
            let v = serde_json::json!({ "params": p, "result": r });
            out!("{}", serde_json::to_string_pretty(&v)?);
        }
        Format::Table => {
            out!(
                "{} records of {} blocks, {} buffers ({}, {}), {} disks, {} processes",
                p.pattern,
                p.record_blocks,
                p.buffers,
                p.policy,
                p.replacement,
                p.disks,
                p.procs
            );
            out!(
                "total time        {:>10.3} s (ideal {:.3} s)",
                r.seconds,
                r.ideal_seconds
            );
            out!("disk writes       {:>10}", r.disk_writes);
            out!("disk reads        {:>10}", r.disk_reads);
            out!("rewrite mistakes  {:>10}", r.rewrite_mistakes);
            out!("stalls for buffers{:>10}", r.stalls);
            out!("time waiting      {:>10.3} process-s", r.wait_seconds);
            out!("disk utilisation  {:>10.1} % mean", r.mean_utilisation * 100.0);
            out!("events            {:>10}", r.events);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(pattern: &str) -> Vec<&'static str> {
        select(pattern).iter().map(|s| s.name).collect()
    }

    #[test]
    fn all_selects_every_scenario_and_a_pattern_one_papers() {
        let every: Vec<_> = scenario::list().iter().map(|s| s.name).collect();
        assert_eq!(names("all"), every);
        assert_eq!(names("*"), every);
        assert_eq!(
            names("kotz92-*"),
            [
                "kotz92-table",
                "kotz92-fig1",
                "kotz92-fig2",
                "kotz92-fig3",
                "kotz92-fig4",
                "kotz92-fig5"
            ]
        );
        assert_eq!(names("*-table"), ["kotz92-table"]);
        assert_eq!(names("capfs05-*d"), ["capfs05-read", "capfs05-shared"]);
        assert_eq!(names("paca96-s*s"), ["paca96-sessions"]);
        assert!(names("kotz93-*").is_empty());
        assert!(names("kotz92-").is_empty());
    }

    #[test]
    fn a_star_matches_any_text_even_none() {
        assert!(matches("a*", "a"));
        assert!(matches("*a*", "bab"));
        assert!(matches("a*b*c", "aXbYc"));
        assert!(!matches("a*b*c", "aXcYb"));
        assert!(matches("é*", "éé"));
        assert!(!matches("ab", "abc"));
    }
}
