//! parcache-server: the daemons, as tokio drivers of the protocol and the
//! stores: the metadata server ([`mds`]) and the data server ([`iod`]).

pub mod iod;
pub mod mds;

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

/// Takes the exclusive lock on a daemon's data directory (`DIR/lock`,
/// flock) for as long as the returned file is open: a second daemon on the
/// same directory (a hand-started one, or an orphan of a failed `up`)
/// would replay, checkpoint and empty the same log, losing data.
pub fn lock_dir(dir: &std::path::Path, what: &str) -> std::io::Result<std::fs::File> {
    use rustix::fs::{flock, FlockOperation};
    std::fs::create_dir_all(dir)?;
    let path = dir.join("lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)?;
    // A predecessor killed a moment ago may still be exiting (in the middle
    // of an fsync, say): give it a few seconds to let go.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match flock(&f, FlockOperation::NonBlockingLockExclusive) {
            Err(rustix::io::Errno::WOULDBLOCK) if std::time::Instant::now() < until => {
                std::thread::sleep(std::time::Duration::from_millis(50))
            }
            r => break lock_result(r, f, dir, &path, what),
        }
    }
}

fn lock_result(
    r: rustix::io::Result<()>,
    f: std::fs::File,
    dir: &std::path::Path,
    path: &std::path::Path,
    what: &str,
) -> std::io::Result<std::fs::File> {
    match r {
        Ok(()) => Ok(f),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!(
                "another {what} is already running on {} (it holds the lock {})",
                dir.display(),
                path.display()
            ),
        )),
        Err(e) => Err(std::io::Error::from(e)),
    }
}

/// A random 64-bit number from the OS (cluster ids).
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS's random source.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish()
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
