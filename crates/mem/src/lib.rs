//! parcache-mem: a cache buffer's memory, [`Block`]: bytes in whole pages
//! that start on a page boundary.
//!
//! A data server reads its blocks from its store around the page cache
//! (`O_DIRECT`), which takes only memory aligned to 4 KiB. In buffers of
//! plain `Vec<u8>` every block it read was copied into its cache's buffer
//! from an aligned one, a copy of every byte of a cold read (issue 14);
//! in a [`Block`] the store reads straight into the cache's buffer, and a
//! node's connection lands a fetched block in one ([`Block`] is the
//! buffer the node cache lends to the wire).

use bytemuck::{Pod, Zeroable};
use bytes::Bytes;
use std::ops::{Deref, DerefMut};

/// Bytes in a page, and the alignment a direct read or write needs.
pub const PAGE: usize = 4096;

#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C, align(4096))]
struct Page([u8; PAGE]);

/// Up to a block of bytes in whole pages on page boundaries. Works as a
/// `Vec<u8>` does (it dereferences to its bytes), except that the pages
/// it once held stay when it is cut or emptied: filled again, it takes no
/// new memory, and memory it takes is zeroed once, when taken.
#[derive(Clone, Default)]
pub struct Block {
    pages: Vec<Page>,
    len: usize,
}

impl Block {
    /// An empty block, no memory taken.
    pub fn new() -> Block {
        Block::default()
    }

    /// An empty block with `bytes` of memory taken (rounded up to pages),
    /// every page written once, so that filling it costs no page fault.
    pub fn with_pages_touched(bytes: usize) -> Block {
        let mut pages = vec![Page::zeroed(); bytes.div_ceil(PAGE)];
        // Written, not just allocated: a zeroed allocation may be the
        // kernel's untouched pages.
        for p in &mut pages {
            p.0[0] = std::hint::black_box(0);
        }
        Block { pages, len: 0 }
    }

    /// A block holding a copy of `src`.
    pub fn from_slice(src: &[u8]) -> Block {
        let mut b = Block::new();
        b.extend_from_slice(src);
        b
    }

    /// Bytes of memory it holds or has room for without allocating.
    pub fn capacity(&self) -> usize {
        self.pages.capacity() * PAGE
    }

    /// Makes room for `bytes` in all (rounded up to pages) without
    /// allocating more than that.
    pub fn reserve_total(&mut self, bytes: usize) {
        let want = bytes.div_ceil(PAGE);
        if want > self.pages.capacity() {
            self.pages.reserve_exact(want - self.pages.len());
        }
    }

    /// Holds no bytes (its pages stay).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Holds its first `n` bytes at most (its pages stay).
    pub fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n);
    }

    /// Makes it `n` bytes long, any byte it did not hold zero.
    pub fn resize_zeroed(&mut self, n: usize) {
        if n <= self.len {
            self.len = n;
            return;
        }
        let had = self.pages.len() * PAGE;
        self.grow_pages(n);
        let len = self.len;
        // New pages come zeroed; pages held before may hold stale bytes.
        self.all_mut()[len..n.min(had).max(len)].fill(0);
        self.len = n;
    }

    /// Appends a copy of `src`.
    pub fn extend_from_slice(&mut self, src: &[u8]) {
        let (at, end) = (self.len, self.len + src.len());
        self.grow_pages(end);
        self.all_mut()[at..end].copy_from_slice(src);
        self.len = end;
    }

    /// Makes it `n` bytes long without clearing what its pages held, for
    /// a read that writes every one of them; returns them.
    pub fn stale(&mut self, n: usize) -> &mut [u8] {
        self.grow_pages(n);
        self.len = n;
        &mut self.all_mut()[..n]
    }

    /// Its memory in whole pages from its first byte on (a direct read of
    /// up to this many bytes may write into all of it), stale past its
    /// length; at least `n` bytes of pages.
    pub fn pages_mut(&mut self, n: usize) -> &mut [u8] {
        self.grow_pages(n);
        self.all_mut()
    }

    /// Holds its first `n` bytes, as a read into [`Block::pages_mut`] left
    /// them (at most as many as its pages hold).
    pub fn set_len(&mut self, n: usize) {
        self.len = n.min(self.pages.len() * PAGE);
    }

    /// Pages for `n` bytes at least, new ones zeroed.
    fn grow_pages(&mut self, n: usize) {
        let want = n.div_ceil(PAGE);
        if want > self.pages.len() {
            self.pages.reserve_exact(want - self.pages.len());
            self.pages.resize(want, Page::zeroed());
        }
    }

    fn all_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(&mut self.pages)
    }
}

impl Deref for Block {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.pages)[..self.len]
    }
}

impl DerefMut for Block {
    fn deref_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.all_mut()[..len]
    }
}

impl AsRef<[u8]> for Block {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl AsMut<[u8]> for Block {
    fn as_mut(&mut self) -> &mut [u8] {
        self
    }
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl PartialEq for Block {
    fn eq(&self, other: &Block) -> bool {
        **self == **other
    }
}

impl Eq for Block {}

/// The bytes of `blocks`, one after another, copied into one buffer.
pub fn concat(blocks: &[Block]) -> Vec<u8> {
    let mut all = Vec::with_capacity(blocks.iter().map(|b| b.len()).sum());
    for b in blocks {
        all.extend_from_slice(b);
    }
    all
}

/// Its bytes as a payload, without a copy.
impl From<Block> for Bytes {
    fn from(b: Block) -> Bytes {
        Bytes::from_owner(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_starts_on_a_page_boundary_and_works_as_a_vec() {
        let mut b = Block::from_slice(b"hello");
        assert_eq!(&b[..], b"hello");
        assert_eq!(b.as_ptr() as usize % PAGE, 0);
        b.extend_from_slice(&[1u8; PAGE]);
        assert_eq!(b.len(), PAGE + 5);
        assert_eq!(b.capacity() % PAGE, 0);
        assert_eq!(b.as_ptr() as usize % PAGE, 0, "still aligned after growing");
        b.truncate(3);
        assert_eq!(&b[..], b"hel");
        b.resize_zeroed(8);
        assert_eq!(&b[..], b"hel\0\0\0\0\0", "bytes held before and cut off read as zeros");
        b.clear();
        assert!(b.is_empty());
        let p = b.as_ptr();
        b.extend_from_slice(b"again");
        assert_eq!(b.as_ptr(), p, "pages stay when emptied");
        assert_eq!(Bytes::from(b.clone()), Bytes::from_static(b"again"));
    }

    #[test]
    fn a_read_fills_stale_pages_and_sets_the_length() {
        let mut b = Block::with_pages_touched(3 * PAGE);
        assert_eq!((b.len(), b.capacity()), (0, 3 * PAGE));
        let p = b.pages_mut(2 * PAGE);
        assert_eq!(p.len(), 3 * PAGE);
        p[..PAGE + 10].fill(9);
        b.set_len(PAGE + 10);
        assert_eq!(b.len(), PAGE + 10);
        assert!(b.iter().all(|&x| x == 9));
        b.set_len(10 * PAGE);
        assert_eq!(b.len(), 3 * PAGE, "no longer than its pages");
        let s = b.stale(100);
        assert_eq!(s.len(), 100);
        assert_eq!(b.len(), 100);
        b.reserve_total(16 * PAGE);
        assert!(b.capacity() >= 16 * PAGE);
    }
}
