//! The FUSE mount against a plain local directory and a FUSE passthrough
//! (bindfs, from Debian) in one run, all measured with fio: sequential
//! write (ending with fsync) and read of one file in 1 MiB blocks, cold
//! (page cache dropped; for parcache also a fresh mount, whose node cache
//! is empty, and the data servers' caches emptied as `parcache
//! drop-caches` empties them; `PARCACHE_COLD=restart` restarts the data
//! servers instead, as the fifth to sixteenth sessions did) and warm
//! (parcache: a fresh mount reading from the data servers' caches, against
//! loopback TCP measured in the same run); 4 KiB random reads with 1 job
//! and with 4 jobs on one file, cold and cached (a 32 MiB file read whole,
//! then read at random for 3 s); creating small files
//! (4 KiB each, one open/write/close per file) and reading them back cold;
//! `tar x` of a source tree's shape (1,000 files of 1-32 KiB, each one's
//! times, owner and mode set before its close, as `cp -a` sets them);
//! 4 KiB random writes each followed by `fsync` (a database's commits);
//! IOR's two access patterns (2 processes writing then, cold, reading 1 MiB
//! transfers of one shared file in segments, and of a file each) with fio,
//! and mdtest's (2 processes creating, stating and removing FILES empty
//! files in one directory), since neither IOR nor mdtest can be built
//! here. Also the CPU per byte of parcache's daemons and mount, the most
//! threads they reached, and two facts of the machine measured in the run:
//! a wake-up round trip between two threads, and the first touch of new
//! memory after a drop of the page cache (dear where the hypervisor takes
//! freed memory back; every page a FUSE read fills in the page cache is
//! touched so).
//!
//! Run: `cargo run --release -p parcache-bench --bin mount-io [-- MIB [FILES]]`
//! (defaults 1024 MiB and 10,000 files). Needs fio, bindfs and fuse3
//! (`scripts/setup.sh` installs them) and root for `drop_caches` (without
//! it the "cold" figures are only cold for parcache). The cluster (4 data
//! servers, 1 metadata server) runs in this process on loopback sockets;
//! the mount is served in this process too, as `parcache mount` serves it.
//! `PARCACHE_PREFETCH=NAME` runs parcache under another prefetch policy
//! than the default, and `PARCACHE_PAGE_CACHE=bypass|cached` under another
//! `page-cache` setting (each set on the root directory). The data servers
//! take their caches' memory once started, and the run waits for it, as
//! for any start of theirs; `PARCACHE_LAZY_CACHE=1` has them take it as
//! blocks fill it (`iod --lazy-cache`), each page's first touch then paid
//! on the data path.
//!
//! `PARCACHE_RIVAL_WEED=PATH` (a SeaweedFS `weed`, which
//! `bench/seaweedfs.sh` builds and `bench/speed.sh` passes) runs every job
//! on SeaweedFS too, a distributed file system users pick instead: `weed
//! server` (master, volume server, filer) on loopback and `weed mount`,
//! with their defaults ([`parcache_bench::seaweedfs`]); cold is a new
//! mount (its chunk cache emptied) with the page cache dropped, warm a new
//! mount only. Its figures print as a row of their own, with parcache's
//! ratio to them.
//!
//! `PARCACHE_FUSE_URING=on` runs parcache's mount over FUSE's io_uring
//! queues (a queue per CPU, `parcache mount --io-uring`) where the kernel
//! has them: as root the run sets the fuse module's `enable_uring` for
//! parcache's part and restores it after. Without it the mount takes its
//! requests over /dev/fuse, as `parcache mount` does by default (the
//! queues are opt-in, `mount --io-uring`: on Linux 6.18 a request over
//! them was now and then never handed to the mount).

use anyhow::{bail, Context, Result};
use parcache_bench::seaweedfs::Seaweed;
use parcache_bench::{drop_caches, mounted, BenchCluster};
use parcache_client::Fs;
use parcache_fuse::{FuseQueues, Mount};
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

/// mdtest's three phases with 2 processes (threads here: each call is a
/// system call of its own) on `n` empty files in one shared directory:
/// create (open with O_CREAT, close), stat, remove. Returns operations
/// per second of each phase, both processes together.
fn md_phases(dir: &Path, n: usize) -> Result<[f64; 3]> {
    let d = dir.join("md");
    std::fs::create_dir(&d)?;
    let per = n / 2;
    let phase = |op: &(dyn Fn(&Path) -> std::io::Result<()> + Sync)| -> Result<f64> {
        let t = Instant::now();
        std::thread::scope(|s| {
            let runs: Vec<_> = (0..2)
                .map(|k| {
                    let d = &d;
                    s.spawn(move || -> std::io::Result<()> {
                        for i in 0..per {
                            op(&d.join(format!("t{k}.{i:05}")))?;
                        }
                        Ok(())
                    })
                })
                .collect();
            for r in runs {
                r.join().expect("an mdtest process panicked")?;
            }
            Ok::<_, std::io::Error>(())
        })
        .with_context(|| format!("mdtest-like phase in {}", d.display()))?;
        Ok((2 * per) as f64 / t.elapsed().as_secs_f64())
    };
    let create = phase(&|p| std::fs::File::create(p).map(drop))?;
    let stat = phase(&|p| std::fs::metadata(p).map(drop))?;
    let remove = phase(&|p| std::fs::remove_file(p))?;
    std::fs::remove_dir(&d)?;
    Ok([create, stat, remove])
}

/// IOR's two patterns with 2 processes (fio jobs) and 1 MiB transfers,
/// `mib` in all: one shared file, each process writing then reading its
/// own contiguous segment (IOR's default layout), and a file per process.
/// The writes end with fsync; `cold` runs before each read. Returns GB/s
/// (both processes together): shared write, shared read, per-process
/// write, per-process read.
fn ior_patterns(dir: &Path, mib: u64, mut cold: impl FnMut() -> Result<()>) -> Result<[f64; 4]> {
    let half = format!("{}M", mib / 2);
    let segment = format!("--offset_increment={}M", mib / 2);
    let shared = ["--numjobs=2", "--group_reporting", "--filename=ior.shared", &segment];
    let sw = fio(
        dir,
        "ior",
        "write",
        "1M",
        &half,
        &[&shared[..], &["--end_fsync=1"]].concat(),
    )?;
    cold()?;
    let sr = fio(dir, "ior", "read", "1M", &half, &shared)?;
    let fpp = ["--numjobs=2", "--group_reporting"];
    let fw = fio(
        dir,
        "iorfpp",
        "write",
        "1M",
        &half,
        &[&fpp[..], &["--end_fsync=1"]].concat(),
    )?;
    cold()?;
    let fr = fio(dir, "iorfpp", "read", "1M", &half, &fpp)?;
    Ok([sw.bw, sr.bw, fw.bw, fr.bw])
}

/// Reads back the `n` files [`small_files`] made, each opened, read and
/// closed, checking their bytes; returns files per second.
fn read_small_files(dir: &Path, n: usize) -> Result<f64> {
    let d = dir.join("small");
    let t = Instant::now();
    for i in 0..n {
        let got = std::fs::read(d.join(format!("f{i:05}")))?;
        if got.len() != 4096 || got.iter().any(|&b| b != 5) {
            bail!("{}/f{i:05}: wrong bytes read back", d.display());
        }
    }
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

/// How long each cached random-read job runs, in seconds.
const CACHED_SECS: u32 = 3;

/// Files in the source tree [`make_tree`] packs, in [`TREE_DIRS`]
/// directories.
const TREE_FILES: usize = 1000;
const TREE_DIRS: usize = 20;

/// Packs a source tree's shape with `tar` into `dir/tree.tar` (from a local
/// directory, removed after): [`TREE_FILES`] files of 1 to 32 KiB, mode
/// 0644, in [`TREE_DIRS`] directories.
fn make_tree(dir: &Path) -> Result<PathBuf> {
    let src = dir.join("tree");
    for i in 0..TREE_FILES {
        let d = src.join(format!("d{:02}", i % TREE_DIRS));
        std::fs::create_dir_all(&d)?;
        let len = 1024 * (1 + (i * 7919) % 32);
        std::fs::write(d.join(format!("f{i:04}.rs")), vec![b'a' + (i % 26) as u8; len])?;
    }
    let tar = dir.join("tree.tar");
    let ok = Command::new("tar")
        .arg("cf")
        .arg(&tar)
        .arg("-C")
        .arg(&src)
        .arg(".")
        .status()
        .context("running tar")?;
    if !ok.success() {
        bail!("tar cf {} failed", tar.display());
    }
    std::fs::remove_dir_all(&src)?;
    Ok(tar)
}

/// Unpacks `tar` ([`make_tree`]'s) into a new directory under `dir` with
/// `tar x`, which (as root) sets each file's times, owner and mode before
/// closing it, as `cp -a` and `rsync` do; returns files per second, and
/// how many differences `tar d` then found between the tree and the
/// archive (bindfs loses every file's modification time here).
fn untar(dir: &Path, tar: &Path) -> Result<(f64, usize)> {
    let d = dir.join("untar");
    std::fs::create_dir(&d)?;
    let t = Instant::now();
    let ok = Command::new("tar").arg("xf").arg(tar).arg("-C").arg(&d).status()?;
    let secs = t.elapsed().as_secs_f64();
    if !ok.success() {
        bail!("tar xf {} -C {} failed", tar.display(), d.display());
    }
    // Whether what was unpacked is the archive: contents, modes and times.
    let compared = Command::new("tar").arg("df").arg(tar).arg("-C").arg(&d).output()?;
    let differ = String::from_utf8_lossy(&compared.stdout).lines().count();
    Ok((TREE_FILES as f64 / secs, differ))
}

/// CPU seconds this process has used (user and system): every daemon of
/// the bench cluster and the mount run in it.
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    (ticks(11) + ticks(12)) / 100.0
}

/// One target's figures.
#[derive(Default, Clone, Copy)]
struct Figures {
    write: f64,
    read: f64,
    read_warm: f64,
    /// GB/s of a second read right after the warm one, on the same mount.
    read_again: f64,
    /// The share of the data servers' reads that hit during the warm read
    /// (parcache only).
    warm_hits: Option<f64>,
    rand_cold: f64,
    rand_cold4: f64,
    rand_cached: f64,
    rand_cached4: f64,
    files: f64,
    files_read: f64,
    /// Files a second `tar x` unpacked, and the differences from the
    /// archive after ([`untar`]).
    untar: f64,
    untar_differ: usize,
    /// 4 KiB writes a second, each followed by `fsync` (a database's
    /// commits).
    fsyncs: f64,
    /// IOR's patterns (GB/s): shared file and file per process, write and read.
    ior: [f64; 4],
    /// mdtest's phases (operations/s): create, stat, remove.
    md: [f64; 3],
    /// CPU nanoseconds per byte of the sequential write and read (this
    /// process only: parcache's daemons and mount; 0 for the others).
    cpu_write: f64,
    cpu_read: f64,
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
        for (var, key) in [("PARCACHE_PREFETCH", "prefetch"), ("PARCACHE_PAGE_CACHE", "page-cache")] {
            if let Ok(v) = std::env::var(var) {
                self.rt
                    .block_on(fs.set_policy("/", key, &v))
                    .with_context(|| format!("{var}={v}"))?;
            }
        }
        let uring = std::env::var("PARCACHE_FUSE_URING").is_ok_and(|v| v == "on");
        self.session = Some(
            Mount::new(fs.clone(), self.rt.handle().clone())
                .with_fuse_uring(if uring { FuseQueues::On } else { FuseQueues::Off })
                .spawn(&self.at)?,
        );
        wait_mounted(&self.at)?;
        // As `parcache mount` does; waited for, as a data server's start is
        // (`PARCACHE_LAZY_CACHE=1`: the pool takes it as blocks fill it).
        if std::env::var_os("PARCACHE_LAZY_CACHE").is_none() {
            let taking = self.rt.block_on(fs.take_cache_memory_ahead())?;
            taking
                .join()
                .map_err(|_| anyhow::anyhow!("node cache: taking its memory ahead panicked"))?;
        }
        Ok(())
    }
}

/// Measures one target in `dir`. `cold` empties every cache below the
/// program (page cache, and for parcache the node's and the data
/// servers'); `warm` only the node's (a fresh mount), so reads come from
/// the data servers' caches; `hits` counts the data servers' read hits and
/// misses (parcache only), so the run says how warm the warm read was.
#[allow(clippy::too_many_arguments)]
fn measure(
    name: &str,
    dir: &Path,
    mib: u64,
    files: usize,
    tar: &Path,
    mut cold: impl FnMut() -> Result<()>,
    mut warm: impl FnMut() -> Result<()>,
    mut hits: impl FnMut() -> Result<Option<(u64, u64)>>,
) -> Result<Figures> {
    let bytes = (mib << 20) as f64;
    eprintln!("{name}: sequential write {mib} MiB");
    let size = format!("{mib}M");
    let c0 = cpu_secs();
    let w = fio(dir, "seq", "write", "1M", &size, &["--end_fsync=1"])?;
    let cpu_write = (cpu_secs() - c0) * 1e9 / bytes;
    cold()?;
    eprintln!("{name}: sequential read, cold and warm");
    let c0 = cpu_secs();
    let r = fio(dir, "seq", "read", "1M", &size, &[])?;
    let cpu_read = (cpu_secs() - c0) * 1e9 / bytes;
    warm()?;
    let before = hits()?;
    let rw = fio(dir, "seq", "read", "1M", &size, &[])?;
    let warm_hits = before.zip(hits()?).map(|(b, a)| parcache_bench::hit_share(b, a));
    // Read again as the first left every cache (no remount): a program
    // reading its input twice.
    let again = fio(dir, "seq", "read", "1M", &size, &[])?;
    eprintln!("{name}: 4 KiB random reads, cold and cached, 1 and 4 jobs");
    fio(dir, "rand", "write", "1M", "256M", &["--end_fsync=1"])?;
    let four = ["--numjobs=4", "--group_reporting", "--filename=rand.0.0"];
    cold()?;
    let cold1 = fio(dir, "rand", "randread", "4k", "256M", &["--io_size=16M"])?;
    cold()?;
    let cold4 = fio(
        dir,
        "rand",
        "randread",
        "4k",
        "256M",
        &[&["--io_size=8M"][..], &four].concat(),
    )?;
    // Cached: a 32 MiB file read whole once, then read at random. fio
    // drops a file's pages before each pass of a job (`invalidate`, on by
    // default), which made the local directory's "cached" reads disk reads
    // and every FUSE file system's a request to its daemon until the
    // fifty-fourth session: `--invalidate=0` keeps what the whole read
    // left cached, below the program and in each daemon. Timed for
    // CACHED_SECS: at a million reads a second a fixed 64 MiB took 20–40
    // ms, and fio counts its runtime in whole milliseconds (with 4 jobs
    // their start-up skew too), so the figure moved by a fifth between
    // runs of the same build (until the sixty-second session).
    fio(dir, "hot", "write", "1M", "32M", &["--end_fsync=1"])?;
    fio(dir, "hot", "read", "1M", "32M", &[])?;
    let timed = format!("--runtime={CACHED_SECS}");
    let cached = fio(
        dir,
        "hot",
        "randread",
        "4k",
        "32M",
        &["--time_based", &timed, "--invalidate=0"],
    )?;
    let hot4 = [
        "--numjobs=4",
        "--group_reporting",
        "--filename=hot.0.0",
        "--time_based",
        &timed,
        "--invalidate=0",
    ];
    let cached4 = fio(dir, "hot", "randread", "4k", "32M", &hot4)?;
    eprintln!("{name}: {files} small files, created and (cold) read back");
    let f = small_files(dir, files)?;
    cold()?;
    let fr = read_small_files(dir, files)?;
    eprintln!("{name}: tar x of {TREE_FILES} files");
    let (untar, untar_differ) = untar(dir, tar)?;
    eprintln!("{name}: 4 KiB writes, each with fsync");
    let fsyncs = fio(dir, "sync", "randwrite", "4k", "4M", &["--fsync=1", "--io_size=2M"])?;
    eprintln!("{name}: IOR's patterns (2 processes, shared file and file per process) and mdtest's (2 processes, {files} files)");
    let ior = ior_patterns(dir, mib, &mut cold)?;
    let md = md_phases(dir, files)?;
    Ok(Figures {
        write: w.bw,
        read: r.bw,
        read_warm: rw.bw,
        read_again: again.bw,
        warm_hits,
        rand_cold: cold1.iops,
        rand_cold4: cold4.iops,
        rand_cached: cached.iops,
        rand_cached4: cached4.iops,
        files: f,
        files_read: fr,
        untar,
        untar_differ,
        fsyncs: fsyncs.iops,
        ior,
        md,
        cpu_write,
        cpu_read,
    })
}

/// Prints one table: a column header, each target's figures (the first
/// `fractional` columns with two decimals; parcache's last), then
/// parcache's ratio to each of the others.
fn print_table<const N: usize>(cols: &[&str; N], fractional: usize, unit: &str, rows: &[(&str, [f64; N])]) {
    print!("{:<10}", "");
    for c in cols {
        print!(" {c:>12}");
    }
    println!("   {unit}");
    for (n, r) in rows {
        print!("{n:<10}");
        for (i, v) in r.iter().enumerate() {
            if i < fractional {
                print!(" {v:>12.2}");
            } else {
                print!(" {v:>12.0}");
            }
        }
        println!();
    }
    let Some(((_, p), others)) = rows.split_last() else {
        return;
    };
    for (n, b) in others {
        print!("{:<10}", format!("/{n}"));
        for (x, y) in p.iter().zip(b) {
            print!(" {:>12.2}", x / y);
        }
        println!();
    }
}

/// The fuse module's `enable_uring`, set for parcache's part of the run
/// (`PARCACHE_FUSE_URING=on`, root, a kernel that has it) and put back
/// when dropped, with what the mount's transport was.
struct UringForRun {
    _set: Option<parcache_fuse_uring::UringEnabled>,
    why: &'static str,
}

impl UringForRun {
    fn start() -> UringForRun {
        let off = |why| UringForRun { _set: None, why };
        if !std::env::var("PARCACHE_FUSE_URING").is_ok_and(|v| v == "on") {
            return off("/dev/fuse (the default; PARCACHE_FUSE_URING=on: io_uring queues)");
        }
        match parcache_fuse_uring::UringEnabled::set() {
            Ok(None) => off("/dev/fuse (this kernel has no FUSE over io_uring)"),
            Err(_) => off("/dev/fuse (enable_uring is N and only root may set it)"),
            Ok(Some(u)) => UringForRun {
                why: if u.was_set() {
                    "io_uring queues, one per CPU (enable_uring was already Y)"
                } else {
                    "io_uring queues, one per CPU (enable_uring set to Y for this run)"
                },
                _set: Some(u),
            },
        }
    }

    fn describe(&self) -> &'static str {
        self.why
    }
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

    let drop_only = || {
        drop_caches();
        Ok(())
    };
    let local = dir.join("local");
    std::fs::create_dir_all(&local)?;
    let tar = make_tree(&dir)?;
    let lf = measure("local", &local, mib, files, &tar, drop_only, || Ok(()), || Ok(None))?;
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
    let bf = measure("bindfs", &bmnt, mib, files, &tar, drop_only, || Ok(()), || Ok(None));
    let _ = Command::new("fusermount3").arg("-u").arg(&bmnt).status();
    let bf = bf?;
    std::fs::remove_dir_all(&bsrc)?;

    // SeaweedFS, where bench/seaweedfs.sh built it: a distributed file
    // system users pick instead, with the same jobs. Cold: a new mount
    // (its chunk cache emptied) and the page cache dropped, so its volume
    // server reads its disk; warm: a new mount only.
    // A failure of its own leaves its row out, said, and the run goes on.
    let sf = std::env::var_os("PARCACHE_RIVAL_WEED").and_then(|weed| {
        let sdir = dir.join("seaweedfs");
        let run = || -> Result<Figures> {
            let sw = std::cell::RefCell::new(Seaweed::start(Path::new(&weed), &sdir)?);
            let at = sw.borrow().at();
            measure(
                "seaweedfs",
                &at,
                mib,
                files,
                &tar,
                || sw.borrow_mut().remount(true),
                || sw.borrow_mut().remount(false),
                || Ok(None),
            )
        };
        let f = run();
        let _ = std::fs::remove_dir_all(&sdir);
        f.map_err(|e| eprintln!("seaweedfs: {e:#}; its figures are left out of this run"))
            .ok()
    });

    // FUSE over io_uring for parcache's part (bindfs's libfuse has none).
    let uring = UringForRun::start();
    let threads = parcache_bench::ThreadWatch::start();
    let mut cluster = BenchCluster::start(&dir.join("cluster"), 4)?;
    let tcp = parcache_bench::loopback_tcp(mib.min(1024) << 20)?;
    let wake = parcache_bench::wake_round_trip()?;
    let touch = parcache_bench::first_touch(256)?;
    let pm = std::cell::RefCell::new(ParcacheMount::new(&cluster, &dir.join("parcache"))?);
    let at = pm.borrow().at.clone();
    let cluster_cell = std::cell::RefCell::new(&mut cluster);
    // Cold: unmounted (the node cache goes), the data servers' caches
    // emptied (drop-caches), the page cache dropped; then mounted again. Warm:
    // mounted again only (the data servers' caches hold the file).
    let pf = measure(
        "parcache",
        &at,
        mib,
        files,
        &tar,
        || {
            let mut pm = pm.borrow_mut();
            let mut c = cluster_cell.borrow_mut();
            pm.session = None;
            c.cold()?;
            pm.mount(&c)
        },
        || pm.borrow_mut().mount(&cluster_cell.borrow()),
        || cluster_cell.borrow().read_hits_misses_now().map(Some),
    )?;
    drop(pm);
    drop(cluster);

    println!(
        "fio, psync; sequential file {mib} MiB in 1 MiB blocks (write ends with fsync); 4 KiB random reads (1 job, and 4 jobs on one file); {files} files of 4 KiB created, then read back cold; tar x of a source tree ({TREE_FILES} files of 1-32 KiB); 4 KiB random writes in 4 MiB, each followed by fsync"
    );
    if !root_caches {
        println!("(not root: the page cache was not dropped, so local and bindfs 'cold' reads are cached)");
    }
    println!("baseline, same run: loopback TCP {tcp:.2} GB/s");
    println!("parcache's FUSE transport: {}", uring.describe());
    println!(
        "machine, same run: a round trip between two threads {:.1} us as the scheduler places them, {} (every FUSE request wakes the mount and then the program)",
        wake.0,
        wake.1
            .map_or("not measured on one CPU (affinity refused)".to_string(), |us| format!("{us:.1} us on one CPU"))
    );
    println!(
        "machine, same run: first touch of new memory after a drop of the page cache {:.1} us a 4 KiB page (free page reporting: {}; each page a FUSE read puts in the page cache is first touched so, which is why large files stream past it, docs/mount.md)",
        touch.0,
        touch.1.as_deref().unwrap_or("not shown by this kernel")
    );
    let cols = [
        "write GB/s",
        "read cold",
        "read warm",
        "rand cold",
        "rand cold x4",
        "rand cached",
        "rand cach x4",
        "create/s",
        "read back/s",
        "tar x/s",
        "fsync/s",
    ];
    let row = |f: &Figures| {
        [
            f.write,
            f.read,
            f.read_warm,
            f.rand_cold,
            f.rand_cold4,
            f.rand_cached,
            f.rand_cached4,
            f.files,
            f.files_read,
            f.untar,
            f.fsyncs,
        ]
    };
    // The targets in the order printed, parcache last.
    let mut targets = vec![("local", lf), ("bindfs", bf)];
    targets.extend(sf.map(|f| ("seaweedfs", f)));
    targets.push(("parcache", pf));
    let rows: Vec<_> = targets.iter().map(|(n, f)| (*n, row(f))).collect();
    print_table(&cols, 3, "(random reads: IOPS)", &rows);
    println!(
        "{:<10} {:>12} {:>12} {:>12.2}   (warm read / loopback TCP; bindfs, a FUSE passthrough of the page cache: {:.2}; the data servers' read hits during parcache's warm read: {})",
        "/TCP",
        "",
        "",
        pf.read_warm / tcp,
        bf.read_warm / tcp,
        pf.warm_hits.map_or("not counted".to_string(), |h| format!("{:.0} %", h * 100.0))
    );
    let each = |what: &dyn Fn(&Figures) -> String| {
        targets
            .iter()
            .map(|(n, f)| format!("{n} {}", what(f)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(f) = sf {
        println!("seaweedfs's warm read / loopback TCP: {:.2}", f.read_warm / tcp);
    }
    println!(
        "read again (right after the warm read, no remount: a program reading its input twice): {} GB/s (parcache {:.2} of its warm read)",
        each(&|f| format!("{:.2}", f.read_again)),
        pf.read_again / pf.read_warm
    );
    println!(
        "tar d after tar x, differences from the archive (contents, modes, times): {}",
        each(&|f| f.untar_differ.to_string())
    );
    println!(
        "IOR's and mdtest's patterns (fio and threads; neither tool can be built here): 2 processes; {mib} MiB in 1 MiB transfers (write ends with fsync, read cold); {files} empty files in one directory"
    );
    let cols2 = [
        "shared wr",
        "shared rd",
        "per-proc wr",
        "per-proc rd",
        "md create/s",
        "md stat/s",
        "md remove/s",
    ];
    let row2 = |f: &Figures| [f.ior[0], f.ior[1], f.ior[2], f.ior[3], f.md[0], f.md[1], f.md[2]];
    let rows2: Vec<_> = targets.iter().map(|(n, f)| (*n, row2(f))).collect();
    print_table(&cols2, 4, "(IOR: GB/s)", &rows2);
    println!(
        "targets (issue 14): write, cold read >= 0.9 of local; warm read >= 0.6 of loopback TCP; random reads >= 0.8 of local; create and read back >= 1.0 of bindfs (tar x and fsync: none, shown for a user's small-file and database work); IOR and mdtest patterns >= 0.8 of bindfs"
    );
    println!(
        "what FUSE alone allows here (bindfs: a passthrough of this disk, no network; same run): random cold reads {:.2} / {:.2} of local (1 / 4 jobs; target 0.8), warm read {:.2} of loopback TCP (target 0.6); parcache's random cold reads {:.2} / {:.2} of bindfs's",
        bf.rand_cold / lf.rand_cold,
        bf.rand_cold4 / lf.rand_cold4,
        bf.read_warm / tcp,
        pf.rand_cold / bf.rand_cold,
        pf.rand_cold4 / bf.rand_cold4
    );
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "CPU per byte (all daemons and the mount, this process): write {:.2} ns/B, cold read {:.2} ns/B (at that, {cpus} CPUs doing nothing else read at most {:.2} GB/s through parcache)",
        pf.cpu_write,
        pf.cpu_read,
        cpus as f64 / pf.cpu_read
    );
    println!(
        "threads: at most {} in this process (all 5 daemons and the mount together; aim: no daemon above 64)",
        threads.most()
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
