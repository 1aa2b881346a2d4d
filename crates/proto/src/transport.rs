//! The byte streams connections run on: TCP, and for a server on this
//! machine's loopback also a Unix socket, which carries the same frames for
//! about a third less CPU per round trip (no TCP state, checksums or
//! acknowledgements between two processes of one kernel).
//!
//! A server listening on a loopback address also listens on the abstract
//! Unix socket named after that address ([`local_name`]); a client asked
//! for a loopback address tries that socket first and falls back to TCP if
//! nothing listens there or its handshake fails. The cluster secret guards
//! both the same way: the handshake is mutual, so a process that took the
//! name first can neither pass for the server nor learn anything; the
//! client then goes by TCP. `PARCACHE_TRANSPORT=tcp` makes clients use TCP
//! only (to compare, or to trace with TCP tools).

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{tcp, unix, TcpStream, UnixListener, UnixStream};

/// The abstract Unix socket a server on loopback address `addr` also
/// listens on; `None` for an address other machines may reach (a Unix
/// socket is for this machine only; each network namespace has its own
/// abstract names, as it has its own loopback).
pub(crate) fn local_name(addr: SocketAddr) -> Option<String> {
    addr.ip().is_loopback().then(|| format!("\0parcache-{addr}"))
}

/// Whether clients may use Unix sockets (`PARCACHE_TRANSPORT` is not `tcp`).
fn unix_allowed() -> bool {
    std::env::var("PARCACHE_TRANSPORT").map_or(true, |v| !v.eq_ignore_ascii_case("tcp"))
}

/// Connects to the Unix socket of a server at `addr`, if `addr` is a
/// loopback address and something listens there (`None`: use TCP).
pub(crate) async fn connect_local(addr: &str) -> Option<Stream> {
    let a: SocketAddr = addr.parse().ok()?;
    let name = local_name(a).filter(|_| unix_allowed())?;
    UnixStream::connect(name).await.ok().map(unix)
}

/// Bytes a Unix socket's sender may have queued before it waits: a 1 MiB
/// answer or write batch fits whole, so the sender is not put to sleep and
/// woken again while the reader takes it. With the default (208 KiB) the
/// data servers made 9.5-9.9 thread switches per MiB of a warm sequential
/// read through a mount, with this 7.9-8.2 (issue 14). The kernel caps it
/// at `net.core.wmem_max`.
const UNIX_SEND_BUFFER: usize = 4 << 20;

/// A Unix socket as a connection's stream, its send buffer raised to
/// [`UNIX_SEND_BUFFER`] where the kernel allows (a Unix stream counts what
/// is queued against the sender only, so each end raises its own).
pub(crate) fn unix(s: UnixStream) -> Stream {
    if let Err(e) = rustix::net::sockopt::set_socket_send_buffer_size(&s, UNIX_SEND_BUFFER) {
        tracing::debug!("raising a Unix socket's send buffer: {e}");
    }
    Stream::Unix(s)
}

/// Connects by TCP, without Nagle's delay (requests are whole frames).
pub(crate) async fn connect_tcp(addr: &str) -> io::Result<Stream> {
    let s = TcpStream::connect(addr).await?;
    s.set_nodelay(true).ok();
    Ok(Stream::Tcp(s))
}

/// Binds the Unix socket of a server listening on `addr` (`None` if it
/// is not on loopback, or the name is taken: clients then use TCP).
pub(crate) fn listen_local(addr: SocketAddr) -> Option<UnixListener> {
    let name = local_name(addr)?;
    match UnixListener::bind(&name) {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::warn!("{addr}: not listening on a local Unix socket too ({e}); clients on this machine use TCP");
            None
        }
    }
}

/// A connection's stream.
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    /// Whether this is a Unix socket.
    pub(crate) fn is_local(&self) -> bool {
        matches!(self, Stream::Unix(_))
    }

    pub(crate) fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Tcp(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Tcp(r), WriteHalf::Tcp(w))
            }
            Stream::Unix(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Unix(r), WriteHalf::Unix(w))
            }
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// A connection's receiving side.
pub(crate) enum ReadHalf {
    Tcp(tcp::OwnedReadHalf),
    Unix(unix::OwnedReadHalf),
}

impl AsyncRead for ReadHalf {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadHalf::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            ReadHalf::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

/// A connection's sending side.
pub(crate) enum WriteHalf {
    Tcp(tcp::OwnedWriteHalf),
    Unix(unix::OwnedWriteHalf),
}

impl crate::outbox::Sink for WriteHalf {
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            WriteHalf::Tcp(w) => AsRef::<TcpStream>::as_ref(w).try_write_vectored(bufs),
            WriteHalf::Unix(w) => AsRef::<UnixStream>::as_ref(w).try_write_vectored(bufs),
        }
    }

    async fn writable(&self) -> io::Result<()> {
        match self {
            WriteHalf::Tcp(w) => AsRef::<TcpStream>::as_ref(w).writable().await,
            WriteHalf::Unix(w) => AsRef::<UnixStream>::as_ref(w).writable().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_addresses_have_a_local_name() {
        let name = |s: &str| local_name(s.parse().unwrap());
        assert_eq!(name("127.0.0.1:7000").as_deref(), Some("\0parcache-127.0.0.1:7000"));
        assert_eq!(name("[::1]:7000").as_deref(), Some("\0parcache-[::1]:7000"));
        assert!(name("127.0.0.1:7000") != name("127.0.0.2:7000"));
        assert_eq!(name("10.0.0.1:7000"), None);
        assert_eq!(name("0.0.0.0:7000"), None);
    }

    /// Both ends of a local connection get the larger send buffer, as far
    /// as `net.core.wmem_max` allows (the kernel reports twice the size set).
    #[tokio::test]
    async fn a_unix_streams_send_buffer_is_raised() {
        let cap = std::fs::read_to_string("/proc/sys/net/core/wmem_max")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(UNIX_SEND_BUFFER);
        let want = 2 * UNIX_SEND_BUFFER.min(cap);
        let (a, b) = UnixStream::pair().unwrap();
        for s in [unix(a), unix(b)] {
            let Stream::Unix(s) = s else { unreachable!() };
            let got = rustix::net::sockopt::socket_send_buffer_size(&s).unwrap();
            assert!(got >= want, "send buffer {got}, want {want}");
        }
    }
}
