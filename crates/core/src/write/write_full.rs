//! `write-full` — WriteFull of Kotz & Ellis 1992 §3.3.2: the disk write is
//! issued as soon as every byte of the block has been written, which in a
//! pattern that writes each byte once is exactly when the block is done. An
//! old, unfilled buffer is written when it is needed, as under write-back.

use super::{BufView, WritePolicy, WritePolicyKind};
use crate::time::Time;

pub struct WriteFull;

impl WritePolicy for WriteFull {
    fn kind(&self) -> WritePolicyKind {
        WritePolicyKind::WriteFull
    }
    fn after_write(&mut self, _now: Time, buf: &BufView) -> bool {
        buf.dirty && buf.written_full
    }
}
