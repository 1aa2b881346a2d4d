//! `parcache sim calibrate-cluster`: measures this machine's costs that the
//! replay's cluster model uses (docs/advisor.md) and writes them as a
//! cluster model file for `--cluster FILE.toml`.
//!
//! What is measured, each by doing it for real:
//! - `memcpy_gbps`: copying a 64 MiB buffer;
//! - `latency_us`: half a round trip of a small message over loopback TCP
//!   between two threads (real sockets);
//! - `link_mbps`: bulk bytes over loopback TCP;
//! - `disk_mbps`: writing a file in 1 MiB pieces and fsyncing it, in the
//!   directory the data servers would use;
//! - `log_write_us`: one 4 KiB append and `fdatasync` there (what a data
//!   server's durable log adds to each write);
//! - with `--data DIR` of a running cluster, through the client library:
//!   `meta_us` (a getattr round trip), `op_us` (a 4 KiB read the node
//!   cache answers) and `latency_us` again, as half a 4 KiB read from a
//!   data server (parcache's own message path, not bare TCP).
//!
//! Every other key keeps the built-in default.

use anyhow::{bail, Context, Result};
use clap::Args;
use parcache_sim::replay::ClusterModel;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct CalibrateArgs {
    /// Where to measure the disk (the file system the data servers' DIR is
    /// on); a file is written there and removed.
    #[arg(long, value_name = "DIR", default_value = ".")]
    dir: PathBuf,
    /// MiB to write for the disk's bandwidth (more is steadier).
    #[arg(long, value_name = "MIB", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1 << 16))]
    mib: u64,
    /// Write the model here instead of standard output.
    #[arg(long, value_name = "FILE.toml")]
    out: Option<PathBuf>,
    #[command(flatten)]
    target: crate::fs::Target,
}

fn step<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_message(format!("measuring {what}"));
    pb.enable_steady_tick(std::time::Duration::from_millis(150));
    let r = f();
    pb.finish_and_clear();
    r.with_context(|| format!("measuring {what}"))
}

/// GB/s of copying a 64 MiB buffer.
fn memcpy_gbps() -> Result<f64> {
    let src = vec![7u8; 64 << 20];
    let mut dst = vec![0u8; 64 << 20];
    let mut best = f64::MAX;
    for _ in 0..8 {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok((64 << 20) as f64 / best / 1e9)
}

/// (one-way latency in µs, bulk MB/s) over loopback TCP.
fn loopback() -> Result<(f64, f64)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    const PINGS: usize = 4000;
    const BULK: usize = 512 << 20;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = l.accept()?;
        s.set_nodelay(true)?;
        let mut b = [0u8; 64];
        for _ in 0..PINGS {
            s.read_exact(&mut b)?;
            s.write_all(&b)?;
        }
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0;
        while got < BULK {
            let n = s.read(&mut buf)?;
            if n == 0 {
                break;
            }
            got += n;
        }
        s.write_all(&[1])?;
        Ok(())
    });
    let mut c = TcpStream::connect(addr)?;
    c.set_nodelay(true)?;
    let mut b = [0u8; 64];
    let t = Instant::now();
    for _ in 0..PINGS {
        c.write_all(&b)?;
        c.read_exact(&mut b)?;
    }
    let latency_us = t.elapsed().as_secs_f64() / PINGS as f64 / 2.0 * 1e6;
    let chunk = vec![3u8; 1 << 20];
    let t = Instant::now();
    for _ in 0..BULK / chunk.len() {
        c.write_all(&chunk)?;
    }
    let mut ack = [0u8; 1];
    c.read_exact(&mut ack)?;
    let mbps = BULK as f64 / t.elapsed().as_secs_f64() / 1e6;
    server.join().expect("the echo thread does not panic")?;
    Ok((latency_us, mbps))
}

/// (MB/s of writing `mib` MiB and fsyncing, µs per 4 KiB append + fdatasync).
fn disk(dir: &std::path::Path, mib: u64) -> Result<(f64, f64)> {
    if !dir.is_dir() {
        bail!("--dir {}: not a directory", dir.display());
    }
    let p = dir.join(format!(".parcache-calibrate-{}", std::process::id()));
    struct Gone(PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _gone = Gone(p.clone());
    let mut f = std::fs::File::create(&p).with_context(|| format!("creating {}", p.display()))?;
    let chunk: Vec<u8> = (0..1 << 20).map(|i| (i * 31 % 251) as u8).collect();
    let t = Instant::now();
    for _ in 0..mib {
        f.write_all(&chunk)
            .with_context(|| format!("writing {} (is the disk full? try a smaller --mib)", p.display()))?;
    }
    f.sync_all()?;
    let mbps = (mib << 20) as f64 / t.elapsed().as_secs_f64() / 1e6;
    let small = [5u8; 4096];
    const APPENDS: usize = 200;
    let t = Instant::now();
    for _ in 0..APPENDS {
        f.write_all(&small)?;
        f.sync_data()?;
    }
    let log_us = t.elapsed().as_secs_f64() / APPENDS as f64 * 1e6;
    Ok((mbps, log_us))
}

/// What a running cluster measured.
struct Measured {
    meta_us: f64,
    op_us: f64,
    /// Half a 4 KiB read's round trip to a data server.
    latency_us: f64,
}

/// Times `n` 4 KiB reads of a new file (64 KiB written first) with the
/// given policies; µs per read.
async fn reads(fs: &parcache_client::Fs, name: &str, policies: &[(&str, &str)], n: usize) -> Result<f64> {
    let a = fs.create(name, 0o600, true).await?;
    let r = async {
        for (k, v) in policies {
            fs.set_policy(name, k, v).await?;
        }
        let a = fs.resolve(name).await?;
        let a = fs.open(&a, true).await?;
        fs.write_at(&a, 0, &[9u8; 64 << 10]).await?;
        fs.flush(&a).await?;
        fs.read_at(&a, 0, 4096).await?;
        let t = Instant::now();
        for i in 0..n {
            fs.read_at(&a, (i as u64 % 16) * 4096, 4096).await?;
        }
        let us = t.elapsed().as_secs_f64() / n as f64 * 1e6;
        fs.close(&a, true).await?;
        Ok::<_, anyhow::Error>(us)
    }
    .await;
    let _ = a;
    fs.unlink(name).await?;
    r
}

/// Round trips through a running cluster: the metadata server's, a data
/// server's (a file with `consistency=posix`, which the node does not
/// cache), and a read the node cache answers.
fn cluster(target: &crate::fs::Target) -> Result<Measured> {
    crate::daemon::runtime()?.block_on(async {
        let fs = target.connect().await?;
        let root = fs.resolve("/").await?;
        const N: usize = 500;
        let t = Instant::now();
        for _ in 0..N {
            fs.getattr(root.handle).await?;
        }
        let meta_us = t.elapsed().as_secs_f64() / N as f64 * 1e6;
        let pid = std::process::id();
        let op_us = reads(&fs, &format!("/.parcache-calibrate-{pid}"), &[], N).await?;
        let direct = reads(
            &fs,
            &format!("/.parcache-calibrate-{pid}-direct"),
            &[("consistency", "posix")],
            N,
        )
        .await?;
        Ok(Measured {
            meta_us,
            op_us,
            latency_us: direct / 2.0,
        })
    })
}

pub fn calibrate(a: CalibrateArgs) -> Result<()> {
    let mut m = ClusterModel::default();
    let mut how = Vec::new();
    m.memcpy_gbps = step("memory copies", memcpy_gbps)?;
    how.push(format!("memcpy_gbps = {:.2}  (a 64 MiB copy)", m.memcpy_gbps));
    let (lat, link) = step("loopback TCP", loopback)?;
    (m.latency_us, m.link_mbps) = (lat, link);
    how.push(format!(
        "latency_us = {lat:.1}  (half a 64-byte round trip over loopback TCP)"
    ));
    how.push(format!("link_mbps = {link:.0}  (512 MiB over loopback TCP)"));
    let (dmbps, log) = step("the disk", || disk(&a.dir, a.mib))?;
    (m.disk_mbps, m.log_write_us) = (dmbps, log);
    how.push(format!(
        "disk_mbps = {dmbps:.0}  ({} MiB written and fsynced in {})",
        a.mib,
        a.dir.display()
    ));
    how.push(format!("log_write_us = {log:.0}  (a 4 KiB append and fdatasync there)"));
    if a.target.data_dir().is_some() || a.target.has_remote() {
        let c = step("the cluster", || cluster(&a.target))?;
        (m.meta_us, m.op_us, m.latency_us) = (c.meta_us, c.op_us, c.latency_us);
        how.push(format!(
            "meta_us = {:.1}  (a getattr round trip to the metadata server)",
            c.meta_us
        ));
        how.push(format!(
            "op_us = {:.1}  (a 4 KiB read the node cache answers, through the client library; a mount adds the kernel's FUSE round trip)",
            c.op_us
        ));
        how.push(format!(
            "latency_us = {:.1}  (replaces the loopback figure: half a 4 KiB read from a data server, file not cached)",
            c.latency_us
        ));
    } else {
        how.push(format!(
            "meta_us = {}, op_us = {}  (defaults: give --data DIR of a running cluster to measure them)",
            m.meta_us, m.op_us
        ));
    }
    m.check()
        .map_err(|e| anyhow::anyhow!("the measured model is not usable: {e}"))?;
    let text = format!(
        "# parcache cluster model, measured by `parcache sim calibrate-cluster` on {}\n{}\n{}",
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .unwrap_or_default()
            .trim(),
        how.iter().map(|h| format!("# {h}")).collect::<Vec<_>>().join("\n"),
        m.to_toml()
    );
    match &a.out {
        Some(p) => {
            std::fs::write(p, &text).with_context(|| format!("writing {}", p.display()))?;
            for h in &how {
                eprintln!("{h}");
            }
            eprintln!(
                "cluster model written to {} (use: parcache advise TRACE --cluster {})",
                p.display(),
                p.display()
            );
        }
        None => outln!("{text}")?,
    }
    Ok(())
}
