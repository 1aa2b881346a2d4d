//! Fitting the model's two overhead constants to two published cells, by
//! bisection on the model itself (each is monotone in its constant).

use super::model::run;
use super::params::{KotzParams, Overheads, Pattern};
use parcache_core::WritePolicyKind;
use serde::Serialize;

/// The two cells the constants are fitted on: (pattern, cache, record
/// blocks, published seconds). Every other cell is a prediction.
pub const FIT_CELLS: [(&str, &str, f64, f64); 2] = [("lw1", "none", 1.0, 127.3), ("lw1", "write-back", 1.0, 16.4)];

#[derive(Clone, Debug, Serialize)]
pub struct Fit {
    pub overheads: Overheads,
    /// Model seconds at the fitted constants for each fit cell.
    pub fitted_seconds: [f64; 2],
}

fn solve(target: f64, mut f: impl FnMut(f64) -> f64) -> f64 {
    let (mut lo, mut hi) = (0.0f64, 50.0f64);
    for _ in 0..40 {
        let mid = (lo + hi) / 2.0;
        if f(mid) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    // Microsecond resolution is far below the paper's precision.
    ((lo + hi) / 2.0 * 1000.0).round() / 1000.0
}

/// Fits `request_ms` on lw1 without a cache, then `buffer_ms` on lw1 with a
/// write-back cache of 80 buffers, one-block records, no compute.
pub fn fit(seed: u64) -> Fit {
    let base = KotzParams {
        pattern: Pattern::Lw1,
        seed,
        ..KotzParams::default()
    };
    let no_cache = |req: f64| KotzParams {
        buffers: 0,
        overheads: Overheads {
            request_ms: req,
            buffer_ms: 0.0,
        },
        ..base.clone()
    };
    let request_ms = solve(FIT_CELLS[0].3, |x| run(&no_cache(x)).expect("valid").seconds);
    let cached = |buf: f64| KotzParams {
        buffers: 80,
        policy: WritePolicyKind::WriteBack,
        overheads: Overheads {
            request_ms,
            buffer_ms: buf,
        },
        ..base.clone()
    };
    let buffer_ms = solve(FIT_CELLS[1].3, |x| run(&cached(x)).expect("valid").seconds);
    Fit {
        overheads: Overheads { request_ms, buffer_ms },
        fitted_seconds: [
            run(&no_cache(request_ms)).unwrap().seconds,
            run(&cached(buffer_ms)).unwrap().seconds,
        ],
    }
}
