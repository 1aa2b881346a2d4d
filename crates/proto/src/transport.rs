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
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::{tcp, TcpStream, UnixListener, UnixStream};

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

    /// The stream's two halves. A Unix socket's are one socket watched
    /// for readability only ([`Quiet`]).
    pub(crate) fn into_split(self) -> io::Result<(ReadHalf, WriteHalf)> {
        Ok(match self {
            Stream::Tcp(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Tcp(r), WriteHalf::Tcp(w))
            }
            Stream::Unix(s) => {
                let q = Arc::new(Quiet::new(s)?);
                (ReadHalf::Unix(q.clone()), WriteHalf::Unix(q))
            }
        })
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

/// A connected Unix socket watched by the runtime for readability only.
///
/// A Unix stream tells its sender "writable" every time its reader takes
/// something, whether or not the sender waits; tokio's own `UnixStream`
/// watches both ways, so every answer a node read woke a data-server thread
/// for nothing (0.84 thread switches per 4 KiB random read through a mount,
/// issue 14). Writes here go straight to the socket; only a write that finds
/// the send buffer full watches for room, through a duplicate of the socket
/// registered for writability until then.
pub(crate) struct Quiet(AsyncFd<OwnedFd>);

/// Registers `fd` with the runtime for `interest`. An `OwnedFd` stays open
/// and names the same socket while registered, which is what tokio's
/// deprecation of this call asks for (its replacement is an `unsafe fn`,
/// and this workspace has no unsafe code).
#[allow(deprecated)]
fn watch(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    AsyncFd::with_interest(fd, interest)
}

impl Quiet {
    fn new(s: UnixStream) -> io::Result<Quiet> {
        let fd: OwnedFd = s.into_std()?.into();
        Ok(Quiet(watch(fd, Interest::READABLE)?))
    }

    /// Reads into the buffer's unfilled part, which the frame reader keeps
    /// initialised for large payloads (pooled buffers): nothing is zeroed
    /// then.
    fn poll_read(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            let mut ready = ready!(self.0.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            let want = unfilled.len();
            match ready.try_io(|fd| Ok(rustix::io::read(fd, &mut *unfilled)?)) {
                Ok(Ok(n)) => {
                    // A short read drained the socket (as tokio's streams
                    // assume): wait for the next readiness.
                    if n > 0 && n < want {
                        ready.clear_ready();
                    }
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

/// The peer reads end of stream once the sending side is gone (as with
/// tokio's write halves), even while this side still reads.
impl Drop for WriteHalf {
    fn drop(&mut self) {
        if let WriteHalf::Unix(q) = self {
            let _ = rustix::net::shutdown(q.0.get_ref(), rustix::net::Shutdown::Write);
        }
    }
}

/// A connection's receiving side.
pub(crate) enum ReadHalf {
    Tcp(tcp::OwnedReadHalf),
    Unix(Arc<Quiet>),
}

impl AsyncRead for ReadHalf {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadHalf::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            ReadHalf::Unix(q) => q.poll_read(cx, buf),
        }
    }
}

/// A connection's sending side.
pub(crate) enum WriteHalf {
    Tcp(tcp::OwnedWriteHalf),
    Unix(Arc<Quiet>),
}

impl crate::outbox::Sink for WriteHalf {
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            WriteHalf::Tcp(w) => AsRef::<TcpStream>::as_ref(w).try_write_vectored(bufs),
            WriteHalf::Unix(q) => Ok(rustix::io::writev(q.0.get_ref(), bufs)?),
        }
    }

    async fn writable(&self) -> io::Result<()> {
        match self {
            WriteHalf::Tcp(w) => AsRef::<TcpStream>::as_ref(w).writable().await,
            WriteHalf::Unix(q) => {
                // Registered now, so it reports room at once if there is.
                let dup = rustix::io::fcntl_dupfd_cloexec(q.0.get_ref(), 0)?;
                let room = watch(dup, Interest::WRITABLE)?;
                let _ = room.writable().await?;
                Ok(())
            }
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

    /// The epoll event masks under which the socket with inode `ino` is
    /// registered, from `/proc/self/fdinfo` of every epoll descriptor.
    fn epoll_masks(ino: u64) -> Vec<u32> {
        let mut masks = Vec::new();
        for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
            if !std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().contains("eventpoll")) {
                continue;
            }
            let Ok(info) = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", e.file_name().to_string_lossy()))
            else {
                continue;
            };
            // "tfd: FD events: MASK data: ... ino: INO sdev: ..."
            for line in info.lines().filter(|l| l.starts_with("tfd:")) {
                let words: Vec<&str> = line.split_whitespace().collect();
                let after = |name: &str| words.iter().position(|w| *w == name).map(|i| words[i + 1]);
                let ino_here = words.iter().find_map(|w| w.strip_prefix("ino:"));
                if ino_here.and_then(|h| u64::from_str_radix(h, 16).ok()) == Some(ino) {
                    masks.push(u32::from_str_radix(after("events:").unwrap(), 16).unwrap());
                }
            }
        }
        masks
    }

    /// A Unix connection's halves are watched for readability only: the
    /// peer's reads (which tell the sender "writable" each time) wake no
    /// thread here. Bytes still go both ways, a full send buffer waits for
    /// room, and dropping the sending half ends the peer's stream.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_unix_connection_is_watched_for_readability_only() {
        use crate::outbox::Sink;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (a, mut b) = UnixStream::pair().unwrap();
        let ino = {
            use std::os::fd::AsRawFd;
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(format!("/proc/self/fd/{}", a.as_raw_fd()))
                .unwrap()
                .ino()
        };
        let (mut r, w) = unix(a).into_split().unwrap();
        let masks = epoll_masks(ino);
        assert!(!masks.is_empty(), "the socket is registered");
        for m in masks {
            assert!(
                m & 0x1 != 0 && m & 0x4 == 0,
                "watched for {m:#x}: EPOLLIN without EPOLLOUT wanted"
            );
        }
        assert_eq!(w.try_write_vectored(&[IoSlice::new(b"ping")]).unwrap(), 4);
        let mut got = [0u8; 4];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        b.write_all(b"pong").await.unwrap();
        r.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"pong");
        // Fill the send buffer, then wait for room while the peer drains.
        let chunk = vec![7u8; 1 << 20];
        let mut sent = 0usize;
        loop {
            match w.try_write_vectored(&[IoSlice::new(&chunk)]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        let drain = tokio::spawn(async move {
            let mut buf = vec![0u8; 1 << 20];
            let mut n = 0usize;
            while n < sent {
                n += b.read(&mut buf).await.unwrap();
            }
            b
        });
        tokio::time::timeout(std::time::Duration::from_secs(10), w.writable())
            .await
            .expect("room once the peer reads")
            .unwrap();
        let mut b = drain.await.unwrap();
        drop(w);
        let mut rest = Vec::new();
        b.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "end of stream once the sending half is gone");
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
