//! Request times of the paper's cluster (2003 Table 1: reads, Table 2:
//! writes, one I/O server, 4–128 KiB requests), each case as a curve
//! through the table's points: linear between them, a request under 4 KiB
//! costing what 4 KiB costs, and beyond 128 KiB the last slope. The tables
//! are the model's only timing input; nothing is fitted to the figures.

use serde::Serialize;

/// Request sizes of Table 1, KiB.
pub const SIZES_KIB: [f64; 6] = [4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

/// Table 1, |IOD| = 1: read times, ms.
pub const PVFS_READ: [f64; 6] = [1.09, 2.27, 4.31, 9.48, 19.04, 38.52];
pub const LOCAL_HIT: [f64; 6] = [0.67, 0.68, 0.72, 0.80, 0.97, 1.59];
pub const LOCAL_MISS: [f64; 6] = [1.25, 2.28, 4.61, 9.54, 20.77, 44.23];
pub const GLOBAL_HIT: [f64; 6] = [1.43, 1.71, 2.44, 4.26, 8.14, 15.28];
pub const GLOBAL_MISS: [f64; 6] = [2.00, 2.85, 5.86, 11.49, 23.85, 50.42];
/// Table 2, |IOD| = 1: write times, ms (4–128 KiB of its 4–256 KiB).
pub const PVFS_WRITE: [f64; 6] = [0.68, 1.03, 1.97, 3.95, 7.83, 15.94];
pub const CACHED_WRITE: [f64; 6] = [0.55, 0.56, 0.60, 0.96, 1.05, 1.76];

/// A case's time against request size, through the table's points, ms.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Line {
    pub points: [f64; 6],
}

impl Line {
    pub fn fit(ms: &[f64; 6]) -> Line {
        Line { points: *ms }
    }

    pub fn ms(&self, bytes: u64) -> f64 {
        let kib = bytes as f64 / 1024.0;
        let (x, y) = (&SIZES_KIB, &self.points);
        if kib <= x[0] {
            return y[0];
        }
        let i = (1..x.len()).find(|&i| kib <= x[i]).unwrap_or(x.len() - 1);
        y[i - 1] + (y[i] - y[i - 1]) * (kib - x[i - 1]) / (x[i] - x[i - 1])
    }

    /// The time one more KiB adds beyond `bytes`.
    pub fn per_kib(&self, bytes: u64) -> f64 {
        self.ms(bytes + 1024) - self.ms(bytes)
    }
}

/// Every case's line.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Costs {
    /// No cache at all (original PVFS).
    pub pvfs_read: Line,
    pub local_hit: Line,
    /// A local miss served by the I/O servers (the global cache bypassed).
    pub local_miss: Line,
    pub global_hit: Line,
    pub global_miss: Line,
    pub pvfs_write: Line,
    /// A write the local cache buffers (a flusher takes it down later).
    pub cached_write: Line,
}

impl Costs {
    pub fn paper() -> Costs {
        Costs {
            pvfs_read: Line::fit(&PVFS_READ),
            local_hit: Line::fit(&LOCAL_HIT),
            local_miss: Line::fit(&LOCAL_MISS),
            global_hit: Line::fit(&GLOBAL_HIT),
            global_miss: Line::fit(&GLOBAL_MISS),
            pvfs_write: Line::fit(&PVFS_WRITE),
            cached_write: Line::fit(&CACHED_WRITE),
        }
    }
}

/// Table 1's "required hit rate": the global cache hit rate at which a
/// local miss through the global cache costs what no cache costs,
/// `(miss − pvfs) / (miss − hit)`.
pub fn required_hit_rate(pvfs: f64, hit: f64, miss: f64) -> f64 {
    (miss - pvfs) / (miss - hit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_follow_the_tables_and_the_required_hit_rate_matches_table_1() {
        let c = Costs::paper();
        for (line, table) in [
            (c.pvfs_read, PVFS_READ),
            (c.global_hit, GLOBAL_HIT),
            (c.local_hit, LOCAL_HIT),
        ] {
            for (kib, ms) in SIZES_KIB.iter().zip(table) {
                let got = line.ms((*kib as u64) << 10);
                assert!((got - ms).abs() < 1e-9, "{kib} KiB: {got:.2} against {ms}");
            }
        }
        assert_eq!(c.pvfs_read.ms(100), 1.09, "under 4 KiB costs 4 KiB's time");
        assert!((c.pvfs_read.ms(12 << 10) - (2.27 + 4.31) / 2.0).abs() < 1e-9);
        assert!((c.pvfs_read.ms(256 << 10) - (38.52 + 2.0 * (38.52 - 19.04))).abs() < 1e-9);
        // Table 1's first Required HR cells, from its own rows.
        assert!((required_hit_rate(1.09, 1.43, 2.00) - 1.59).abs() < 0.01);
        assert!((required_hit_rate(9.48, 4.26, 11.49) - 0.27).abs() < 0.01);
    }
}
