//! The application's hints as a file carries them (the policy setting
//! `bypass`, the xattr `user.parcache.bypass`, `parcache hint`): a list of
//! rules applied in order, later ones overriding earlier ones where they
//! overlap (Vilayannur et al. 2003 §3: the bits "can be set via a system
//! call" by the program or the compiler; a rule without a range is the
//! coarse, file-level hint).
//!
//! One rule is `OP[@A-B]:LEVELS`: `OP` is `read`, `write` or `rw`; `A-B`
//! a byte range (`0-1M`, end exclusive; sizes as `64K`, `1M`); `LEVELS`
//! as [`Hint::parse`] reads them (`local=off,global=on`). Rules are
//! separated by `;`; `none` (or nothing) is the empty list.

use super::segments::{Hint, SegmentMap};
use super::Op;
use crate::catalogue::parse_size;
use crate::error::PolicyError;
use std::fmt;
use std::str::FromStr;

/// One rule: a hint over a byte range of the file, or over all of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HintRule {
    /// `[start, end)` in bytes; `None`: the whole file.
    pub range: Option<(u64, u64)>,
    pub hint: Hint,
}

/// A file's rules, in the order they were given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HintList(pub Vec<HintRule>);

impl HintList {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Adds `more` after these rules (they win where they overlap).
    pub fn extend(&mut self, more: &HintList) {
        self.0.extend(more.0.iter().copied());
    }

    /// Sets `file`'s bits in `map` from these rules, for blocks of
    /// `block_size` bytes (a range covers every block it touches).
    pub fn apply(&self, map: &mut SegmentMap, file: u64, block_size: u32) {
        map.clear(file);
        let bs = block_size.max(1) as u64;
        for r in &self.0 {
            match r.range {
                None => map.hint_file(file, r.hint),
                Some((a, b)) => map.hint_blocks(file, a / bs, (b - 1) / bs, r.hint),
            }
        }
    }
}

fn bad(detail: String) -> PolicyError {
    PolicyError::BadParameter {
        policy: "bypass".into(),
        detail,
    }
}

impl FromStr for HintList {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let mut rules = Vec::new();
        if s.is_empty() || s == "none" {
            return Ok(HintList(rules));
        }
        for rule in s.split(';').map(str::trim).filter(|r| !r.is_empty()) {
            let (head, levels) = rule
                .split_once(':')
                .ok_or_else(|| bad(format!("'{rule}' is not OP[@A-B]:LEVELS (e.g. read@0-1M:global=off)")))?;
            let (op, range) = match head.split_once('@') {
                Some((op, r)) => (op.trim(), Some(parse_range(r)?)),
                None => (head.trim(), None),
            };
            let ops: &[Op] = match op {
                "read" => &[Op::Read],
                "write" => &[Op::Write],
                "rw" => &[Op::Read, Op::Write],
                other => {
                    return Err(bad(format!(
                        "'{other}' in '{rule}': the operation is read, write or rw"
                    )))
                }
            };
            for &op in ops {
                rules.push(HintRule {
                    range,
                    hint: Hint::parse(op, levels)?,
                });
            }
        }
        Ok(HintList(rules))
    }
}

/// Parses `A-B` (bytes, end exclusive, sizes with K/M/G).
pub fn parse_range(s: &str) -> Result<(u64, u64), PolicyError> {
    let (a, b) = s
        .trim()
        .split_once('-')
        .ok_or_else(|| bad(format!("range '{s}' is not A-B (e.g. 0-1M)")))?;
    let (a, b) = match (parse_size(a), parse_size(b)) {
        (Some(a), Some(b)) => (a, b),
        _ => {
            return Err(bad(format!(
                "range '{s}': A and B are byte offsets such as 4096 or 64K"
            )))
        }
    };
    if a >= b {
        return Err(bad(format!("range '{s}' is empty: A must be below B")));
    }
    Ok((a, b))
}

impl fmt::Display for HintList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(";")?;
            }
            write!(f, "{}", r.hint.op)?;
            if let Some((a, b)) = r.range {
                write!(f, "@{a}-{b}")?;
            }
            f.write_str(":")?;
            let mut sep = "";
            for (name, v) in [("local", r.hint.local), ("global", r.hint.global)] {
                if let Some(on) = v {
                    write!(f, "{sep}{name}={}", if on { "on" } else { "off" })?;
                    sep = ",";
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::BlockKey;
    use crate::bypass::Level;

    #[test]
    fn rules_parse_print_and_apply_in_order() {
        let l: HintList = "rw:global=off; read@64K-128K:local=off,global=on".parse().unwrap();
        assert_eq!(l.0.len(), 3);
        let canon = l.to_string();
        assert_eq!(
            canon,
            "read:global=off;write:global=off;read@65536-131072:local=off,global=on"
        );
        assert_eq!(canon.parse::<HintList>().unwrap(), l, "canonical form reads back");
        let mut m = SegmentMap::new(4);
        // 16 KiB blocks: 64K-128K is blocks 4..=7, segment 1.
        l.apply(&mut m, 9, 16 << 10);
        let k = |i| BlockKey::new(9, i);
        assert!(!m.through(k(0), Op::Read, Level::Global));
        assert!(m.through(k(5), Op::Read, Level::Global));
        assert!(!m.through(k(5), Op::Read, Level::Local));
        assert!(
            !m.through(k(5), Op::Write, Level::Global),
            "the range hint is for reads"
        );
        assert!(!m.through(k(8), Op::Read, Level::Global));
        // Applying again starts from scratch.
        HintList::default().apply(&mut m, 9, 16 << 10);
        assert!(m.through(k(0), Op::Read, Level::Global));
        assert_eq!(HintList::default().to_string(), "none");
        assert!("none".parse::<HintList>().unwrap().is_empty());
    }

    #[test]
    fn bad_rules_name_the_fault() {
        for (s, want) in [
            ("read", "OP[@A-B]:LEVELS"),
            ("append:local=off", "'append'"),
            ("read@5-1:local=off", "empty"),
            ("read@x-1:local=off", "byte offsets"),
            ("read@12:local=off", "not A-B"),
            ("read:local=sometimes", "use on or off"),
        ] {
            let e = s.parse::<HintList>().unwrap_err().to_string();
            assert!(e.contains(want), "{s}: {e}");
        }
    }
}
