//! Drop-behind for sequential writers through the page cache: the pages a
//! program streamed into a file leave the kernel's page cache once it has
//! written [`BEHIND`] bytes past them, instead of staying until memory
//! runs short. A program that writes a file once (most opens for reading
//! and writing, as fio's and IOR's, stream) then reuses the page cache's
//! memory instead of allocating fresh pages for every byte, which on this
//! machine's VM cost a host fault per page (issue 14). The pages dropped
//! are clean (the mount has every byte written through), so a later read
//! gets the bytes from the node cache or the data servers.

use parking_lot::Mutex;
use std::collections::HashMap;

/// How far behind a sequential writer its pages are dropped.
pub(crate) const BEHIND: u64 = 8 << 20;

/// Streams followed at most; past it, all are forgotten (a stream is
/// found again from its next write).
const MOST_STREAMS: usize = 1024;

/// Each writer's sequential stream, by inode and writing process (so the
/// processes of a parallel program writing their own regions of one
/// file, as IOR's shared-file pattern does, each make a stream).
#[derive(Default)]
pub(crate) struct DropBehind(Mutex<HashMap<(u64, u32), Stream>>);

#[derive(Clone, Copy, Debug, PartialEq)]
struct Stream {
    /// Where the next sequential write starts.
    next: u64,
    /// Bytes before this were dropped (or the stream started here).
    dropped_to: u64,
}

impl DropBehind {
    /// Notes a write of `len` bytes at `offset` to `ino` by process
    /// `pid`; returns the range of the file (start, length) whose pages to
    /// drop now, if any: from where the last drop ended to [`BEHIND`]
    /// before this write's end, once that is [`BEHIND`] long. A write that
    /// does not continue the process's stream in the file starts a new one.
    pub(crate) fn wrote(&self, ino: u64, pid: u32, offset: u64, len: u64) -> Option<(u64, u64)> {
        let mut m = self.0.lock();
        if m.len() >= MOST_STREAMS && !m.contains_key(&(ino, pid)) {
            m.clear();
        }
        let end = offset + len;
        let s = m.entry((ino, pid)).or_insert(Stream {
            next: offset,
            dropped_to: offset,
        });
        if offset != s.next {
            *s = Stream {
                next: end,
                dropped_to: offset,
            };
            return None;
        }
        s.next = end;
        if end - s.dropped_to < 2 * BEHIND {
            return None;
        }
        let from = s.dropped_to;
        s.dropped_to = end - BEHIND;
        Some((from, s.dropped_to - from))
    }

    /// The file is closed (or gone): forget its streams.
    pub(crate) fn forget(&self, ino: u64) {
        self.0.lock().retain(|&(i, _), _| i != ino);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_only_well_behind_a_sequential_writer() {
        let d = DropBehind::default();
        let mib = 1 << 20;
        let mut dropped = Vec::new();
        for k in 0..40 {
            if let Some(r) = d.wrote(7, 1, k * mib, mib) {
                dropped.push((k, r));
            }
        }
        // First at 16 MiB written: the first 8 MiB; then every 8 MiB.
        assert_eq!(
            dropped,
            [
                (15, (0, 8 * mib)),
                (23, (8 * mib, 8 * mib)),
                (31, (16 * mib, 8 * mib)),
                (39, (24 * mib, 8 * mib))
            ]
        );
        // A jump starts a new stream: nothing dropped until it is long.
        assert_eq!(d.wrote(7, 1, 100 * mib, mib), None);
        for k in 101..115 {
            assert_eq!(d.wrote(7, 1, k * mib, mib), None, "{k}");
        }
        assert_eq!(d.wrote(7, 1, 115 * mib, mib), Some((100 * mib, 8 * mib)));
        // Two processes streaming into their halves of one file: each
        // is a stream of its own.
        let mut halves = [0, 0];
        for k in 0..64 {
            let who = (k % 2) as usize;
            if let Some((from, len)) = d.wrote(8, 10 + who as u32, who as u64 * 512 * mib + (k / 2) * mib, mib) {
                halves[who] += len;
                assert!(from >= who as u64 * 512 * mib, "{from}");
            }
        }
        assert_eq!(halves, [24 * mib, 24 * mib]);
        // Writes of one process that jump about drop nothing.
        for k in 0..64 {
            assert_eq!(d.wrote(9, 1, (k % 2) * 512 * mib + k * mib, mib), None);
        }
        // Forgotten at close: the next write starts a stream.
        d.forget(7);
        for k in 116..131 {
            assert_eq!(d.wrote(7, 1, k * mib, mib), None, "{k}");
        }
    }
}
