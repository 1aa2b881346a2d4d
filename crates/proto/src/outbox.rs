//! A connection's outgoing frames, each written whole, one after another.
//! A sender whose frame finds nothing queued before it writes the frame
//! itself, at once, on its own thread: a request made on the mount's
//! session thread reaches the socket without waking a runtime worker, and
//! a reply leaves without another task's turn. Only what the socket does
//! not take at once is queued, for the connection's writer task.

use bytes::{Buf, Bytes, BytesMut};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::future::Future;
use std::io::{self, IoSlice};
use std::sync::Arc;
use tokio::sync::Notify;

/// A frame: its encoded head, and a payload written after it uncopied, in
/// one piece or several (a run of blocks from different buffers).
pub(crate) struct Frame {
    head: BytesMut,
    body: Bytes,
    more: Vec<Bytes>,
}

impl Frame {
    /// A frame whose payload is `pieces`, one after another.
    pub(crate) fn pieces(head: BytesMut, pieces: &[Bytes]) -> Frame {
        Frame {
            head,
            body: Bytes::new(),
            more: pieces.to_vec(),
        }
    }

    fn is_sent(&self) -> bool {
        !self.head.has_remaining() && !self.body.has_remaining() && self.more.iter().all(|b| b.is_empty())
    }
}

impl From<(BytesMut, Bytes)> for Frame {
    fn from((head, body): (BytesMut, Bytes)) -> Frame {
        Frame {
            head,
            body,
            more: Vec::new(),
        }
    }
}

/// Buffers given to one vectored write at most.
const SLICES: usize = 18;

/// Where frames go: a socket's sending side (a fake in tests).
pub(crate) trait Sink: Send + Sync + 'static {
    /// Writes what it takes without waiting; `WouldBlock` if nothing.
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;
    /// Waits until a write may take something.
    fn writable(&self) -> impl Future<Output = io::Result<()>> + Send;
}

struct Shared<W> {
    w: W,
    q: Mutex<Queue>,
    wake: Notify,
}

#[derive(Default)]
struct Queue {
    frames: VecDeque<Frame>,
    /// The writer task is writing a frame it took from `frames`.
    busy: bool,
    /// Every sender is gone: the writer ends once `frames` is empty.
    closed: bool,
    /// Why a write failed: the connection is broken, nothing more is sent.
    failed: Option<String>,
}

/// The sending side of a connection; clones share it. When the last clone
/// is dropped, the writer task writes what is queued and ends (closing the
/// socket's sending side).
pub(crate) struct Outbox<W: Sink = crate::transport::WriteHalf>(Arc<Senders<W>>);

impl<W: Sink> Clone for Outbox<W> {
    fn clone(&self) -> Self {
        Outbox(self.0.clone())
    }
}

struct Senders<W: Sink>(Arc<Shared<W>>);

impl<W: Sink> Drop for Senders<W> {
    fn drop(&mut self) {
        self.0.q.lock().closed = true;
        self.0.wake.notify_one();
    }
}

impl<W: Sink> Outbox<W> {
    /// The outbox of `w`, and its writer task (to spawn), which ends with
    /// why a write failed, if one did.
    pub(crate) fn new(w: W) -> (Outbox<W>, impl Future<Output = Result<(), String>> + Send) {
        let sh = Arc::new(Shared {
            w,
            q: Mutex::new(Queue::default()),
            wake: Notify::new(),
        });
        (Outbox(Arc::new(Senders(sh.clone()))), writer(sh))
    }

    /// Sends a frame: written now if nothing is queued before it and the
    /// socket takes it, else (its rest) queued for the writer task. Fails
    /// with the reason once a write has failed.
    pub(crate) fn send(&self, f: impl Into<Frame>) -> Result<(), String> {
        let mut f = f.into();
        let sh = &self.0 .0;
        let mut q = sh.q.lock();
        if let Some(e) = &q.failed {
            return Err(e.clone());
        }
        if q.frames.is_empty() && !q.busy {
            // The lock is held across non-blocking writes only.
            match write_now(&sh.w, &mut f) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    let e = format!("sending: {e}");
                    q.failed = Some(e.clone());
                    drop(q);
                    sh.wake.notify_one();
                    return Err(e);
                }
            }
        }
        q.frames.push_back(f);
        drop(q);
        sh.wake.notify_one();
        Ok(())
    }
}

/// Writes as much of `f` as the socket takes without waiting: `true` when
/// all of it went.
fn write_now(s: &impl Sink, f: &mut Frame) -> io::Result<bool> {
    loop {
        if f.is_sent() {
            return Ok(true);
        }
        let mut slices = [IoSlice::new(&[]); SLICES];
        let all = [&f.head[..], &f.body[..]]
            .into_iter()
            .chain(f.more.iter().map(|b| &b[..]))
            .filter(|b| !b.is_empty());
        let mut n = 0;
        for (slot, b) in slices.iter_mut().zip(all) {
            *slot = IoSlice::new(b);
            n += 1;
        }
        match s.try_write_vectored(&slices[..n]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => advance(f, n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn advance(f: &mut Frame, mut n: usize) {
    let head = n.min(f.head.len());
    f.head.advance(head);
    n -= head;
    for b in std::iter::once(&mut f.body).chain(f.more.iter_mut()) {
        let k = n.min(b.len());
        b.advance(k);
        n -= k;
    }
}

/// The writer task: writes queued frames in order, waiting for the socket
/// to take each whole.
async fn writer<W: Sink>(sh: Arc<Shared<W>>) -> Result<(), String> {
    loop {
        let next = {
            let mut q = sh.q.lock();
            let next = q.frames.pop_front();
            q.busy = next.is_some();
            if next.is_none() && (q.closed || q.failed.is_some()) {
                return q.failed.clone().map_or(Ok(()), Err);
            }
            next
        };
        let Some(mut f) = next else {
            // A send after the check above left a permit: no wake is lost.
            sh.wake.notified().await;
            continue;
        };
        let s = &sh.w;
        loop {
            match write_now(s, &mut f) {
                Ok(true) => break,
                Ok(false) => {
                    if let Err(e) = s.writable().await {
                        return Err(fail(&sh, e));
                    }
                }
                Err(e) => return Err(fail(&sh, e)),
            }
        }
    }
}

fn fail<W>(sh: &Shared<W>, e: io::Error) -> String {
    let e = format!("sending: {e}");
    let mut q = sh.q.lock();
    q.failed = Some(e.clone());
    q.frames.clear();
    q.busy = false;
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpStream;

    /// Frames sent from many threads at once while the peer reads, many
    /// too large for the socket to take at once, arrive whole and each
    /// sender's in its order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn frames_from_many_senders_arrive_whole_and_in_each_senders_order() {
        const SENDERS: u8 = 4;
        const FRAMES: u32 = 5_000;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), l.accept());
        let (_r, w) = client.unwrap().into_split();
        let w = crate::transport::WriteHalf::Tcp(w);
        let (mut server, _) = accepted.unwrap();
        let reader = tokio::spawn(async move {
            let mut next = [0u32; SENDERS as usize];
            for _ in 0..SENDERS as u32 * FRAMES {
                let mut head = [0u8; 9];
                server.read_exact(&mut head).await.unwrap();
                let s = head[0];
                assert!(s < SENDERS, "a frame's head is mixed with another's bytes");
                let i = u32::from_le_bytes(head[1..5].try_into().unwrap());
                let len = u32::from_le_bytes(head[5..9].try_into().unwrap()) as usize;
                assert_eq!(i, next[s as usize], "sender {s}'s frames out of order");
                next[s as usize] += 1;
                let mut body = vec![0u8; len];
                server.read_exact(&mut body).await.unwrap();
                assert!(
                    body.iter().all(|&b| b == s),
                    "frame {i} of sender {s} mixed with another"
                );
            }
            let mut rest = Vec::new();
            server.read_to_end(&mut rest).await.unwrap();
            rest.len()
        });
        let (out, writer) = Outbox::new(w);
        let writer = tokio::spawn(writer);
        let mut threads = Vec::new();
        for s in 0..SENDERS {
            let out = out.clone();
            threads.push(std::thread::spawn(move || {
                for i in 0..FRAMES {
                    // A frame: sender, number, payload length, then the
                    // payload, every byte the sender's: mostly small, every
                    // 500th up to 4 MiB (more than the socket takes at once).
                    let len = if i % 500 == 0 {
                        (i as usize * 777_767) % (4 << 20)
                    } else {
                        i as usize % 64
                    };
                    let mut head = BytesMut::new();
                    head.extend_from_slice(&[s]);
                    head.extend_from_slice(&i.to_le_bytes());
                    head.extend_from_slice(&(len as u32).to_le_bytes());
                    out.send((head, Bytes::from(vec![s; len]))).unwrap();
                }
            }));
        }
        drop(out);
        for t in threads {
            t.join().unwrap();
        }
        // Every sender gone and the queue empty: the writer ends and the
        // socket's sending side closes, with nothing after the frames.
        writer.await.unwrap().unwrap();
        assert_eq!(reader.await.unwrap(), 0);
    }

    /// A sink that takes `room` bytes, then would block until given more.
    #[derive(Default)]
    struct Fake {
        out: Mutex<Vec<u8>>,
        room: Mutex<usize>,
        more: Notify,
    }

    impl Sink for Arc<Fake> {
        fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
            let mut room = self.room.lock();
            if *room == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(*room - n);
                self.out.lock().extend_from_slice(&b[..take]);
                n += take;
            }
            *room -= n;
            Ok(n)
        }

        async fn writable(&self) -> io::Result<()> {
            loop {
                let more = self.more.notified();
                if *self.room.lock() > 0 {
                    return Ok(());
                }
                more.await;
            }
        }
    }

    fn frame(head: &[u8], payload: &[u8]) -> Frame {
        (BytesMut::from(head), Bytes::copy_from_slice(payload)).into()
    }

    /// While the writer task waits to finish a frame the sink took only
    /// part of, a frame sent meanwhile waits behind it even when the sink
    /// could take it at once: it is never written into the middle.
    #[tokio::test(flavor = "current_thread")]
    async fn a_frame_sent_while_the_writer_is_mid_frame_waits_behind_it() {
        let sink = Arc::new(Fake::default());
        *sink.room.lock() = 10;
        let (out, writer) = Outbox::new(sink.clone());
        let writer = tokio::spawn(writer);
        out.send(frame(b"AAAA", &[b'a'; 96])).unwrap();
        // The writer takes the rest of A, finds no room and waits.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(sink.out.lock().len(), 10);
        // Room again, but the writer has not run yet: B must not jump in.
        *sink.room.lock() = 1000;
        out.send(frame(b"BBBB", b"bbbbbb")).unwrap();
        sink.more.notify_waiters();
        drop(out);
        writer.await.unwrap().unwrap();
        let mut want = b"AAAA".to_vec();
        want.extend_from_slice(&[b'a'; 96]);
        want.extend_from_slice(b"BBBBbbbbbb");
        assert_eq!(*sink.out.lock(), want);
    }

    /// A payload in pieces (more than one vectored write takes, some
    /// empty) arrives whole and in order, written a few bytes at a time.
    #[tokio::test(flavor = "current_thread")]
    async fn a_payload_in_pieces_arrives_in_order() {
        let sink = Arc::new(Fake::default());
        *sink.room.lock() = 13;
        let (out, writer) = Outbox::new(sink.clone());
        let writer = tokio::spawn(writer);
        let pieces: Vec<Bytes> = (0..40u8).map(|i| Bytes::from(vec![i; (i as usize * 7) % 11])).collect();
        out.send(Frame::pieces(BytesMut::from(&b"HEAD"[..]), &pieces)).unwrap();
        out.send(frame(b"NEXT", b"tail")).unwrap();
        drop(out);
        let mut want = b"HEAD".to_vec();
        for p in &pieces {
            want.extend_from_slice(p);
        }
        want.extend_from_slice(b"NEXTtail");
        while sink.out.lock().len() < want.len() {
            tokio::task::yield_now().await;
            *sink.room.lock() = 13;
            sink.more.notify_waiters();
        }
        writer.await.unwrap().unwrap();
        assert_eq!(*sink.out.lock(), want);
    }

    /// Once the peer is gone, a send fails and says why.
    #[tokio::test]
    async fn a_send_to_a_closed_peer_fails() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), l.accept());
        let (_r, w) = client.unwrap().into_split();
        let w = crate::transport::WriteHalf::Tcp(w);
        drop(accepted.unwrap());
        let (out, writer) = Outbox::new(w);
        let writer = tokio::spawn(writer);
        let mut err = None;
        for _ in 0..1000 {
            if let Err(e) = out.send((BytesMut::from(&b"x"[..]), Bytes::from(vec![0u8; 64 << 10]))) {
                err = Some(e);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        let err = err.expect("sends to a closed peer keep failing");
        assert!(err.starts_with("sending:"), "{err}");
        drop(out);
        assert!(writer.await.unwrap().is_err());
    }
}
