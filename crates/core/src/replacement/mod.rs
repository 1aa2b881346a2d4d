//! Replacement: which buffer a cache gives up when it needs one (DESIGN.md §3).
//!
//! Each policy lives in its own file and implements [`Replacement`]. The
//! cache asks a policy two things: whether a buffer is replaceable, and which
//! replaceable buffers to try first. Buffers that are pinned by an access in
//! progress or busy with I/O are never offered, whatever the policy says:
//! the cache filters them.

mod lru;
mod recency;
mod toss_immediately;

pub use lru::Lru;
pub use recency::RecencyList;
pub use toss_immediately::TossImmediately;

use crate::error::PolicyError;
use crate::ids::{BufId, ProcId};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A replacement policy over a fixed set of buffers `0..buffers`.
pub trait Replacement: Send {
    /// The catalogue name of the policy.
    fn kind(&self) -> ReplacementKind;
    /// `proc` is about to use the cache. Fails if the policy cannot serve one
    /// more process (toss-immediately needs a buffer per process).
    fn admit(&mut self, proc: ProcId) -> Result<(), PolicyError> {
        let _ = proc;
        Ok(())
    }
    /// A buffer now holds a new block (it becomes the most recently used).
    fn on_insert(&mut self, buf: BufId);
    /// `proc` finished an access to `buf`. Returns a buffer that became
    /// replaceable because of this access, if any.
    fn on_access(&mut self, proc: ProcId, buf: BufId) -> Option<BufId>;
    /// The buffer no longer holds a block.
    fn on_evict(&mut self, buf: BufId);
    /// Whether the policy allows `buf` to be replaced.
    fn is_replaceable(&self, buf: BufId) -> bool;
    /// Offers the candidates for a buffer that `proc` needs to `visit`, in
    /// order of preference, until `visit` returns `false`. Only buffers
    /// replaceable for `proc` are offered (for toss-immediately, that
    /// includes the buffer holding `proc`'s own MRU block, which it is
    /// about to leave).
    fn candidates(&self, proc: Option<ProcId>, visit: &mut dyn FnMut(BufId) -> bool);
    /// Whether `candidates` offers every buffer holding a block, whoever
    /// asks. The cache then stops its walk once it has seen every idle
    /// buffer, since the rest can only be busy.
    fn offers_every_block(&self) -> bool {
        false
    }
}

/// The replacement policies of the catalogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReplacementKind {
    Lru,
    TossImmediately,
}

impl ReplacementKind {
    pub const ALL: [ReplacementKind; 2] = [ReplacementKind::Lru, ReplacementKind::TossImmediately];

    pub fn name(self) -> &'static str {
        match self {
            ReplacementKind::Lru => "lru",
            ReplacementKind::TossImmediately => "toss-immediately",
        }
    }

    /// How many processes may have accesses in progress at once in a cache
    /// of `buffers` buffers. Toss-immediately keeps every process's most
    /// recently used block, even a process idle now (Kotz & Ellis 1992
    /// §3.3): half the buffers stay free for the rest.
    pub fn max_processes(self, buffers: usize) -> usize {
        match self {
            ReplacementKind::Lru => buffers,
            ReplacementKind::TossImmediately => buffers / 2,
        }
    }

    /// Builds the policy for a cache of `buffers` buffers.
    pub fn build(self, buffers: usize) -> Box<dyn Replacement> {
        match self {
            ReplacementKind::Lru => Box::new(Lru::new(buffers)),
            ReplacementKind::TossImmediately => Box::new(TossImmediately::new(buffers)),
        }
    }
}

impl fmt::Display for ReplacementKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReplacementKind {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ReplacementKind::ALL
            .into_iter()
            .find(|k| k.name() == s.trim())
            .ok_or_else(|| PolicyError::Unknown {
                what: "replacement",
                name: s.to_string(),
                known: ReplacementKind::ALL
                    .iter()
                    .map(|k| k.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}
