//! `none` — no prefetching: blocks are read only on demand.

use super::{Prefetch, PrefetchKind};

pub struct NoPrefetch;

impl Prefetch for NoPrefetch {
    fn kind(&self) -> PrefetchKind {
        PrefetchKind::None
    }
}
