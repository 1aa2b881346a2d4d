//! The application's bypass bits (Vilayannur et al. 2003 §3): for each
//! segment of a file, for each operation, one bit per level saying whether
//! the request passes through that cache. A segment with no bits set is
//! cached at both levels; a file-wide hint is the same setting over every
//! segment (the coarse form the paper compares against).

use super::{Level, Op, Route, SegmentKey};
use crate::block::BlockKey;
use crate::error::PolicyError;
use std::collections::{BTreeMap, HashMap};

/// The four bits of one segment: (read, write) x (local, global).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentBits {
    pub read: Route,
    pub write: Route,
}

impl Default for SegmentBits {
    fn default() -> Self {
        SegmentBits {
            read: Route::CACHED,
            write: Route::CACHED,
        }
    }
}

impl SegmentBits {
    fn route_mut(&mut self, op: Op) -> &mut Route {
        match op {
            Op::Read => &mut self.read,
            Op::Write => &mut self.write,
        }
    }
}

/// One hint: for blocks `first..=last` of a file (None: the whole file),
/// whether `op` goes through each level (None: leave it as it is).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hint {
    pub op: Op,
    pub local: Option<bool>,
    pub global: Option<bool>,
}

impl Hint {
    /// Parses `local=off,global=on` (either or both, in any order) for `op`.
    pub fn parse(op: Op, s: &str) -> Result<Hint, PolicyError> {
        let bad = |detail: String| PolicyError::BadParameter {
            policy: format!("{op} hint"),
            detail,
        };
        let mut h = Hint {
            op,
            local: None,
            global: None,
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("'{part}' is not level=on|off")))?;
            let on = match v.trim() {
                "on" | "cache" => true,
                "off" | "bypass" => false,
                other => return Err(bad(format!("'{other}' for {k}: use on or off"))),
            };
            match k.trim() {
                "local" => h.local = Some(on),
                "global" => h.global = Some(on),
                other => return Err(bad(format!("unknown level '{other}' (local, global)"))),
            }
        }
        if h.local.is_none() && h.global.is_none() {
            return Err(bad(format!("'{s}' names no level (local=on|off, global=on|off)")));
        }
        Ok(h)
    }
}

/// The bits of every hinted segment, per file; file-wide hints apply where
/// no segment hint overrides them.
#[derive(Clone, Debug)]
pub struct SegmentMap {
    blocks_per_segment: u64,
    segments: HashMap<u64, BTreeMap<u64, SegmentBits>>,
    files: HashMap<u64, SegmentBits>,
}

impl SegmentMap {
    pub fn new(blocks_per_segment: u64) -> SegmentMap {
        SegmentMap {
            blocks_per_segment: blocks_per_segment.max(1),
            segments: HashMap::new(),
            files: HashMap::new(),
        }
    }

    pub fn blocks_per_segment(&self) -> u64 {
        self.blocks_per_segment
    }

    /// Applies `hint` to the whole file (the coarse form).
    pub fn hint_file(&mut self, file: u64, hint: Hint) {
        apply(self.files.entry(file).or_default(), hint);
        // A file-wide hint also overrides what earlier segment hints said.
        if let Some(segs) = self.segments.get_mut(&file) {
            segs.values_mut().for_each(|b| apply(b, hint));
        }
    }

    /// Applies `hint` to every segment that blocks `first..=last` touch.
    pub fn hint_blocks(&mut self, file: u64, first: u64, last: u64, hint: Hint) {
        let base = self.files.get(&file).copied().unwrap_or_default();
        let segs = self.segments.entry(file).or_default();
        for s in first / self.blocks_per_segment..=last / self.blocks_per_segment {
            apply(segs.entry(s).or_insert(base), hint);
        }
    }

    /// Forgets every hint for the file (removed, or hints cleared).
    pub fn clear(&mut self, file: u64) {
        self.segments.remove(&file);
        self.files.remove(&file);
    }

    /// Where `op` on `block` goes.
    pub fn route(&self, block: BlockKey, op: Op) -> Route {
        let seg = SegmentKey::of(block, self.blocks_per_segment);
        let bits = self
            .segments
            .get(&seg.file)
            .and_then(|s| s.get(&seg.segment))
            .or_else(|| self.files.get(&seg.file))
            .copied()
            .unwrap_or_default();
        match op {
            Op::Read => bits.read,
            Op::Write => bits.write,
        }
    }

    /// Whether the file has any hint (none: every request goes through).
    pub fn hinted(&self, file: u64) -> bool {
        self.files.contains_key(&file) || self.segments.get(&file).is_some_and(|s| !s.is_empty())
    }

    /// Whether `op` on `block` passes through `level`.
    pub fn through(&self, block: BlockKey, op: Op, level: Level) -> bool {
        self.route(block, op).through(level)
    }
}

fn apply(bits: &mut SegmentBits, hint: Hint) {
    let r = bits.route_mut(hint.op);
    if let Some(l) = hint.local {
        r.local = l;
    }
    if let Some(g) = hint.global {
        r.global = g;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(i: u64) -> BlockKey {
        BlockKey::new(7, i)
    }

    #[test]
    fn segment_hints_override_file_hints_by_segment_and_operation() {
        let mut m = SegmentMap::new(4);
        assert_eq!(m.route(b(0), Op::Read), Route::CACHED, "no hint: both levels");
        m.hint_file(7, Hint::parse(Op::Read, "global=off").unwrap());
        assert!(!m.through(b(100), Op::Read, Level::Global));
        assert!(m.through(b(100), Op::Read, Level::Local));
        assert!(m.through(b(100), Op::Write, Level::Global), "writes untouched");
        // Blocks 5..=9 touch segments 1 and 2 (blocks 4..=11).
        m.hint_blocks(7, 5, 9, Hint::parse(Op::Read, "global=on,local=off").unwrap());
        for i in 4..12 {
            assert_eq!(
                m.route(b(i), Op::Read),
                Route {
                    local: false,
                    global: true
                },
                "block {i}"
            );
        }
        assert!(
            !m.through(b(3), Op::Read, Level::Global),
            "segment 0 keeps the file hint"
        );
        assert!(
            !m.through(b(12), Op::Read, Level::Global),
            "segment 3 keeps the file hint"
        );
        // Another file is not affected; clearing forgets.
        assert_eq!(m.route(BlockKey::new(8, 5), Op::Read), Route::CACHED);
        m.clear(7);
        assert_eq!(m.route(b(5), Op::Read), Route::CACHED);
    }

    use proptest::prelude::*;

    proptest! {
        /// Any sequence of file and segment hints routes every block as a
        /// per-block replay of the same hints does.
        #[test]
        fn routes_match_a_per_block_replay(
            hints in prop::collection::vec(
                (any::<bool>(), 0u64..64, 0u64..16, any::<bool>(), prop::option::of(any::<bool>()), prop::option::of(any::<bool>())),
                0..24,
            )
        ) {
            let mut m = SegmentMap::new(4);
            let mut model = vec![SegmentBits::default(); 80];
            for (whole, first, len, write, local, global) in hints {
                let op = if write { Op::Write } else { Op::Read };
                let hint = Hint { op, local, global };
                if whole {
                    m.hint_file(7, hint);
                    model.iter_mut().for_each(|bits| apply(bits, hint));
                } else {
                    let last = first + len;
                    m.hint_blocks(7, first, last, hint);
                    for (i, bits) in model.iter_mut().enumerate() {
                        let seg = i as u64 / 4;
                        if (first / 4..=last / 4).contains(&seg) {
                            apply(bits, hint);
                        }
                    }
                }
            }
            for (i, bits) in model.iter().enumerate() {
                prop_assert_eq!(m.route(b(i as u64), Op::Read), bits.read, "block {}", i);
                prop_assert_eq!(m.route(b(i as u64), Op::Write), bits.write, "block {}", i);
            }
        }
    }

    #[test]
    fn hints_parse_with_clear_errors() {
        let h = Hint::parse(Op::Write, " local=off , global=on ").unwrap();
        assert_eq!((h.local, h.global), (Some(false), Some(true)));
        for bad in ["", "local", "local=maybe", "remote=on"] {
            let e = Hint::parse(Op::Read, bad).unwrap_err().to_string();
            assert!(e.contains("read hint"), "{bad}: {e}");
        }
    }
}
