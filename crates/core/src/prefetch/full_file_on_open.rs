//! `full-file-on-open` — Cortes et al. 1996 §4: when a file is opened, queue
//! every one of its blocks; they are fetched as the disks fall idle.

use super::{Prefetch, PrefetchKind};
use crate::block::{BlockKey, FileId};

pub struct FullFileOnOpen;

impl Prefetch for FullFileOnOpen {
    fn kind(&self) -> PrefetchKind {
        PrefetchKind::FullFileOnOpen
    }
    fn on_open(&mut self, file: FileId, blocks: u64, out: &mut Vec<BlockKey>) {
        out.extend((0..blocks).map(|i| BlockKey::new(file, i)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queues_the_whole_file() {
        let mut out = Vec::new();
        FullFileOnOpen.on_open(3, 4, &mut out);
        assert_eq!(out.iter().map(|k| k.index).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        FullFileOnOpen.on_access(BlockKey::new(3, 0), &mut out);
        assert_eq!(out.len(), 4);
    }
}
