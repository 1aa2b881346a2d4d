//! `greedy` (Cortes, Girona & Labarta 1996 §4: "N=0 implements a cache
//! where remote hits are possible but no coordination between nodes is
//! done"): [`n_chance`](super::n_chance) with no forwarding. Each node
//! caches what it reads and drops what it evicts; a miss may still hit in
//! a peer's cache. With no prefetching its hit ratio is low, which is why
//! prefetching helps it most (§6.2).

use super::n_chance::Directory;

/// Forwards an unreferenced last copy gets under `greedy`.
pub const N: u8 = 0;

/// The directory of a `greedy` tier.
pub fn directory() -> Directory {
    Directory::new(N)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::BlockKey;
    use crate::cooperative::n_chance::Evicted;
    use crate::cooperative::{Members, Source};

    /// Remote hits, but an evicted last copy is dropped, never forwarded.
    #[test]
    fn remote_hits_and_no_forwarding() {
        let m = Members::new(1..=3);
        let mut d = directory();
        let b = BlockKey::new(4, 0);
        d.cached(1, b);
        assert_eq!(d.lookup(2, b, &m), Source::Peer(1));
        assert_eq!(d.evicted(1, b, 0, true, 9, &m), Evicted::Dropped);
        assert_eq!(d.lookup(2, b, &m), Source::Servers);
        assert_eq!(d.stats.forwards, 0);
    }
}
