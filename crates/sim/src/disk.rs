//! Disk models: how long a disk takes to serve one request (DESIGN.md §4).

use parcache_core::Span;

/// What a disk is asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskOp {
    Read,
    Write,
}

/// A service-time model of one disk.
pub trait DiskModel {
    fn service(&self, op: DiskOp, bytes: u64) -> Span;
}

/// Constant service time for every request, whatever its kind or size:
/// Kotz & Ellis 1992 §4.1, "a constant artificial delay of 30 msec".
#[derive(Clone, Copy, Debug)]
pub struct ConstantDisk {
    pub service: Span,
}

impl DiskModel for ConstantDisk {
    fn service(&self, _op: DiskOp, _bytes: u64) -> Span {
        self.service
    }
}
