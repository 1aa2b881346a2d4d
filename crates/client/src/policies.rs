//! Which policies a file's blocks get in the node cache, and how big that
//! cache is.
//!
//! Defaults (docs/client.md says why): `write-full` (a block goes to the
//! data servers as soon as it is completely written, so streaming writes
//! leave the node at once and little dirty data waits; Kotz & Ellis 1992
//! found it the best write policy for parallel writers), `lru`,
//! `one-block-ahead` prefetch, and `close-to-open` consistency.

use parcache_core::{ConsistencyKind, PrefetchKind, ReplacementKind, Span, WritePolicyKind};

/// The policies the node cache applies to one file, from the metadata
/// server's settings for it, with defaults for those not set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FilePolicies {
    pub write: WritePolicyKind,
    pub replacement: ReplacementKind,
    pub prefetch: PrefetchKind,
    pub consistency: ConsistencyKind,
}

impl Default for FilePolicies {
    fn default() -> Self {
        FilePolicies {
            write: WritePolicyKind::WriteFull,
            replacement: ReplacementKind::Lru,
            prefetch: PrefetchKind::OneBlockAhead,
            consistency: ConsistencyKind::CloseToOpen,
        }
    }
}

impl FilePolicies {
    /// Reads the settings the metadata server holds (already checked by it);
    /// unknown keys (layout settings) are not the cache's business.
    pub fn from_settings(settings: &[(String, String)]) -> Self {
        let mut p = FilePolicies::default();
        for (k, v) in settings {
            match k.as_str() {
                "write" => p.write = v.parse().unwrap_or(p.write),
                "replacement" => p.replacement = v.parse().unwrap_or(p.replacement),
                "prefetch" => p.prefetch = v.parse().unwrap_or(p.prefetch),
                "consistency" => p.consistency = v.parse().unwrap_or(p.consistency),
                _ => {}
            }
        }
        p
    }

    /// Files with the same replacement, write and prefetch policies share a
    /// pool of the node cache.
    /// The policies as settings (key, value), as `policy set` takes them.
    pub fn settings(&self) -> [(&'static str, String); 4] {
        [
            ("write", self.write.to_string()),
            ("replacement", self.replacement.to_string()),
            ("prefetch", self.prefetch.to_string()),
            ("consistency", self.consistency.to_string()),
        ]
    }

    pub fn pool_key(&self) -> (ReplacementKind, WritePolicyKind, PrefetchKind) {
        (self.replacement, self.write, self.prefetch)
    }
}

/// How the node cache is built.
#[derive(Clone, Debug)]
pub struct NodeCacheConfig {
    /// Bytes of each pool (one pool per combination of policies in use).
    pub pool_bytes: u64,
    /// Block size of the node cache.
    pub block_size: u32,
    /// Block accesses in progress at once, per pool.
    pub lanes: usize,
    /// The syncer interval: dirty blocks older than this go down whatever
    /// the write policy (Unix's update daemon).
    pub syncer: Span,
}

impl Default for NodeCacheConfig {
    fn default() -> Self {
        NodeCacheConfig {
            pool_bytes: 64 << 20,
            block_size: 64 << 10,
            lanes: 64,
            syncer: Span::from_secs(30),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_override_defaults_and_layout_keys_are_ignored() {
        let s = |k: &str, v: &str| (k.to_string(), v.to_string());
        let p = FilePolicies::from_settings(&[
            s("write", "write-back"),
            s("stripe_unit", "1M"),
            s("consistency", "none"),
        ]);
        assert_eq!(p.write, WritePolicyKind::WriteBack);
        assert_eq!(p.replacement, ReplacementKind::Lru);
        assert_eq!(p.consistency, ConsistencyKind::None);
        assert_eq!(FilePolicies::from_settings(&[]), FilePolicies::default());
    }
}
