//! `posix`: a read returns every byte written by any write that completed
//! before it began, on any node (POSIX's read-after-write, which PVFS does
//! not give: Vilayannur et al. 2005 §3.1). The node caches nothing of the
//! file: reads and writes go to the data servers, and a write that grows
//! the file reports its size before it returns. What it does not give is
//! atomicity of one write across data servers (two overlapping writes that
//! span servers may interleave per stripe unit); the CAPFS plug-ins with
//! their commit do. No server half beyond the version.

use super::{stop_caching, Action, Consistency, ConsistencyKind, KernelCache, NodeFile, ServerView};
use crate::time::Time;

/// The plug-in.
#[derive(Clone, Copy, Debug, Default)]
pub struct Posix;

impl Consistency for Posix {
    fn kind(&self) -> ConsistencyKind {
        ConsistencyKind::Posix
    }

    fn post_open(&self, file: &mut NodeFile, _now: Time, _server: ServerView, _cacheable: bool) -> Vec<Action> {
        file.opens += 1;
        if file.cached {
            stop_caching(file)
        } else {
            vec![]
        }
    }

    fn kernel_cache(&self) -> KernelCache {
        KernelCache::Bypass
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_stays_cached_and_growth_is_reported_at_once() {
        let view = ServerView { size: 0, version: 1 };
        let mut f = NodeFile::new(view, Time::ZERO);
        assert_eq!(
            Posix.post_open(&mut f, Time::ZERO, view, true),
            [Action::PushDirty, Action::DropCached, Action::ReportSize]
        );
        assert!(!f.cached);
        assert!(Posix.post_open(&mut f, Time::ZERO, view, true).is_empty());
        f.wrote(10);
        assert_eq!(Posix.post_write(&mut f, Time::ZERO, true), [Action::ReportSize]);
        assert!(Posix.post_write(&mut f, Time::ZERO, false).is_empty());
        assert_eq!(Posix.kernel_cache(), KernelCache::Bypass);
    }
}
