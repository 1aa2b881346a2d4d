//! Counters a cache keeps about itself (DESIGN.md §5: hits and misses,
//! dirty blocks, immediate writes).

use serde::{Deserialize, Serialize};

/// Why a block was written down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WriteCause {
    /// The write policy decided it (write-through, write-full, write-free).
    Policy,
    /// The buffer was needed for another block: an "immediate" write.
    Need,
    /// The threshold policy's high limit was passed.
    Threshold,
    /// The periodic policy found the block old enough.
    Age,
    /// The syncer's interval passed.
    Sync,
    /// The driver asked for a flush (fsync, close, shutdown).
    Flush,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheStats {
    /// Reads served from the cache without a fetch of their own (a read
    /// that waited for its demand fetch counts as a miss only).
    pub read_hits: u64,
    pub read_misses: u64,
    /// The read hits on blocks a prefetch brought in (part of `read_hits`).
    pub prefetch_hits: u64,
    pub write_hits: u64,
    /// Write hits on bytes still dirty: overwrites the cache absorbed
    /// (Biswas et al. 1993 §6.1, "write hits on a dirty block").
    #[serde(default)]
    pub overwrites: u64,
    pub write_allocs: u64,
    pub fetches: u64,
    /// Fetches made to fill a block before a partial write (read-modify-write).
    pub fill_fetches: u64,
    pub prefetches: u64,
    pub writes: u64,
    pub policy_writes: u64,
    /// Writes forced because a buffer was needed ("immediate" writes).
    pub immediate_writes: u64,
    pub threshold_writes: u64,
    pub age_writes: u64,
    pub sync_writes: u64,
    pub flush_writes: u64,
    pub detached_writes: u64,
    /// Times an access had to wait for a buffer to become free.
    pub stalls: u64,
    pub evictions: u64,
    /// Fetches that failed below (the driver reported the error).
    #[serde(default)]
    pub fetch_failures: u64,
    /// Dirty blocks dropped unwritten because their file was removed or cut.
    #[serde(default)]
    pub discarded: u64,
}

/// Adds another cache's counters (totals over a level's caches). Every
/// field is named, so a new counter cannot be left out.
impl std::ops::AddAssign<&CacheStats> for CacheStats {
    fn add_assign(&mut self, o: &CacheStats) {
        let CacheStats {
            read_hits,
            read_misses,
            prefetch_hits,
            write_hits,
            overwrites,
            write_allocs,
            fetches,
            fill_fetches,
            prefetches,
            writes,
            policy_writes,
            immediate_writes,
            threshold_writes,
            age_writes,
            sync_writes,
            flush_writes,
            detached_writes,
            stalls,
            evictions,
            fetch_failures,
            discarded,
        } = *o;
        self.read_hits += read_hits;
        self.read_misses += read_misses;
        self.prefetch_hits += prefetch_hits;
        self.write_hits += write_hits;
        self.overwrites += overwrites;
        self.write_allocs += write_allocs;
        self.fetches += fetches;
        self.fill_fetches += fill_fetches;
        self.prefetches += prefetches;
        self.writes += writes;
        self.policy_writes += policy_writes;
        self.immediate_writes += immediate_writes;
        self.threshold_writes += threshold_writes;
        self.age_writes += age_writes;
        self.sync_writes += sync_writes;
        self.flush_writes += flush_writes;
        self.detached_writes += detached_writes;
        self.stalls += stalls;
        self.evictions += evictions;
        self.fetch_failures += fetch_failures;
        self.discarded += discarded;
    }
}

impl CacheStats {
    pub(crate) fn count_write(&mut self, cause: WriteCause) {
        self.writes += 1;
        match cause {
            WriteCause::Policy => self.policy_writes += 1,
            WriteCause::Need => self.immediate_writes += 1,
            WriteCause::Threshold => self.threshold_writes += 1,
            WriteCause::Age => self.age_writes += 1,
            WriteCause::Sync => self.sync_writes += 1,
            WriteCause::Flush => self.flush_writes += 1,
        }
    }
}
