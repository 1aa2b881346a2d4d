//! `nfs`: close-to-open, plus what NFS clients do while a file is open:
//! attributes (and with them the file's version) older than a timeout are
//! fetched again before a read, and cached blocks of a file another node
//! changed are dropped (Sandberg et al. 1985; the timeout is NFS's
//! `acregmin`, 3 s by default). A reader thus sees another node's closed
//! writes within the timeout even without reopening. As close-to-open, a
//! close publishes. No server half beyond the version.

use super::{revalidate, Action, Consistency, ConsistencyKind, KernelCache, NodeFile, ServerView};
use crate::time::{Span, Time};

/// The plug-in, with its attribute timeout.
#[derive(Clone, Copy, Debug)]
pub struct Nfs {
    pub timeout: Span,
}

impl Consistency for Nfs {
    fn kind(&self) -> ConsistencyKind {
        ConsistencyKind::Nfs { timeout: self.timeout }
    }

    fn pre_open(&self, _file: &NodeFile, _now: Time, _write: bool) -> Vec<Action> {
        vec![Action::FetchAttr]
    }

    fn post_open(&self, file: &mut NodeFile, now: Time, server: ServerView, _cacheable: bool) -> Vec<Action> {
        file.opens += 1;
        revalidate(file, now, server)
    }

    fn pre_read(&self, file: &NodeFile, now: Time) -> Vec<Action> {
        if now.since(file.validated_at) >= self.timeout {
            vec![Action::FetchAttr]
        } else {
            vec![]
        }
    }

    fn read_past_end(&self, _file: &NodeFile) -> Vec<Action> {
        vec![Action::FetchAttr]
    }

    fn revalidated(&self, file: &mut NodeFile, now: Time, server: ServerView) -> Vec<Action> {
        revalidate(file, now, server)
    }

    fn flush(&self, _file: &mut NodeFile, _now: Time) -> Vec<Action> {
        vec![Action::PushDirty, Action::ReportSize]
    }

    /// Reads must reach the node for it to revalidate while the file is open.
    fn kernel_cache(&self) -> KernelCache {
        KernelCache::Bypass
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_revalidate_once_the_attributes_are_older_than_the_timeout() {
        let p = Nfs {
            timeout: Span::from_secs(3),
        };
        let t = |s: u64| Time(s * 1_000_000_000);
        let view = |version| ServerView { size: 0, version };
        let mut f = NodeFile::new(view(1), t(0));
        assert!(p.post_open(&mut f, t(0), view(1), true).is_empty());
        assert!(p.pre_read(&f, t(2)).is_empty(), "fresh attributes: no traffic");
        assert_eq!(p.pre_read(&f, t(3)), [Action::FetchAttr]);
        // Unchanged: the attributes are fresh again for another 3 s.
        assert!(p.revalidated(&mut f, t(3), view(1)).is_empty());
        assert!(p.pre_read(&f, t(5)).is_empty());
        // Changed by another node: own writes go first, then the blocks.
        assert_eq!(
            p.revalidated(&mut f, t(6), view(2)),
            [Action::PushDirty, Action::ReportSize, Action::DropCached, Action::Adopt]
        );
        assert_eq!(p.flush(&mut f, t(6)), [Action::PushDirty, Action::ReportSize]);
    }
}
