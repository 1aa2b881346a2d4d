//! `parcache sim replay TRACE`: one trace, one combination of policies, on
//! a modelled cluster (docs/advisor.md).

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use parcache_sim::replay::{self, Choice, ClusterModel, Outcome};
use parcache_sim::trace::{self, Trace};
use std::io::Write;
use std::path::{Path, PathBuf};

macro_rules! out {
    ($($t:tt)*) => { writeln!(std::io::stdout().lock(), $($t)*)? };
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
}

/// The modelled cluster, from a file and flags.
#[derive(Args, Clone)]
pub struct ClusterArgs {
    /// A cluster model (TOML; `parcache sim calibrate-cluster` writes one).
    /// Without it, the built-in model of parcache on loopback.
    #[arg(long, value_name = "FILE.toml")]
    cluster: Option<PathBuf>,
    /// Fold the trace's nodes onto this many nodes (node i runs on i mod N;
    /// default: one per traced node).
    #[arg(long)]
    nodes: Option<usize>,
    /// Data servers (default 4).
    #[arg(long)]
    servers: Option<usize>,
    /// Each node's cache, in MiB (default 64).
    #[arg(long, value_name = "MIB")]
    node_cache_mib: Option<u64>,
    /// Each data server's cache, in MiB (default 256).
    #[arg(long, value_name = "MIB")]
    server_cache_mib: Option<u64>,
}

impl ClusterArgs {
    pub fn model(&self) -> Result<ClusterModel> {
        let mut m = match &self.cluster {
            Some(p) => {
                let text =
                    std::fs::read_to_string(p).with_context(|| format!("reading cluster model {}", p.display()))?;
                ClusterModel::from_toml(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
            }
            None => ClusterModel::default(),
        };
        if let Some(n) = self.nodes {
            if n == 0 {
                bail!("--nodes must be at least 1");
            }
            m.nodes = n;
        }
        if let Some(n) = self.servers {
            m.servers = n;
        }
        if let Some(n) = self.node_cache_mib {
            m.node_cache_mib = n;
        }
        if let Some(n) = self.server_cache_mib {
            m.server_cache_mib = n;
        }
        m.check().map_err(|e| anyhow::anyhow!("cluster model: {e}"))?;
        Ok(m)
    }
}

#[derive(Args)]
pub struct ReplayArgs {
    /// The trace: a Darshan DXT log, parcache's CSV or JSONL (what `mount
    /// --record` writes), a block-id list or an MSR/Tencent block CSV
    /// (gzip or bzip2 compressed too).
    trace: PathBuf,
    /// A policy for every file, as `parcache policy set` takes it
    /// (write=…, replacement=…, prefetch=…, consistency=…, cooperative=…);
    /// repeat for several. Unset keys keep parcache's defaults.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    #[command(flatten)]
    cluster: ClusterArgs,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Also write the trace as parcache's CSV to this file (to edit, or to
    /// replay elsewhere).
    #[arg(long, value_name = "FILE.csv")]
    export: Option<PathBuf>,
}

/// Reads a trace, showing a spinner while a large one is read.
pub fn load(path: &Path) -> Result<Trace> {
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_message(format!("reading {}", path.display()));
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
    let t = trace::load(path);
    pb.finish_and_clear();
    Ok(t?)
}

pub fn replay(a: ReplayArgs) -> Result<()> {
    let trace = load(&a.trace)?;
    let cluster = a.cluster.model()?;
    let mut choice = Choice::default();
    for kv in &a.set {
        choice.set(kv).map_err(|e| anyhow::anyhow!("--set {kv}: {e}"))?;
    }
    if let Some(p) = &a.export {
        std::fs::write(p, trace::records::to_csv(&trace)).with_context(|| format!("writing {}", p.display()))?;
        eprintln!("trace written to {} as parcache CSV", p.display());
    }
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_message(format!("replaying {} operations", trace.ops.len()));
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
    let o = replay::replay(&trace, &cluster, &choice)?;
    pb.finish_and_clear();
    let summary = trace.summary();
    match a.format {
        Format::Json => {
            let v = serde_json::json!({
                "trace": a.trace.display().to_string(),
                "format": trace.format.map(|f| f.name()),
                "summary": summary,
                "notes": trace.notes,
                "cluster": cluster,
                "policies": choice.settings().iter().map(|(k, v)| (k.to_string(), v.clone())).collect::<std::collections::BTreeMap<_, _>>(),
                "outcome": without_file_times(&o),
            });
            out!("{}", serde_json::to_string_pretty(&v)?);
        }
        Format::Table => {
            print_summary(&a.trace, &trace)?;
            out!("policies: {choice}");
            print_outcome(&o)?;
        }
    }
    Ok(())
}

fn without_file_times(o: &Outcome) -> serde_json::Value {
    let mut v = serde_json::to_value(o).expect("outcome serialises");
    v.as_object_mut().expect("an object").remove("file_time");
    v
}

/// What a trace holds, in a few lines.
pub fn print_summary(path: &Path, t: &Trace) -> Result<()> {
    let s = t.summary();
    out!(
        "{}: {} ({} operations, {} nodes, {} processes, {} files, {:.1} s)",
        path.display(),
        t.format.map_or("?", |f| f.name()),
        s.ops,
        s.nodes,
        s.processes,
        s.files,
        s.span
    );
    out!(
        "  reads {} ({}), writes {} ({}), files written on one node and used on another: {}",
        s.reads,
        bytes(s.read_bytes),
        s.writes,
        bytes(s.write_bytes),
        s.write_shared_files
    );
    for n in &t.notes {
        out!("  note: {n}");
    }
    Ok(())
}

fn print_outcome(o: &Outcome) -> Result<()> {
    out!("time                  {:>12.3} s (last operation done)", o.elapsed);
    out!("all data on disk      {:>12.3} s", o.drained);
    out!("time in I/O           {:>12.3} process-s", o.io_time);
    out!("node cache hit ratio  {:>12.1} %", o.node_hit_ratio * 100.0);
    out!("remote hits           {:>12}", o.remote_hits);
    out!("server cache hits     {:>12.1} %", o.server_hit_ratio * 100.0);
    out!("bytes to disk         {:>12}", bytes(o.disk_write_bytes));
    out!("bytes from disk       {:>12}", bytes(o.disk_read_bytes));
    out!("rewrite mistakes      {:>12}", o.rewrite_mistakes);
    out!(
        "messages              {:>12} ({} metadata requests)",
        o.messages,
        o.metadata_requests
    );
    Ok(())
}

/// `1.5 GiB`.
pub fn bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}
