//! `write-free` — WriteFree of Kotz & Ellis 1992 §3.3.2: a disk write is
//! issued when the buffer becomes replaceable, i.e. before it is needed but
//! after no process is using it. Under toss-immediately that is when the
//! last process whose MRU block it holds moves on — after its compute phase
//! (§4.4.1, Figure 2).

use super::{BufView, WritePolicy, WritePolicyKind};
use crate::time::Time;

pub struct WriteFree;

impl WritePolicy for WriteFree {
    fn kind(&self) -> WritePolicyKind {
        WritePolicyKind::WriteFree
    }
    fn on_replaceable(&mut self, _now: Time, buf: &BufView) -> bool {
        buf.dirty
    }
}
