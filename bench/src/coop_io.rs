//! The cooperative tier (Cortes, Girona & Labarta 1996) on the real system,
//! measured in one run: a metadata server and 4 data servers on loopback,
//! and three nodes (client instances joined to the tier, each with its
//! own node cache and peer listener, as a mount has).
//!
//! - A large file (1 GiB by default) written by node A, read whole by B,
//!   then by C, under `none` (every miss to the data servers; the OS page
//!   cache dropped before each read when run as root, so they are cold),
//!   `lru-interleaved` and `n-chance`: MB/s of each pass and where the
//!   blocks came from.
//! - The cost of one read request, 4 KiB to 1 MiB at random offsets: a
//!   local hit (the node's own cache), a remote hit (`n-chance`: a peer
//!   holds every block) and a data-server read (a node that never read the
//!   file, cooperative off).
//!
//! Run: `cargo run --release -p parcache-bench --bin coop-io [-- MIB]`.

use anyhow::Result;
use parcache_bench::{distinct, BenchCluster};
use parcache_client::{Fs, NodeCacheConfig};
use parcache_proto::{NodeStats, Secret};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// The file of the request-cost table.
const SMALL_MIB: u64 = 64;
const SIZES: [u64; 5] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20];
/// The node cache's block (`NodeCacheConfig`'s default).
const BLOCK: u64 = 64 << 10;

/// Drops the OS page cache (root only): the data servers' files are then
/// read from disk. Returns whether it could.
fn drop_page_cache() -> bool {
    let _ = std::process::Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

struct Bench {
    mds: String,
    secret: Secret,
}

impl Bench {
    /// A node in the tier with a node cache of `mib` MiB per pool.
    async fn node(&self, name: &str, mib: u64) -> Result<Arc<Fs>> {
        let cache = NodeCacheConfig {
            pool_bytes: mib * MIB,
            ..Default::default()
        };
        let fs = Fs::connect_with(&self.mds, &self.secret, cache).await?;
        fs.join_tier(name.to_string(), "127.0.0.1:0").await?;
        Ok(fs)
    }

    /// Three fresh nodes that know each other (a heartbeat after the last joined).
    async fn three(&self, tag: &str, mib: u64) -> Result<[Arc<Fs>; 3]> {
        let a = self.node(&format!("{tag}-a"), mib).await?;
        let b = self.node(&format!("{tag}-b"), mib).await?;
        let c = self.node(&format!("{tag}-c"), mib).await?;
        tokio::time::sleep(Duration::from_millis(5_500)).await;
        Ok([a, b, c])
    }

    /// A directory `/name` whose new files run `cooperative=mode`.
    async fn dir(&self, name: &str, mode: &str) -> Result<String> {
        let fs = Fs::connect(&self.mds, &self.secret).await?;
        let d = format!("/{name}");
        fs.mkdir(&d, 0o755).await?;
        fs.set_policy(&d, "cooperative", mode).await?;
        Ok(d)
    }
}

async fn write_file(fs: &Fs, path: &str, mib: u64, seed: u64) -> Result<()> {
    fs.create(path, 0o644, true).await?;
    let a = fs.open(&fs.resolve(path).await?, true).await?;
    for k in 0..mib {
        fs.write_at(&a, k * MIB, &distinct(seed + k, MIB as usize)).await?;
    }
    fs.close(&a, true).await?;
    Ok(())
}

/// Reads the file whole in 1 MiB requests, checking its bytes: MB/s.
async fn read_file(fs: &Fs, path: &str, mib: u64, seed: u64) -> Result<f64> {
    let a = fs.open(&fs.resolve(path).await?, false).await?;
    let mut buf = vec![0u8; MIB as usize];
    let t = Instant::now();
    for k in 0..mib {
        let n = fs.read_into(&a, k * MIB, &mut buf).await?;
        anyhow::ensure!(
            n == MIB as usize && buf == distinct(seed + k, MIB as usize),
            "{path}: MiB {k} differs"
        );
    }
    let secs = t.elapsed().as_secs_f64();
    fs.close(&a, false).await?;
    Ok((mib * MIB) as f64 / secs / 1e6)
}

/// `n` reads of `size` bytes, each in blocks no earlier request touched
/// (64 KiB apart at least), in a shuffled order: µs per request.
async fn requests(fs: &Fs, path: &str, size: u64, n: u64) -> Result<f64> {
    let a = fs.open(&fs.resolve(path).await?, false).await?;
    let mut buf = vec![0u8; size as usize];
    let stride = size.max(BLOCK);
    let mut slots: Vec<u64> = (0..SMALL_MIB * MIB / stride).collect();
    let mut x = 0x2545_F491_4F6C_DD1Du64 ^ size;
    for i in (1..slots.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        slots.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let n = n.min(slots.len() as u64);
    let t = Instant::now();
    for &k in &slots[..n as usize] {
        fs.read_into(&a, k * stride, &mut buf).await?;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    fs.close(&a, false).await?;
    Ok(us)
}

fn sources(s: NodeStats) -> String {
    format!(
        "local hits {}, remote hits {}, data-server reads {}, forwards {}",
        s.local_hits, s.remote_hits, s.server_reads, s.forwards
    )
}

async fn large(b: &Bench, mib: u64) -> Result<()> {
    println!("## A {mib} MiB file written by node A, read whole by B, then by C (1 MiB requests)\n");
    let cold = drop_page_cache();
    if !cold {
        println!("(not root: the OS page cache could not be dropped; data-server reads may be warm)\n");
    }
    println!("| cooperative | B MB/s | C MB/s | C / B | C's blocks |");
    println!("|---|---:|---:|---:|---|");
    let mut c_rates = vec![];
    for mode in ["none", "lru-interleaved", "n-chance"] {
        let d = b.dir(mode, mode).await?;
        let path = format!("{d}/big");
        // Each home holds a third under lru-interleaved; a reader holds all under none and n-chance.
        let nodes = b.three(mode, mib + mib / 4).await?;
        write_file(&nodes[0], &path, mib, 7).await?;
        drop_page_cache();
        let rb = read_file(&nodes[1], &path, mib, 7).await?;
        // C's read is cold on the data servers' disks too.
        drop_page_cache();
        let before = nodes[2].node_stats();
        let rc = read_file(&nodes[2], &path, mib, 7).await?;
        let after = nodes[2].node_stats();
        let delta = NodeStats {
            local_hits: after.local_hits - before.local_hits,
            server_reads: after.server_reads - before.server_reads,
            remote_hits: after.remote_hits - before.remote_hits,
            forwards: after.forwards - before.forwards,
            ..NodeStats::default()
        };
        println!("| {mode} | {rb:.0} | {rc:.0} | {:.2} | {} |", rc / rb, sources(delta));
        c_rates.push(rc);
        for n in nodes {
            n.leave_tier().await?;
            n.shutdown().await?;
        }
    }
    println!(
        "\nC's read from peers over C's read from the data servers: lru-interleaved {:.2}, n-chance {:.2}\n",
        c_rates[1] / c_rates[0],
        c_rates[2] / c_rates[0]
    );
    Ok(())
}

async fn costs(b: &Bench) -> Result<()> {
    println!("## One read request at a random offset of a {SMALL_MIB} MiB file, µs\n");
    let none = b.dir("costs-none", "none").await?;
    let nc = b.dir("costs-n-chance", "n-chance").await?;
    let [a, holder, other] = b.three("costs", 256).await?;
    other.leave_tier().await?;
    other.shutdown().await?;
    let mut remote_stats = vec![];
    let (pn, pc) = (format!("{none}/small"), format!("{nc}/small"));
    write_file(&a, &pn, SMALL_MIB, 3).await?;
    write_file(&a, &pc, SMALL_MIB, 3).await?;
    // The holder reads the n-chance file (from the data servers): it then
    // holds every block, and the reader's misses are remote hits.
    read_file(&holder, &pc, SMALL_MIB, 3).await?;
    // The local-hit node reads the plain file once: every block is cached.
    read_file(&holder, &pn, SMALL_MIB, 3).await?;
    println!("| request | local hit | remote hit | data-server read | remote / local | data server / remote |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for size in SIZES {
        let n = 64 / SIZES.len() as u64 * MIB / size.max(BLOCK) / 4;
        let local = requests(&holder, &pn, size, n).await?;
        // A fresh node each size (outside the tier), so every request misses its cache.
        let fresh = Fs::connect(&b.mds, &b.secret).await?;
        let server = requests(&fresh, &pn, size, n).await?;
        fresh.shutdown().await?;
        // A fresh tier node each size, so every request is a remote hit
        // (it learns the members from its first heartbeat).
        let reader = b.node("costs-r", 256).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let remote = requests(&reader, &pc, size, n).await?;
        remote_stats.push(reader.node_stats());
        reader.leave_tier().await?;
        reader.shutdown().await?;
        println!(
            "| {} KiB | {local:.0} | {remote:.0} | {server:.0} | {:.1} | {:.2} |",
            size >> 10,
            remote / local,
            server / remote
        );
    }
    for (size, s) in SIZES.iter().zip(remote_stats) {
        println!("\nThe remote-hit reader, {} KiB: {}", size >> 10, sources(s));
    }
    println!();
    for n in [a, holder] {
        n.leave_tier().await?;
        n.shutdown().await?;
    }
    Ok(())
}

fn main() -> Result<()> {
    let mib: u64 = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(1024);
    let dir = std::env::temp_dir().join(format!("parcache-coop-io-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cluster = BenchCluster::start(&dir, 4)?;
    let rt = tokio::runtime::Runtime::new()?;
    let b = Bench {
        mds: cluster.mds_addr.clone(),
        secret: cluster.secret.clone(),
    };
    println!("# coop-io: the cooperative tier on loopback (4 data servers, 3 nodes)\n");
    rt.block_on(async {
        large(&b, mib).await?;
        costs(&b).await
    })?;
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
