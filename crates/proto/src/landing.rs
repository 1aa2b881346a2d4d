//! Buffers of the caller's that a reply's payload is read into, in place of
//! a buffer of the connection's.
//!
//! A node cache fetching a block lends the block's own buffer: the
//! connection's reader reads the answer's bytes from the socket straight
//! into it, and the copy from a connection's buffer into the cache goes
//! (16 % of a reading client's CPU, the largest single part after the
//! kernel's copies; issue 14). Only a payload large enough to be read on
//! its own ([`crate::buf_pool::POOLED_MIN`]) and no larger than the
//! buffers lands; any other comes as usual and the caller copies it.

use parcache_mem::Block;
use parking_lot::Mutex;
use std::sync::Arc;

/// Where a reply's payload may land: the buffers, filled one after the
/// other, each up to its length. Cheap to clone; clones share the buffers
/// (a request sent again after a lost connection lends the same ones).
#[derive(Clone, Default)]
pub struct Landing(Arc<Mutex<Lent>>);

#[derive(Default)]
struct Lent {
    /// `None` while a reader fills them (and for good if its connection
    /// fails meanwhile: they go with it).
    bufs: Option<Vec<Block>>,
    /// Bytes of the payload that landed, once one did.
    landed: Option<usize>,
}

impl Landing {
    /// Lends `bufs`, each as long as the bytes it is to take (their bytes
    /// are stale: a payload overwrites as many as it has).
    pub fn new(bufs: Vec<Block>) -> Landing {
        Landing(Arc::new(Mutex::new(Lent {
            bufs: Some(bufs),
            landed: None,
        })))
    }

    /// The buffers back, and how many bytes of the payload landed in them
    /// (`None`: it came as the reply's own payload, or nothing came). The
    /// buffers are gone if the connection failed while filling them.
    pub fn finish(&self) -> (Vec<Block>, Option<usize>) {
        let mut l = self.0.lock();
        (l.bufs.take().unwrap_or_default(), l.landed.take())
    }

    /// The buffers to fill with a payload of `len` bytes, if they are here
    /// and hold that much.
    pub(crate) fn take_for(&self, len: usize) -> Option<Vec<Block>> {
        let mut l = self.0.lock();
        let room: usize = l.bufs.as_ref()?.iter().map(|b| b.len()).sum();
        if len > room {
            return None;
        }
        l.landed = None;
        l.bufs.take()
    }

    /// Gives back the buffers, `len` bytes of the payload in them.
    pub(crate) fn landed(&self, bufs: Vec<Block>, len: usize) {
        let mut l = self.0.lock();
        l.bufs = Some(bufs);
        l.landed = Some(len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Buffers too small for a payload are not taken; taken ones come back
    /// with the payload's length; a caller finishing gets them and the
    /// length once.
    #[test]
    fn buffers_are_lent_only_to_a_payload_that_fits() {
        let l = Landing::new(vec![Block::from_slice(&[0u8; 4]), Block::from_slice(&[0u8; 4])]);
        assert!(l.take_for(9).is_none(), "9 bytes do not fit in 8");
        let bufs = l.take_for(6).expect("6 fit");
        assert!(l.clone().take_for(1).is_none(), "lent to the reader");
        l.landed(bufs, 6);
        let (bufs, landed) = l.finish();
        assert_eq!((bufs.len(), landed), (2, Some(6)));
        assert_eq!(l.finish(), (Vec::new(), None));
    }
}
