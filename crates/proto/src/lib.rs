//! parcache-proto: the wire protocol between parcache clients, the metadata
//! server and the data servers.
//!
//! Parts: [`frame`] (length-prefixed frames whose file data travels as raw
//! payload), [`msg`] (requests and replies), [`auth`] (mutual
//! challenge–response on the cluster secret, which never crosses the wire)
//! [`buf_pool`] (large payloads' buffers, used again), [`landing`] (a caller's buffers a reply's payload is read into), and [`conn`] (a multiplexed client and a concurrent server loop, over
//! TCP, or a Unix socket to a server on this machine's loopback).
//! Guarantees: a malformed, oversized or truncated frame yields an error
//! reply or a closed connection, never a panic or a hang; no request is
//! served before the peer has proven the secret.

pub mod auth;
pub mod buf_pool;
pub mod conn;
pub mod frame;
pub mod landing;
pub mod msg;
mod outbox;
mod transport;

pub use auth::{random_u64, Secret};
pub use buf_pool::BufPool;
pub use conn::{serve, Client, ConnError, Handler, Payload};
pub use landing::Landing;
pub use msg::{
    boot_id, never_changed, show_name, Attr, Behind, Callback, ChunkHash, DirEntry, EntryPlus, ErrorCode, ErrorReply,
    FileKind, Handle, Layout, LocalFile, Name, NodeInfo, NodeStats, Request, Response, SetAttr, Timestamp,
    FIRST_VERSION, HANDLES_MOST, LIST_CHUNKS_PAGE, LIST_PARTS_PAGE, NAME_MAX, ROOT, SMALL_COPY_MAX, VERSION_SHIFT,
};
pub use parcache_mem::Block;
