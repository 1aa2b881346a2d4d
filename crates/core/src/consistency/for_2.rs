//! `for-2` (Vilayannur et al. 2005, Table 1): forced commits with a coherent H-cache: reads hit the H-cache, commits skip the conflict check but still wait for the invalidations.

use super::capfs::CapfsParams;

/// The preset's parameters: Table 1's row (use_hcache true, hcache_coherence true, force_commit true).
pub const PARAMS: CapfsParams = CapfsParams::table_1(true, true, true);

#[cfg(test)]
mod tests {
    use super::*;

    /// Table 1's row, and whether the preset is sequentially consistent.
    #[test]
    fn table_1_row() {
        assert_eq!(
            (PARAMS.use_hcache, PARAMS.hcache_coherence, PARAMS.force_commit),
            (true, true, true)
        );
        assert!(!PARAMS.sequential());
    }
}
