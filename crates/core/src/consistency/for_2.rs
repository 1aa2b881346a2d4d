//! `for-2` (Vilayannur et al. 2005, Table 1): forced commits with a coherent H-cache: reads hit the H-cache, commits skip the conflict check but still wait for the invalidations.

use super::capfs::CapfsParams;

/// The preset's parameters (`delay_commit` off, `num_hashes` the default).
pub const PARAMS: CapfsParams = CapfsParams {
    use_hcache: true,
    hcache_coherence: true,
    force_commit: true,
    delay_commit: false,
    num_hashes: CapfsParams::DEFAULT_NUM_HASHES,
};

#[cfg(test)]
mod tests {
    use super::*;

    /// Table 1's row: use_hcache true, hcache_coherence true, force_commit true.
    #[test]
    fn table_1_row() {
        assert_eq!(
            (PARAMS.use_hcache, PARAMS.hcache_coherence, PARAMS.force_commit),
            (true, true, true)
        );
        assert!(!PARAMS.sequential());
    }
}
