//! `parcache iod` and `parcache secret`: running a daemon by hand.

use anyhow::{bail, Context, Result};
use clap::Args;
use parcache_proto::Secret;
use parcache_server::iod::{self, IodConfig};
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
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let (stop, rx) = tokio::sync::watch::channel(false);
        let (addr, served) = iod::start(cfg, rx)
            .await
            .with_context(|| format!("starting the data server in {}", a.data.display()))?;
        tracing::info!("data server for {} listening on {addr}", a.data.display());
        // The first line of standard output tells scripts where we listen.
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on {addr}")?;
        out.flush()?;
        drop(out);
        tokio::spawn(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {},
                _ = term.recv() => {},
            }
            tracing::info!("stopping: checkpointing the write log");
            let _ = stop.send(true);
        });
        served.await.context("final checkpoint")?;
        Ok(())
    })
}
