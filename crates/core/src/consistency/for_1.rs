//! `for-1` (Vilayannur et al. 2005, Table 1): forced commits without an H-cache. Writers replace the hashes whatever the server holds, never retrying; a slightly relaxed policy for files modified by non-overlapping jobs (§4).

use super::capfs::CapfsParams;

/// The preset's parameters: Table 1's row (use_hcache false, hcache_coherence false, force_commit true).
pub const PARAMS: CapfsParams = CapfsParams::table_1(false, false, true);

#[cfg(test)]
mod tests {
    use super::*;

    /// Table 1's row, and whether the preset is sequentially consistent.
    #[test]
    fn table_1_row() {
        assert_eq!(
            (PARAMS.use_hcache, PARAMS.hcache_coherence, PARAMS.force_commit),
            (false, false, true)
        );
        assert!(!PARAMS.sequential());
    }
}
