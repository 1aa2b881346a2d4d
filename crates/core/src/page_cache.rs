//! Whether the kernel above a mount keeps a file's pages (`page-cache`).
//!
//! The kernel's page cache holds what a program read or wrote, so that
//! reading it again costs no request to the node; the file's consistency
//! plug-in says how long it may ([`KernelCache`]). An open that bypasses it
//! (direct I/O) sends every read and write to the node, which moves the
//! bytes straight between its cache and the program's buffer: one copy
//! fewer per byte, and no page cache to fill. Files streamed once (a
//! checkpoint, the input of a scan) move faster so; files read again and
//! again in small pieces move slower, each read a request to the node
//! (issue 14, `bench/README.md`).
//!
//! Under `auto` a large file opened for reading only is streamed past the
//! page cache too ([`streams`]), unless the node has seen the file read in
//! small pieces. Filling the page cache is the mount's copy of every byte
//! into pages the kernel just took from its free memory; where the
//! hypervisor takes freed memory back (free page reporting, as on the
//! machine issue 14 measures on) each such page costs a fault on the host
//! at its first touch, about 28 µs: sequential reads of 1 MiB ran at
//! 0.2–0.3 GB/s through the page cache against 1.6–2.0 GB/s bypassing it
//! (`bench/README.md`, fiftieth session).
//!
//! [`KernelCache`]: crate::consistency::KernelCache

use crate::error::PolicyError;
use std::fmt;
use std::str::FromStr;

/// The `page-cache` setting of a file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PageCache {
    /// An open for writing bypasses the page cache (the kernel drops the
    /// pages a direct write changes from its cache, and maps a direct open
    /// through its page cache), and so does an open for reading only of a
    /// file [`streams`] says is streamed; other opens for reading keep
    /// pages as the consistency plug-in says.
    #[default]
    Auto,
    /// Every open bypasses the page cache.
    Bypass,
    /// Every open keeps pages as the consistency plug-in says, writes too
    /// (for a node that reads back what it wrote).
    Cached,
}

/// A file at least this large, opened for reading only, is streamed past
/// the page cache under `auto`: files this large are mostly read once in
/// large pieces (a checkpoint read back, a scan's input, an MPI-IO
/// collective read), where filling the page cache costs more than it saves.
pub const STREAM_FROM: u64 = 64 << 20;

/// A read shorter than this is a small one ([`SMALL_READS_KEEP`]).
pub const SMALL_READ: u64 = 32 << 10;

/// After this many small reads of a file, each beginning where the one
/// before ended and following a small one (a small read right after a
/// large one is the tail of a read the kernel split at its 256-page limit,
/// [`crate::consistency::NodeFile::read_small`]), the node lets later
/// opens keep the page cache: a program
/// reading a large file in small pieces (`dd` without `bs=`, a line reader
/// with its own small buffer) asks the node for each piece when bypassing
/// it, where the page cache's read-ahead asks for many at once.
pub const SMALL_READS_KEEP: u32 = 64;

/// Whether an open for reading only of a file `size` bytes long, of which
/// this node has seen `small_reads` small reads, is streamed past the page
/// cache under `auto`.
pub fn streams(size: u64, small_reads: u32) -> bool {
    size >= STREAM_FROM && small_reads < SMALL_READS_KEEP
}

impl PageCache {
    /// Whether an open bypasses the page cache, whatever the plug-in says:
    /// `writer`, opened for writing; `streamed`, opened for reading only,
    /// of a file [`streams`] says is streamed.
    pub fn bypasses(self, writer: bool, streamed: bool) -> bool {
        match self {
            PageCache::Auto => writer || streamed,
            PageCache::Bypass => true,
            PageCache::Cached => false,
        }
    }
}

impl FromStr for PageCache {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, PolicyError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(PageCache::Auto),
            "bypass" => Ok(PageCache::Bypass),
            "cached" => Ok(PageCache::Cached),
            _ => Err(PolicyError::BadParameter {
                policy: "page-cache".into(),
                detail: format!("'{}' must be auto, bypass or cached", s.trim()),
            }),
        }
    }
}

impl fmt::Display for PageCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PageCache::Auto => "auto",
            PageCache::Bypass => "bypass",
            PageCache::Cached => "cached",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print_and_others_are_refused_by_name() {
        for p in [PageCache::Auto, PageCache::Bypass, PageCache::Cached] {
            assert_eq!(p.to_string().parse::<PageCache>().unwrap(), p);
        }
        assert_eq!(" Bypass ".parse::<PageCache>().unwrap(), PageCache::Bypass);
        let e = "direct".parse::<PageCache>().unwrap_err().to_string();
        assert!(
            e.contains("page-cache") && e.contains("'direct'") && e.contains("auto, bypass or cached"),
            "{e}"
        );
    }

    #[test]
    fn auto_bypasses_opens_for_writing_and_streamed_reads_only() {
        assert!(PageCache::Auto.bypasses(true, false));
        assert!(PageCache::Auto.bypasses(false, true));
        assert!(!PageCache::Auto.bypasses(false, false));
        for (w, s) in [(false, false), (true, false), (false, true)] {
            assert!(PageCache::Bypass.bypasses(w, s));
            assert!(!PageCache::Cached.bypasses(w, s));
        }
    }

    #[test]
    fn large_files_stream_until_read_in_small_pieces() {
        assert!(!streams(STREAM_FROM - 1, 0), "a smaller file keeps the page cache");
        assert!(streams(STREAM_FROM, 0));
        assert!(streams(10 * STREAM_FROM, SMALL_READS_KEEP - 1));
        assert!(
            !streams(10 * STREAM_FROM, SMALL_READS_KEEP),
            "read in small pieces: later opens keep the page cache"
        );
    }
}
