//! `seq-1` (Vilayannur et al. 2005, Table 1): sequential consistency without an H-cache. Every read fetches the hashes it needs from the metadata server, and commits are checked for conflicts and retried, so no H-cache needs to be kept coherent. The strictest and, for writes, the slowest (up to 50 % below `rel-1` in §4.1).

use super::capfs::CapfsParams;

/// The preset's parameters: Table 1's row (use_hcache false, hcache_coherence false, force_commit false).
pub const PARAMS: CapfsParams = CapfsParams::table_1(false, false, false);

#[cfg(test)]
mod tests {
    use super::*;

    /// Table 1's row, and whether the preset is sequentially consistent.
    #[test]
    fn table_1_row() {
        assert_eq!(
            (PARAMS.use_hcache, PARAMS.hcache_coherence, PARAMS.force_commit),
            (false, false, false)
        );
        assert!(PARAMS.sequential());
    }
}
