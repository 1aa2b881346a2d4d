//! Buffers for large payloads (a frame read from a socket, a run of blocks
//! a data server reads from its store), used again once the payload is
//! dropped. A new buffer per payload costs the kernel a page fault and a
//! cleared page for each 4 KiB it touches, since the allocator gives freed
//! buffers of this size back to the kernel: a fifth of a data server's
//! CPU, and a tenth of a mount's, on a cold sequential read through a
//! mount (issue 14).

use bytes::Bytes;
use parking_lot::Mutex;
use std::sync::Arc;

/// Buffers kept for use again, at most.
const KEEP: usize = 32;

/// Bytes kept for use again, at most (every connection has a pool, so a
/// data server with many nodes' connections would otherwise keep up to
/// KEEP buffers of [`LARGEST`] for each, long after the large requests
/// that left them).
const KEEP_BYTES: usize = 16 << 20;

/// The largest buffer kept (a larger answer's goes back to the allocator).
const LARGEST: usize = 4 << 20;

/// Payloads smaller than this take no pooled buffer (a small payload kept
/// for long, a small file's content in a node's cache, would hold a large
/// buffer out of use).
pub const POOLED_MIN: usize = 32 << 10;

/// New buffers are a multiple of this long.
const PAGE: usize = 4096;

#[derive(Default)]
pub struct BufPool {
    free: Mutex<Vec<Vec<u8>>>,
}

impl BufPool {
    /// A buffer of `len` bytes, kept from an earlier payload where one of
    /// at most twice the size is free: its bytes are stale, for the caller
    /// to overwrite every one.
    pub fn take(&self, len: usize) -> Vec<u8> {
        let kept = {
            let mut free = self.free.lock();
            let fits = free
                .iter()
                .rposition(|b| b.capacity() >= len && b.capacity() <= len.saturating_mul(2));
            fits.map(|i| free.swap_remove(i))
        };
        // A new buffer is a whole number of pages: the next payload's
        // header may be a byte longer (postcard encodes an integer in as
        // many bytes as it needs), and a buffer cut to the byte would
        // then not fit it.
        let mut buf = kept.unwrap_or_else(|| Vec::with_capacity(len.next_multiple_of(PAGE)));
        buf.resize(len, 0);
        buf
    }

    /// `buf` as a payload; its buffer comes back here when the payload (and
    /// every slice of it) is dropped.
    pub fn bytes(self: &Arc<Self>, buf: Vec<u8>) -> Bytes {
        Bytes::from_owner(Pooled {
            buf,
            pool: Arc::clone(self),
        })
    }

    #[cfg(test)]
    pub(crate) fn kept(&self) -> usize {
        self.free.lock().len()
    }
}

/// A payload's buffer, on its way back to the pool.
struct Pooled {
    buf: Vec<u8>,
    pool: Arc<BufPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let cap = self.buf.capacity();
        if (POOLED_MIN..=LARGEST).contains(&cap) {
            let mut free = self.pool.free.lock();
            let held: usize = free.iter().map(Vec::capacity).sum();
            if free.len() < KEEP && held + cap <= KEEP_BYTES {
                free.push(std::mem::take(&mut self.buf));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dropped payload's buffer is taken again (same memory), sized to the
    /// new request, unless it is over twice that; slices keep it out until
    /// the last is dropped; the pool keeps at most KEEP buffers, none over
    /// LARGEST, and at most KEEP_BYTES in all.
    #[test]
    fn buffers_come_back_when_the_last_slice_goes() {
        let pool = Arc::new(BufPool::default());
        let mut b = pool.take(POOLED_MIN);
        b.fill(7);
        let at = b.as_ptr();
        let answer = pool.bytes(b);
        let part = answer.slice(10..20);
        drop(answer);
        assert_eq!(pool.kept(), 0, "a slice still holds it");
        assert_eq!(&part[..], &[7u8; 10]);
        drop(part);
        assert_eq!(pool.kept(), 1);
        let small = pool.take(100);
        assert_ne!(small.as_ptr(), at, "over twice the size asked");
        drop(pool.bytes(small));
        assert_eq!(pool.kept(), 1, "too small to keep");
        let again = pool.take(POOLED_MIN - 500);
        assert_eq!((again.as_ptr(), again.len()), (at, POOLED_MIN - 500));
        drop(again);
        let many: Vec<Bytes> = (0..KEEP + 5).map(|_| pool.bytes(pool.take(POOLED_MIN))).collect();
        drop(many);
        assert_eq!(pool.kept(), KEEP);
        let big = pool.bytes(vec![0u8; LARGEST + 1]);
        let before = pool.kept();
        drop(pool.take(POOLED_MIN));
        drop(big);
        assert_eq!(pool.kept(), before - 1, "too large to keep");
    }

    /// A buffer taken for a payload serves the next one a few bytes
    /// longer: consecutive writes' headers differed by a byte, and a
    /// data server's connection took a new 256 KiB
    /// buffer (and cleared its pages) for most of them.
    #[test]
    fn a_buffer_serves_a_payload_a_byte_longer() {
        let pool = Arc::new(BufPool::default());
        let first = pool.take(266_245);
        let at = first.as_ptr();
        drop(pool.bytes(first));
        let next = pool.take(266_246);
        assert_eq!((next.as_ptr(), next.len()), (at, 266_246));
    }

    /// Large buffers are kept only up to KEEP_BYTES in all: a burst of
    /// large requests does not leave KEEP of them held for good.
    #[test]
    fn the_pool_keeps_a_bounded_number_of_bytes() {
        let pool = Arc::new(BufPool::default());
        let many: Vec<Bytes> = (0..KEEP).map(|_| pool.bytes(pool.take(LARGEST))).collect();
        drop(many);
        let held: usize = pool.free.lock().iter().map(Vec::capacity).sum();
        assert!(held <= KEEP_BYTES, "{held} bytes kept");
        assert_eq!(pool.kept(), KEEP_BYTES / LARGEST);
        // Small buffers still fill the pool to KEEP.
        let pool = Arc::new(BufPool::default());
        let many: Vec<Bytes> = (0..KEEP + 1).map(|_| pool.bytes(pool.take(POOLED_MIN))).collect();
        drop(many);
        assert_eq!(pool.kept(), KEEP);
    }
}
