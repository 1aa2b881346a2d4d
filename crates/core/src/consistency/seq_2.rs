//! `seq-2` (Vilayannur et al. 2005, Table 1): sequential consistency with a coherent H-cache. Reads that hit the H-cache need no hash fetch (up to 80 % more read bandwidth than `seq-1` for large files, §4.1); each commit waits until the metadata server has invalidated every other node's cached hashes of the file, which costs most when many nodes make small writes to one shared file (§4.2).

use super::capfs::CapfsParams;

/// The preset's parameters: Table 1's row (use_hcache true, hcache_coherence true, force_commit false).
pub const PARAMS: CapfsParams = CapfsParams::table_1(true, true, false);

#[cfg(test)]
mod tests {
    use super::*;

    /// Table 1's row, and whether the preset is sequentially consistent.
    #[test]
    fn table_1_row() {
        assert_eq!(
            (PARAMS.use_hcache, PARAMS.hcache_coherence, PARAMS.force_commit),
            (true, true, false)
        );
        assert!(PARAMS.sequential());
    }
}
