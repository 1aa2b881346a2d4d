//! Helpers shared by the benchmarks.

use anyhow::Result;
use parcache_proto::Secret;
use parcache_server::{iod, mds};
use std::path::{Path, PathBuf};
use std::time::Instant;

pub mod seaweedfs;

/// The share of the data servers' reads between two counts of their
/// (hits, misses) that hit.
pub fn hit_share(before: (u64, u64), after: (u64, u64)) -> f64 {
    let hits = after.0.saturating_sub(before.0) as f64;
    let misses = after.1.saturating_sub(before.1) as f64;
    if hits + misses == 0.0 {
        0.0
    } else {
        hits / (hits + misses)
    }
}

/// A parcache cluster (`iods` data servers and a metadata server) on
/// loopback, each daemon on a runtime of its own, bounded as its process's
/// would be (`parcache_server::runtime`): real sockets, the real protocol,
/// the write log fsyncing as in production. Until the forty-ninth session
/// the five shared one runtime (2 workers and 16 blocking threads here):
/// with one each, warm reads through a mount rose from 0.17-0.25 of
/// loopback TCP to 0.44-0.46 (cold reads did not move: bench/README.md).
pub struct BenchCluster {
    pub mds_addr: String,
    pub secret: Secret,
    stop: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
    iods: Vec<RunningIod>,
    /// The metadata server's (and the bench's own calls').
    rt: tokio::runtime::Runtime,
}

/// Waits until the data server at `addr` has taken its cache's memory
/// (all `cache_bytes`, or as much as it takes before it stops growing; it
/// does so in the background once started, `IodConfig::lazy_cache`), so
/// that a measurement does not share the machine with it: the cost is the
/// server's start, not its data path.
fn cache_taken(
    rt: &tokio::runtime::Runtime,
    addr: std::net::SocketAddr,
    secret: &Secret,
    cache_bytes: u64,
) -> Result<()> {
    let whole = iod::cache_buffers(cache_bytes) as u64 * iod::IOD_BLOCK as u64;
    let (addr, secret) = (addr.to_string(), secret.clone());
    rt.block_on(async move {
        let c = parcache_proto::Client::connect(&addr, &secret).await?;
        let t = Instant::now();
        let (mut last, mut still) = (0, 0);
        loop {
            let held = match c.call(&parcache_proto::Request::Stats, &[]).await?.0 {
                parcache_proto::Response::Stats(s) => s.cache_memory_bytes,
                other => anyhow::bail!("stats of data server {addr}: {other:?}"),
            };
            // Whole, or no longer growing (a host short of memory stops
            // it; blocks replayed from the log hold buffers of their own).
            still = if held == last { still + 1 } else { 0 };
            last = held;
            if held >= whole || (held > 0 && still >= 10) {
                return Ok(());
            }
            anyhow::ensure!(
                t.elapsed() < std::time::Duration::from_secs(60),
                "data server {addr} took {held} of its {whole} bytes of cache memory in 60 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
}

/// A data server of a bench cluster: where it keeps its data, where it
/// listens, and how to stop it.
struct RunningIod {
    dir: PathBuf,
    addr: std::net::SocketAddr,
    stop: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
    /// Its own runtime, as its own process would have.
    rt: tokio::runtime::Runtime,
}

fn start_iod(dir: PathBuf, addr: std::net::SocketAddr, secret: &Secret) -> Result<RunningIod> {
    let rt = parcache_server::runtime()?;
    let mut cfg = iod::IodConfig::new(dir.clone(), addr, secret.clone());
    cfg.checkpoint_bytes = 256 << 20;
    cfg.lazy_cache = std::env::var_os("PARCACHE_LAZY_CACHE").is_some();
    let cache_bytes = cfg.cache_bytes;
    let lazy = cfg.lazy_cache;
    let r = rt.block_on(iod::start(cfg))?;
    let running = RunningIod {
        dir,
        addr: r.addr,
        stop: r.stop,
        served: rt.spawn(r.served),
        rt,
    };
    if !lazy {
        cache_taken(&running.rt, running.addr, secret, cache_bytes)?;
    }
    Ok(running)
}

impl BenchCluster {
    /// Starts the servers with their data under `dir`.
    pub fn start(dir: &Path, iods: usize) -> Result<BenchCluster> {
        let secret = Secret::generate();
        let rt = parcache_server::runtime()?;
        let mut iod_addrs = vec![];
        let mut running = vec![];
        for i in 0..iods {
            let r = start_iod(dir.join(format!("iod-{i}")), "127.0.0.1:0".parse()?, &secret)?;
            iod_addrs.push(r.addr.to_string());
            running.push(r);
        }
        let m = rt.block_on(mds::start(mds::MdsConfig {
            data_dir: dir.join("mds"),
            listen: "127.0.0.1:0".parse()?,
            secret: secret.clone(),
            iods: iod_addrs,
        }))?;
        let mds_addr = m.addr.to_string();
        rt.spawn(m.served);
        Ok(BenchCluster {
            mds_addr,
            secret,
            stop: m.stop,
            iods: running,
            rt,
        })
    }

    /// Empties the data servers' caches as `parcache drop-caches` does
    /// (each writes its dirty blocks down and forgets every block, keeping
    /// the cache's memory, as a long-running daemon would have it), then
    /// drops the page cache (root only; returns whether it was). With
    /// `PARCACHE_COLD=restart` each data server is restarted instead
    /// ([`BenchCluster::restart`]).
    pub fn cold(&mut self) -> Result<bool> {
        if std::env::var("PARCACHE_COLD").is_ok_and(|v| v == "restart") {
            return self.restart();
        }
        for r in &self.iods {
            let (addr, secret) = (r.addr.to_string(), self.secret.clone());
            let answer = self.rt.block_on(async move {
                let c = parcache_proto::Client::connect(&addr, &secret).await?;
                anyhow::Ok(c.call(&parcache_proto::Request::DropCaches, &[]).await?.0)
            })?;
            anyhow::ensure!(
                answer == parcache_proto::Response::Ok,
                "drop-caches at data server {}: {answer:?}",
                r.addr
            );
        }
        Ok(drop_caches())
    }

    /// The data servers' read hits and misses so far, summed (on the caller's
    /// runtime): a run says from them how warm a "warm" read was.
    pub async fn read_hits_misses(&self) -> Result<(u64, u64)> {
        let (mut hits, mut misses) = (0, 0);
        for r in &self.iods {
            let c = parcache_proto::Client::connect(&r.addr.to_string(), &self.secret).await?;
            match c.call(&parcache_proto::Request::Stats, &[]).await?.0 {
                parcache_proto::Response::Stats(s) => {
                    hits += s.read_hits;
                    misses += s.read_misses;
                }
                other => anyhow::bail!("stats of data server {}: {other:?}", r.addr),
            }
        }
        Ok((hits, misses))
    }

    /// [`BenchCluster::read_hits_misses`] on the cluster's own runtime
    /// (from outside any runtime).
    pub fn read_hits_misses_now(&self) -> Result<(u64, u64)> {
        self.rt.block_on(self.read_hits_misses())
    }

    /// Empties the data servers' caches by restarting them: each stops
    /// (its checkpoint writes every dirty block down) and starts again on
    /// the same directory and address. A daemon restarted in its own
    /// process has new cache memory, whose first touch cost a cold read
    /// through a mount 11-26 % of its rate on this machine (bench/README.md,
    /// seventeenth session); here, in one process, the allocator may hand
    /// the new server what the old one freed. Clients reconnect on their
    /// next request. Then the page cache is dropped (root only; returns
    /// whether it was).
    pub fn restart(&mut self) -> Result<bool> {
        for i in 0..self.iods.len() {
            let old = &mut self.iods[i];
            let _ = old.stop.send(true);
            old.rt.block_on(&mut old.served)??;
            let (dir, addr) = (old.dir.clone(), old.addr);
            self.iods[i] = start_iod(dir, addr, &self.secret)?;
        }
        Ok(drop_caches())
    }
}

/// Loopback TCP bandwidth, GB/s: `total` bytes in 1 MiB writes from one
/// socket to another, each end on a thread of its own, as between two
/// processes (the baseline of a data path that crosses loopback). Until
/// the forty-sixth session `mount-io` ran both ends on one thread, taking
/// turns, which measured twice what two threads (or processes) move here
/// (5.7-7.4 GB/s against 2.3-3.5); `cluster-io` ran them on its runtime's
/// threads. Both benchmarks take this one now.
pub fn loopback_tcp(total: u64) -> Result<f64> {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let sink = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = l.accept()?;
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0u64;
        while n < total {
            match s.read(&mut buf)? {
                0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                k => n += k as u64,
            }
        }
        s.write_all(b"k")
    });
    let mut c = std::net::TcpStream::connect(addr)?;
    let buf = vec![7u8; 1 << 20];
    let t = Instant::now();
    let mut sent = 0;
    while sent < total {
        c.write_all(&buf)?;
        sent += (1usize << 20) as u64;
    }
    let mut ack = [0u8; 1];
    c.read_exact(&mut ack)?;
    let secs = t.elapsed().as_secs_f64();
    sink.join()
        .map_err(|_| anyhow::anyhow!("the loopback sink panicked"))??;
    Ok(total as f64 / secs / 1e9)
}

/// The first touch of memory the kernel hands out, in microseconds a 4 KiB
/// page: `mib` MiB of new anonymous memory, one byte written per page,
/// after a drop of the page cache (root only) and a pause in which a
/// hypervisor that takes freed memory back (free page reporting) can take
/// it. Every page a FUSE read fills in the page cache is first touched by
/// the mount's copy into it, so this bounds reads through the page cache
/// (`page-cache`, docs/mount.md); a local file system's pages are filled
/// by its device, on the host's side. Also the free page reporting
/// settings, where the kernel shows them (`None` elsewhere).
pub fn first_touch(mib: usize) -> Result<(f64, Option<String>)> {
    drop_caches();
    std::thread::sleep(std::time::Duration::from_secs(2));
    let page = 4096;
    // Allocated by the kernel's zero pages, untouched until written.
    let mut m = vec![0u8; mib << 20];
    let t = Instant::now();
    for k in (0..m.len()).step_by(page) {
        m[k] = 1;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / (m.len() / page) as f64;
    std::hint::black_box(&m);
    let dir = std::path::Path::new("/sys/module/page_reporting/parameters");
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .ok()
            .map(|v| v.trim().to_string())
    };
    let reporting = read("page_reporting_order").map(|order| match read("min_free_ms") {
        Some(ms) => format!("order {order}, after {ms} ms"),
        None => format!("order {order}"),
    });
    Ok((us, reporting))
}

/// Round trips of one byte between two threads over a Unix socket pair,
/// in microseconds: as the scheduler places the threads (each wake-up
/// usually of a thread on the other CPU, woken from idle), and with both
/// on one CPU; `None` for the second if this process may not choose its
/// CPU. Every FUSE request and every request to a server is such a
/// wake-up or two; on a machine (a VM) where waking another CPU is dear,
/// this bounds the columns of small requests.
pub fn wake_round_trip() -> Result<(f64, Option<f64>)> {
    use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
    use std::io::{Read, Write};
    const ROUNDS: u32 = 5_000;
    fn rounds(pin: Option<&CpuSet>) -> Result<f64> {
        let (mut a, mut b) = std::os::unix::net::UnixStream::pair()?;
        let echo = {
            let pin = pin.cloned();
            std::thread::spawn(move || -> std::io::Result<()> {
                if let Some(set) = pin {
                    sched_setaffinity(None, &set)?;
                }
                let mut byte = [0u8; 1];
                for _ in 0..ROUNDS {
                    b.read_exact(&mut byte)?;
                    b.write_all(&byte)?;
                }
                Ok(())
            })
        };
        let mut byte = [7u8; 1];
        let t = Instant::now();
        for _ in 0..ROUNDS {
            a.write_all(&byte)?;
            a.read_exact(&mut byte)?;
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / ROUNDS as f64;
        echo.join().map_err(|_| anyhow::anyhow!("the echo thread panicked"))??;
        Ok(us)
    }
    let free = rounds(None)?;
    let all = sched_getaffinity(None)?;
    let Some(first) = (0..CpuSet::MAX_CPU).find(|&c| all.is_set(c)) else {
        return Ok((free, None));
    };
    let mut one = CpuSet::new();
    one.set(first);
    if sched_setaffinity(None, &one).is_err() {
        return Ok((free, None));
    }
    let pinned = rounds(Some(&one));
    sched_setaffinity(None, &all)?;
    Ok((free, Some(pinned?)))
}

/// The disk's own sequential write rate, GB/s: `total` bytes in 1 MiB
/// `O_DIRECT` writes from `writers` threads, each to a file of its own in
/// `dir` and ending with fsync, as `writers` data servers write their
/// stripes to their block stores. Every byte written through parcache
/// crosses this disk, so this bounds parcache's write+fsync here whatever
/// the network does. `None` where the file system refuses `O_DIRECT`.
pub fn disk_direct_write(dir: &Path, total: u64, writers: u64) -> Result<Option<f64>> {
    use std::os::unix::fs::OpenOptionsExt;
    const PIECE: usize = 1 << 20;
    const ALIGN: usize = 4096;
    let share = (total / writers).div_ceil(PIECE as u64);
    let paths: Vec<_> = (0..writers).map(|k| dir.join(format!("direct-{k}.bin"))).collect();
    let t = Instant::now();
    let lanes: Vec<_> = paths
        .iter()
        .map(|p| {
            let p = p.clone();
            std::thread::spawn(move || -> std::io::Result<bool> {
                let f = match std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
                    .open(&p)
                {
                    Ok(f) => f,
                    Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => return Ok(false),
                    Err(e) => return Err(e),
                };
                let mut raw = vec![0x5au8; PIECE + ALIGN];
                let skip = raw.as_ptr().align_offset(ALIGN);
                let piece = &mut raw[skip..skip + PIECE];
                for k in 0..share {
                    piece[..8].copy_from_slice(&k.to_le_bytes());
                    std::os::unix::fs::FileExt::write_all_at(&f, piece, k * PIECE as u64)?;
                }
                f.sync_all()?;
                Ok(true)
            })
        })
        .collect();
    let mut direct = true;
    let mut failed = None;
    for lane in lanes {
        match lane.join().map_err(|_| anyhow::anyhow!("a direct writer panicked"))? {
            Ok(d) => direct &= d,
            Err(e) => failed = Some(e),
        }
    }
    let secs = t.elapsed().as_secs_f64();
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
    if let Some(e) = failed {
        return Err(anyhow::Error::new(e).context(format!("direct writes in {}", dir.display())));
    }
    Ok(direct.then(|| (share * writers * PIECE as u64) as f64 / secs / 1e9))
}

/// Whether a file system is mounted at `dir` (per /proc/mounts).
pub fn mounted(dir: &Path) -> bool {
    let Ok(dir) = dir.canonicalize() else { return false };
    let table = std::fs::read("/proc/mounts").unwrap_or_default();
    parcache_fuse::mount_table(&table).iter().any(|e| e.at == dir)
}

/// Writes dirty pages down and drops the kernel's page cache, dentries and
/// inodes (root only); whether it could.
pub fn drop_caches() -> bool {
    let _ = std::process::Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// Samples this process's thread count (every daemon of a bench cluster,
/// and the client, run in it) until dropped; [`ThreadWatch::most`] is the
/// highest count seen.
pub struct ThreadWatch {
    most: std::sync::Arc<std::sync::atomic::AtomicU32>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl ThreadWatch {
    pub fn start() -> ThreadWatch {
        use std::sync::atomic::Ordering;
        let w = ThreadWatch {
            most: Default::default(),
            stop: Default::default(),
        };
        let (most, stop) = (w.most.clone(), w.stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                most.fetch_max(parcache_server::threads_now(), Ordering::Relaxed);
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        });
        w
    }

    pub fn most(&self) -> u32 {
        self.most.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for ThreadWatch {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for BenchCluster {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for i in &self.iods {
            let _ = i.stop.send(true);
        }
    }
}

/// Distinct bytes for benchmark files: a xorshift stream from `seed`, so no
/// two 16 KiB chunks of different seeds or offsets are alike (content-
/// addressed stores cannot deduplicate them) and a read is checked cheaply.
pub fn distinct(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect()
}
