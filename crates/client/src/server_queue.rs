//! What a per-data-server queue of requests that go together holds: the
//! connection, the server's place in the cluster and the block size runs
//! are made of. The write queue ([`crate::write_batch`]) and the read queue
//! ([`crate::read_batch`]) each add their own waiting state.

use crate::peer::Peer;
use parking_lot::Mutex;
use std::sync::Arc;

/// One data server's queue, with state `S`.
pub(crate) struct ServerQueue<S> {
    pub(crate) peer: Arc<Peer>,
    /// Its index in the cluster (for errors).
    pub(crate) index: u32,
    pub(crate) block: u64,
    pub(crate) state: Mutex<S>,
}

impl<S: Default> ServerQueue<S> {
    pub(crate) fn new(peer: Arc<Peer>, index: u32, block: u32) -> Arc<Self> {
        Arc::new(ServerQueue {
            peer,
            index,
            block: block.max(1) as u64,
            state: Mutex::default(),
        })
    }
}
