//! `none` (PVFS, as Vilayannur et al. 2005 §3.1 describe it): no guarantee
//! between nodes and no traffic for one. A node keeps its cached blocks
//! across opens and never revalidates them; dirty blocks go down when the
//! write policy (or the 30 s syncer) sends them. For files one node writes
//! and nobody reads while it does, or that are read-only. No server half.

use super::{Consistency, ConsistencyKind, KernelCache};

/// The plug-in (every hook does nothing but count opens).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoConsistency;

impl Consistency for NoConsistency {
    fn kind(&self) -> ConsistencyKind {
        ConsistencyKind::None
    }

    fn kernel_cache(&self) -> KernelCache {
        KernelCache::Keep
    }

    /// An append goes at the end this node knows: no traffic.
    fn appends_at_server(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::super::{NodeFile, ServerView};
    use super::*;
    use crate::time::Time;

    #[test]
    fn nothing_is_asked_dropped_or_pushed() {
        let mut f = NodeFile::new(ServerView { size: 0, version: 1 }, Time::ZERO);
        let p = NoConsistency;
        assert!(p.pre_open(&f, Time::ZERO, true).is_empty());
        // Another node changed the file: this one keeps what it cached.
        assert!(p
            .post_open(&mut f, Time::ZERO, ServerView { size: 9, version: 7 }, true)
            .is_empty());
        f.wrote(10);
        assert!(p.post_write(&mut f, Time::ZERO, true).is_empty());
        assert!(p.flush(&mut f, Time::ZERO).is_empty());
        assert!(!p.appends_at_server());
        assert!(p.release(&mut f, Time::ZERO, true).is_empty());
        assert_eq!((f.opens, f.version), (0, 1));
        assert_eq!(p.kernel_cache(), KernelCache::Keep);
    }
}
