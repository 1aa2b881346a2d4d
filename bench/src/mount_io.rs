//! The FUSE mount against a plain local directory and a FUSE passthrough
//! (bindfs, from Debian) in one run, all measured with fio: sequential
//! write (ending with fsync) and read of one file in 1 MiB blocks; 4 KiB
//! random reads, cold (page cache dropped, a fresh parcache mount whose
//! node cache is empty) and cached (the same reads again); and creating
//! small files (4 KiB each, one open/write/close per file).
//!
//! Run: `cargo run --release -p parcache-bench --bin mount-io [-- MIB [FILES]]`
//! (defaults 1024 MiB and 10,000 files). Needs fio, bindfs and fuse3
//! (`scripts/setup.sh` installs them) and root for `drop_caches` (without
//! it the "cold" figures are only cold for parcache). The cluster (4 data
//! servers, 1 metadata server) runs in this process on loopback sockets;
//! the mount is served in this process too, as `parcache mount` serves it.

use anyhow::{bail, Context, Result};
use parcache_bench::BenchCluster;
use parcache_client::Fs;
use parcache_fuse::Mount;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// What fio measured for one job.
struct Fio {
    bw: f64,
    iops: f64,
}

/// Runs one fio job in `dir`; `rw` is fio's `--rw`.
fn fio(dir: &Path, name: &str, rw: &str, bs: &str, size: &str, extra: &[&str]) -> Result<Fio> {
    let out = Command::new("fio")
        .arg(format!("--name={name}"))
        .arg(format!("--directory={}", dir.display()))
        .arg(format!("--rw={rw}"))
        .arg(format!("--bs={bs}"))
        .arg(format!("--size={size}"))
        .args(["--ioengine=psync", "--output-format=json", "--randrepeat=1"])
        .args(extra)
        .output()
        .context("running fio (scripts/setup.sh installs it)")?;
    if !out.status.success() {
        bail!(
            "fio {name} in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value = serde_json::from_str(&text[text.find('{').unwrap_or(0)..])
        .with_context(|| format!("fio {name}: output is not JSON"))?;
    let job = &json["jobs"][0];
    let side = if rw.contains("write") {
        &job["write"]
    } else {
        &job["read"]
    };
    Ok(Fio {
        bw: side["bw_bytes"].as_f64().unwrap_or(0.0) / 1e9,
        iops: side["iops"].as_f64().unwrap_or(0.0),
    })
}

fn drop_caches() -> bool {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

fn mounted(dir: &Path) -> bool {
    let Ok(dir) = dir.canonicalize() else { return false };
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(1) == dir.to_str())
}

fn wait_mounted(dir: &Path) -> Result<()> {
    let t = Instant::now();
    while !mounted(dir) {
        if t.elapsed() > Duration::from_secs(20) {
            bail!("{} did not mount", dir.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Creates `n` files of 4 KiB in a new directory under `dir`, each opened,
/// written and closed; returns files per second.
fn small_files(dir: &Path, n: usize) -> Result<f64> {
    let d = dir.join("small");
    std::fs::create_dir(&d)?;
    let data = vec![5u8; 4096];
    let t = Instant::now();
    for i in 0..n {
        std::fs::write(d.join(format!("f{i:05}")), &data)?;
    }
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

/// One target's figures.
#[derive(Default, Clone, Copy)]
struct Figures {
    write: f64,
    read: f64,
    rand_cold: f64,
    rand_cached: f64,
    files: f64,
}

/// The parcache mount, served in this process; remounting gives a node
/// with an empty cache.
struct ParcacheMount {
    // Dropped first: unmounting runs the node's shutdown on `rt`.
    session: Option<parcache_fuse::BackgroundSession>,
    rt: tokio::runtime::Runtime,
    at: PathBuf,
}

impl ParcacheMount {
    fn new(c: &BenchCluster, at: &Path) -> Result<ParcacheMount> {
        std::fs::create_dir_all(at)?;
        let rt = parcache_server::runtime()?;
        let mut m = ParcacheMount {
            session: None,
            rt,
            at: at.to_path_buf(),
        };
        m.mount(c)?;
        Ok(m)
    }

    fn mount(&mut self, c: &BenchCluster) -> Result<()> {
        self.session = None; // unmounts, pushing dirty data
        let fs = self.rt.block_on(Fs::connect(&c.mds_addr, &c.secret))?;
        self.session = Some(Mount::new(fs, self.rt.handle().clone()).spawn(&self.at)?);
        wait_mounted(&self.at)
    }
}

fn measure(name: &str, dir: &Path, mib: u64, files: usize, mut remount: impl FnMut() -> Result<()>) -> Result<Figures> {
    eprintln!("{name}: sequential write {mib} MiB");
    let size = format!("{mib}M");
    let w = fio(dir, "seq", "write", "1M", &size, &["--end_fsync=1"])?;
    drop_caches();
    remount()?;
    eprintln!("{name}: sequential read");
    let r = fio(dir, "seq", "read", "1M", &size, &[])?;
    eprintln!("{name}: 4 KiB random reads, cold and cached");
    fio(dir, "rand", "write", "1M", "256M", &["--end_fsync=1"])?;
    drop_caches();
    remount()?;
    let cold = fio(dir, "rand", "randread", "4k", "256M", &["--io_size=16M"])?;
    // Cached: a 32 MiB file read whole once, then read at random.
    fio(dir, "hot", "write", "1M", "32M", &["--end_fsync=1"])?;
    fio(dir, "hot", "read", "1M", "32M", &[])?;
    let cached = fio(dir, "hot", "randread", "4k", "32M", &["--io_size=64M"])?;
    eprintln!("{name}: {files} small files");
    let f = small_files(dir, files)?;
    Ok(Figures {
        write: w.bw,
        read: r.bw,
        rand_cold: cold.iops,
        rand_cached: cached.iops,
        files: f,
    })
}

fn main() -> Result<()> {
    let mib: u64 = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(1024);
    let files: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(10_000);
    let dir = std::env::temp_dir().join(format!("parcache-mount-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let root_caches = drop_caches();

    let local = dir.join("local");
    std::fs::create_dir_all(&local)?;
    let lf = measure("local", &local, mib, files, || Ok(()))?;
    std::fs::remove_dir_all(&local)?;

    let (bsrc, bmnt) = (dir.join("bindfs-src"), dir.join("bindfs"));
    std::fs::create_dir_all(&bsrc)?;
    std::fs::create_dir_all(&bmnt)?;
    let ok = Command::new("bindfs")
        .arg(&bsrc)
        .arg(&bmnt)
        .status()
        .context("running bindfs (scripts/setup.sh installs it)")?;
    if !ok.success() {
        bail!("bindfs {} {} failed", bsrc.display(), bmnt.display());
    }
    wait_mounted(&bmnt)?;
    let bf = measure("bindfs", &bmnt, mib, files, || Ok(()));
    let _ = Command::new("fusermount3").arg("-u").arg(&bmnt).status();
    let bf = bf?;
    std::fs::remove_dir_all(&bsrc)?;

    let threads = parcache_bench::ThreadWatch::start();
    let cluster = BenchCluster::start(&dir.join("cluster"), 4)?;
    let mut pm = ParcacheMount::new(&cluster, &dir.join("parcache"))?;
    let at = pm.at.clone();
    let pf = measure("parcache", &at, mib, files, || pm.mount(&cluster))?;
    drop(pm);
    drop(cluster);

    println!(
        "fio, psync; sequential file {mib} MiB in 1 MiB blocks (write ends with fsync); 4 KiB random reads; {files} files of 4 KiB"
    );
    if !root_caches {
        println!("(not root: the page cache was not dropped, so local and bindfs 'cold' reads are cached)");
    }
    println!(
        "{:<10} {:>12} {:>12} {:>16} {:>16} {:>12}",
        "", "write GB/s", "read GB/s", "rand cold IOPS", "rand cached IOPS", "files/s"
    );
    for (n, f) in [("local", lf), ("bindfs", bf), ("parcache", pf)] {
        println!(
            "{n:<10} {:>12.2} {:>12.2} {:>16.0} {:>16.0} {:>12.0}",
            f.write, f.read, f.rand_cold, f.rand_cached, f.files
        );
    }
    let ratio = |a: Figures, b: Figures| {
        format!(
            "{:>12.2} {:>12.2} {:>16.2} {:>16.2} {:>12.2}",
            a.write / b.write,
            a.read / b.read,
            a.rand_cold / b.rand_cold,
            a.rand_cached / b.rand_cached,
            a.files / b.files
        )
    };
    println!("{:<10} {}", "/bindfs", ratio(pf, bf));
    println!("{:<10} {}", "/local", ratio(pf, lf));
    println!("targets: sequential write and read >= 0.80 of bindfs; small files >= 0.50 of bindfs");
    println!(
        "threads: at most {} in this process (all 5 daemons and the mount together; aim: no daemon above 64)",
        threads.most()
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
