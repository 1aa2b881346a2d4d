//! `rel-1` (Vilayannur et al. 2005, Table 1): the most relaxed: forced commits and an H-cache that is not kept coherent. A node may read hashes another node has replaced until it opens the file again (`Capfs::post_open`); for files not shared between unrelated processes. The fastest writes (320 MB/s against PVFS's 280 MB/s with 16 clients, §4.1).

use super::capfs::CapfsParams;

/// The preset's parameters: Table 1's row (use_hcache true, hcache_coherence false, force_commit true).
pub const PARAMS: CapfsParams = CapfsParams::table_1(true, false, true);

#[cfg(test)]
mod tests {
    use super::*;

    /// Table 1's row, and whether the preset is sequentially consistent.
    #[test]
    fn table_1_row() {
        assert_eq!(
            (PARAMS.use_hcache, PARAMS.hcache_coherence, PARAMS.force_commit),
            (true, false, true)
        );
        assert!(!PARAMS.sequential());
    }
}
