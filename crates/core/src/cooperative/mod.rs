//! Cooperative caching (Cortes, Girona & Labarta 1996, PACA): the memory of
//! every node is one cache, so a block one node holds need not be read from
//! the data servers by another.
//!
//! The algorithms decide where a missed block is looked for and what
//! happens to a block a node evicts; they are pure decisions, driven by the
//! daemons and by the simulator alike:
//! - [`lru_interleaved`]: each block has one home node; no replicas, so no
//!   coherence traffic (1996 §3.2).
//! - [`n_chance`]: nodes cache what they read; the last copy of an evicted
//!   block is forwarded to a random peer up to `n` times (Dahlin et al.
//!   1994, as 1996 §4 adapts it).
//! - [`greedy`]: `n-chance` with `n = 0`: remote hits, no forwarding.
//! - [`membership`]: which nodes are in the tier (heartbeats, silence).

pub mod global;
pub mod greedy;
pub mod lru_interleaved;
pub mod membership;
pub mod n_chance;

use crate::catalogue::{find_named, split_params};
use crate::error::PolicyError;
use crate::ids::NodeId;
use std::fmt;
use std::str::FromStr;

/// A file's cooperative-caching algorithm.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CooperativeKind {
    /// Each node's cache is private (a miss goes to the data servers).
    #[default]
    None,
    /// [`lru_interleaved`].
    LruInterleaved,
    /// [`n_chance`] with `n` forwards of an unreferenced last copy
    /// (`n = 0` is [`greedy`]).
    NChance { n: u8 },
    /// [`global`]: a private node cache with the hash-placed global cache
    /// below it (2003); `threshold` > 0 turns on the runtime bypass and
    /// `harvest` replacement there.
    Global { threshold: u32 },
}

impl CooperativeKind {
    /// Dahlin's best `n`, which the 1996 paper uses (§4).
    pub const DEFAULT_N: u8 = 2;
    /// The most forwards a block may have without a reference.
    pub const MAX_N: u8 = 16;
    /// The largest runtime bypass threshold accepted.
    pub const MAX_THRESHOLD: u32 = 1 << 20;

    const NAMES: [&'static str; 5] = ["none", "lru-interleaved", "n-chance", "greedy", "global"];
}

impl fmt::Display for CooperativeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CooperativeKind::None => f.write_str("none"),
            CooperativeKind::LruInterleaved => f.write_str("lru-interleaved"),
            CooperativeKind::NChance { n: 0 } => f.write_str("greedy"),
            CooperativeKind::NChance { n } => write!(f, "n-chance(n={n})"),
            CooperativeKind::Global { threshold: 0 } => f.write_str("global"),
            CooperativeKind::Global { threshold } => write!(f, "global(threshold={threshold})"),
        }
    }
}

impl FromStr for CooperativeKind {
    type Err = PolicyError;

    /// `none`, `lru-interleaved`, `greedy`, `n-chance` or `n-chance(n=K)`
    /// with K from 0 to 16, `global` or `global(threshold=T)` (the paper's
    /// 20–50; 0 turns the runtime bypass off).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, params) = split_params(s)?;
        let name = find_named(&Self::NAMES, name, "cooperative", |n| n)?;
        let bad = |detail: String| PolicyError::BadParameter {
            policy: name.to_string(),
            detail,
        };
        let mut kind = match name {
            "none" => CooperativeKind::None,
            "lru-interleaved" => CooperativeKind::LruInterleaved,
            "greedy" => CooperativeKind::NChance { n: 0 },
            "global" => CooperativeKind::Global { threshold: 0 },
            _ => CooperativeKind::NChance { n: Self::DEFAULT_N },
        };
        for (k, v) in params {
            match (&mut kind, k) {
                (CooperativeKind::NChance { n }, "n") if name == "n-chance" => {
                    *n = v
                        .parse()
                        .ok()
                        .filter(|&x| x <= Self::MAX_N)
                        .ok_or_else(|| bad(format!("n '{v}' must be from 0 to {}", Self::MAX_N)))?
                }
                (CooperativeKind::Global { threshold }, "threshold") => {
                    *threshold = v
                        .parse()
                        .ok()
                        .filter(|&x| x <= Self::MAX_THRESHOLD)
                        .ok_or_else(|| bad(format!("threshold '{v}' must be from 0 to {}", Self::MAX_THRESHOLD)))?
                }
                _ => return Err(bad(format!("unknown parameter '{k}'"))),
            }
        }
        Ok(kind)
    }
}

/// Where a node gets a block it does not hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Another node's cache (a remote hit).
    Peer(NodeId),
    /// This node's own cache is the block's place (its home under
    /// `lru-interleaved`): a miss there goes to the data servers.
    Own,
    /// No cache holds it: the data servers.
    Servers,
}

/// The nodes of the cooperative tier: distinct, in order (the metadata
/// server's membership list; a node that leaves or dies is dropped).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Members(Vec<NodeId>);

impl Members {
    pub fn new(nodes: impl IntoIterator<Item = NodeId>) -> Members {
        let mut v: Vec<NodeId> = nodes.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        Members(v)
    }

    pub fn nodes(&self) -> &[NodeId] {
        &self.0
    }

    pub fn contains(&self, node: NodeId) -> bool {
        self.0.binary_search(&node).is_ok()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A node other than `not`, picked by `pick` (a random number the
    /// driver supplies: the core draws none itself).
    pub fn other_than(&self, not: NodeId, pick: u64) -> Option<NodeId> {
        let others = self.0.iter().filter(|&&n| n != not).count();
        if others == 0 {
            return None;
        }
        self.0
            .iter()
            .copied()
            .filter(|&n| n != not)
            .nth((pick % others as u64) as usize)
    }
}

/// A 64-bit mix (splitmix64's finaliser): spreads nearby ids apart.
pub(crate) fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_ones_are_named() {
        for s in [
            "none",
            "lru-interleaved",
            "greedy",
            "n-chance(n=2)",
            "n-chance(n=5)",
            "global",
            "global(threshold=20)",
        ] {
            assert_eq!(s.parse::<CooperativeKind>().unwrap().to_string(), s);
        }
        assert_eq!(
            "n-chance".parse::<CooperativeKind>().unwrap(),
            CooperativeKind::NChance { n: 2 }
        );
        assert_eq!(
            "n-chance(n=0)".parse::<CooperativeKind>().unwrap().to_string(),
            "greedy"
        );
        let e = "n-chance(n=99)".parse::<CooperativeKind>().unwrap_err().to_string();
        assert!(e.contains("from 0 to 16"), "{e}");
        let e = "lru-interleaved(n=2)"
            .parse::<CooperativeKind>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown parameter 'n'"), "{e}");
        assert_eq!(
            "global(threshold=0)".parse::<CooperativeKind>().unwrap().to_string(),
            "global"
        );
        let e = "global(threshold=-1)"
            .parse::<CooperativeKind>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("threshold '-1'"), "{e}");
        let e = "xfs".parse::<CooperativeKind>().unwrap_err().to_string();
        assert!(e.contains("lru-interleaved") && e.contains("n-chance"), "{e}");
    }

    #[test]
    fn a_peer_other_than_the_asker() {
        let m = Members::new([5, 3, 9, 3]);
        assert_eq!(m.nodes(), &[3, 5, 9]);
        for pick in 0..10 {
            let p = m.other_than(5, pick).unwrap();
            assert!(p != 5 && m.contains(p));
        }
        assert_eq!(Members::new([4]).other_than(4, 7), None);
    }
}
