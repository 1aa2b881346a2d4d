//! `write-back` — WriteBack of Kotz & Ellis 1992 §3.3.2: the disk write is
//! delayed until the buffer is needed for another block. When the cache
//! looks for a buffer, each dirty replaceable buffer it passes over is
//! started on its way down and the first clean one is taken (as BSD's
//! getnewbuf does), so a single process still keeps several disks busy
//! (§4.3: "lw1 was able to use more than one disk by using delayed writes").

use super::{WritePolicy, WritePolicyKind};

pub struct WriteBack;

impl WritePolicy for WriteBack {
    fn kind(&self) -> WritePolicyKind {
        WritePolicyKind::WriteBack
    }
}
