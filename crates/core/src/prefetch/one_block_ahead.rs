//! `one-block-ahead` — Cortes et al. 1996 §4: after each access to block k,
//! queue block k+1 (if the file has one); it is fetched when its disk is idle.

use super::{Prefetch, PrefetchKind};
use crate::block::{BlockKey, FileId};
use rustc_hash::FxHashMap;

#[derive(Default)]
pub struct OneBlockAhead {
    /// Size in blocks of each open file, so the policy never reads past its end.
    sizes: FxHashMap<FileId, u64>,
}

impl Prefetch for OneBlockAhead {
    fn kind(&self) -> PrefetchKind {
        PrefetchKind::OneBlockAhead
    }
    fn on_open(&mut self, file: FileId, blocks: u64, _out: &mut Vec<BlockKey>) {
        self.sizes.insert(file, blocks);
    }
    fn on_access(&mut self, key: BlockKey, out: &mut Vec<BlockKey>) {
        let next = key.next();
        match self.sizes.get(&key.file) {
            Some(&n) if next.index >= n => {}
            _ => out.push(next),
        }
    }
    fn on_close(&mut self, file: FileId) {
        self.sizes.remove(&file);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_the_next_block_within_the_file() {
        let mut p = OneBlockAhead::default();
        let mut out = Vec::new();
        p.on_open(7, 3, &mut out);
        assert!(out.is_empty());
        p.on_access(BlockKey::new(7, 0), &mut out);
        assert_eq!(out, vec![BlockKey::new(7, 1)]);
        out.clear();
        p.on_access(BlockKey::new(7, 2), &mut out);
        assert!(out.is_empty(), "no block after the last one");
    }
}
