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

#[derive(Args)]
pub struct IodArgs {
    /// Directory for this server's write log and stripes.
    #[arg(long, value_name = "DIR")]
    data: PathBuf,
    /// Address to listen on. Loopback by default; give a routable address
    /// to serve other hosts.
    #[arg(long, default_value = "127.0.0.1:7401")]
    listen: SocketAddr,
    /// File holding the cluster secret (see `parcache secret`). Default: DIR/secret.
    #[arg(long, value_name = "FILE")]
    secret_file: Option<PathBuf>,
    /// Checkpoint (sync the stripes, empty the log) when the log passes this size.
    #[arg(long, default_value_t = 64, value_name = "MIB")]
    checkpoint_mib: u64,
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

fn logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PARCACHE_LOG").unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

#[derive(Args)]
pub struct MdsArgs {
    /// Directory for the metadata store.
    #[arg(long, value_name = "DIR")]
    data: PathBuf,
    /// Address to listen on. Loopback by default.
    #[arg(long, default_value = "127.0.0.1:7400")]
    listen: SocketAddr,
    /// File holding the cluster secret. Default: DIR/secret.
    #[arg(long, value_name = "FILE")]
    secret_file: Option<PathBuf>,
    /// A data server's address; give one per data server, in server-id order.
    #[arg(long = "iod", value_name = "ADDR", required = true)]
    iods: Vec<String>,
}

fn run_daemon(
    what: &str,
    dir: &std::path::Path,
    start: impl std::future::Future<Output = std::io::Result<Running>>,
) -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
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

pub fn iod(a: IodArgs) -> Result<()> {
    logging();
    let secret_file = a.secret_file.unwrap_or_else(|| a.data.join("secret"));
    let secret = Secret::load(&secret_file).with_context(|| "the data server needs the cluster secret")?;
    let cfg = IodConfig {
        data_dir: a.data.clone(),
        listen: a.listen,
        secret,
        checkpoint_bytes: a.checkpoint_mib << 20,
    };
    run_daemon("data server", &a.data, iod::start(cfg))
}

pub fn mds(a: MdsArgs) -> Result<()> {
    logging();
    let secret_file = a.secret_file.unwrap_or_else(|| a.data.join("secret"));
    let secret = Secret::load(&secret_file).with_context(|| "the metadata server needs the cluster secret")?;
    let cfg = MdsConfig {
        data_dir: a.data.clone(),
        listen: a.listen,
        secret,
        iods: a.iods,
    };
    run_daemon("metadata server", &a.data, mds::start(cfg))
}
