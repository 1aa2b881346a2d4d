//! `nv-io`: what a durable write costs on this machine with and without a
//! node's durable write cache (Biswas et al. 1993: a small client NV cache
//! cuts write response about 4x). Every case makes each write durable
//! before the next one starts, and all are measured in one run against
//! the same cluster (4 data servers on loopback), so the ratios stand
//! though the machine is noisy:
//!
//! * `write + fsync`: the default policies; each write is followed by an
//!   `fsync` (the data servers sync their logs, the metadata server commits);
//! * `nv=on, node NV`: a node with `--nv-dir`; the write returns once the
//!   node's own log has fsynced it;
//! * `nv=on, no node NV`: the same file policy on a node without one: each
//!   write goes through to the data servers' logs, durably.
//!
//! For reference, `buffered write` is a write the node cache takes without
//! any durability (it is lost with the node).

use anyhow::Result;
use parcache_bench::{distinct, BenchCluster};
use parcache_client::{Fs, NodeCacheConfig, NvConfig};
use std::sync::Arc;
use std::time::Instant;

/// Writes per case and size.
const N: usize = 400;
/// Writes land at random places in this many bytes (overwrites happen).
const REGION: u64 = 4 << 20;
const SIZES: [u64; 2] = [4 << 10, 64 << 10];

async fn node(c: &BenchCluster, nv: Option<NvConfig>) -> Result<Arc<Fs>> {
    let cfg = NodeCacheConfig {
        nv,
        ..NodeCacheConfig::default()
    };
    Ok(Fs::connect_with(&c.mds_addr, &c.secret, cfg).await?)
}

/// Mean µs per durable write of `size` bytes (with `fsync` after each if
/// `sync`).
async fn case(fs: &Fs, path: &str, settings: &[(&str, &str)], size: u64, sync: bool) -> Result<f64> {
    fs.create(path, 0o644, true).await?;
    for (k, v) in settings {
        fs.set_policy(path, k, v).await?;
    }
    let a = fs.open(&fs.resolve(path).await?, true).await?;
    let data = distinct(size, size as usize);
    let mut x = size | 1;
    let t = Instant::now();
    for _ in 0..N {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let at = (x % (REGION / size)) * size;
        fs.write_at(&a, at, &data).await?;
        if sync {
            fs.fsync(&a).await?;
        }
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / N as f64;
    fs.close(&a, true).await?;
    Ok(us)
}

fn main() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("parcache-nv-io-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let c = BenchCluster::start(&dir, 4)?;
    let rt = parcache_server::runtime()?;
    rt.block_on(async {
        let plain = node(&c, None).await?;
        let nv = node(
            &c,
            Some(NvConfig {
                dir: dir.join("node-nv"),
                bytes: 8 << 20,
            }),
        )
        .await?;
        let nv_policy = [("nv", "on"), ("write", "threshold")];
        println!(
            "{:>7} {:>16} {:>16} {:>18} {:>16}   (mean µs per write, {N} writes, random places in {} MiB)",
            "size",
            "write + fsync",
            "nv=on, node NV",
            "nv=on, no node NV",
            "buffered write",
            REGION >> 20
        );
        for size in SIZES {
            let synced = case(&plain, &format!("/sync-{size}"), &[], size, true).await?;
            let logged = case(&nv, &format!("/nv-{size}"), &nv_policy, size, false).await?;
            let through = case(&plain, &format!("/through-{size}"), &nv_policy, size, false).await?;
            let buffered = case(&plain, &format!("/buffered-{size}"), &[], size, false).await?;
            println!(
                "{:>6}K {:>16.0} {:>16.0} {:>18.0} {:>16.0}",
                size >> 10,
                synced,
                logged,
                through,
                buffered
            );
            println!(
                "{:>7} {:>16} {:>15.2}x {:>17.2}x {:>15.2}x   (write + fsync / case: how many times faster)",
                "",
                "1.00x",
                synced / logged,
                synced / through,
                synced / buffered
            );
        }
        for fs in [&plain, &nv] {
            fs.shutdown().await?;
        }
        anyhow::Ok(())
    })?;
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
