//! `lru-writeback` — the LRU purge of Biswas et al. 1993 §3: dirty blocks
//! stay in the (non-volatile) cache until it is full; then each arriving
//! block makes the cache write its least recently used dirty block, and the
//! arrival waits for it. Such writes are "immediate" writes and are counted.

use super::{WritePolicy, WritePolicyKind};

pub struct LruWriteback;

impl WritePolicy for LruWriteback {
    fn kind(&self) -> WritePolicyKind {
        WritePolicyKind::LruWriteback
    }
    fn writes_per_need(&self) -> Option<usize> {
        Some(1)
    }
}
