//! Prefetch: which blocks a cache reads before they are asked for
//! (DESIGN.md §3; Cortes et al. 1996 §4). A policy only proposes blocks; the
//! cache queues them and hands one to the driver when the driver says the
//! block's device is idle, so demand requests always go before prefetches.

mod full_file_on_open;
mod none;
mod one_block_ahead;
mod read_ahead;

pub use full_file_on_open::FullFileOnOpen;
pub use none::NoPrefetch;
pub use one_block_ahead::OneBlockAhead;
pub use read_ahead::ReadAhead;

use crate::block::{BlockKey, FileId};
use crate::error::PolicyError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A prefetch policy: proposes blocks to read ahead into `out`.
pub trait Prefetch: Send {
    fn kind(&self) -> PrefetchKind;
    /// A file of `blocks` blocks was opened.
    fn on_open(&mut self, file: FileId, blocks: u64, out: &mut Vec<BlockKey>) {
        let _ = (file, blocks, out);
    }
    /// A block of an open file was accessed.
    fn on_access(&mut self, key: BlockKey, out: &mut Vec<BlockKey>) {
        let _ = (key, out);
    }
    /// A block of an open file was written: an access, unless the policy
    /// reads ahead for readers only.
    fn on_write(&mut self, key: BlockKey, out: &mut Vec<BlockKey>) {
        self.on_access(key, out)
    }
    /// The file was closed: forget what is known of it.
    fn on_close(&mut self, file: FileId) {
        let _ = file;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PrefetchKind {
    None,
    OneBlockAhead,
    FullFileOnOpen,
    ReadAhead,
}

impl PrefetchKind {
    pub const ALL: [PrefetchKind; 4] = [
        PrefetchKind::None,
        PrefetchKind::OneBlockAhead,
        PrefetchKind::FullFileOnOpen,
        PrefetchKind::ReadAhead,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PrefetchKind::None => "none",
            PrefetchKind::OneBlockAhead => "one-block-ahead",
            PrefetchKind::FullFileOnOpen => "full-file-on-open",
            PrefetchKind::ReadAhead => "read-ahead",
        }
    }

    /// The policy for a cache of `buffers` buffers.
    pub fn build(self, buffers: usize) -> Box<dyn Prefetch> {
        match self {
            PrefetchKind::None => Box::new(NoPrefetch),
            PrefetchKind::OneBlockAhead => Box::new(OneBlockAhead::default()),
            PrefetchKind::FullFileOnOpen => Box::new(FullFileOnOpen),
            PrefetchKind::ReadAhead => Box::new(ReadAhead::for_cache(buffers)),
        }
    }
}

impl fmt::Display for PrefetchKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PrefetchKind {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PrefetchKind::ALL
            .into_iter()
            .find(|k| k.name() == s.trim())
            .ok_or_else(|| PolicyError::Unknown {
                what: "prefetch",
                name: s.to_string(),
                known: PrefetchKind::ALL
                    .iter()
                    .map(|k| k.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}
