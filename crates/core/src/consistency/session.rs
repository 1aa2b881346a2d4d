//! `session` (AFS-like sessions, as Vilayannur et al. 2005 §3.6 sketch a
//! plug-in for them: "fetch all hashes at the time of open, delay the
//! commits till the time of a close"): an open revalidates and reads the
//! whole file into the node cache, so the session works on a snapshot; a
//! close publishes (dirty blocks down, size and version at the metadata
//! server). Another node's changes become visible at the next open, not
//! during a session. Blocks the write policy sends down early reach the
//! data servers before the close, but no other node reads past the old size
//! or revalidates until the close reports it. No server half beyond the
//! version.

use super::{revalidate, Action, Consistency, ConsistencyKind, KernelCache, NodeFile, ServerView};
use crate::time::Time;

/// The plug-in.
#[derive(Clone, Copy, Debug, Default)]
pub struct Session;

impl Consistency for Session {
    fn kind(&self) -> ConsistencyKind {
        ConsistencyKind::Session
    }

    fn pre_open(&self, _file: &NodeFile, _now: Time, _write: bool) -> Vec<Action> {
        vec![Action::FetchAttr]
    }

    fn post_open(&self, file: &mut NodeFile, now: Time, server: ServerView, _cacheable: bool) -> Vec<Action> {
        file.opens += 1;
        let mut acts = revalidate(file, now, server);
        if file.opens == 1 {
            acts.push(Action::FetchWhole);
        }
        acts
    }

    fn flush(&self, _file: &mut NodeFile, _now: Time) -> Vec<Action> {
        vec![Action::PushDirty, Action::ReportSize]
    }

    /// The open revalidates, so the kernel's pages of an unchanged file
    /// stay.
    fn kernel_cache(&self) -> KernelCache {
        KernelCache::UntilChanged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_open_fetches_the_whole_file_and_close_publishes() {
        let view = |version| ServerView { size: 100, version };
        let mut f = NodeFile::new(view(1), Time::ZERO);
        assert_eq!(Session.pre_open(&f, Time::ZERO, false), [Action::FetchAttr]);
        assert_eq!(
            Session.post_open(&mut f, Time::ZERO, view(1), true),
            [Action::FetchWhole]
        );
        // A second open on the node shares the session's snapshot.
        assert!(Session.post_open(&mut f, Time::ZERO, view(1), true).is_empty());
        assert!(
            Session.pre_read(&f, Time(u64::MAX)).is_empty(),
            "no revalidation inside a session"
        );
        assert_eq!(
            Session.flush(&mut f, Time::ZERO),
            [Action::PushDirty, Action::ReportSize]
        );
        Session.release(&mut f, Time::ZERO, false);
        Session.release(&mut f, Time::ZERO, false);
        assert_eq!(
            Session.post_open(&mut f, Time::ZERO, view(2), true),
            [
                Action::PushDirty,
                Action::ReportSize,
                Action::DropCached,
                Action::Adopt,
                Action::FetchWhole
            ]
        );
    }
}
