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
//! [`KernelCache`]: crate::consistency::KernelCache

use crate::error::PolicyError;
use std::fmt;
use std::str::FromStr;

/// The `page-cache` setting of a file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PageCache {
    /// An open for writing bypasses the page cache (the kernel drops the
    /// pages a direct write changes from its cache, and maps a direct open
    /// through its page cache); an open for reading only keeps pages as the
    /// consistency plug-in says.
    #[default]
    Auto,
    /// Every open bypasses the page cache.
    Bypass,
    /// Every open keeps pages as the consistency plug-in says, writes too
    /// (for a node that reads back what it wrote).
    Cached,
}

impl PageCache {
    /// Whether an open (`writer`: opened for writing) bypasses the page
    /// cache, whatever the plug-in says.
    pub fn bypasses(self, writer: bool) -> bool {
        match self {
            PageCache::Auto => writer,
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
    fn auto_bypasses_only_opens_for_writing() {
        assert!(PageCache::Auto.bypasses(true));
        assert!(!PageCache::Auto.bypasses(false));
        assert!(PageCache::Bypass.bypasses(false) && PageCache::Bypass.bypasses(true));
        assert!(!PageCache::Cached.bypasses(true) && !PageCache::Cached.bypasses(false));
    }
}
