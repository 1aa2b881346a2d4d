//! parcache-server: the daemons, as tokio drivers of the protocol and the
//! stores: the metadata server ([`mds`]) and the data server ([`iod`]).

pub mod iod;
pub mod mds;

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
