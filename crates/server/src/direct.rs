//! Direct writes: a buffered write of whole cache blocks goes straight to
//! the block store instead of through the write log, so each of its bytes
//! crosses the disk once, not twice (log, then write-down). ZFS's indirect
//! writes to its intent log are the model: the bytes go where they will
//! stay, and a sync makes them durable before it makes the log durable.
//!
//! What a buffered write promises still holds: it survives `kill -9` of
//! the server as soon as it is acknowledged (its bytes are in the kernel's
//! page cache, which outlives the process), and a power cut once a `Sync`
//! has returned (a sync first fsyncs every part written directly since the
//! last one, then the log).
//!
//! The write log's replay must never undo a direct write, nor a direct
//! write undo a logged one that a sync made durable, so a write goes
//! directly only to blocks with no bytes in the log since the last
//! checkpoint, and only below every length the part was truncated to
//! since then (replay truncates again; a removal counts as a truncate to
//! nothing; an extension never shrinks a part, so it does not count).
//! This module keeps that account; the data server asks it before and
//! again after writing.

use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap, HashSet};

/// Most blocks kept in the account of logged bytes: past it (a flood of
/// tiny writes), no write goes directly until the next checkpoint.
const LOGGED_MAX: usize = 1 << 17;

/// What the write log holds since the last checkpoint, and which parts
/// hold bytes written directly that no sync has made durable yet.
#[derive(Default)]
pub struct DirectWrites {
    inner: Mutex<Account>,
}

#[derive(Default)]
struct Account {
    /// (handle, block) with bytes in the log.
    logged: HashSet<(u64, u64)>,
    /// The same blocks by handle, in order.
    logged_parts: HashMap<u64, BTreeSet<u64>>,
    /// More blocks were logged than [`LOGGED_MAX`]: none may go directly.
    saturated: bool,
    /// Handles with a truncate or removal in the log, with the least
    /// length one of them left (bytes beyond it a replay would cut).
    cut: HashMap<u64, u64>,
    /// Handles written directly since the last sync or checkpoint.
    unsynced: HashSet<u64>,
}

/// The blocks of `block` bytes that `len` bytes at `offset` cover.
fn blocks(offset: u64, len: u64, block: u32) -> std::ops::Range<u64> {
    let b = block as u64;
    offset / b..(offset + len).div_ceil(b)
}

impl DirectWrites {
    /// Whether `len` bytes at `offset` cover whole blocks
    /// only: the shape a direct write needs (a part of a block would need
    /// the rest of it from the cache or the store).
    pub fn whole_blocks(offset: u64, len: u64, block: u32) -> bool {
        let b = block as u64;
        len > 0 && offset.is_multiple_of(b) && len.is_multiple_of(b)
    }

    /// Whether `block` (of `block_size` bytes) of `handle` may be written
    /// directly: the log holds nothing of it, nor a cut of its part to
    /// less than its end.
    pub fn may_place(&self, handle: u64, block: u64, block_size: u32) -> bool {
        let a = self.inner.lock();
        let end = (block + 1) * block_size as u64;
        !a.saturated && a.cut.get(&handle).is_none_or(|&keep| end <= keep) && !a.logged.contains(&(handle, block))
    }

    /// Before bytes of `handle` are appended to the log.
    pub fn logging_write(&self, handle: u64, offset: u64, len: u64, block: u32) {
        let mut a = self.inner.lock();
        if a.saturated {
            return;
        }
        let ks = blocks(offset, len.max(1), block);
        for k in ks.clone() {
            a.logged.insert((handle, k));
        }
        a.logged_parts.entry(handle).or_default().extend(ks);
        if a.logged.len() > LOGGED_MAX {
            a.saturated = true;
            a.logged = HashSet::new();
            a.logged_parts = HashMap::new();
        }
    }

    /// The blocks of `handle` with bytes in the log since the last
    /// checkpoint, in order (its part's file may lack those bytes, which
    /// the server answers with from its cache); `None` if the account
    /// cannot tell (saturated) or names more than `most`. A node reads
    /// the others from the file itself (local reads,
    /// [`parcache_proto::Request::LocalPart`]).
    pub fn logged_blocks(&self, handle: u64, most: usize) -> Option<Vec<u64>> {
        let a = self.inner.lock();
        if a.saturated {
            return None;
        }
        match a.logged_parts.get(&handle) {
            None => Some(Vec::new()),
            Some(b) if b.len() <= most => Some(b.iter().copied().collect()),
            Some(_) => None,
        }
    }

    /// Before a truncate of `handle` to `keep` bytes (a removal: 0) is
    /// appended.
    pub fn logging_cut(&self, handle: u64, keep: u64) {
        let mut a = self.inner.lock();
        let k = a.cut.entry(handle).or_insert(keep);
        *k = (*k).min(keep);
    }

    /// Bytes of `handle` were written directly (and not yet synced).
    pub fn placed(&self, handle: u64) {
        self.inner.lock().unsynced.insert(handle);
    }

    /// The parts written directly since the last call: a sync fsyncs them
    /// before the log. On failure the caller gives them back with
    /// [`DirectWrites::placed`].
    pub fn take_unsynced(&self) -> Vec<u64> {
        self.inner.lock().unsynced.drain().collect()
    }

    /// The log was emptied by a checkpoint that synced every part written
    /// since the one before: nothing is logged or unsynced any more.
    pub fn checkpointed(&self) {
        *self.inner.lock() = Account::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: u32 = 64 << 10;

    #[test]
    fn only_whole_aligned_blocks_qualify() {
        assert!(DirectWrites::whole_blocks(0, 64 << 10, B));
        assert!(DirectWrites::whole_blocks(128 << 10, 1 << 20, B));
        assert!(!DirectWrites::whole_blocks(0, 0, B));
        assert!(!DirectWrites::whole_blocks(4096, 64 << 10, B));
        assert!(!DirectWrites::whole_blocks(0, 4096, B));
    }

    #[test]
    fn logged_blocks_and_blocks_past_a_cut_are_refused_until_a_checkpoint() {
        let d = DirectWrites::default();
        assert!(d.may_place(1, 0, B));
        // 100 bytes across the boundary of blocks 0 and 1.
        d.logging_write(1, (64 << 10) - 50, 100, B);
        assert!(!d.may_place(1, 0, B) && !d.may_place(1, 1, B));
        assert!(d.may_place(1, 2, B) && d.may_place(2, 0, B));
        assert_eq!(d.logged_blocks(1, 8), Some(vec![0, 1]));
        assert_eq!(d.logged_blocks(1, 1), None, "more than asked for");
        assert_eq!(d.logged_blocks(2, 8), Some(vec![]));
        // Truncated to 8 blocks, then to 7 and a half: a replay cuts
        // block 7.
        d.logging_cut(2, 8 * B as u64);
        assert!(d.may_place(2, 7, B) && !d.may_place(2, 8, B));
        d.logging_cut(2, 7 * B as u64 + 10);
        d.logging_cut(2, 9 * B as u64);
        assert!(d.may_place(2, 6, B) && !d.may_place(2, 7, B));
        d.logging_cut(5, 0);
        assert!(!d.may_place(5, 0, B), "removed");
        d.placed(3);
        d.placed(3);
        assert_eq!(d.take_unsynced(), vec![3]);
        assert!(d.take_unsynced().is_empty());
        d.placed(4);
        d.checkpointed();
        assert!(d.may_place(1, 0, B) && d.may_place(2, 7, B) && d.may_place(5, 0, B));
        assert_eq!(d.logged_blocks(1, 8), Some(vec![]));
        assert!(d.take_unsynced().is_empty());
    }

    #[test]
    fn a_flood_of_logged_blocks_stops_direct_writes_until_a_checkpoint() {
        let d = DirectWrites::default();
        for k in 0..=LOGGED_MAX as u64 {
            d.logging_write(9, k * B as u64, 1, B);
        }
        assert!(!d.may_place(10, 0, B), "saturated: nothing goes directly");
        assert_eq!(
            d.logged_blocks(10, 8),
            None,
            "saturated: no part is read by a node itself"
        );
        d.checkpointed();
        assert!(d.may_place(10, 0, B) && d.logged_blocks(10, 8) == Some(vec![]));
    }
}
