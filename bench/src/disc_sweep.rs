//! `disc-sweep`: the 2003 out-of-core sweep (the simulator's
//! `vilayannur03-*` kernel, `parcache_sim::vilayannur03::workload`) on the
//! real system at small scale. Seven arrays of n × n doubles as cluster
//! files, three iterations of tomcatv-like nests, run by one library node
//! A whose own cache is 1 MiB; A and a second node B each give 8 MiB to the
//! global cache (`cooperative=global`). Every scheme gets fresh files and
//! fresh nodes. One run; times are compared with no cache in the same run.
//!
//! Schemes: no cache (hints send every request around the node's cache, on
//! files without a global level), the node's cache only (`cooperative=none`),
//! cache everything (`global`), file hints
//! (the arrays that fit in the global cache by accesses per block go
//! through it, the rest around), and the runtime bypass
//! (`global(threshold=20)`). Segment hints are the simulator's only.

use anyhow::{ensure, Result};
use parcache_bench::BenchCluster;
use parcache_client::{Fs, NodeCacheConfig};
use parcache_proto::Secret;
use parcache_sim::vilayannur03::workload::{generate, Kernel, Order};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const SIZES: [u64; 3] = [300, 500, 700];
const ITERATIONS: usize = 3;
const GLOBAL_MIB: u64 = 8;
const LOCAL_MIB: u64 = 1;
const SCHEMES: [&str; 5] = ["no-cache", "local-only", "cache-all", "file-hints", "runtime(20)"];

async fn node(mds: &str, secret: &Secret, name: &str) -> Result<Arc<Fs>> {
    let cache = NodeCacheConfig {
        pool_bytes: LOCAL_MIB * MIB,
        global_bytes: GLOBAL_MIB * MIB,
        ..Default::default()
    };
    let fs = Fs::connect_with(mds, secret, cache).await?;
    fs.join_tier(name.into(), "127.0.0.1:0").await?;
    Ok(fs)
}

/// Runs one scheme at size `n`: seconds of the program's I/O.
async fn run(mds: &str, secret: &Secret, n: u64, scheme: &str) -> Result<f64> {
    let w = generate(Kernel::Tomcatv(Order::Row), n, ITERATIONS, 1);
    let setup = Fs::connect(mds, secret).await?;
    let dir = format!("/{scheme}-{n}");
    setup.mkdir(&dir, 0o755).await?;
    let coop = match scheme {
        "no-cache" | "local-only" => "none",
        "runtime(20)" => "global(threshold=20)",
        _ => "global",
    };
    setup.set_policy(&dir, "cooperative", coop).await?;
    setup.set_policy(&dir, "prefetch", "none").await?;
    let zeros = vec![0u8; w.array_bytes as usize];
    for f in 0..w.arrays {
        let p = format!("{dir}/a{f}");
        setup.create(&p, 0o644, true).await?;
        let a = setup.open(&setup.resolve(&p).await?, true).await?;
        setup.write_at(&a, 0, &zeros).await?;
        setup.close(&a, true).await?;
    }
    // The hints, as the compiler would set them.
    let fit = (2 * GLOBAL_MIB * MIB / w.array_bytes.max(1)) as usize;
    let mut per: HashMap<u64, u64> = HashMap::new();
    for r in &w.requests {
        *per.entry(r.file).or_default() += r.len;
    }
    let mut by_use: Vec<(u64, u64)> = per.into_iter().collect();
    by_use.sort_by_key(|(f, b)| (std::cmp::Reverse(*b), *f));
    for (rank, (f, _)) in by_use.iter().enumerate() {
        let p = format!("{dir}/a{f}");
        let rules = match scheme {
            "no-cache" => "rw:local=off",
            "file-hints" if rank >= fit => "rw:global=off",
            _ => continue,
        };
        setup.hint(&p, &rules.parse()?).await?;
    }
    setup.shutdown().await?;
    let a = node(mds, secret, "sweep-a").await?;
    let b = node(mds, secret, "sweep-b").await?;
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    let mut open = Vec::new();
    for f in 0..w.arrays {
        let at = a.resolve(&format!("{dir}/a{f}")).await?;
        open.push(a.open(&at, true).await?);
    }
    let mut buf = vec![0u8; (w.array_bytes as usize).min(1 << 20)];
    let data = vec![7u8; buf.len()];
    let t = Instant::now();
    for r in &w.requests {
        let h = &open[r.file as usize];
        if r.write {
            a.write_at(h, r.offset, &data[..r.len as usize]).await?;
        } else {
            let got = a.read_into(h, r.offset, &mut buf[..r.len as usize]).await?;
            ensure!(got == r.len as usize, "short read");
        }
    }
    let secs = t.elapsed().as_secs_f64();
    for h in &open {
        a.close(h, true).await?;
    }
    let s = a.node_stats();
    let sb = b.node_stats();
    eprintln!(
        "  {scheme} n={n}: local hits {}, global hits {} / misses {} (kept out {}), bypasses local {} global {}",
        s.local_hits,
        s.global_hits + sb.global_hits,
        s.global_misses + sb.global_misses,
        s.global_kept_out + sb.global_kept_out,
        s.local_read_bypasses + s.local_write_bypasses,
        s.global_read_bypasses + s.global_write_bypasses
    );
    for fs in [a, b] {
        fs.leave_tier().await?;
        fs.shutdown().await?;
    }
    Ok(secs)
}

fn main() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("parcache-disc-sweep-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cluster = BenchCluster::start(&dir, 4)?;
    let rt = tokio::runtime::Runtime::new()?;
    println!(
        "# disc-sweep: the 2003 tomcatv-like sweep on the real system (4 data servers, 2 nodes, local cache {LOCAL_MIB} MiB, global cache 2 x {GLOBAL_MIB} MiB)\n"
    );
    println!("| n | arrays, MiB | no cache, s | local only / none | cache all / local only | file hints / local only | runtime(20) / local only |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    rt.block_on(async {
        for n in SIZES {
            let mut t = Vec::new();
            for s in SCHEMES {
                t.push(run(&cluster.mds_addr, &cluster.secret, n, s).await?);
            }
            println!(
                "| {n} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                (7 * n * n * 8) as f64 / MIB as f64,
                t[0],
                t[1] / t[0],
                t[2] / t[1],
                t[3] / t[1],
                t[4] / t[1]
            );
        }
        anyhow::Ok(())
    })?;
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
