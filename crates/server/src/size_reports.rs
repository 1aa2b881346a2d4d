//! Size reports the metadata server holds in memory until its next durable
//! commit: a node's `Written` (a close, an `fsync`, a write-back that grew
//! a file) moves the file's size, times and version, and nothing else, so
//! it needs no write transaction of its own. Each one is a few page writes
//! fewer per closed file; the syncer writes them all in one transaction
//! within [`crate::mds::SYNC_EVERY`], as a non-durable commit would have
//! waited for it. A crash loses the same changes either way: those since
//! the last durable commit.
//!
//! A report applies to a stored inode only while its version is newer than
//! the stored one. Every change to the inode reads it with the reports
//! applied and bumps nothing backwards, so once such a change is stored the
//! report is spent, and forgetting it later is safe.

use parcache_proto::{Attr, Handle, Timestamp};
use parking_lot::RwLock;
use std::collections::HashMap;

/// What a `Written` left: the file's size, its new times and version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeReport {
    pub size: u64,
    pub time: Timestamp,
    pub version: u64,
}

impl SizeReport {
    /// The report as it was made, from the attributes after it.
    pub fn of(a: &Attr) -> SizeReport {
        SizeReport {
            size: a.size,
            time: a.mtime,
            version: a.version,
        }
    }

    /// `a` with this report applied, if the report is newer than `a`.
    pub fn apply(&self, a: &mut Attr) {
        if self.version > a.version {
            a.size = self.size;
            a.mtime = self.time;
            a.ctime = self.time;
            a.version = self.version;
        }
    }
}

/// The reports not yet stored, by file. Readers hold [`SizeReports::hold`]
/// across their whole read transaction, so the reports a durable commit
/// stored are forgotten ([`SizeReports::forget_all`]) only between readers:
/// a reader's snapshot either has them or still sees them here.
#[derive(Default)]
pub struct SizeReports {
    reports: RwLock<HashMap<Handle, SizeReport>>,
}

impl SizeReports {
    /// Held by a reader while it reads a snapshot (recursively: lookups
    /// inside take it again).
    pub fn hold(&self) -> parking_lot::RwLockReadGuard<'_, HashMap<Handle, SizeReport>> {
        self.reports.read_recursive()
    }

    /// Applies the report on `a`'s file, if any and newer.
    pub fn apply(&self, a: &mut Attr) {
        if let Some(r) = self.reports.read_recursive().get(&a.handle) {
            r.apply(a);
        }
    }

    /// Records what a `Written` left (replacing an older report).
    pub fn record(&self, handle: Handle, r: SizeReport) {
        self.reports.write().insert(handle, r);
    }

    /// Every report, to be stored.
    pub fn all(&self) -> Vec<(Handle, SizeReport)> {
        self.reports.read_recursive().iter().map(|(h, r)| (*h, *r)).collect()
    }

    /// Forgets every report: they are all stored (durably), and no reader
    /// is between its snapshot and its lookups here.
    pub fn forget_all(&self) {
        self.reports.write().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parcache_proto::FileKind;

    fn attr(size: u64, version: u64) -> Attr {
        Attr {
            handle: 7,
            kind: FileKind::File,
            mode: 0o644,
            uid: 0,
            gid: 0,
            size,
            nlink: 1,
            atime: Timestamp { secs: 1, nanos: 0 },
            mtime: Timestamp { secs: 1, nanos: 0 },
            ctime: Timestamp { secs: 1, nanos: 0 },
            version,
            layout: None,
            rdev: 0,
        }
    }

    #[test]
    fn a_report_applies_only_to_an_older_inode() {
        let r = SizeReport {
            size: 4096,
            time: Timestamp { secs: 9, nanos: 5 },
            version: 3,
        };
        let mut old = attr(0, 2);
        r.apply(&mut old);
        assert_eq!((old.size, old.version, old.mtime, old.ctime), (4096, 3, r.time, r.time));
        // A truncate stored after the report (same or later version) wins.
        let mut cut = attr(10, 3);
        r.apply(&mut cut);
        assert_eq!((cut.size, cut.version), (10, 3));
        let mut later = attr(10, 4);
        r.apply(&mut later);
        assert_eq!((later.size, later.version), (10, 4));
    }

    #[test]
    fn reports_are_kept_per_file_until_forgotten() {
        let s = SizeReports::default();
        let mut a = attr(0, 1);
        s.apply(&mut a);
        assert_eq!(a.size, 0);
        let mut b = a.clone();
        b.size = 100;
        b.version = 2;
        s.record(7, SizeReport::of(&b));
        b.size = 200;
        b.version = 3;
        s.record(7, SizeReport::of(&b));
        let g = s.hold();
        s.apply(&mut a);
        drop(g);
        assert_eq!((a.size, a.version), (200, 3));
        assert_eq!(s.all().len(), 1);
        s.forget_all();
        assert!(s.all().is_empty());
    }
}
