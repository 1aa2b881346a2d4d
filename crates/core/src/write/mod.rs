//! Write policies: when dirty data moves one level down (DESIGN.md §3,
//! Kotz & Ellis 1992 §3.3.2, Biswas et al. 1993 §3).
//!
//! A policy is a set of hooks that the cache calls at the moments a policy
//! can act: after a write lands in a buffer, when a buffer becomes
//! replaceable, when a buffer is needed, when the number of dirty buffers
//! changes, and on a timer. Each hook answers with a decision; the cache
//! does the bookkeeping and emits the effects. Every policy shares one
//! fallback: a dirty buffer that the cache needs for another block is
//! written first (an "immediate" write, counted), which is how write-full
//! "becomes write-back during non-sequential access".

mod lru_writeback;
mod periodic;
mod threshold;
mod write_back;
mod write_free;
mod write_full;
mod write_through;

pub use lru_writeback::LruWriteback;
pub use periodic::Periodic;
pub use threshold::Threshold;
pub use write_back::WriteBack;
pub use write_free::WriteFree;
pub use write_full::WriteFull;
pub use write_through::WriteThrough;

use crate::block::BlockKey;
use crate::catalogue::{find_named, split_params};
use crate::error::PolicyError;
use crate::time::{parse_span, Span, Time};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// What a policy may look at when deciding about one buffer.
#[derive(Clone, Copy, Debug)]
pub struct BufView {
    pub key: BlockKey,
    /// The buffer holds bytes not yet written down.
    pub dirty: bool,
    /// Every byte of the block has been written by requests since the block
    /// entered the buffer (write-full's test).
    pub written_full: bool,
    /// When the buffer last went from clean to dirty.
    pub dirty_since: Option<Time>,
}

/// A write policy: hooks with do-nothing defaults.
pub trait WritePolicy: Send {
    /// The policy and its parameters.
    fn kind(&self) -> WritePolicyKind;
    /// A write request's bytes landed in the buffer. `true` writes it down now.
    fn after_write(&mut self, now: Time, buf: &BufView) -> bool {
        let _ = (now, buf);
        false
    }
    /// The buffer just became replaceable. `true` writes it down now.
    fn on_replaceable(&mut self, now: Time, buf: &BufView) -> bool {
        let _ = (now, buf);
        false
    }
    /// When a buffer is needed and the replacement order meets dirty
    /// buffers, how many of them to start writing before giving up on this
    /// attempt: `None` writes every dirty one met until a clean one is found.
    fn writes_per_need(&self) -> Option<usize> {
        None
    }
    /// The dirty level changed: `dirty` buffers hold unwritten data, of which
    /// `writing` are on their way down, out of `capacity`. Returns how many of
    /// the least recently used dirty buffers to start writing now.
    fn on_dirty_level(&mut self, dirty: usize, writing: usize, capacity: usize) -> usize {
        let _ = (dirty, writing, capacity);
        0
    }
    /// When the policy next wants a timer, given the time and dirty count.
    fn next_wake(&self, now: Time, dirty: usize) -> Option<Time> {
        let _ = (now, dirty);
        None
    }
    /// The timer fired: returns a cut-off; every buffer dirty since at or
    /// before it is written down.
    fn on_timer(&mut self, now: Time) -> Option<Time> {
        let _ = now;
        None
    }
}

/// The write policies of the catalogue, with their parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WritePolicyKind {
    WriteThrough,
    WriteBack,
    WriteFree,
    WriteFull,
    Periodic { interval: Span, age: Span },
    Threshold { high_pct: u8, low_pct: u8 },
    LruWriteback,
}

impl WritePolicyKind {
    /// Every policy, with default parameters.
    pub const ALL: [WritePolicyKind; 7] = [
        WritePolicyKind::WriteThrough,
        WritePolicyKind::WriteBack,
        WritePolicyKind::WriteFree,
        WritePolicyKind::WriteFull,
        WritePolicyKind::PERIODIC_DEFAULT,
        WritePolicyKind::THRESHOLD_DEFAULT,
        WritePolicyKind::LruWriteback,
    ];
    /// Sprite's values (1993 §3): every 5 s, blocks dirty for 30 s.
    pub const PERIODIC_DEFAULT: WritePolicyKind = WritePolicyKind::Periodic {
        interval: Span(5_000_000_000),
        age: Span(30_000_000_000),
    };
    pub const THRESHOLD_DEFAULT: WritePolicyKind = WritePolicyKind::Threshold {
        high_pct: 90,
        low_pct: 50,
    };

    /// The bare catalogue name, without parameters.
    pub fn name(self) -> &'static str {
        match self {
            WritePolicyKind::WriteThrough => "write-through",
            WritePolicyKind::WriteBack => "write-back",
            WritePolicyKind::WriteFree => "write-free",
            WritePolicyKind::WriteFull => "write-full",
            WritePolicyKind::Periodic { .. } => "periodic",
            WritePolicyKind::Threshold { .. } => "threshold",
            WritePolicyKind::LruWriteback => "lru-writeback",
        }
    }

    /// Whether a write request returns only once its blocks are down
    /// (write-through), so the driver waits for them.
    pub fn write_waits(self) -> bool {
        self == WritePolicyKind::WriteThrough
    }

    pub fn build(self) -> Box<dyn WritePolicy> {
        match self {
            WritePolicyKind::WriteThrough => Box::new(WriteThrough),
            WritePolicyKind::WriteBack => Box::new(WriteBack),
            WritePolicyKind::WriteFree => Box::new(WriteFree),
            WritePolicyKind::WriteFull => Box::new(WriteFull),
            WritePolicyKind::Periodic { interval, age } => Box::new(Periodic::new(interval, age)),
            WritePolicyKind::Threshold { high_pct, low_pct } => Box::new(Threshold::new(high_pct, low_pct)),
            WritePolicyKind::LruWriteback => Box::new(LruWriteback),
        }
    }
}

impl fmt::Display for WritePolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            WritePolicyKind::Periodic { interval, age } => {
                write!(f, "periodic(interval={interval},age={age})")
            }
            WritePolicyKind::Threshold { high_pct, low_pct } => {
                write!(f, "threshold(high={high_pct}%,low={low_pct}%)")
            }
            k => f.write_str(k.name()),
        }
    }
}

impl FromStr for WritePolicyKind {
    type Err = PolicyError;
    /// Accepts `write-full`, `periodic`, `periodic(interval=5s,age=30s)`,
    /// `threshold(high=90%,low=50%)` and the like.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, params) = split_params(s)?;
        let mut kind = find_named(&WritePolicyKind::ALL, name, "write", WritePolicyKind::name)?;
        let bad = |detail: String| PolicyError::BadParameter {
            policy: name.to_string(),
            detail,
        };
        for (k, v) in params {
            match (&mut kind, k) {
                (WritePolicyKind::Periodic { interval, .. }, "interval") => {
                    *interval = parse_span(v)
                        .filter(|d| d.0 > 0)
                        .ok_or_else(|| bad(format!("interval '{v}'")))?
                }
                (WritePolicyKind::Periodic { age, .. }, "age") => {
                    *age = parse_span(v).ok_or_else(|| bad(format!("age '{v}'")))?
                }
                (WritePolicyKind::Threshold { high_pct, .. }, "high") => {
                    *high_pct = parse_pct(v).ok_or_else(|| bad(format!("high '{v}'")))?
                }
                (WritePolicyKind::Threshold { low_pct, .. }, "low") => {
                    *low_pct = parse_pct(v).ok_or_else(|| bad(format!("low '{v}'")))?
                }
                _ => return Err(bad(format!("unknown parameter '{k}'"))),
            }
        }
        if let WritePolicyKind::Threshold { high_pct, low_pct } = kind {
            if low_pct > high_pct {
                return Err(bad(format!("low {low_pct}% is above high {high_pct}%")));
            }
        }
        Ok(kind)
    }
}

fn parse_pct(v: &str) -> Option<u8> {
    let n: u8 = v.trim_end_matches('%').trim().parse().ok()?;
    (n <= 100).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for k in WritePolicyKind::ALL {
            assert_eq!(k.to_string().parse::<WritePolicyKind>().unwrap(), k);
            assert_eq!(k.name().parse::<WritePolicyKind>().unwrap(), k);
            assert_eq!(k.build().kind(), k);
        }
        assert_eq!(
            "periodic(interval=1s, age=0s)".parse::<WritePolicyKind>().unwrap(),
            WritePolicyKind::Periodic {
                interval: Span::from_secs(1),
                age: Span::ZERO
            }
        );
        assert_eq!(
            "threshold(high=99,low=30%)".parse::<WritePolicyKind>().unwrap(),
            WritePolicyKind::Threshold {
                high_pct: 99,
                low_pct: 30
            }
        );
    }

    #[test]
    fn bad_names_and_parameters_are_named_in_the_error() {
        let e = "write-fool".parse::<WritePolicyKind>().unwrap_err().to_string();
        assert!(e.contains("write-fool") && e.contains("write-full"), "{e}");
        let e = "threshold(high=40,low=60)"
            .parse::<WritePolicyKind>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("low 60% is above high 40%"), "{e}");
        assert!("periodic(speed=3)".parse::<WritePolicyKind>().is_err());
        assert!("periodic(interval=0s)".parse::<WritePolicyKind>().is_err());
    }
}
