//! parcache-server: the daemons, as tokio drivers of the protocol and the
//! stores: the metadata server ([`mds`]) and the data server ([`iod`]).

pub mod direct;
pub mod incarnation;
pub mod iod;
pub mod mds;
mod once;
pub mod read_queue;

/// Total and free bytes of the file system holding `dir` ((0, 0) if it
/// cannot be asked).
pub fn capacity(dir: &std::path::Path) -> (u64, u64) {
    let (total, free, _) = disk(dir);
    (total, free)
}

/// Total and free bytes of the file system holding `dir`, and its id (so
/// servers sharing one disk are counted once).
pub fn disk(dir: &std::path::Path) -> (u64, u64, u64) {
    match rustix::fs::statvfs(dir) {
        Ok(v) => (v.f_blocks * v.f_frsize, v.f_bavail * v.f_frsize, v.f_fsid),
        Err(e) => {
            tracing::warn!("statvfs {}: {e}", dir.display());
            (0, 0, 0)
        }
    }
}

pub use parcache_store::lock_dir;

/// Worker threads of any parcache process: the cores, at most 8.
pub const MAX_WORKERS: usize = 8;
/// Threads for blocking work (block store reads and writes, metadata
/// commits): a fixed pool, so a burst of requests queues instead of
/// growing a thread per request (tokio's default allows 512).
pub const MAX_BLOCKING: usize = 16;

/// The tokio runtime of every parcache process (daemons, mounts, commands,
/// benchmarks), its threads bounded: workers + blocking pool + a log thread
/// + main stay well under 64.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores.clamp(1, MAX_WORKERS))
        .max_blocking_threads(MAX_BLOCKING)
        .enable_all()
        .build()
}

/// Threads of this process now (from /proc/self/status; 0 if unknown).
pub fn threads_now() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Stops a daemon a moment from now, so the reply to the `Shutdown` that
/// asked for it reaches the asker first.
pub fn stop_soon(stop: &Arc<watch::Sender<bool>>) {
    let stop = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let _ = stop.send(true);
    });
}

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::watch;

/// A started daemon: where it listens, how to stop it, and the future that
/// serves until stopped (then flushes) — await it to run the daemon.
pub struct Running {
    pub addr: SocketAddr,
    pub stop: Arc<watch::Sender<bool>>,
    pub served: Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>>,
}
