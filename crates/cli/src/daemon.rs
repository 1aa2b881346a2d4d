//! `parcache iod` and `parcache secret`: running a daemon by hand.

use anyhow::{bail, Context, Result};
use clap::Args;
use parcache_proto::Secret;
use parcache_server::iod::{self, IodConfig};
use parcache_server::mds::{self, MdsConfig};
use parcache_server::Running;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Settings of `parcache iod`, from `--config FILE.toml` and flags (flags win).
#[derive(Args, serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct IodArgs {
    /// TOML file with any of the settings below (keys as the flags, with _).
    #[arg(long, value_name = "FILE.toml")]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Directory for this server's write log and stripes.
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:7401]. Loopback unless you
    /// give a routable address to serve other hosts.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// File holding the cluster secret (see `parcache secret`) [default: DIR/secret].
    #[arg(long, value_name = "FILE")]
    secret_file: Option<PathBuf>,
    /// Checkpoint (sync the stripes, empty the log) when the log passes this size [default: 64].
    #[arg(long, value_name = "MIB")]
    checkpoint_mib: Option<u64>,
    /// Size of the server's cache: clean blocks are its read cache, dirty
    /// ones (already in the log) its write cache [default: 256].
    #[arg(long, value_name = "MIB")]
    cache_mib: Option<u64>,
    /// When the write cache's dirty blocks go to the block store:
    /// threshold(high=90%,low=50%) (default), periodic(interval=5s,age=30s)
    /// or lru-writeback.
    #[arg(long, value_name = "POLICY")]
    write_policy: Option<String>,
    /// Read and write stripes through the kernel's page cache. By default
    /// reads, and writes of whole aligned blocks, go around it (O_DIRECT,
    /// where the file system allows): the server's own cache (--cache-mib)
    /// keeps what it read, a cold read costs no copy out of the page
    /// cache, and a write no first touch of its pages.
    #[arg(long)]
    #[serde(default)]
    page_cache_reads: bool,
    /// Let the cache take its memory as blocks fill it. By default the
    /// server takes all of its cache's memory (--cache-mib), and the 4 MiB
    /// of buffers its direct writes to the block store copy into, once it
    /// has started, in the background, so that the first blocks it caches
    /// or writes pay no page faults on the data path.
    #[arg(long)]
    #[serde(default)]
    lazy_cache: bool,
}

/// Settings of `parcache mds`, from `--config FILE.toml` and flags (flags win).
#[derive(Args, serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct MdsArgs {
    /// TOML file with any of the settings below (keys as the flags, with _).
    #[arg(long, value_name = "FILE.toml")]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Directory for the metadata store.
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:7400]. Loopback unless told otherwise.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// File holding the cluster secret [default: DIR/secret].
    #[arg(long, value_name = "FILE")]
    secret_file: Option<PathBuf>,
    /// A data server's address; one per data server, in server-id order.
    #[arg(long = "iod", value_name = "ADDR")]
    #[serde(default)]
    iods: Vec<String>,
}

/// Reads a daemon's TOML config, naming the file and the bad key on error.
fn config<T: serde::de::DeserializeOwned + Default>(path: &Option<PathBuf>) -> Result<T> {
    let Some(p) = path else { return Ok(T::default()) };
    let s = std::fs::read_to_string(p).with_context(|| format!("reading config {}", p.display()))?;
    toml::from_str(&s).with_context(|| format!("config {}", p.display()))
}

#[derive(Args)]
pub struct SecretArgs {
    /// Where to write a new cluster secret (readable by its owner only).
    file: PathBuf,
}

pub fn secret(a: SecretArgs) -> Result<()> {
    if a.file.exists() {
        bail!("{} exists already; not replacing a cluster secret", a.file.display());
    }
    Secret::generate().save(&a.file)?;
    println!("new cluster secret in {}", a.file.display());
    Ok(())
}

/// Where daemons log: standard error, which `parcache up` points at a
/// file. A failed write (a full disk) drops the line: logging must never
/// panic, least of all while a request holds a lock (tracing-subscriber's
/// own fallback for a failed write is `eprintln!`, which panics).
struct QuietStderr;

impl std::io::Write for QuietStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// Logs to standard error at `PARCACHE_LOG` (default `info`), with colour
/// only on a terminal (a log file gets plain text).
pub fn logging() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("PARCACHE_LOG").unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .log_internal_errors(false)
        .with_writer(|| QuietStderr)
        .try_init();
}

/// The tokio runtime of every parcache process, its threads bounded
/// (see [`parcache_server::runtime`]).
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(parcache_server::runtime()?)
}

fn run_daemon(
    what: &str,
    dir: &std::path::Path,
    start: impl std::future::Future<Output = std::io::Result<Running>>,
) -> Result<()> {
    let rt = runtime()?;
    rt.block_on(async {
        let running = start
            .await
            .with_context(|| format!("starting the {what} in {}", dir.display()))?;
        tracing::info!("{what} for {} listening on {}", dir.display(), running.addr);
        // The first line of standard output tells scripts where we listen.
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on {}", running.addr)?;
        out.flush()?;
        drop(out);
        let stop = running.stop.clone();
        tokio::spawn(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {},
                _ = term.recv() => {},
            }
            let _ = stop.send(true);
        });
        running.served.await.context("shutting down")?;
        tracing::info!("{what} stopped");
        Ok(())
    })
}

/// The settings every daemon has, each from its flag, else the config
/// file, else the default: data directory, listen address, cluster secret.
fn common(
    what: &str,
    data: (Option<PathBuf>, Option<PathBuf>),
    listen: (Option<SocketAddr>, Option<SocketAddr>),
    secret_file: (Option<PathBuf>, Option<PathBuf>),
    default_listen: &str,
) -> Result<(PathBuf, SocketAddr, Secret)> {
    let data = data
        .0
        .or(data.1)
        .with_context(|| format!("the {what} needs its directory: --data DIR (or data = \"DIR\" in --config)"))?;
    let listen = listen
        .0
        .or(listen.1)
        .unwrap_or_else(|| default_listen.parse().expect("valid default"));
    let secret_file = secret_file.0.or(secret_file.1).unwrap_or_else(|| data.join("secret"));
    let secret = Secret::load(&secret_file).with_context(|| format!("the {what} needs the cluster secret"))?;
    Ok((data, listen, secret))
}

pub fn iod(a: IodArgs) -> Result<()> {
    logging();
    let f: IodArgs = config(&a.config)?;
    let (data, listen, secret) = common(
        "data server",
        (a.data, f.data),
        (a.listen, f.listen),
        (a.secret_file, f.secret_file),
        "127.0.0.1:7401",
    )?;
    let checkpoint = a.checkpoint_mib.or(f.checkpoint_mib).unwrap_or(64);
    let mut cfg = IodConfig::new(data.clone(), listen, secret);
    cfg.checkpoint_bytes = checkpoint << 20;
    cfg.cache_bytes = a.cache_mib.or(f.cache_mib).unwrap_or(256) << 20;
    cfg.page_cache_reads = a.page_cache_reads || f.page_cache_reads;
    cfg.lazy_cache = a.lazy_cache || f.lazy_cache;
    if let Some(w) = a.write_policy.as_ref().or(f.write_policy.as_ref()) {
        cfg.write_policy = w
            .parse()
            .with_context(|| format!("--write-policy '{w}' (threshold, periodic or lru-writeback)"))?;
    }
    run_daemon("data server", &data, iod::start(cfg))
}

pub fn mds(a: MdsArgs) -> Result<()> {
    logging();
    let f: MdsArgs = config(&a.config)?;
    let (data, listen, secret) = common(
        "metadata server",
        (a.data, f.data),
        (a.listen, f.listen),
        (a.secret_file, f.secret_file),
        "127.0.0.1:7400",
    )?;
    let iods = if a.iods.is_empty() { f.iods } else { a.iods };
    if iods.is_empty() {
        bail!("the metadata server needs its data servers: --iod ADDR, once per server (or iods = [...] in --config)");
    }
    let cfg = MdsConfig {
        data_dir: data.clone(),
        listen,
        secret,
        iods,
    };
    run_daemon("metadata server", &data, mds::start(cfg))
}
