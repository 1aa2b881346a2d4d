//! Authenticated connections: a client that keeps many requests in flight
//! on one connection (matched by request id), and a server loop that
//! handles each request in its own task. Connections run on TCP, or on a
//! Unix socket to a server on this machine's loopback ([`crate::transport`]).

use crate::auth::{client_handshake, server_handshake, AuthError, Secret};
use crate::buf_pool::BufPool;
use crate::frame::{encode, encode_head, read_frame_landing, FrameError};
use crate::landing::Landing;
use crate::msg::{ErrorCode, Request, Response};
use crate::outbox::{Frame, Outbox};
use crate::transport::{self, Stream};
use bytes::Bytes;
use parcache_mem::Block;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use thiserror::Error;
use tokio::io::BufReader;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

/// A request's payload, as [`Client::call_with`] takes it.
#[derive(Clone, Copy, Debug)]
pub enum Payload<'a> {
    /// Bytes the caller lends: copied into the frame.
    Slice(&'a [u8]),
    /// Bytes shared by reference count: over 4 KiB, sent uncopied.
    Shared(&'a Bytes),
    /// Several pieces sent one after another as one payload, uncopied.
    Pieces(&'a [Bytes]),
}

/// Payloads up to this size are copied in after the header (one
/// buffer, one plain write); larger ones are written after it uncopied.
const INLINE_PAYLOAD: usize = 4096;

/// Bytes a connection's reader asks the socket for at once: a small frame
/// (a metadata request, an answer with no data) and its length arrive in
/// one `recv`, where reading the length first took two, and several
/// frames already there in one. A large payload is read past this buffer,
/// straight into its own.
const READ_BUF: usize = 8 << 10;

#[derive(Debug, Error, Clone)]
pub enum ConnError {
    #[error("cannot connect to {addr}: {reason}")]
    Connect { addr: String, reason: String },
    #[error("{addr}: {reason}")]
    Auth { addr: String, reason: String },
    #[error("connection to {addr} lost: {reason}")]
    Closed { addr: String, reason: String },
    #[error("request too large: {0}")]
    TooLarge(String),
}

type Reply = Result<(Response, Bytes), ConnError>;

struct Inner {
    addr: String,
    /// Frames to send: the encoded head, and a payload sent after it uncopied.
    out: Outbox,
    pending: Mutex<HashMap<u64, Waiting>>,
    next: AtomicU64,
    closed: AtomicBool,
    reason: Mutex<String>,
    /// The connection is a Unix socket to a server on this machine.
    local: bool,
}

/// A request sent and not yet answered.
struct Waiting {
    reply: oneshot::Sender<Reply>,
    /// Where its answer's payload may land ([`Landing`]).
    landing: Option<Landing>,
}

impl Inner {
    fn fail_all(&self, reason: String) {
        *self.reason.lock() = reason.clone();
        self.closed.store(true, Ordering::SeqCst);
        let pending: Vec<_> = self.pending.lock().drain().collect();
        for (_, w) in pending {
            let _ = w.reply.send(Err(ConnError::Closed {
                addr: self.addr.clone(),
                reason: reason.clone(),
            }));
        }
    }
}

/// A client connection. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl Client {
    /// Connects to `addr` and proves the cluster secret: by the server's
    /// Unix socket if it is on this machine's loopback and its handshake
    /// succeeds there, else by TCP.
    pub async fn connect(addr: &str, secret: &Secret) -> Result<Client, ConnError> {
        if let Some(mut s) = transport::connect_local(addr).await {
            match client_handshake(&mut s, secret).await {
                Ok(()) => return Self::start(addr, s),
                Err(e) => tracing::debug!("{addr}: the local socket's handshake failed ({e}); trying TCP"),
            }
        }
        let mut s = transport::connect_tcp(addr).await.map_err(|e| ConnError::Connect {
            addr: addr.to_string(),
            reason: e.to_string(),
        })?;
        client_handshake(&mut s, secret).await.map_err(|e| match e {
            // A server stopping (killed a moment ago) resets the connection
            // it had just accepted: it went away, it is not a stranger.
            AuthError::Frame(crate::frame::FrameError::Io(io))
                if matches!(
                    io.kind(),
                    std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::BrokenPipe
                        | std::io::ErrorKind::UnexpectedEof
                ) =>
            {
                ConnError::Connect {
                    addr: addr.to_string(),
                    reason: format!("the connection closed during the handshake: {io}"),
                }
            }
            e => ConnError::Auth {
                addr: addr.to_string(),
                reason: match e {
                    AuthError::BadProof => "the server does not know our cluster secret: the local secret file \
                                        does not match the cluster's (or this is another cluster)"
                        .into(),
                    AuthError::Frame(_) | AuthError::Unexpected | AuthError::Timeout(_) => {
                        format!("this is not a parcache server (the handshake failed: {e})")
                    }
                    e => e.to_string(),
                },
            },
        })?;
        Self::start(addr, s)
    }

    /// Runs an authenticated stream: its writer and reader tasks.
    fn start(addr: &str, s: Stream) -> Result<Client, ConnError> {
        let local = s.is_local();
        let (r, w) = s.into_split().map_err(|e| ConnError::Connect {
            addr: addr.to_string(),
            reason: format!("setting up the connection: {e}"),
        })?;
        let mut r = BufReader::with_capacity(READ_BUF, r);
        let (out, writer) = Outbox::new(w);
        let inner = Arc::new(Inner {
            addr: addr.to_string(),
            out,
            pending: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            reason: Mutex::new(String::new()),
            local,
        });
        let failed = Arc::downgrade(&inner);
        tokio::spawn(async move {
            if let Err(e) = writer.await {
                if let Some(inner) = failed.upgrade() {
                    inner.fail_all(e);
                }
            }
        });
        let reader = inner.clone();
        tokio::spawn(async move {
            // Replies' payloads (blocks read) come in buffers used again.
            let pool = Arc::new(BufPool::default());
            loop {
                let landing = |id, _: &Response, _| reader.pending.lock().get(&id).and_then(|w| w.landing.clone());
                match read_frame_landing::<Response, _>(&mut r, Some(&pool), landing).await {
                    Ok(f) => {
                        let w = reader.pending.lock().remove(&f.id);
                        if let Some(w) = w {
                            let _ = w.reply.send(Ok((f.msg, f.data)));
                        }
                    }
                    Err(e) => {
                        reader.fail_all(e.to_string());
                        break;
                    }
                }
            }
        });
        Ok(Client { inner })
    }

    /// The address this client is connected to.
    pub fn addr(&self) -> &str {
        &self.inner.addr
    }

    /// Whether the connection is a Unix socket to a server on this machine
    /// (else TCP).
    pub fn is_local(&self) -> bool {
        self.inner.local
    }

    /// Whether the connection has failed.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }

    /// Sends a request with its payload and waits for the reply.
    pub async fn call(&self, req: &Request, data: &[u8]) -> Reply {
        self.call_with(req, Payload::Slice(data)).await
    }

    /// [`Client::call`] with a payload borrowed (copied into the frame) or
    /// shared (a large one written after the frame's head, uncopied).
    pub async fn call_with(&self, req: &Request, data: Payload<'_>) -> Reply {
        self.send(req, data, None).await
    }

    /// [`Client::call`] without a payload, whose answer's payload lands in
    /// the buffers `landing` lends where it fits (the reply's own payload
    /// is then empty); [`Landing::finish`] says how much did.
    pub async fn call_landing(&self, req: &Request, landing: &Landing) -> Reply {
        self.send(req, Payload::Slice(&[]), Some(landing.clone())).await
    }

    async fn send(&self, req: &Request, data: Payload<'_>, landing: Option<Landing>) -> Reply {
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let too_large = |e: FrameError| ConnError::TooLarge(e.to_string());
        let frame: Frame = match data {
            Payload::Shared(b) if b.len() > INLINE_PAYLOAD => {
                (encode_head(id, req, b.len(), 0).map_err(too_large)?, b.clone()).into()
            }
            Payload::Shared(b) => (encode(id, req, b).map_err(too_large)?, Bytes::new()).into(),
            Payload::Slice(d) => (encode(id, req, d).map_err(too_large)?, Bytes::new()).into(),
            Payload::Pieces(p) => {
                let len = p.iter().map(|b| b.len()).sum();
                Frame::pieces(encode_head(id, req, len, 0).map_err(too_large)?, p)
            }
        };
        let (tx, rx) = oneshot::channel();
        self.inner.pending.lock().insert(id, Waiting { reply: tx, landing });
        let closed = || ConnError::Closed {
            addr: self.inner.addr.clone(),
            reason: self.inner.reason.lock().clone(),
        };
        if self.is_closed() {
            self.inner.pending.lock().remove(&id);
            return Err(closed());
        }
        if let Err(e) = self.inner.out.send(frame) {
            self.inner.fail_all(e);
            return Err(closed());
        }
        rx.await.unwrap_or_else(|_| Err(closed()))
    }
}

/// What a server does with each request.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, req: Request, data: Bytes) -> impl Future<Output = (Response, Bytes)> + Send;

    /// As [`Handler::handle`], for an answer whose payload is several
    /// pieces sent one after another, uncopied (a data server's blocks
    /// straight out of its cache). By default the one piece of `handle`.
    fn handle_pieces(&self, req: Request, data: Bytes) -> impl Future<Output = (Response, Vec<Bytes>)> + Send {
        async move {
            let (resp, data) = self.handle(req, data).await;
            (resp, vec![data])
        }
    }

    /// Memory a request's payload of `len` bytes lands in, in place of a
    /// buffer of the connection's: the buffers, filled one after the
    /// other, each up to its length. A data server lends buffers its cache
    /// takes as they are for a write of whole blocks, so their bytes are
    /// not copied into it (issue 14). By default none.
    fn landing(&self, req: &Request, len: usize) -> Option<Vec<Block>> {
        let _ = (req, len);
        None
    }

    /// As [`Handler::handle_pieces`], for a request whose payload landed
    /// in the buffers [`Handler::landing`] lent, every one full. By
    /// default they are copied into one payload.
    fn handle_landed(&self, req: Request, landed: Vec<Block>) -> impl Future<Output = (Response, Vec<Bytes>)> + Send {
        async move {
            self.handle_pieces(req, Bytes::from(parcache_mem::concat(&landed)))
                .await
        }
    }

    /// A connection that carried requests made for `node`
    /// (`Request::As`) closed: the node's process is gone or will
    /// reconnect (and then holds nothing it was granted before).
    fn disconnected(&self, node: u64) {
        let _ = node;
    }
}

/// The next request on a connection, or `None` once the server is told
/// to stop. The stop is looked at first (an unbiased `select!` draws
/// between ready branches, and took a request ready with the stop half
/// the time): a server stopping gracefully tells its next incarnation it
/// lost nothing it acknowledged, so it takes no request after the stop.
async fn next_request<R: tokio::io::AsyncRead + Unpin>(
    r: &mut R,
    pool: &Arc<BufPool>,
    shutdown: &mut watch::Receiver<bool>,
    landing: impl FnOnce(u64, &Request, usize) -> Option<Landing>,
) -> Option<Result<crate::frame::Frame<Request>, FrameError>> {
    tokio::select! {
        biased;
        _ = shutdown.changed() => None,
        f = read_frame_landing::<Request, _>(r, Some(pool), landing) => Some(f),
    }
}

/// Accepts connections until `shutdown` turns true: on `listener`, and on
/// a loopback address also on its Unix socket. Every connection must prove
/// the secret first; a peer that fails is refused and logged. The Unix
/// socket is bound when this is called (within a runtime), so a client
/// told the address after it finds both.
pub fn serve<H: Handler>(
    listener: TcpListener,
    secret: Secret,
    handler: Arc<H>,
    shutdown: watch::Receiver<bool>,
) -> impl Future<Output = ()> + Send {
    let local = listener.local_addr().ok().and_then(transport::listen_local);
    accept(listener, local, secret, handler, shutdown)
}

async fn accept<H: Handler>(
    listener: TcpListener,
    local: Option<tokio::net::UnixListener>,
    secret: Secret,
    handler: Arc<H>,
    mut shutdown: watch::Receiver<bool>,
) {
    let here = listener
        .local_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            r = listener.accept() => match r {
                Ok((s, peer)) => {
                    s.set_nodelay(true).ok();
                    (Stream::Tcp(s), peer.to_string())
                }
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    continue;
                }
            },
            r = async { local.as_ref().expect("polled only when bound").accept().await }, if local.is_some() => match r {
                Ok((s, _)) => (transport::unix(s), format!("a local process (Unix socket of {here})")),
                Err(e) => {
                    tracing::warn!("accept on the local socket failed: {e}");
                    continue;
                }
            },
        };
        let (secret, handler, shutdown) = (secret.clone(), handler.clone(), shutdown.clone());
        tokio::spawn(async move { connection(stream, peer, secret, handler, shutdown).await });
    }
}

async fn connection<H: Handler>(
    mut stream: Stream,
    peer: String,
    secret: Secret,
    handler: Arc<H>,
    mut shutdown: watch::Receiver<bool>,
) {
    if let Err(e) = server_handshake(&mut stream, &secret).await {
        match e {
            AuthError::Frame(FrameError::Closed) => tracing::debug!("{peer} left before authenticating"),
            AuthError::Refused(reason) => tracing::warn!("refused connection from {peer}: {reason}"),
            AuthError::BadProof => {
                tracing::warn!("refused connection from {peer}: its cluster secret does not match ours")
            }
            e => tracing::warn!("refused connection from {peer}: {e}"),
        }
        return;
    }
    let (r, w) = match stream.into_split() {
        Ok(halves) => halves,
        Err(e) => {
            tracing::warn!("connection from {peer}: setting it up: {e}");
            return;
        }
    };
    let mut r = BufReader::with_capacity(READ_BUF, r);
    // A reply is its encoded head and its payload, written together with
    // one vectored write: the payload (a block read) is not copied again.
    let (tx, writer) = Outbox::new(w);
    let writer = tokio::spawn(writer);
    // The nodes requests were made for on this connection.
    let mut nodes: Vec<u64> = Vec::new();
    // Requests' payloads (blocks written) come in buffers used again.
    let pool = Arc::new(BufPool::default());
    loop {
        // Where the next request's payload landed, if the handler lent
        // buffers for it.
        let mut lent = None;
        let landing = |_: u64, req: &Request, len: usize| {
            let l = handler.landing(req, len).map(Landing::new);
            lent.clone_from(&l);
            l
        };
        let Some(frame) = next_request(&mut r, &pool, &mut shutdown, landing).await else {
            break;
        };
        match frame {
            Ok(f) => {
                if let Request::As { node, .. } = &f.msg {
                    if !nodes.contains(node) {
                        nodes.push(*node);
                    }
                }
                let landed = match lent.map(|l| l.finish()) {
                    Some((bufs, Some(_))) => Some(bufs),
                    _ => None,
                };
                let (handler, tx) = (handler.clone(), tx.clone());
                tokio::spawn(async move {
                    let (resp, pieces) = match landed {
                        Some(bufs) => handler.handle_landed(f.msg, bufs).await,
                        None => handler.handle_pieces(f.msg, f.data).await,
                    };
                    // A small payload goes in the head (one buffer, no
                    // vectored write); a large one after it, uncopied.
                    let len = pieces.iter().map(Bytes::len).sum();
                    let room = if len <= INLINE_PAYLOAD { len } else { 0 };
                    let frame: Frame = match encode_head(f.id, &resp, len, room) {
                        Ok(mut head) if room > 0 => {
                            for p in &pieces {
                                head.extend_from_slice(p);
                            }
                            (head, Bytes::new()).into()
                        }
                        Ok(head) => match <[Bytes; 1]>::try_from(pieces) {
                            Ok([one]) => (head, one).into(),
                            Err(pieces) => Frame::pieces(head, &pieces),
                        },
                        Err(e) => (
                            encode(
                                f.id,
                                &Response::error(ErrorCode::Io, format!("reply too large: {e}")),
                                &[],
                            )
                            .expect("small error reply encodes"),
                            Bytes::new(),
                        )
                            .into(),
                    };
                    let _ = tx.send(frame);
                });
            }
            Err(FrameError::BadHeader { id, reason }) => {
                tracing::warn!("{peer}: malformed request {id}: {reason}");
                let reply = Response::error(ErrorCode::BadRequest, format!("malformed request: {reason}"));
                let _ = tx.send((
                    encode(id, &reply, &[]).expect("small error reply encodes"),
                    Bytes::new(),
                ));
            }
            Err(FrameError::Closed) => break,
            Err(e) => {
                // Oversized, short or truncated: the stream cannot be resynchronised.
                tracing::warn!("{peer}: closing connection: {e}");
                let reply = Response::error(ErrorCode::BadRequest, e.to_string());
                let _ = tx.send((encode(0, &reply, &[]).expect("small error reply encodes"), Bytes::new()));
                break;
            }
        }
    }
    for node in nodes {
        handler.disconnected(node);
    }
    drop(tx);
    let _ = writer.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that accepts and closes at once (it was being killed) is
    /// gone, not a stranger: the error is one the caller retries.
    #[tokio::test]
    async fn a_connection_closed_during_the_handshake_is_a_connect_failure() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            drop(s);
        });
        let secret = Secret::generate();
        match Client::connect(&addr, &secret).await {
            Err(ConnError::Connect { reason, .. }) => assert!(reason.contains("handshake"), "{reason}"),
            Err(other) => panic!("expected a connect failure, got {other}"),
            Ok(_) => panic!("connected to a closed socket"),
        }
    }

    /// A request ready together with the order to stop is not taken, in
    /// any draw (an unbiased choice took it in half of them, and a
    /// restart test saw a stopped server answer).
    #[tokio::test]
    async fn a_request_that_comes_with_the_stop_is_not_taken() {
        let frame = encode(1, &Request::Sync, &[]).unwrap();
        let pool = Arc::new(BufPool::default());
        for _ in 0..64 {
            let (stop, mut rx) = watch::channel(false);
            let mut r: &[u8] = &frame;
            stop.send(true).unwrap();
            assert!(
                next_request(&mut r, &pool, &mut rx, |_, _, _| None).await.is_none(),
                "taken after the stop"
            );
        }
        let (_stop, mut rx) = watch::channel(false);
        let mut r: &[u8] = &frame;
        let f = next_request(&mut r, &pool, &mut rx, |_, _, _| None)
            .await
            .expect("no stop")
            .unwrap();
        assert!(matches!(f.msg, Request::Sync));
    }
}
