//! `read-ahead` — one-block-ahead for sequential readers only, with a
//! window that grows while they stay sequential. Cortes et al. 1996 §7.4
//! found one-block-ahead's two faults: the next block is asked for too late
//! to be there in time, and random accesses gain nothing from it (each
//! costs a fetch nobody uses). So, as an operating system's read-ahead
//! does: an access to block k+1 right after block k of the same stream
//! doubles the stream's window (1, 2, 4 … [`MAX_WINDOW`] blocks, at most a
//! quarter of the cache) and queues the blocks up to k+1+window not queued
//! yet; at the largest window it tops the stream up half a window at a
//! time, when the stream's lead has fallen to half the window; an access
//! that continues no stream queues nothing and starts a new one. Each file
//! keeps up to [`STREAMS`] streams, so processes reading their own parts of
//! one file (IOR's shared-file layout) each keep theirs.

use super::{Prefetch, PrefetchKind};
use crate::block::{BlockKey, FileId};
use rustc_hash::FxHashMap;

/// Largest window, in blocks (4 MiB ahead at 64 KiB blocks). A data
/// server, whose store reads skip the kernel's read-ahead, waited on its
/// disk for 11-13 % of a cold sequential read through a mount with 8;
/// 32 (with 16 prefetches in flight) read 4-24 % faster. Once large files
/// streamed past the page cache, 64 (with 64 in flight) read two files
/// cold side by side at 1,471-1,887 MB/s against 1,311-1,683 with 32
/// (issue 14, bench/README.md, fiftieth session).
pub const MAX_WINDOW: u64 = 64;

/// Sequential streams followed per file; a new one replaces the one least
/// recently continued.
pub const STREAMS: usize = 4;

/// Files followed at once; a new one past this many replaces the one least
/// recently accessed. A node forgets a file at its close, but a data
/// server's cache sees no opens or closes: without a bound, every part it
/// ever served would keep an entry.
pub const FILES: usize = 4096;

#[derive(Clone, Copy, Debug)]
struct Stream {
    /// The block accessed last.
    last: u64,
    /// Blocks queued ahead of `last` at the last step.
    window: u64,
    /// The highest block queued so far (none past it is queued again).
    ahead: u64,
    /// When it was last continued (a count of accesses to the file).
    used: u64,
}

#[derive(Default)]
struct FileStreams {
    /// Size in blocks when opened, if it was (nothing past it is queued).
    blocks: Option<u64>,
    streams: Vec<Stream>,
    clock: u64,
    /// When the file was last opened or accessed (a count over all files).
    touched: u64,
}

pub struct ReadAhead {
    files: FxHashMap<FileId, FileStreams>,
    clock: u64,
    /// The window's bound here: [`MAX_WINDOW`], or a quarter of a smaller
    /// cache's buffers (a window as large as the cache evicts the blocks
    /// it read ahead before their reader comes to them).
    max_window: u64,
}

impl Default for ReadAhead {
    fn default() -> Self {
        ReadAhead {
            files: FxHashMap::default(),
            clock: 0,
            max_window: MAX_WINDOW,
        }
    }
}

impl ReadAhead {
    /// Read-ahead for a cache of `buffers` buffers.
    pub fn for_cache(buffers: usize) -> Self {
        ReadAhead {
            max_window: (buffers as u64 / 4).clamp(1, MAX_WINDOW),
            ..ReadAhead::default()
        }
    }

    /// The file's entry, made if new (replacing the least recently touched
    /// one when [`FILES`] are followed already).
    fn file(&mut self, file: FileId) -> &mut FileStreams {
        self.clock += 1;
        if !self.files.contains_key(&file) && self.files.len() >= FILES {
            let oldest = self.files.iter().min_by_key(|(_, f)| f.touched).map(|(&k, _)| k);
            if let Some(k) = oldest {
                self.files.remove(&k);
            }
        }
        let f = self.files.entry(file).or_default();
        f.touched = self.clock;
        f
    }
}

impl Prefetch for ReadAhead {
    fn kind(&self) -> PrefetchKind {
        PrefetchKind::ReadAhead
    }

    fn on_open(&mut self, file: FileId, blocks: u64, _out: &mut Vec<BlockKey>) {
        self.file(file).blocks = Some(blocks);
    }

    fn on_access(&mut self, key: BlockKey, out: &mut Vec<BlockKey>) {
        let max_window = self.max_window;
        let f = self.file(key.file);
        f.clock += 1;
        let (i, now) = (key.index, f.clock);
        // Another access to a stream's block (small reads within it).
        if let Some(s) = f.streams.iter_mut().find(|s| s.last == i) {
            s.used = now;
            return;
        }
        let continued = f.streams.iter_mut().find(|s| s.last.checked_add(1) == Some(i));
        let s = match continued {
            Some(s) => {
                s.window = (s.window * 2).clamp(1, max_window);
                s.last = i;
                s.used = now;
                s
            }
            None => {
                // A read from a file's start is taken for sequential at once.
                let fresh = Stream {
                    last: i,
                    window: u64::from(i == 0),
                    ahead: i,
                    used: now,
                };
                if f.streams.len() < STREAMS {
                    f.streams.push(fresh);
                } else if let Some(old) = f.streams.iter_mut().min_by_key(|s| s.used) {
                    *old = fresh;
                }
                match f.streams.iter_mut().find(|s| s.last == i) {
                    Some(s) if s.window > 0 => s,
                    _ => return,
                }
            }
        };
        // At the largest window the stream is topped up half a window at a
        // time, once its lead has fallen to half the window, as the kernel's
        // asynchronous read-ahead does: a data server's store then reads
        // each half as one run, with one reader's wake-up (issue 14).
        if s.window >= max_window && s.ahead.saturating_sub(i) * 2 > s.window {
            return;
        }
        let mut end = i.saturating_add(s.window);
        if let Some(n) = f.blocks {
            end = end.min(n.saturating_sub(1));
        }
        let from = s.ahead.max(i) + 1;
        for b in from..=end {
            out.push(BlockKey::new(key.file, b));
        }
        s.ahead = s.ahead.max(end);
    }

    /// A writer needs nothing read ahead (one-block-ahead queues after
    /// writes too, the paper's way).
    fn on_write(&mut self, _key: BlockKey, _out: &mut Vec<BlockKey>) {}

    fn on_close(&mut self, file: FileId) {
        self.files.remove(&file);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(p: &mut ReadAhead, file: FileId, i: u64) -> Vec<u64> {
        let mut out = Vec::new();
        p.on_access(BlockKey::new(file, i), &mut out);
        out.into_iter().map(|k| k.index).collect()
    }

    #[test]
    fn a_sequential_reader_gets_a_window_that_doubles_up_to_the_largest() {
        // A cache of 128 buffers: a largest window of 32 blocks.
        let mut p = ReadAhead::for_cache(128);
        p.on_open(1, 100, &mut Vec::new());
        assert_eq!(access(&mut p, 1, 0), vec![1], "a file's start is sequential at once");
        assert_eq!(
            access(&mut p, 1, 0),
            Vec::<u64>::new(),
            "the same block again queues nothing"
        );
        assert_eq!(access(&mut p, 1, 1), vec![2, 3]);
        assert_eq!(access(&mut p, 1, 2), vec![4, 5, 6]);
        assert_eq!(access(&mut p, 1, 3), vec![7, 8, 9, 10, 11]);
        assert_eq!(access(&mut p, 1, 4), (12..=20).collect::<Vec<_>>());
        assert_eq!(access(&mut p, 1, 5), (21..=37).collect::<Vec<_>>());
        // At the largest window the stream is topped up half a window at
        // a time, once its lead has fallen to half the window.
        for i in 6..21 {
            assert!(access(&mut p, 1, i).is_empty(), "block {i}: a lead over 16");
        }
        assert_eq!(access(&mut p, 1, 21), (38..=53).collect::<Vec<_>>());
        assert!(access(&mut p, 1, 22).is_empty());
    }

    #[test]
    fn a_small_cache_gets_a_window_of_a_quarter_of_its_buffers() {
        let mut p = ReadAhead::for_cache(16);
        p.on_open(1, 100, &mut Vec::new());
        assert_eq!(access(&mut p, 1, 0), vec![1]);
        assert_eq!(access(&mut p, 1, 1), vec![2, 3]);
        assert_eq!(access(&mut p, 1, 2), vec![4, 5, 6]);
        assert!(access(&mut p, 1, 3).is_empty(), "4 blocks ahead at most");
        assert_eq!(access(&mut p, 1, 4), vec![7, 8], "topped up 2 at a time");
        assert_eq!(ReadAhead::for_cache(4096).max_window, MAX_WINDOW);
        assert_eq!(ReadAhead::default().max_window, MAX_WINDOW);
        assert_eq!(ReadAhead::for_cache(2).max_window, 1);
    }

    #[test]
    fn random_accesses_queue_nothing() {
        let mut p = ReadAhead::default();
        p.on_open(1, 1000, &mut Vec::new());
        for i in [500, 17, 912, 300, 301 + 40, 3] {
            assert!(access(&mut p, 1, i).is_empty(), "block {i}");
        }
        // Two in a row start a stream, from its second block on.
        assert_eq!(access(&mut p, 1, 4), vec![5]);
    }

    #[test]
    fn nothing_past_the_file_end_at_open_is_queued() {
        let mut p = ReadAhead::default();
        p.on_open(1, 3, &mut Vec::new());
        assert_eq!(access(&mut p, 1, 0), vec![1]);
        assert_eq!(access(&mut p, 1, 1), vec![2]);
        assert!(access(&mut p, 1, 2).is_empty());
        // A file never opened here has no known end.
        assert_eq!(access(&mut p, 2, 0), vec![1]);
    }

    #[test]
    fn two_readers_of_one_file_each_keep_their_stream() {
        const MAX_WINDOW: u64 = 32;
        let mut p = ReadAhead::for_cache(4 * MAX_WINDOW as usize);
        p.on_open(1, 1000, &mut Vec::new());
        let (mut a, mut b) = (Vec::new(), Vec::new());
        // Twelve steps each: both reach the largest window.
        for k in 0..12 {
            a.extend(access(&mut p, 1, k));
            b.extend(access(&mut p, 1, 500 + k));
        }
        assert_eq!(a, (1..=5 + MAX_WINDOW).collect::<Vec<_>>());
        assert_eq!(
            b,
            (502..=506 + MAX_WINDOW).collect::<Vec<_>>(),
            "the second starts at its second block"
        );
        // A fifth stream replaces the one least recently continued: a's.
        for start in [100, 200, 300] {
            assert!(access(&mut p, 1, start).is_empty());
        }
        for i in 512..522 {
            assert!(access(&mut p, 1, i).is_empty(), "block {i}");
        }
        let topped: Vec<u64> = (507 + MAX_WINDOW..=522 + MAX_WINDOW).collect();
        assert_eq!(access(&mut p, 1, 522), topped, "b's stream goes on");
        assert!(access(&mut p, 1, 12).is_empty(), "a's stream was replaced");
    }

    #[test]
    fn writes_queue_nothing_and_leave_the_streams_as_they_were() {
        let mut p = ReadAhead::default();
        p.on_open(1, 100, &mut Vec::new());
        let mut out = Vec::new();
        for i in 0..4 {
            p.on_write(BlockKey::new(1, i), &mut out);
        }
        assert!(out.is_empty());
        assert_eq!(access(&mut p, 1, 0), vec![1]);
    }

    #[test]
    fn at_most_files_are_followed_and_the_least_recently_touched_goes() {
        let mut p = ReadAhead::default();
        p.on_open(0, 100, &mut Vec::new());
        for f in 1..FILES as FileId {
            access(&mut p, f, 0);
        }
        // File 0 is used again, so file 1 is the least recently touched.
        assert_eq!(access(&mut p, 0, 0), vec![1]);
        assert_eq!(access(&mut p, 0, 1), vec![2, 3]);
        access(&mut p, FILES as FileId, 0);
        assert_eq!(p.files.len(), FILES);
        assert!(
            !p.files.contains_key(&1),
            "the least recently touched file was forgotten"
        );
        assert_eq!(access(&mut p, 0, 2), vec![4, 5, 6], "file 0 kept its stream");
        assert_eq!(p.files[&0].blocks, Some(100), "and its size");
    }

    #[test]
    fn close_forgets_the_file() {
        let mut p = ReadAhead::default();
        p.on_open(1, 10, &mut Vec::new());
        access(&mut p, 1, 0);
        p.on_close(1);
        assert!(p.files.is_empty());
    }
}
