//! `threshold(high, low)` — Biswas et al. 1993 §3: when the dirty blocks in a
//! cache exceed the high limit, the least recently used dirty blocks are
//! written until the number falls below the low limit (defaults 90 % / 50 %,
//! the paper's best setting in Tables 6.4 and 6.5).

use super::{WritePolicy, WritePolicyKind};

pub struct Threshold {
    high_pct: u8,
    low_pct: u8,
}

impl Threshold {
    pub fn new(high_pct: u8, low_pct: u8) -> Self {
        assert!(
            low_pct <= high_pct && high_pct <= 100,
            "threshold needs low <= high <= 100"
        );
        Threshold { high_pct, low_pct }
    }
}

impl WritePolicy for Threshold {
    fn kind(&self) -> WritePolicyKind {
        WritePolicyKind::Threshold {
            high_pct: self.high_pct,
            low_pct: self.low_pct,
        }
    }
    /// A full NV write cache replaces its LRU block, written back if
    /// dirty: one write per need (Biswas et al. 1993 §2.2).
    fn writes_per_need(&self) -> Option<usize> {
        Some(1)
    }
    fn on_dirty_level(&mut self, dirty: usize, writing: usize, capacity: usize) -> usize {
        let high = capacity * self.high_pct as usize / 100;
        let low = capacity * self.low_pct as usize / 100;
        if dirty <= high {
            return 0;
        }
        // Blocks already on their way down will leave the dirty set.
        (dirty - writing).saturating_sub(low)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drains_from_high_to_low() {
        let mut t = Threshold::new(90, 50);
        assert_eq!(t.on_dirty_level(90, 0, 100), 0);
        assert_eq!(t.on_dirty_level(91, 0, 100), 41);
        assert_eq!(t.on_dirty_level(91, 41, 100), 0);
        assert_eq!(t.on_dirty_level(95, 40, 100), 5);
    }
}
