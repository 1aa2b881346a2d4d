//! CAPFS (Vilayannur et al. 2005 §5) on the real system at this machine's
//! scale, measured in one run: 4 data servers and a metadata server on
//! loopback, 1, 2 and 4 nodes (client instances, each with its own node
//! cache, H-cache and D-cache, as a mount has), each of the five presets
//! of Table 1 on content-addressed files beside a PVFS-like baseline
//! (`posix` on block files: no client cache, as PVFS 1 had none).
//!
//! - Writes (Fig. 8): the nodes write disjoint shares of one file in 1 MiB
//!   requests, then `fsync`.
//! - Reads (Fig. 7): the nodes read a large file (larger than the D-cache)
//!   and many small files twice; the second pass is where an H-cache
//!   saves the metadata server's round trips.
//! - Repeated data (§3.3): a file of one 16 KiB pattern against one of
//!   distinct data: stored bytes, write and read rates.
//!
//! Run: `cargo run --release -p parcache-bench --bin capfs-io [-- MIB [SMALL]]`
//! (MIB: size of the large file, default 128; SMALL: number of 16 KiB
//! files, default 512).

use anyhow::Result;
use parcache_bench::{distinct, BenchCluster};
use parcache_client::Fs;
use parcache_proto::Secret;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

const MIB: u64 = 1 << 20;
const NODES: [usize; 3] = [1, 2, 4];
/// The baseline first, then Table 1's rows.
const POLICIES: [&str; 6] = ["pvfs", "seq-1", "seq-2", "for-1", "for-2", "rel-1"];

fn mbs(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / 1e6
}

struct Bench {
    mds: String,
    secret: Secret,
}

impl Bench {
    async fn node(&self) -> Result<Arc<Fs>> {
        Ok(Fs::connect(&self.mds, &self.secret).await?)
    }

    /// A directory `/name` whose new files run `policy`.
    async fn dir(&self, name: &str, policy: &str) -> Result<String> {
        let fs = self.node().await?;
        let d = format!("/{name}");
        fs.mkdir(&d, 0o755).await?;
        if policy == "pvfs" {
            fs.set_policy(&d, "consistency", "posix").await?;
        } else {
            fs.set_policy(&d, "store", "cas").await?;
            fs.set_policy(&d, "consistency", policy).await?;
        }
        Ok(d)
    }

    /// `nodes` nodes write disjoint shares of a `mib` MiB file at once, in
    /// 1 MiB requests, each ending with fsync: aggregate MB/s.
    async fn write(&self, path: &str, nodes: usize, mib: u64, seed: u64) -> Result<f64> {
        self.node().await?.create(path, 0o644, true).await?;
        let mut fss = vec![];
        for _ in 0..nodes {
            fss.push(self.node().await?);
        }
        let t = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for (i, fs) in fss.into_iter().enumerate() {
            let path = path.to_string();
            tasks.spawn(async move {
                let a = fs.open(&fs.resolve(&path).await?, true).await?;
                let share = mib / nodes as u64;
                for k in i as u64 * share..(i as u64 + 1) * share {
                    fs.write_at(&a, k * MIB, &distinct(seed + k, MIB as usize)).await?;
                }
                fs.fsync(&a).await?;
                fs.close(&a, true).await?;
                anyhow::Ok(())
            });
        }
        while let Some(r) = tasks.join_next().await {
            r??;
        }
        Ok(mbs(mib * MIB, t.elapsed().as_secs_f64()))
    }

    /// `nodes` fresh nodes each read `paths` whole, twice, in 1 MiB
    /// requests: aggregate MB/s of the first and of the second pass.
    async fn read(&self, paths: &[String], nodes: usize) -> Result<(f64, f64)> {
        let mut fss = vec![];
        for _ in 0..nodes {
            fss.push(self.node().await?);
        }
        let mut rates = vec![];
        for _pass in 0..2 {
            let t = Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for fs in &fss {
                let (fs, paths) = (fs.clone(), paths.to_vec());
                tasks.spawn(async move {
                    let mut bytes = 0u64;
                    for p in &paths {
                        let a = fs.open(&fs.resolve(p).await?, false).await?;
                        let mut off = 0;
                        while off < a.size {
                            let d = fs.read_at(&a, off, MIB).await?;
                            anyhow::ensure!(!d.is_empty(), "{p}: short read at {off}");
                            off += d.len() as u64;
                        }
                        fs.close(&a, false).await?;
                        bytes += a.size;
                    }
                    anyhow::Ok(bytes)
                });
            }
            let mut bytes = 0;
            while let Some(r) = tasks.join_next().await {
                bytes += r??;
            }
            rates.push(mbs(bytes, t.elapsed().as_secs_f64()));
        }
        Ok((rates[0], rates[1]))
    }
}

/// Bytes of the chunks the data servers store.
fn chunk_bytes(dir: &Path) -> u64 {
    fn walk(p: &Path) -> u64 {
        let Ok(rd) = std::fs::read_dir(p) else { return 0 };
        rd.flatten()
            .map(|e| match e.file_type() {
                Ok(t) if t.is_dir() => walk(&e.path()),
                _ => e.metadata().map(|m| m.len()).unwrap_or(0),
            })
            .sum()
    }
    (0..4).map(|i| walk(&dir.join(format!("iod-{i}/chunks")))).sum()
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mib: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(128);
    let small: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(512);
    anyhow::ensure!(
        mib >= 4 && mib.is_multiple_of(4),
        "MIB must be a multiple of 4 (the nodes' shares)"
    );
    let dir = std::env::temp_dir().join(format!("parcache-bench-capfs-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let cluster = BenchCluster::start(&dir, 4)?;
    let b = Bench {
        mds: cluster.mds_addr.clone(),
        secret: cluster.secret.clone(),
    };
    let client = parcache_server::runtime()?;
    println!(
        "4 data servers on loopback; large file {mib} MiB, {small} small files of 16 KiB; 1 MiB requests; \
         D-cache 64 MiB, H-cache 65,536 hashes per node"
    );
    println!("MB/s, aggregate over the nodes; pvfs = posix on block files (no client cache)");
    println!(
        "{:<7} {:>9} {:>9} {:>9}   {:>11} {:>11}   {:>11} {:>11}",
        "policy", "write x1", "write x2", "write x4", "large cold", "large again", "small cold", "small again"
    );
    let mut rows = std::collections::HashMap::new();
    client.block_on(async {
        // Unmeasured: the data servers create their 256 chunk directories
        // at the first content-addressed writes, which would fall on
        // whichever preset runs first.
        let d = b.dir("warm-up", "rel-1").await?;
        b.write(&format!("{d}/w"), 1, 16, 1 << 50).await?;
        anyhow::Ok(())
    })?;
    client.block_on(async {
        for (pi, policy) in POLICIES.iter().enumerate() {
            let d = b.dir(policy, policy).await?;
            let mut w = vec![];
            for (ni, &n) in NODES.iter().enumerate() {
                let seed = ((pi * 8 + ni) as u64) << 32;
                w.push(b.write(&format!("{d}/w{n}"), n, mib, seed).await?);
            }
            let fs = b.node().await?;
            let mut smalls = vec![];
            for i in 0..small {
                let p = format!("{d}/s{i}");
                let a = fs.open(&fs.create(&p, 0o644, true).await?, true).await?;
                fs.write_at(&a, 0, &distinct(((pi as u64) << 40) + i as u64, 16 << 10))
                    .await?;
                fs.fsync(&a).await?;
                fs.close(&a, true).await?;
                smalls.push(p);
            }
            let (lc, lw) = b.read(&[format!("{d}/w4")], 1).await?;
            let (sc, sw) = b.read(&smalls, 1).await?;
            println!(
                "{policy:<7} {:>9.0} {:>9.0} {:>9.0}   {lc:>11.0} {lw:>11.0}   {sc:>11.1} {sw:>11.1}",
                w[0], w[1], w[2]
            );
            rows.insert(*policy, (w, lc, lw, sc, sw));
        }
        anyhow::Ok(())
    })?;

    // Repeated data: one 16 KiB pattern throughout, against distinct data.
    let (rep, dis, rep_stored, dis_stored) = client.block_on(async {
        let d = b.dir("dedup", "seq-1").await?;
        let fs = b.node().await?;
        let pattern = distinct(77, 16 << 10).repeat((MIB >> 14) as usize);
        let mut out = vec![];
        for (name, repeated) in [("repeated", true), ("distinct", false)] {
            let before = chunk_bytes(&dir);
            let p = format!("{d}/{name}");
            let a = fs.open(&fs.create(&p, 0o644, true).await?, true).await?;
            let t = Instant::now();
            for k in 0..mib {
                let buf = if repeated {
                    pattern.clone()
                } else {
                    distinct((9 << 40) + k, MIB as usize)
                };
                fs.write_at(&a, k * MIB, &buf).await?;
            }
            fs.fsync(&a).await?;
            fs.close(&a, true).await?;
            let w = mbs(mib * MIB, t.elapsed().as_secs_f64());
            let stored = chunk_bytes(&dir) - before;
            let (r, _) = b.read(&[p], 1).await?;
            out.push((w, r, stored));
        }
        anyhow::Ok((out[0], out[1], out[0].2, out[1].2))
    })?;
    println!(
        "repeated data (seq-1): write {:.0} MB/s, read {:.0} MB/s, {} KiB stored; distinct: write {:.0}, read {:.0}, {} KiB stored",
        rep.0,
        rep.1,
        rep_stored >> 10,
        dis.0,
        dis.1,
        dis_stored >> 10
    );

    let r = |p: &str| rows[p].clone();
    let (seq1, rel1, seq2, pvfs) = (r("seq-1"), r("rel-1"), r("seq-2"), r("pvfs"));
    println!(
        "ratio seq-1 / rel-1 writes:        {:.2} (x1)  {:.2} (x2)  {:.2} (x4)   paper: below 1 (Fig. 8: the commit checks cost)",
        seq1.0[0] / rel1.0[0],
        seq1.0[1] / rel1.0[1],
        seq1.0[2] / rel1.0[2]
    );
    println!(
        "ratio seq-1 / pvfs writes:         {:.2} (x1)  {:.2} (x2)  {:.2} (x4)",
        seq1.0[0] / pvfs.0[0],
        seq1.0[1] / pvfs.0[1],
        seq1.0[2] / pvfs.0[2]
    );
    println!(
        "ratio seq-2 / seq-1 reads, again:  {:.2} (large file)  {:.2} (small files)   paper: H-cache gains on large files, not on small (Fig. 7)",
        seq2.2 / seq1.2,
        seq2.4 / seq1.4
    );
    println!(
        "ratio seq-2 / pvfs reads, again:   {:.2} (large file)  {:.2} (small files)",
        seq2.2 / pvfs.2,
        seq2.4 / pvfs.4
    );
    println!(
        "ratio repeated / distinct data:    stored {:.4}  write {:.2}  read {:.2}   (§3.3: identical chunks stored once)",
        rep_stored as f64 / dis_stored.max(1) as f64,
        rep.0 / dis.0,
        rep.1 / dis.1
    );
    drop(client);
    drop(cluster);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
