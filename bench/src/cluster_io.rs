//! The data path against the machine's limits, measured in one run:
//! sequential write (ending with fsync) and read of 1 GiB in 1 MiB
//! requests and 4 KiB random reads through the client library against a
//! 4-data-server cluster on loopback, beside the same operations on a local
//! directory, the loopback TCP bandwidth and memcpy measured in the same
//! run. Reads go through a second client whose node cache is cold, from
//! the disks (cold: a second file written after the first pushed most of
//! it out of the data servers' caches), then through a third, whose node
//! cache is cold too, from the data servers' caches (warm, as the mount's
//! warm read, and the figure compared with loopback TCP); the cache-hit
//! figure rereads 32 MiB the writer's node cache holds. The disk's own
//! direct writes, measured in the same run, bound every write+fsync.
//!
//! Run: `cargo run --release -p parcache-bench --bin cluster-io [-- MIB]`
//! (MIB: size of the sequential file, default 1024;
//! `PARCACHE_PREFETCH=NAME` runs it under another prefetch policy than the
//! default, `PARCACHE_BLOCK_KIB` with another node block size,
//! `PARCACHE_LAZY_CACHE=1` with data servers and clients that take their
//! caches' memory as blocks fill it, as `mount-io` says; by default each
//! client takes its node cache's memory before it is timed, as a mount
//! does at start, and as a long-lived program using the library may with
//! `Fs::take_cache_memory_ahead`). The
//! servers run in this process on their own tokio runtime, talking over real loopback
//! sockets with the real protocol; the write log fsyncs as in production.

use anyhow::Result;
use parcache_bench::{hit_share, loopback_tcp, BenchCluster};
use parcache_client::{Attr, Fs};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Instant;

const MIB: usize = 1 << 20;

fn rate(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

/// memcpy of 1 MiB pieces out of a 32 MiB buffer: the same request size
/// and working set as the cache-hit reads.
fn memcpy(total: u64) -> f64 {
    let src = vec![3u8; 32 * MIB];
    let mut dst = vec![0u8; MIB];
    let t = Instant::now();
    let mut n = 0;
    let mut k = 0;
    while n < total {
        dst.copy_from_slice(&src[k * MIB..(k + 1) * MIB]);
        std::hint::black_box(&mut dst);
        k = (k + 1) % 32;
        n += MIB as u64;
    }
    rate(total, t.elapsed().as_secs_f64())
}

/// The local directory's write+fsync, cold sequential read and cold random
/// 4 KiB reads, and whether its reads were cold (root drops the page
/// cache before each).
fn local_dir(dir: &std::path::Path, total: u64, random: usize) -> Result<(f64, f64, f64, bool)> {
    let p = dir.join("local.bin");
    let buf: Vec<u8> = (0..MIB).map(|i| i as u8).collect();
    let t = Instant::now();
    let mut f = std::fs::File::create(&p)?;
    let mut n = 0;
    while n < total {
        f.write_all(&buf)?;
        n += MIB as u64;
    }
    f.sync_all()?;
    let w = rate(total, t.elapsed().as_secs_f64());
    let mut rbuf = vec![0u8; MIB];
    drop(f);
    // Cold, as parcache's cold read: from the disk (root only; otherwise
    // from the page cache, which the printout says).
    let cold = parcache_bench::drop_caches();
    let mut f = std::fs::File::open(&p)?;
    let t = Instant::now();
    let mut n = 0;
    while n < total {
        f.read_exact(&mut rbuf)?;
        n += MIB as u64;
    }
    let r = rate(total, t.elapsed().as_secs_f64());
    parcache_bench::drop_caches();
    let mut small = [0u8; 4096];
    let mut x = 12345u64;
    let t = Instant::now();
    for _ in 0..random {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let off = (x >> 20) % (total - 4096);
        f.read_exact_at(&mut small, off)?;
    }
    let iops = random as f64 / t.elapsed().as_secs_f64();
    std::fs::remove_file(&p)?;
    Ok((w, r, iops, cold))
}

/// Reads the file `a` of `mib` MiB sequentially in 1 MiB requests, `lanes`
/// of them in flight (lane k reads MiB k, k + lanes, ...), each into a
/// buffer of its own used again, as fio's jobs and the TCP baseline do (a
/// new buffer per read, `Fs::read_at`'s, cost 8 lanes a fifth of their
/// CPU in the kernel clearing the pages the allocator had given back);
/// GB/s.
async fn read_seq(fs: &Arc<Fs>, a: &Attr, mib: u64, lanes: u64) -> Result<f64> {
    let t = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for lane in 0..lanes {
        let (fs, a) = (fs.clone(), a.clone());
        tasks.spawn(async move {
            let mut buf = vec![0u8; MIB];
            let mut k = lane;
            while k < mib {
                let n = fs.read_into(&a, k * MIB as u64, &mut buf).await?;
                anyhow::ensure!(n == MIB, "read {n} bytes of MiB {k}");
                k += lanes;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(rate(mib * MIB as u64, t.elapsed().as_secs_f64()))
}

/// Reads the file `a` as [`read_seq`] does from a new client (its node
/// cache empty, its memory taken first): GB/s, and the share of the data
/// servers' reads meanwhile that hit.
async fn read_warm(
    cluster: &BenchCluster,
    ncfg: &parcache_client::NodeCacheConfig,
    a: &Attr,
    mib: u64,
    lanes: u64,
) -> Result<(f64, f64)> {
    let fs = Fs::connect_with(&cluster.mds_addr, &cluster.secret, ncfg.clone()).await?;
    cache_taken(&fs).await?;
    let before = cluster.read_hits_misses().await?;
    let rate = read_seq(&fs, a, mib, lanes).await?;
    let after = cluster.read_hits_misses().await?;
    Ok((rate, hit_share(before, after)))
}

/// Takes the client's node cache memory and waits for it, as `mount-io`'s
/// mount does (unless `PARCACHE_LAZY_CACHE=1`): on this machine a page's
/// first touch costs 2–30 µs, which a short run would otherwise count
/// against the data path (64 MiB, a third of a second).
async fn cache_taken(fs: &Fs) -> Result<()> {
    if std::env::var_os("PARCACHE_LAZY_CACHE").is_some() {
        return Ok(());
    }
    let taking = fs.take_cache_memory_ahead().await?;
    tokio::task::spawn_blocking(move || taking.join())
        .await?
        .map_err(|_| anyhow::anyhow!("node cache: taking its memory ahead panicked"))?;
    Ok(())
}

fn main() -> Result<()> {
    let mib: u64 = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(1024);
    let total = mib * MIB as u64;
    let random = 20_000;
    let dir = std::env::temp_dir().join(format!("parcache-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let threads = parcache_bench::ThreadWatch::start();
    let cluster = BenchCluster::start(&dir, 4)?;
    let (mds_addr, secret) = (cluster.mds_addr.clone(), cluster.secret.clone());

    let client = parcache_server::runtime()?;
    let tcp = loopback_tcp(total)?;
    let mem = memcpy(total);
    let (lw, lr, liops, lcold) = local_dir(&dir, total, random)?;
    let disk = parcache_bench::disk_direct_write(&dir, total, 4)?;
    let (cw, cw8, cr, cr8, (ww, warm_hits), (ww8, warm8_hits), ciops, chit) = client.block_on(async {
        let mut ncfg = parcache_client::NodeCacheConfig::default();
        if let Some(kib) = std::env::var("PARCACHE_BLOCK_KIB")
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
        {
            ncfg.block_size = kib << 10;
        }
        let fs = Fs::connect_with(&mds_addr, &secret, ncfg.clone()).await?;
        cache_taken(&fs).await?;
        if let Ok(v) = std::env::var("PARCACHE_PREFETCH") {
            fs.set_policy("/", "prefetch", &v).await?;
        }
        let buf: Vec<u8> = (0..MIB).map(|i| (i * 7) as u8).collect();
        // One request at a time.
        let a = fs.create("/seq1", 0o644, true).await?;
        let t = Instant::now();
        for k in 0..mib {
            fs.write_at(&a, k * MIB as u64, &buf).await?;
        }
        fs.fsync(&a).await?;
        let cw = rate(total, t.elapsed().as_secs_f64());
        // Eight 1 MiB requests in flight.
        let a8 = fs.create("/seq8", 0o644, true).await?;
        let t = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for lane in 0..8u64 {
            let (fs, a8, buf) = (fs.clone(), a8.clone(), buf.clone());
            tasks.spawn(async move {
                let mut k = lane;
                while k < mib {
                    fs.write_at(&a8, k * MIB as u64, &buf).await?;
                    k += 8;
                }
                anyhow::Ok(())
            });
        }
        while let Some(r) = tasks.join_next().await {
            r??;
        }
        fs.fsync(&a8).await?;
        let cw8 = rate(total, t.elapsed().as_secs_f64());
        // Reads from another node, whose cache is cold: from the disks
        // (the second file pushed most of the first out of the data
        // servers' caches), then warm (a third node reads the same file,
        // now in the data servers' caches, as the mount's warm read).
        let writer = fs;
        let fs = Fs::connect_with(&mds_addr, &secret, ncfg.clone()).await?;
        cache_taken(&fs).await?;
        let a = fs.resolve("/seq1").await?;
        let cr = read_seq(&fs, &a, mib, 1).await?;
        let (ww, warm_hits) = read_warm(&cluster, &ncfg, &a, mib, 1).await?;
        let a8 = fs.resolve("/seq8").await?;
        let cr8 = read_seq(&fs, &a8, mib, 8).await?;
        let (ww8, warm8_hits) = read_warm(&cluster, &ncfg, &a8, mib, 8).await?;
        let mut x = 12345u64;
        let t = Instant::now();
        for _ in 0..random {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let off = (x >> 20) % (total - 4096);
            fs.read_at(&a, off, 4096).await?;
        }
        let ciops = random as f64 / t.elapsed().as_secs_f64();
        // Cache hits: 32 MiB that the writer's node cache holds (64 MiB pool).
        let hot = 32u64.min(mib);
        let base = (mib - hot) * MIB as u64;
        let mut hit = vec![0u8; MIB];
        for k in 0..hot {
            writer.read_into(&a, base + k * MIB as u64, &mut hit).await?;
        }
        let t = Instant::now();
        let rounds = 8;
        for _ in 0..rounds {
            for k in 0..hot {
                writer.read_into(&a, base + k * MIB as u64, &mut hit).await?;
            }
        }
        std::hint::black_box(&hit);
        let chit = rate(rounds * hot * MIB as u64, t.elapsed().as_secs_f64());
        anyhow::Ok((cw, cw8, cr, cr8, (ww, warm_hits), (ww8, warm8_hits), ciops, chit))
    })?;
    println!("file size {mib} MiB, 1 MiB requests; 4 data servers on loopback; {random} random 4 KiB reads");
    println!(
        "caches' memory: {}",
        if std::env::var_os("PARCACHE_LAZY_CACHE").is_some() {
            "taken as blocks fill them (PARCACHE_LAZY_CACHE)"
        } else {
            "taken before timing, the data servers' at start and each client's node cache's once connected (as a mount does)"
        }
    );
    println!("baselines, same run: loopback TCP {tcp:.2} GB/s, memcpy {mem:.2} GB/s");
    println!(
        "local directory:  write+fsync {lw:.2} GB/s, read {lr:.2} GB/s ({}), random 4 KiB {liops:.0} reads/s",
        if lcold {
            "cold: the page cache dropped before it and the random reads"
        } else {
            "not root: from the page cache, as the random reads"
        }
    );
    match disk {
        Some(d) => println!(
            "the disk's own writes, same directory ({}): {d:.2} GB/s (4 writers of 1 MiB O_DIRECT pieces, each ending with fsync, as 4 data servers write their stripes)",
            dir.display()
        ),
        None => println!("the disk's own writes: not measured (the file system here refuses O_DIRECT)"),
    }
    println!(
        "parcache, 1 in flight:  write+fsync {cw:.2} GB/s, cold read {cr:.2} GB/s, random 4 KiB {ciops:.0} reads/s"
    );
    println!("parcache, 8 in flight:  write {cw8:.2} GB/s, cold read {cr8:.2} GB/s");
    println!(
        "parcache, warm read (a fresh client; the data servers' caches hold the file): {ww:.2} GB/s (1 in flight), {ww8:.2} GB/s (8 in flight); data servers' read hits {:.0} % and {:.0} %",
        warm_hits * 100.0,
        warm8_hits * 100.0
    );
    println!(
        "threads: at most {} in this process (all 5 daemons and the client together; aim: no daemon above 64)",
        threads.most()
    );
    println!(
        "ratio write / loopback TCP:  {:.2} (1 in flight)  {:.2} (8 in flight)   target 0.60",
        cw / tcp,
        cw8 / tcp
    );
    if let Some(d) = disk {
        println!(
            "ceiling of the write / loopback TCP on this machine: {:.2} (the disk's own writes / TCP; every written byte crosses the disk before fsync returns); write / the disk's own writes: {:.2} (1 in flight)  {:.2} (8 in flight)",
            d / tcp,
            cw / d,
            cw8 / d
        );
    }
    println!(
        "ratio warm read / loopback TCP: {:.2} (1 in flight)  {:.2} (8 in flight)   target 0.60",
        ww / tcp,
        ww8 / tcp
    );
    println!(
        "ratio cold read / loopback TCP: {:.2} (1 in flight)  {:.2} (8 in flight)   (from the disks: bounded by them, not by TCP)",
        cr / tcp,
        cr8 / tcp
    );
    println!(
        "ratio write / local dir:     {:.2}   read / local dir: {:.2}   random reads / local dir: {:.3}",
        cw / lw,
        cr / lr,
        ciops / liops
    );
    println!(
        "cache-hit reads / memcpy:    {:.2} ({chit:.2} GB/s through the node cache)   target 0.50",
        chit / mem
    );
    drop(client);
    drop(cluster);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
