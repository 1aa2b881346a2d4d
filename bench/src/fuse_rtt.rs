//! What one FUSE request costs on this machine over each transport the
//! kernel has: /dev/fuse read and write (what fuser, and so the mount,
//! uses) against FUSE over io_uring with a queue per CPU
//! (`parcache-fuse-uring`). The server is the probe, a file system of one
//! file answered from memory, so the figures are the transport's alone:
//! 4 KiB reads of a direct-I/O file and stats (each a request), one at a
//! time from one thread placed by the scheduler, then from a thread on
//! every CPU; 1 MiB reads for bandwidth. Every request through the mount
//! pays its transport's round trip.
//!
//! Needs root (the probe mounts with mount(2)). It sets the `fuse`
//! module's `enable_uring` for its run and restores it; a kernel without
//! FUSE over io_uring (before 6.14) measures /dev/fuse alone and says so.
//!
//! Run: `cargo run --release -p parcache-bench --bin fuse-rtt [-- N]`
//! (N requests of each kind, default 20,000).

use anyhow::{bail, Context, Result};
use parcache_fuse_uring::probe::{self, Probe, Transport};
use std::os::unix::fs::FileExt;
use std::time::Instant;

struct Figures {
    read_us: f64,
    stat_us: f64,
    /// 4 KiB reads per second, a thread on every CPU.
    iops_all: f64,
    /// 1 MiB reads, GB/s.
    bw: f64,
}

fn measure(p: &Probe, n: usize) -> Result<Figures> {
    let path = p.file();
    let f = std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let mut b = vec![0u8; 4096];
    for i in 0..1000u64 {
        f.read_exact_at(&mut b, i * 4096)?;
    }
    let t = Instant::now();
    for i in 0..n as u64 {
        f.read_exact_at(&mut b, (i % 4096) * 4096)?;
    }
    let read_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    if b[0] != probe::byte_at(((n as u64 - 1) % 4096) * 4096) {
        bail!("the probe answered the wrong bytes");
    }
    let t = Instant::now();
    for _ in 0..n {
        std::fs::metadata(&path)?;
    }
    let stat_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    let cpus = parcache_fuse_uring::possible_cpus()?;
    let t = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let runs: Vec<_> = (0..cpus)
            .map(|cpu| {
                let path = &path;
                s.spawn(move || -> std::io::Result<()> {
                    let mut set = rustix::thread::CpuSet::new();
                    set.set(cpu);
                    let _ = rustix::thread::sched_setaffinity(None, &set);
                    let f = std::fs::File::open(path)?;
                    let mut b = vec![0u8; 4096];
                    for i in 0..(n / cpus) as u64 {
                        f.read_exact_at(&mut b, (i % 4096) * 4096)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for r in runs {
            r.join().expect("a reader panicked")?;
        }
        Ok(())
    })?;
    let iops_all = (n / cpus * cpus) as f64 / t.elapsed().as_secs_f64();
    let mut big = vec![0u8; 1 << 20];
    let reads = (n / 20).max(50);
    let t = Instant::now();
    for i in 0..reads as u64 {
        f.read_exact_at(&mut big, (i % 512) << 20)?;
    }
    let bw = reads as f64 * (1 << 20) as f64 / t.elapsed().as_secs_f64() / 1e9;
    Ok(Figures {
        read_us,
        stat_us,
        iops_all,
        bw,
    })
}

fn run(at: &std::path::Path, t: Transport, n: usize) -> Result<(Figures, bool)> {
    std::fs::create_dir_all(at)?;
    let p = Probe::mount(at, t).with_context(|| format!("mounting the probe at {}", at.display()))?;
    let uring = p.uring;
    let fig = measure(&p, n);
    p.stop().context("stopping the probe")?;
    Ok((fig?, uring))
}

fn main() -> Result<()> {
    let n: usize = match std::env::args().nth(1) {
        Some(a) => a
            .parse()
            .with_context(|| format!("N must be a number of requests, not {a:?}"))?,
        None => 20_000,
    };
    if n < 100 {
        bail!("N must be at least 100 (requests of each kind), not {n}");
    }
    if !rustix::process::geteuid().is_root() {
        bail!("fuse-rtt mounts its probe with mount(2): run it as root");
    }
    let base = std::env::temp_dir().join(format!("parcache-fuse-rtt-{}", std::process::id()));
    eprintln!("fuse-rtt: /dev/fuse, {n} requests of each kind");
    let (dev, _) = run(&base.join("dev"), Transport::Dev, n)?;
    let uring = parcache_fuse_uring::UringEnabled::set().context("enabling FUSE over io_uring")?;
    let ring = match &uring {
        None => None,
        Some(_) => {
            eprintln!("fuse-rtt: FUSE over io_uring, {n} requests of each kind");
            let (f, agreed) = run(&base.join("ring"), Transport::Uring, n)?;
            if !agreed {
                bail!("the kernel did not offer FUSE over io_uring although enable_uring is Y");
            }
            Some(f)
        }
    };
    drop(uring);
    let _ = std::fs::remove_dir_all(&base);
    println!("FUSE round trips, probe file system answering from memory; {n} requests of each kind");
    println!("               4K read us      stat us  4K IOPS all CPUs  1 MiB reads GB/s");
    let row = |name: &str, f: &Figures| {
        println!(
            "{name:<12} {:>11.1} {:>12.1} {:>17.0} {:>18.2}",
            f.read_us, f.stat_us, f.iops_all, f.bw
        )
    };
    row("/dev/fuse", &dev);
    match &ring {
        Some(r) => {
            row("io_uring", r);
            println!(
                "io_uring over /dev/fuse: read {:.2}x, stat {:.2}x, IOPS {:.2}x, bandwidth {:.2}x (speed-ups)",
                dev.read_us / r.read_us,
                dev.stat_us / r.stat_us,
                r.iops_all / dev.iops_all,
                r.bw / dev.bw
            );
        }
        None => println!("io_uring: this kernel has no FUSE over io_uring (Linux 6.14+, CONFIG_FUSE_IO_URING)"),
    }
    Ok(())
}
