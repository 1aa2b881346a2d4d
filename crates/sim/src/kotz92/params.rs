//! Parameters of the 1992 model, with the paper's base values (§4.1) as defaults.

use parcache_core::replacement::TossImmediately;
use parcache_core::{ReplacementKind, WritePolicyKind};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use thiserror::Error;

/// The write-only access patterns of 1992 §3.2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Local whole file, one process: one process writes the whole file.
    Lw1,
    /// Segmented: one contiguous segment per process, written in order.
    Seg,
    /// Global whole file: processes take the next record from a shared
    /// counter, so requests may reach the file system out of order.
    Gw,
}

impl Pattern {
    pub const ALL: [Pattern; 3] = [Pattern::Lw1, Pattern::Seg, Pattern::Gw];
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Lw1 => "lw1",
            Pattern::Seg => "seg",
            Pattern::Gw => "gw",
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Pattern {
    type Err = ParamError;
    fn from_str(s: &str) -> Result<Self, ParamError> {
        Pattern::ALL
            .into_iter()
            .find(|p| p.name() == s.trim())
            .ok_or_else(|| ParamError::UnknownPattern(s.to_string()))
    }
}

/// Compute delay after each record: exponential with `mean_ms`, truncated
/// at `max_ms`, drawn once per workload from the seed (1992 §4.1, footnote 2).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Compute {
    pub mean_ms: f64,
    pub max_ms: f64,
}

impl Compute {
    /// The paper's: mean 30 ms, truncated at 150 ms.
    pub const PAPER: Compute = Compute {
        mean_ms: 30.0,
        max_ms: 150.0,
    };
}

/// The software costs of the 1992 testbed, the model's only calibrated
/// constants (see `docs/reproduction/kotz92.md`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Overheads {
    /// CPU time of one file-system call on the caller's processor, with or
    /// without a cache (argument handling, locating the disk, starting I/O).
    pub request_ms: f64,
    /// CPU time per block a call touches through the cache (lookup, locks,
    /// buffer management, copying the bytes).
    pub buffer_ms: f64,
}

impl Overheads {
    /// Fitted with [`crate::kotz92::fit`]: `request_ms` on lw1 without a cache
    /// (127.3 s), then `buffer_ms` on lw1 with a write-back cache (16.4 s),
    /// both with one-block records. `parcache sim calibrate` refits them.
    pub const FITTED: Overheads = Overheads {
        request_ms: 1.771,
        buffer_ms: 1.869,
    };
    /// The bare queueing model.
    pub const ZERO: Overheads = Overheads {
        request_ms: 0.0,
        buffer_ms: 0.0,
    };
}

/// How the per-call CPU costs vary around their means. Real software costs
/// vary from call to call (memory contention, lock waits: 1992 §4.2), and
/// that variation is what keeps processes that start together (seg) from
/// staying in lockstep; `constant` gives the idealised machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OverheadDist {
    Constant,
    Exponential,
}

impl FromStr for OverheadDist {
    type Err = ParamError;
    fn from_str(s: &str) -> Result<Self, ParamError> {
        match s.trim() {
            "constant" => Ok(OverheadDist::Constant),
            "exponential" => Ok(OverheadDist::Exponential),
            other => Err(ParamError::UnknownDist(other.to_string())),
        }
    }
}

/// Everything one run of the model needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KotzParams {
    pub pattern: Pattern,
    /// Record size in blocks; may be fractional (0.25 = a quarter block).
    pub record_blocks: f64,
    /// Cache buffers of one block each; 0 means no cache.
    pub buffers: usize,
    pub policy: WritePolicyKind,
    pub replacement: ReplacementKind,
    pub disks: u32,
    pub procs: u32,
    /// Blocks in the file.
    pub blocks: u64,
    pub block_size: u32,
    pub compute: Option<Compute>,
    pub disk_ms: f64,
    pub overheads: Overheads,
    pub overhead_dist: OverheadDist,
    pub seed: u64,
}

impl Default for KotzParams {
    /// The paper's base parameters (1992 §4.1) with a write-back cache.
    fn default() -> Self {
        KotzParams {
            pattern: Pattern::Gw,
            record_blocks: 1.0,
            buffers: 80,
            policy: WritePolicyKind::WriteBack,
            replacement: ReplacementKind::TossImmediately,
            disks: 20,
            procs: 20,
            blocks: 4000,
            block_size: 1024,
            compute: None,
            disk_ms: 30.0,
            overheads: Overheads::FITTED,
            overhead_dist: OverheadDist::Exponential,
            seed: 1992,
        }
    }
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum ParamError {
    #[error("unknown overhead distribution '{0}' (known: constant, exponential)")]
    UnknownDist(String),
    #[error("unknown pattern '{0}' (known: lw1, seg, gw)")]
    UnknownPattern(String),
    #[error("--{name} must be positive (got {value})")]
    NotPositive { name: &'static str, value: String },
    #[error("--record-blocks {0} is not a whole number of bytes with {1}-byte blocks")]
    FractionalBytes(f64, u32),
    #[error("--{name} {value} is not a finite, non-negative number")]
    BadNumber { name: &'static str, value: f64 },
    #[error("the model deadlocked: {processes} processes still waiting when nothing was left to happen at {at:.3} s (a bug: please report the parameters)")]
    Deadlock { processes: usize, at: f64 },
    #[error("--buffers {buffers}: {reason}")]
    Policy {
        buffers: usize,
        reason: parcache_core::PolicyError,
    },
}

impl KotzParams {
    /// Processes that issue requests (lw1 uses one).
    pub fn active_procs(&self) -> u32 {
        match self.pattern {
            Pattern::Lw1 => 1,
            _ => self.procs,
        }
    }

    /// Record size in bytes.
    pub fn record_bytes(&self) -> u64 {
        (self.record_blocks * self.block_size as f64).round() as u64
    }

    pub fn total_bytes(&self) -> u64 {
        self.blocks * self.block_size as u64
    }

    /// Checks every parameter and names the first one at fault.
    pub fn validate(&self) -> Result<(), ParamError> {
        let pos = |name, ok: bool, value: String| {
            if ok {
                Ok(())
            } else {
                Err(ParamError::NotPositive { name, value })
            }
        };
        pos("procs", self.procs > 0, self.procs.to_string())?;
        pos("disks", self.disks > 0, self.disks.to_string())?;
        pos("blocks", self.blocks > 0, self.blocks.to_string())?;
        pos("block-size", self.block_size > 0, self.block_size.to_string())?;
        pos(
            "record-blocks",
            self.record_blocks.is_finite() && self.record_blocks > 0.0,
            self.record_blocks.to_string(),
        )?;
        let bytes = self.record_blocks * self.block_size as f64;
        if (bytes - bytes.round()).abs() > 1e-6 || bytes.round() < 1.0 {
            return Err(ParamError::FractionalBytes(self.record_blocks, self.block_size));
        }
        for (name, v) in [
            ("disk-ms", self.disk_ms),
            ("request-overhead-ms", self.overheads.request_ms),
            ("buffer-overhead-ms", self.overheads.buffer_ms),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(ParamError::BadNumber { name, value: v });
            }
        }
        if let Some(c) = self.compute {
            if !(c.mean_ms.is_finite() && c.mean_ms >= 0.0) {
                return Err(ParamError::BadNumber {
                    name: "compute-ms",
                    value: c.mean_ms,
                });
            }
            if !(c.max_ms.is_finite() && c.max_ms > 0.0) {
                return Err(ParamError::BadNumber {
                    name: "compute-max-ms",
                    value: c.max_ms,
                });
            }
        }
        if self.buffers > 0 && self.replacement == ReplacementKind::TossImmediately {
            TossImmediately::check(self.buffers, self.active_procs() as usize).map_err(|reason| {
                ParamError::Policy {
                    buffers: self.buffers,
                    reason,
                }
            })?;
        }
        Ok(())
    }

    /// The paper's ideal time (1992 §4.2.1): the larger of the I/O time with
    /// every disk busy and the compute time of the busiest processor.
    pub fn ideal_seconds(&self) -> f64 {
        let io = self.blocks as f64 * self.disk_ms / 1000.0 / self.disks as f64;
        let records = (self.total_bytes() as f64 / self.record_bytes() as f64).ceil();
        let compute = match self.compute {
            Some(c) => records / self.active_procs() as f64 * c.mean_ms / 1000.0,
            None => 0.0,
        };
        io.max(compute)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_parameters_have_the_papers_ideal_times() {
        let p = KotzParams::default();
        p.validate().unwrap();
        assert!((p.ideal_seconds() - 6.0).abs() < 1e-9);
        let lw1 = KotzParams {
            pattern: Pattern::Lw1,
            compute: Some(Compute::PAPER),
            ..p
        };
        assert!((lw1.ideal_seconds() - 120.0).abs() < 1e-9);
    }

    #[test]
    fn bad_parameters_name_the_option() {
        let p = KotzParams {
            buffers: 10,
            ..KotzParams::default()
        };
        let e = p.validate().unwrap_err().to_string();
        assert!(e.contains("--buffers 10") && e.contains("20 processes"), "{e}");
        let p = KotzParams {
            record_blocks: 0.3,
            ..KotzParams::default()
        };
        assert!(p.validate().unwrap_err().to_string().contains("--record-blocks 0.3"));
        let p = KotzParams {
            disks: 0,
            ..KotzParams::default()
        };
        assert!(p.validate().unwrap_err().to_string().contains("--disks"));
        // lw1 has one active process, so a small toss-immediately cache is fine.
        KotzParams {
            pattern: Pattern::Lw1,
            buffers: 2,
            ..KotzParams::default()
        }
        .validate()
        .unwrap();
    }
}
