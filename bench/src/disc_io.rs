//! `disc-io`: the 2003 paper's Table 1 and Table 2 on this machine
//! (Vilayannur et al. 2003 §3.3): the time of one read request of 4 KiB to
//! 256 KiB with no cache, a local hit, a local miss, a global hit and a
//! global miss, the "required hit rate" at which the global cache pays off
//! against no cache, and the time of a write that the node cache buffers
//! against one that goes around every cache. One run, 4 data servers on
//! loopback; every case is measured in the same run, so the ratios stand
//! though the machine is noisy.
//!
//! Two library nodes form the tier: A runs the requests; B's share of the
//! global cache holds the blocks A asks for (only blocks whose home is B
//! are used, so a global request always crosses the network as in the
//! paper, where the global cache ran on another node). Every case reads
//! blocks no earlier request touched, except the hits, which re-read the
//! case before them.

use anyhow::{ensure, Result};
use parcache_bench::{distinct, BenchCluster};
use parcache_client::{Fs, HintList};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 64 << 10;
const FILE_MIB: u64 = 512;
const SIZES: [u64; 7] = [4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10];
/// Requests per case and size.
const N: usize = 24;

async fn write_file(fs: &Fs, path: &str) -> Result<()> {
    fs.create(path, 0o644, true).await?;
    let a = fs.open(&fs.resolve(path).await?, true).await?;
    for k in 0..FILE_MIB {
        fs.write_at(&a, k * MIB, &distinct(k, MIB as usize)).await?;
    }
    fs.close(&a, true).await?;
    Ok(())
}

/// Mean µs of reading `size` bytes at each offset.
async fn reads(fs: &Fs, path: &str, offsets: &[u64], size: u64) -> Result<f64> {
    let a = fs.open(&fs.resolve(path).await?, false).await?;
    let mut buf = vec![0u8; size as usize];
    let t = Instant::now();
    for &o in offsets {
        let n = fs.read_into(&a, o, &mut buf).await?;
        ensure!(n == size as usize, "{path}: short read at {o}");
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / offsets.len() as f64;
    fs.close(&a, false).await?;
    Ok(us)
}

/// Mean µs of writing `size` bytes at each offset (the close after is
/// not timed: the paper times the write call's return).
async fn writes(fs: &Fs, path: &str, offsets: &[u64], size: u64) -> Result<f64> {
    let a = fs.open(&fs.resolve(path).await?, true).await?;
    let data = distinct(size, size as usize);
    let t = Instant::now();
    for &o in offsets {
        fs.write_at(&a, o, &data).await?;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / offsets.len() as f64;
    fs.close(&a, true).await?;
    Ok(us)
}

/// `N` block-aligned offsets whose `size` bytes lie in blocks no earlier
/// pick used, all with home `want` (any home if `None`).
fn pick(fs: &Fs, handle: u64, size: u64, want: Option<u64>, used: &mut HashSet<u64>) -> Result<Vec<u64>> {
    let blocks = size.div_ceil(BLOCK);
    let mut out = Vec::new();
    let mut i = 0;
    while out.len() < N {
        ensure!(
            i + blocks <= FILE_MIB * MIB / BLOCK,
            "the file has too few free blocks for {size} B requests"
        );
        let run: Vec<u64> = (i..i + blocks).collect();
        let ok = run
            .iter()
            .all(|&b| !used.contains(&b) && want.is_none_or(|w| fs.global_home_of(handle, b) == w));
        if ok {
            used.extend(&run);
            out.push(i * BLOCK);
            i += blocks;
        } else {
            i += 1;
        }
    }
    Ok(out)
}

async fn hint(fs: &Fs, path: &str, rules: &str) -> Result<()> {
    fs.clear_hints(path).await?;
    if !rules.is_empty() {
        fs.hint(path, &rules.parse::<HintList>()?).await?;
    }
    Ok(())
}

fn main() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("parcache-disc-io-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cluster = BenchCluster::start(&dir, 4)?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let (mds, secret) = (&cluster.mds_addr, &cluster.secret);
        let w = Fs::connect(mds, secret).await?;
        w.mkdir("/plain", 0o755).await?;
        w.mkdir("/glob", 0o755).await?;
        w.set_policy("/glob", "cooperative", "global").await?;
        // The paper's caches did not prefetch; one block ahead would turn
        // misses into hits here.
        for d in ["/plain", "/glob"] {
            w.set_policy(d, "prefetch", "none").await?;
        }
        write_file(&w, "/plain/f").await?;
        write_file(&w, "/glob/f").await?;
        w.shutdown().await?;
        let a: Arc<Fs> = Fs::connect(mds, secret).await?;
        let b: Arc<Fs> = Fs::connect(mds, secret).await?;
        a.join_tier("disc-a".into(), "127.0.0.1:0").await?;
        b.join_tier("disc-b".into(), "127.0.0.1:0").await?;
        tokio::time::sleep(Duration::from_millis(5_500)).await;
        let hp = a.resolve("/plain/f").await?.handle;
        let hg = a.resolve("/glob/f").await?.handle;
        let (mut used_p, mut used_g) = (HashSet::new(), HashSet::new());
        println!("# disc-io: the 2003 micro-benchmarks (Tables 1 and 2) on loopback, 4 data servers, 64 KiB blocks\n");
        println!("Reads, µs per request (mean of {N}); ratios to no cache:\n");
        println!("| size | no cache | local hit | local miss | global hit | global miss | required hit rate | local hit / none | global hit / none | global miss / none |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for size in SIZES {
            // No cache: around the node's cache (the plain file has no
            // global level).
            hint(&a, "/plain/f", "read:local=off").await?;
            let none = reads(&a, "/plain/f", &pick(&a, hp, size, None, &mut used_p)?, size).await?;
            hint(&a, "/plain/f", "").await?;
            let lm_at = pick(&a, hp, size, None, &mut used_p)?;
            let local_miss = reads(&a, "/plain/f", &lm_at, size).await?;
            let local_hit = reads(&a, "/plain/f", &lm_at, size).await?;
            // Global: around A's own cache, so each request reaches B.
            hint(&a, "/glob/f", "read:local=off").await?;
            let gm_at = pick(&a, hg, size, Some(b.node_id()), &mut used_g)?;
            let global_miss = reads(&a, "/glob/f", &gm_at, size).await?;
            let global_hit = reads(&a, "/glob/f", &gm_at, size).await?;
            let required = (global_miss - none) / (global_miss - global_hit);
            println!(
                "| {} KiB | {none:.0} | {local_hit:.0} | {local_miss:.0} | {global_hit:.0} | {global_miss:.0} | {required:.2} | {:.2} | {:.2} | {:.2} |",
                size >> 10,
                local_hit / none,
                global_hit / none,
                global_miss / none
            );
        }
        let s = a.node_stats();
        println!(
            "\nNode A's counters: local read bypasses {}, global read bypasses {}; B's share: hits {}, misses {}.",
            s.local_read_bypasses,
            s.global_read_bypasses,
            b.node_stats().global_hits,
            b.node_stats().global_misses
        );
        println!("\nWrites, µs per request until the call returns (mean of {N}):\n");
        println!("| size | no cache | cached | cached / none |");
        println!("|---|---:|---:|---:|");
        for size in SIZES {
            hint(&a, "/plain/f", "write:local=off").await?;
            let none = writes(&a, "/plain/f", &pick(&a, hp, size, None, &mut used_p)?, size).await?;
            hint(&a, "/plain/f", "").await?;
            let cached = writes(&a, "/plain/f", &pick(&a, hp, size, None, &mut used_p)?, size).await?;
            println!("| {} KiB | {none:.0} | {cached:.0} | {:.2} |", size >> 10, cached / none);
        }
        println!();
        for n in [a, b] {
            n.leave_tier().await?;
            n.shutdown().await?;
        }
        anyhow::Ok(())
    })?;
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
