//! The simulator's one seeded random source. PCG64 has a fixed, documented
//! output sequence, so a seed gives the same numbers on every machine and
//! every build. Independent streams (one per process, say) are derived from
//! the seed, so adding a draw to one stream does not shift the others.

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

pub struct SimRng(Pcg64Mcg);

impl SimRng {
    pub fn new(seed: u64) -> Self {
        SimRng(Pcg64Mcg::seed_from_u64(seed))
    }

    /// A stream derived from `seed` and a stream number.
    pub fn stream(seed: u64, stream: u64) -> Self {
        // SplitMix-style mixing so neighbouring streams are unrelated.
        let mut z = seed ^ stream.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        SimRng::new(z ^ (z >> 31))
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        self.0.gen::<f64>()
    }

    /// Uniform integer in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.gen_range(0..n)
    }

    /// Exponential with mean `mean`, truncated at `max`: draws above `max`
    /// are drawn again (a truncated distribution, as in Kotz & Ellis 1992
    /// footnote 2), so no value exceeds `max`.
    pub fn exp_truncated(&mut self, mean: f64, max: f64) -> f64 {
        assert!(mean > 0.0 && max > 0.0, "exponential needs positive mean and bound");
        loop {
            let u = 1.0 - self.uniform(); // (0, 1]
            let x = -mean * u.ln();
            if x <= max {
                return x;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_numbers_and_streams_differ() {
        let a: Vec<f64> = (0..5)
            .map({
                let mut r = SimRng::new(7);
                move |_| r.uniform()
            })
            .collect();
        let b: Vec<f64> = (0..5)
            .map({
                let mut r = SimRng::new(7);
                move |_| r.uniform()
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(SimRng::stream(7, 0).uniform(), SimRng::stream(7, 1).uniform());
    }

    #[test]
    fn truncated_exponential_stays_below_its_bound_with_the_right_mean() {
        let mut r = SimRng::new(1);
        let xs: Vec<f64> = (0..100_000).map(|_| r.exp_truncated(30.0, 150.0)).collect();
        assert!(xs.iter().all(|&x| (0.0..=150.0).contains(&x)));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        // Truncation at 5 means lowers the mean of Exp(30) to about 29.0.
        assert!((28.5..29.5).contains(&mean), "mean {mean}");
    }
}
