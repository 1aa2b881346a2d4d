//! The node's place in the cooperative tier (Cortes, Girona & Labarta 1996
//! §3): a mount sends the metadata server a heartbeat with its counters
//! every few seconds, so `parcache status` lists the nodes, and a node
//! that dies drops out of the tier's membership once silent.

use crate::Fs;
use parcache_core::cooperative::membership::HEARTBEAT;
use parcache_proto::{NodeStats, Request};
use std::time::Duration;

impl Fs {
    /// The node's counters, summed over its cache's pools.
    pub fn node_stats(&self) -> NodeStats {
        let mut s = NodeStats::default();
        for (_, c) in self.cache_stats() {
            s.local_hits += c.read_hits + c.prefetch_hits;
            s.server_reads += c.fetches;
        }
        s
    }

    /// Starts sending heartbeats as `name` (a mount passes its mount
    /// point), until this `Fs` is dropped. A heartbeat that fails (the
    /// metadata server restarting) is simply sent again at the next beat.
    pub fn heartbeat(&self, name: String) {
        let me = self.me.clone();
        let (mds, node) = (self.mds.clone(), self.node);
        tokio::spawn(async move {
            loop {
                let Some(fs) = me.upgrade() else { return };
                let stats = fs.node_stats();
                drop(fs);
                let beat = Request::Heartbeat {
                    node,
                    name: name.clone(),
                    stats,
                };
                if let Err(e) = mds.call(&beat, &[]).await {
                    tracing::debug!("heartbeat: {e}");
                }
                tokio::time::sleep(Duration::from_nanos(HEARTBEAT.0)).await;
            }
        });
    }
}
