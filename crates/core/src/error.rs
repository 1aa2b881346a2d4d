//! Errors of the policy core. Each names the policy, parameter or request at fault.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PolicyError {
    #[error("unknown {what} policy '{name}' (known: {known})")]
    Unknown {
        what: &'static str,
        name: String,
        known: String,
    },
    #[error("unknown policy key '{key}' (known: {known})")]
    UnknownKey { key: String, known: String },
    #[error("bad parameter for policy '{policy}': {detail}")]
    BadParameter { policy: String, detail: String },
    #[error("toss-immediately needs at least one buffer per process: {buffers} buffers for {processes} processes")]
    TooFewBuffers { buffers: usize, processes: usize },
    #[error("a cache needs at least one buffer")]
    NoBuffers,
    #[error("block size must be positive")]
    ZeroBlockSize,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum AccessError {
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("byte range [{start},{end}) is outside a block of {block_size} bytes")]
    OutOfBlock { start: u32, end: u32, block_size: u32 },
    #[error("buffer {0} is not pinned by an access in progress")]
    NotPinned(u32),
}
