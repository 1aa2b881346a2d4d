//! `write-through` — WriteThru of Kotz & Ellis 1992 §3.3.2: every write
//! request forces a disk write. The write is started behind the request
//! (write-behind), so with one-block records it equals write-full (§4.4.1);
//! with records smaller than a block it rewrites the same block many times
//! ("rewrite mistakes", §4.4.2).

use super::{BufView, WritePolicy, WritePolicyKind};
use crate::time::Time;

pub struct WriteThrough;

impl WritePolicy for WriteThrough {
    fn kind(&self) -> WritePolicyKind {
        WritePolicyKind::WriteThrough
    }
    fn after_write(&mut self, _now: Time, buf: &BufView) -> bool {
        buf.dirty
    }
}
