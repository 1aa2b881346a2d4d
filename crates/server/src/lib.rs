//! parcache-server: the daemons, as tokio drivers of the protocol and the
//! stores: the metadata server ([`mds`]) and the data server ([`iod`]).

pub mod iod;
pub mod mds;

/// Total and free bytes of the file system holding `dir` ((0, 0) if it
/// cannot be asked).
pub fn capacity(dir: &std::path::Path) -> (u64, u64) {
    match rustix::fs::statvfs(dir) {
        Ok(v) => (v.f_blocks * v.f_frsize, v.f_bavail * v.f_frsize),
        Err(e) => {
            tracing::warn!("statvfs {}: {e}", dir.display());
            (0, 0)
        }
    }
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
