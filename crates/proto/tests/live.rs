//! A live server on loopback TCP: concurrency, authentication and
//! robustness against random and mutated frames.

use bytes::Bytes;
use parcache_proto::auth::client_handshake;
use parcache_proto::frame::encode;
use parcache_proto::{serve, Client, Handler, Request, Response, Secret};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

struct Echo;

impl Handler for Echo {
    async fn handle(&self, req: Request, data: Bytes) -> (Response, Bytes) {
        match req {
            Request::Read { len, .. } => {
                // Answer out of order: later requests may overtake earlier ones.
                tokio::time::sleep(Duration::from_micros(len % 500)).await;
                (Response::Data { len }, data)
            }
            _ => (Response::Written { len: data.len() as u64 }, Bytes::new()),
        }
    }
}

async fn server() -> (String, Secret, tokio::sync::watch::Sender<bool>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let secret = Secret::generate();
    let (stop, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(serve(l, secret.clone(), Arc::new(Echo), rx));
    (addr, secret, stop)
}

/// Small and large frames in flight together, so that several arrive in
/// one read and frames straddle the readers' buffers (8 KiB) at every
/// point: each answer is its own request's payload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_requests_in_flight_on_one_connection() {
    let (addr, secret, stop) = server().await;
    let c = Client::connect(&addr, &secret).await.unwrap();
    let calls = (0..500u64).map(|i| {
        let c = c.clone();
        tokio::spawn(async move {
            // Every fifth from 0 to 80 KB; the others 8 bytes.
            let len = if i % 5 == 0 { (i * 7919 % 80_000) as usize } else { 8 };
            let payload: Vec<u8> = (0..len).map(|k| (k as u64 * 31 + i) as u8).collect();
            let (r, d) = c
                .call(
                    &Request::Read {
                        handle: i,
                        offset: 0,
                        len: i,
                        need: 0,
                    },
                    &payload,
                )
                .await
                .unwrap();
            assert_eq!(r, Response::Data { len: i });
            assert_eq!(&d[..], &payload, "reply matched to the wrong request");
        })
    });
    for t in calls {
        t.await.unwrap();
    }
    let _ = stop.send(true);
}

#[tokio::test]
async fn a_wrong_secret_is_refused() {
    let (addr, _secret, stop) = server().await;
    let e = Client::connect(&addr, &Secret::generate())
        .await
        .err()
        .expect("refused");
    assert!(
        e.to_string().contains("cluster secret") || e.to_string().contains("refused"),
        "{e}"
    );
    let _ = stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_mutated_frames_do_not_stop_the_server() {
    let (addr, secret, stop) = server().await;
    let good = Client::connect(&addr, &secret).await.unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 64,
        ..Config::default()
    });
    let blobs = proptest::collection::vec(any::<u8>(), 0..300);
    let mutations = (
        any::<u64>(),
        proptest::collection::vec(any::<u8>(), 0..64),
        any::<usize>(),
        any::<u8>(),
    );
    let strategy = (blobs, mutations);
    let cases: Vec<_> = (0..64)
        .map(|_| strategy.new_tree(&mut runner).unwrap().current())
        .collect();
    for (blob, (handle, data, pos, byte)) in cases {
        // Before authentication: random bytes.
        let mut s = TcpStream::connect(&addr).await.unwrap();
        let _ = s.write_all(&blob).await;
        drop(s);
        // After authentication: a valid frame with one byte changed.
        let mut s = TcpStream::connect(&addr).await.unwrap();
        client_handshake(&mut s, &secret).await.unwrap();
        let mut f = encode(9, &Request::Write { handle, offset: 0 }, &data).unwrap();
        let i = pos % f.len();
        f[i] = byte;
        let _ = s.write_all(&f).await;
        // The server answers or closes, but never hangs the connection.
        let mut buf = [0u8; 256];
        let r = tokio::time::timeout(Duration::from_secs(5), async {
            let _ = s.shutdown().await;
            while s.read(&mut buf).await.map(|n| n > 0).unwrap_or(false) {}
        })
        .await;
        assert!(r.is_ok(), "server hung on a mutated frame");
        // And the good client is still served.
        let (resp, _) = good
            .call(&Request::Write { handle: 1, offset: 0 }, b"abc")
            .await
            .unwrap();
        assert_eq!(resp, Response::Written { len: 3 });
    }
    let _ = stop.send(true);
}

/// A server on loopback is reached by its Unix socket, which carries large
/// payloads and many requests as TCP does, and refuses a wrong secret and
/// garbage before authentication as TCP does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_on_loopback_is_reached_by_its_local_socket() {
    let (addr, secret, stop) = server().await;
    let c = Client::connect(&addr, &secret).await.unwrap();
    assert!(c.is_local(), "a loopback server is reached by its Unix socket");
    let big = Bytes::from(vec![7u8; 3 << 20]);
    let calls = (0..32u64).map(|i| {
        let (c, big) = (c.clone(), big.clone());
        tokio::spawn(async move {
            let len = (i * 97_001) % big.len() as u64;
            let req = Request::Read {
                handle: i,
                offset: 0,
                len,
                need: 0,
            };
            let (r, d) = c
                .call_with(&req, parcache_proto::Payload::Shared(&big.slice(..len as usize)))
                .await
                .unwrap();
            assert_eq!(r, Response::Data { len });
            assert_eq!(d.len() as u64, len);
            assert!(d.iter().all(|&b| b == 7));
        })
    });
    for t in calls {
        t.await.unwrap();
    }
    let e = Client::connect(&addr, &Secret::generate())
        .await
        .err()
        .expect("refused");
    assert!(e.to_string().contains("cluster secret"), "{e}");
    // Garbage on the local socket before authentication.
    let name = format!("\0parcache-{addr}");
    let mut s = tokio::net::UnixStream::connect(&name).await.unwrap();
    let _ = s.write_all(b"\xff\xff\xff\xffnot a frame at all").await;
    let mut buf = [0u8; 64];
    let r = tokio::time::timeout(Duration::from_secs(10), async {
        while s.read(&mut buf).await.map(|n| n > 0).unwrap_or(false) {}
    })
    .await;
    assert!(r.is_ok(), "the server hung on garbage on its local socket");
    let (resp, _) = c.call(&Request::Write { handle: 1, offset: 0 }, b"ok").await.unwrap();
    assert_eq!(resp, Response::Written { len: 2 });
    let _ = stop.send(true);
}

/// A process that took a server's local socket name first (it does not
/// know the secret) neither passes for the server nor keeps clients away:
/// they go by TCP. A server listening beyond loopback has no local socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_squatter_on_the_local_name_is_passed_by_over_tcp() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let squatter = tokio::net::UnixListener::bind(format!("\0parcache-{addr}")).unwrap();
    let stranger = Secret::generate();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = squatter.accept().await {
            let stranger = stranger.clone();
            tokio::spawn(async move {
                let _ = parcache_proto::auth::server_handshake(&mut s, &stranger).await;
            });
        }
    });
    let secret = Secret::generate();
    let (stop, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(serve(l, secret.clone(), Arc::new(Echo), rx));
    let c = Client::connect(&addr, &secret).await.unwrap();
    assert!(!c.is_local(), "the squatter's socket is not used");
    let (resp, _) = c.call(&Request::Write { handle: 1, offset: 0 }, b"abc").await.unwrap();
    assert_eq!(resp, Response::Written { len: 3 });
    let _ = stop.send(true);

    let any = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = any.local_addr().unwrap().port();
    let (stop, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(serve(any, secret.clone(), Arc::new(Echo), rx));
    let c = Client::connect(&format!("127.0.0.1:{port}"), &secret).await.unwrap();
    assert!(!c.is_local(), "a server on every address is reached by TCP");
    let (resp, _) = c.call(&Request::Write { handle: 1, offset: 0 }, b"abcd").await.unwrap();
    assert_eq!(resp, Response::Written { len: 4 });
    let _ = stop.send(true);
}

/// Answers a read of `len` bytes of `handle` with bytes made from both.
struct Pattern;

fn pattern(handle: u64, len: u64) -> Vec<u8> {
    (0..len).map(|k| (k * 7 + handle * 13) as u8).collect()
}

impl Handler for Pattern {
    async fn handle(&self, req: Request, _data: Bytes) -> (Response, Bytes) {
        match req {
            Request::Read { handle, len, .. } => {
                tokio::time::sleep(Duration::from_micros(handle % 300)).await;
                (Response::Data { len }, pattern(handle, len).into())
            }
            _ => (Response::Ok, Bytes::new()),
        }
    }
}

/// Answers' payloads land in the buffers their requests lend, while many
/// are in flight beside requests that lend none: a large payload that
/// fits lands (the reply's own payload empty) whole and in order across
/// the buffers; a small one, or one larger than the buffers, comes as the
/// reply's payload and leaves the buffers untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_land_in_the_buffers_lent_for_them() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let secret = Secret::generate();
    let (stop, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(serve(l, secret.clone(), Arc::new(Pattern), rx));
    let c = Client::connect(&addr, &secret).await.unwrap();
    const B: usize = 64 << 10;
    let calls = (0..300u64).map(|i| {
        let c = c.clone();
        tokio::spawn(async move {
            // Sizes from 4 KiB to 4 blocks and a half; buffers of 1–4 blocks.
            let len = [4 << 10, B, 3 * B, 4 * B, 4 * B + B / 2, 100_000][(i % 6) as usize] as u64;
            let req = Request::Read {
                handle: i,
                offset: 0,
                len,
                need: 0,
            };
            let want = pattern(i, len);
            if i % 4 == 3 {
                let (_, d) = c.call(&req, &[]).await.unwrap();
                assert_eq!(&d[..], &want[..]);
                return;
            }
            let lent = 1 + (i % 4) as usize;
            let landing = parcache_proto::Landing::new(vec![parcache_proto::Block::from_slice(&[0xEE; B]); lent]);
            let (r, d) = c.call_landing(&req, &landing).await.unwrap();
            assert_eq!(r, Response::Data { len });
            let (bufs, landed) = landing.finish();
            assert_eq!(bufs.len(), lent, "the buffers come back");
            let fits = len as usize <= lent * B && len >= 32 << 10;
            if fits {
                assert_eq!(landed, Some(len as usize), "read {i} of {len} bytes should land");
                assert!(d.is_empty());
                let got: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
                assert_eq!(&got[..len as usize], &want[..], "read {i}: the landed bytes");
                assert!(
                    got[len as usize..].iter().all(|&b| b == 0xEE),
                    "past the payload: untouched"
                );
            } else {
                assert_eq!(landed, None, "read {i} of {len} bytes should not land");
                assert_eq!(&d[..], &want[..]);
                assert!(bufs.iter().all(|b| b.iter().all(|&x| x == 0xEE)));
            }
        })
    });
    for t in calls {
        t.await.unwrap();
    }
    let _ = stop.send(true);
}

/// A connection lost in the middle of a payload that was landing fails
/// the request, and the lent buffers go with it (the caller finds none,
/// rather than buffers half filled as if whole).
#[tokio::test]
async fn a_payload_cut_short_fails_and_keeps_no_buffer() {
    use parcache_proto::auth::server_handshake;
    use parcache_proto::frame::{encode_head, read_frame};
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let secret = Secret::generate();
    let s2 = secret.clone();
    let server = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        server_handshake(&mut s, &s2).await.unwrap();
        let f = read_frame::<Request, _>(&mut s).await.unwrap();
        let head = encode_head(f.id, &Response::Data { len: 100_000 }, 100_000, 0).unwrap();
        s.write_all(&head).await.unwrap();
        s.write_all(&[5u8; 10_000]).await.unwrap();
        s.flush().await.unwrap();
    });
    let c = Client::connect(&addr, &secret).await.unwrap();
    let landing = parcache_proto::Landing::new(vec![parcache_proto::Block::from_slice(&[0u8; 64 << 10]); 2]);
    let req = Request::Read {
        handle: 1,
        offset: 0,
        len: 100_000,
        need: 0,
    };
    let r = c.call_landing(&req, &landing).await;
    assert!(r.is_err(), "a cut payload is an error: {r:?}");
    assert_eq!(landing.finish(), (Vec::new(), None));
    server.await.unwrap();
}

/// Lends buffers of [`LANDED`] bytes for a write's payload of whole such
/// buffers, and answers a write whose payload landed in them with `Data`
/// if they hold the bytes [`pattern`] makes of its handle (any other write
/// with `Written`).
struct Lands;

const LANDED: usize = 64 << 10;

impl Handler for Lands {
    async fn handle(&self, req: Request, data: Bytes) -> (Response, Bytes) {
        match req {
            Request::Write { handle, .. } if data[..] == pattern(handle, data.len() as u64)[..] => {
                (Response::Written { len: data.len() as u64 }, Bytes::new())
            }
            _ => (
                Response::error(parcache_proto::ErrorCode::Io, "wrong bytes"),
                Bytes::new(),
            ),
        }
    }

    fn landing(&self, req: &Request, len: usize) -> Option<Vec<parcache_proto::Block>> {
        let whole = matches!(req, Request::Write { .. }) && len.is_multiple_of(LANDED);
        whole.then(|| {
            (0..len / LANDED)
                .map(|_| {
                    let mut b = parcache_proto::Block::from_slice(&[0xEE; 100]);
                    b.stale(LANDED);
                    b
                })
                .collect()
        })
    }

    async fn handle_landed(&self, req: Request, landed: Vec<parcache_proto::Block>) -> (Response, Vec<Bytes>) {
        let len: usize = landed.iter().map(|b| b.len()).sum();
        let resp = match req {
            Request::Write { handle, .. }
                if landed.iter().all(|b| b.len() == LANDED)
                    && parcache_mem::concat(&landed) == pattern(handle, len as u64) =>
            {
                Response::Data { len: len as u64 }
            }
            _ => Response::error(parcache_proto::ErrorCode::Io, "wrong landed bytes"),
        };
        (resp, Vec::new())
    }
}

/// Requests' payloads land in the buffers the server's handler lends for
/// them, while many are in flight: a payload of whole buffers lands (the
/// handler gets them full, in order); any other, or one too small to be
/// read on its own, comes as the request's payload. A request whose
/// header does not decode has its payload skipped: the next request on
/// the connection is read from its start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_payloads_land_in_the_buffers_the_server_lends() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let secret = Secret::generate();
    let (stop, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(serve(l, secret.clone(), Arc::new(Lands), rx));
    let c = Client::connect(&addr, &secret).await.unwrap();
    let calls = (0..200u64).map(|i| {
        let c = c.clone();
        tokio::spawn(async move {
            let len = [LANDED, 3 * LANDED, 100_000, 16 << 10, 16 * LANDED][(i % 5) as usize];
            let req = Request::Write { handle: i, offset: 0 };
            let (r, _) = c.call(&req, &pattern(i, len as u64)).await.unwrap();
            let lands = len.is_multiple_of(LANDED);
            let want = if lands {
                Response::Data { len: len as u64 }
            } else {
                Response::Written { len: len as u64 }
            };
            assert_eq!(r, want, "write {i} of {len} bytes");
        })
    });
    for t in calls {
        t.await.unwrap();
    }
    // A header that does not decode, with a large payload, then a good
    // request: the first is refused, the second answered.
    use parcache_proto::frame::read_frame;
    let mut s = TcpStream::connect(&addr).await.unwrap();
    client_handshake(&mut s, &secret).await.unwrap();
    let (header, payload) = ([0xFFu8; 16], 3 * LANDED);
    let mut bad = Vec::new();
    bad.extend_from_slice(&((8 + 4 + header.len() + payload) as u32).to_le_bytes());
    bad.extend_from_slice(&7u64.to_le_bytes());
    bad.extend_from_slice(&(header.len() as u32).to_le_bytes());
    bad.extend_from_slice(&header);
    bad.extend_from_slice(&vec![1u8; payload]);
    s.write_all(&bad).await.unwrap();
    let good = encode(
        8,
        &Request::Write { handle: 5, offset: 0 },
        &pattern(5, 2 * LANDED as u64),
    )
    .unwrap();
    s.write_all(&good).await.unwrap();
    let first = read_frame::<Response, _>(&mut s).await.unwrap();
    assert_eq!(first.id, 7);
    assert!(matches!(first.msg, Response::Error(_)), "{:?}", first.msg);
    let second = read_frame::<Response, _>(&mut s).await.unwrap();
    assert_eq!((second.id, second.msg), (8, Response::Data { len: 2 * LANDED as u64 }));
    let _ = stop.send(true);
}
