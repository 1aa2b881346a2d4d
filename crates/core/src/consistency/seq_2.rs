//! `seq-2` (Vilayannur et al. 2005, Table 1): sequential consistency with a coherent H-cache. Reads that hit the H-cache need no hash fetch (up to 80 % more read bandwidth than `seq-1` for large files, §4.1); each commit waits until the metadata server has invalidated every other node's cached hashes of the file, which costs most when many nodes make small writes to one shared file (§4.2).

use super::capfs::CapfsParams;

/// The preset's parameters (`delay_commit` off, `num_hashes` the default).
pub const PARAMS: CapfsParams = CapfsParams {
    use_hcache: true,
    hcache_coherence: true,
    force_commit: false,
    delay_commit: false,
    num_hashes: CapfsParams::DEFAULT_NUM_HASHES,
};

#[cfg(test)]
mod tests {
    use super::*;

    /// Table 1's row: use_hcache true, hcache_coherence true, force_commit false.
    #[test]
    fn table_1_row() {
        assert_eq!(
            (PARAMS.use_hcache, PARAMS.hcache_coherence, PARAMS.force_commit),
            (true, true, false)
        );
        assert!(PARAMS.sequential());
    }
}
