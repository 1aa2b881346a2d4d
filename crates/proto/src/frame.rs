//! Framing: how one message and its payload travel on a byte stream.
//!
//! ```text
//! u32  length of the rest of the frame (little endian), at most MAX_FRAME
//! u64  request id (responses carry their request's id)
//! u32  header length, at most MAX_HEADER
//! ...  header: a postcard-encoded message
//! ...  payload: raw bytes (file data), passed on as `Bytes` without copying
//! ```
//!
//! A frame that is too long, too short for its own header, or whose header
//! does not decode is an error, never a panic; a peer that stops mid-frame
//! is `Truncated`.

use crate::buf_pool::{BufPool, POOLED_MIN};
use crate::landing::Landing;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{de::DeserializeOwned, Serialize};
use std::sync::Arc;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest payload a frame may carry (one request moves at most this much data).
pub const MAX_PAYLOAD: usize = 16 << 20;
/// Largest encoded header: room for a commit of 50,000 chunk changes, or
/// 100,000 hashes (a recipe's worth for 1.6 GiB of 16 KiB chunks).
pub const MAX_HEADER: usize = 4 << 20;
/// Largest frame after the length field.
pub const MAX_FRAME: usize = 8 + 4 + MAX_HEADER + MAX_PAYLOAD;

#[derive(Debug, Error)]
pub enum FrameError {
    #[error("frame of {0} bytes is larger than the limit of {MAX_FRAME}")]
    TooLarge(usize),
    #[error("message of {0} bytes encoded is larger than the limit of {MAX_HEADER}")]
    HeaderTooLarge(usize),
    #[error("payload of {0} bytes is larger than the limit of {MAX_PAYLOAD}")]
    PayloadTooLarge(usize),
    #[error("frame of {0} bytes is too short for its header")]
    Short(usize),
    #[error("frame header does not decode: {0}")]
    Malformed(String),
    #[error("request {id}: header does not decode: {reason}")]
    BadHeader { id: u64, reason: String },
    #[error("connection closed in the middle of a frame")]
    Truncated,
    #[error("connection closed")]
    Closed,
    /// Said as the I/O error itself: a message with it and a source of it
    /// printed it twice along an error's chain ("i/o: X: X").
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A decoded frame: request id, message, payload.
#[derive(Debug)]
pub struct Frame<M> {
    pub id: u64,
    pub msg: M,
    pub data: Bytes,
}

/// Encodes a frame into one buffer (header and length prefix; the payload
/// is appended, so one write sends it all).
pub fn encode<M: Serialize>(id: u64, msg: &M, data: &[u8]) -> Result<BytesMut, FrameError> {
    let mut b = encode_head(id, msg, data.len(), data.len())?;
    b.put_slice(data);
    Ok(b)
}

/// Encodes a frame's length, id and header for a payload of `payload`
/// bytes sent after it (the payload is not copied: a writer sends both
/// with one vectored write), with room for `room` more bytes.
pub fn encode_head<M: Serialize>(id: u64, msg: &M, payload: usize, room: usize) -> Result<BytesMut, FrameError> {
    let header = postcard::to_stdvec(msg).map_err(|e| FrameError::Malformed(e.to_string()))?;
    if header.len() > MAX_HEADER {
        return Err(FrameError::HeaderTooLarge(header.len()));
    }
    if payload > MAX_PAYLOAD {
        return Err(FrameError::PayloadTooLarge(payload));
    }
    let len = 8 + 4 + header.len() + payload;
    let mut b = BytesMut::with_capacity(4 + 8 + 4 + header.len() + room);
    b.put_u32_le(len as u32);
    b.put_u64_le(id);
    b.put_u32_le(header.len() as u32);
    b.put_slice(&header);
    Ok(b)
}

/// Decodes the body of a frame (everything after the length field).
pub fn decode<M: DeserializeOwned>(mut body: Bytes) -> Result<Frame<M>, FrameError> {
    let n = body.len();
    if n < 12 {
        return Err(FrameError::Short(n));
    }
    let id = body.get_u64_le();
    let hlen = body.get_u32_le() as usize;
    if hlen > body.len() {
        return Err(FrameError::Short(n));
    }
    let header = body.split_to(hlen);
    let msg = message(id, &header)?;
    Ok(Frame { id, msg, data: body })
}

/// The message of request `id` from its encoded header.
fn message<M: DeserializeOwned>(id: u64, header: &[u8]) -> Result<M, FrameError> {
    postcard::from_bytes(header).map_err(|e| FrameError::BadHeader {
        id,
        reason: e.to_string(),
    })
}

/// Reads one frame. `Closed` if the peer closed cleanly between frames.
pub async fn read_frame<M: DeserializeOwned, R: AsyncRead + Unpin>(r: &mut R) -> Result<Frame<M>, FrameError> {
    read_frame_pooled(r, None).await
}

/// Reads one frame, a large one into a buffer of `pool` (which gets it
/// back when the frame's payload is dropped).
pub async fn read_frame_pooled<M: DeserializeOwned, R: AsyncRead + Unpin>(
    r: &mut R,
    pool: Option<&Arc<BufPool>>,
) -> Result<Frame<M>, FrameError> {
    read_frame_landing(r, pool, |_, _, _| None).await
}

/// As [`read_frame_pooled`], a large payload landing instead in the buffers
/// `landing(id, message, payload length)` lends, where it fits
/// ([`Landing`]): the frame's `data` is then empty and the landing says how
/// much came. A node lends a block's buffers for the answer to request
/// `id`; a data server lends buffers its cache takes as they are for a
/// write of whole blocks.
pub async fn read_frame_landing<M: DeserializeOwned, R: AsyncRead + Unpin>(
    r: &mut R,
    pool: Option<&Arc<BufPool>>,
    landing: impl FnOnce(u64, &M, usize) -> Option<Landing>,
) -> Result<Frame<M>, FrameError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    if let Some(pool) = pool.filter(|_| len >= POOLED_MIN) {
        return read_aligned(r, pool, len, landing).await;
    }
    // Read into the buffer's spare capacity: no zeroing of bytes about to
    // be overwritten.
    let mut body = BytesMut::with_capacity(len);
    let mut rest = (&mut *r).take(len as u64);
    while body.len() < len {
        if rest.read_buf(&mut body).await? == 0 {
            return Err(FrameError::Truncated);
        }
    }
    decode(body.freeze())
}

/// Where a pooled payload starts in memory: on a boundary of this many
/// bytes, so a data server writes whole blocks from it around the page
/// cache (`O_DIRECT`) without copying them into an aligned buffer first.
pub const PAYLOAD_ALIGN: usize = 4096;

/// Reads the body of a frame of `len` bytes: the id, the header's length
/// and the header first (from the reader's buffer, mostly), then the
/// payload, into the buffers `landing` lends for it or into a buffer of
/// `pool` at a [`PAYLOAD_ALIGN`] boundary. A header that does not decode
/// has its payload read and dropped, so the next frame is read from its
/// start.
async fn read_aligned<M: DeserializeOwned, R: AsyncRead + Unpin>(
    r: &mut R,
    pool: &Arc<BufPool>,
    len: usize,
    landing: impl FnOnce(u64, &M, usize) -> Option<Landing>,
) -> Result<Frame<M>, FrameError> {
    let truncated = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            FrameError::Truncated
        } else {
            e.into()
        }
    };
    let mut head = [0u8; 12];
    if len < head.len() {
        return Err(FrameError::Short(len));
    }
    r.read_exact(&mut head).await.map_err(truncated)?;
    let id = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
    let hlen = u32::from_le_bytes(head[8..].try_into().expect("4 bytes")) as usize;
    let rest = len - head.len();
    if hlen > rest {
        return Err(FrameError::Short(len));
    }
    let payload = rest - hlen;
    let mut header = vec![0u8; hlen];
    r.read_exact(&mut header).await.map_err(truncated)?;
    let msg = message(id, &header);
    let lent = msg.as_ref().ok().and_then(|m| landing(id, m, payload));
    if let Some((l, mut bufs)) = lent.and_then(|l| l.take_for(payload).map(|bufs| (l, bufs))) {
        let mut left = payload;
        for b in &mut bufs {
            let n = left.min(b.len());
            r.read_exact(&mut b[..n]).await.map_err(truncated)?;
            left -= n;
        }
        l.landed(bufs, payload);
        return Ok(Frame {
            id,
            msg: msg?,
            data: Bytes::new(),
        });
    }
    let mut buf = pool.take(payload + PAYLOAD_ALIGN);
    let at = match buf.as_ptr().align_offset(PAYLOAD_ALIGN) {
        at if at < PAYLOAD_ALIGN => at,
        // Not computable here (`align_offset` may say so): unaligned,
        // which a data server copies into an aligned buffer.
        _ => 0,
    };
    r.read_exact(&mut buf[at..at + payload]).await.map_err(truncated)?;
    let data = pool.bytes(buf).slice(at..at + payload);
    Ok(Frame { id, msg: msg?, data })
}

/// Writes one frame.
pub async fn write_frame<M: Serialize, W: AsyncWrite + Unpin>(
    w: &mut W,
    id: u64,
    msg: &M,
    data: &[u8],
) -> Result<(), FrameError> {
    let b = encode(id, msg, data)?;
    w.write_all(&b).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An I/O error is said once along the chain a user is shown
    /// (`anyhow`'s `{:#}` joins each error and its sources).
    #[test]
    fn an_io_error_is_said_once_along_its_chain() {
        let e = FrameError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "reset by the peer",
        ));
        let mut said = e.to_string();
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            said += &format!(": {c}");
            cause = c.source();
        }
        assert_eq!(said.matches("reset by the peer").count(), 1, "{said}");
    }

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    enum T {
        A(u32),
        B { s: String },
    }

    /// A message of 100,000 hashes fits a header (a collection found the
    /// old 64 KiB limit cut a data server's chunk list at 2,000); a larger
    /// one is refused, naming the header's size.
    #[test]
    fn large_headers_fit_and_too_large_ones_are_named() {
        let hashes = vec![[7u8; 32]; 100_000];
        let b = encode(1, &hashes, b"").unwrap();
        let back: Frame<Vec<[u8; 32]>> = decode(b.freeze().slice(4..)).unwrap();
        assert_eq!(back.msg, hashes);
        let e = encode(1, &vec![[7u8; 32]; 200_000], b"").unwrap_err();
        assert!(matches!(e, FrameError::HeaderTooLarge(n) if n > MAX_HEADER), "{e}");
    }

    #[tokio::test]
    async fn a_head_and_its_payload_written_apart_read_as_one_frame_in_small_pieces() {
        // The serving side sends a large payload after its head, uncopied;
        // the reader gets the bytes a few KiB at a time.
        let (mut a, mut b) = tokio::io::duplex(4096);
        let data: Bytes = (0..200_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>().into();
        let head = encode_head(9, &T::A(5), data.len(), 0).unwrap();
        let sent = data.clone();
        let w = tokio::spawn(async move {
            a.write_all_buf(&mut head.chain(sent)).await.unwrap();
        });
        let f: Frame<T> = read_frame(&mut b).await.unwrap();
        w.await.unwrap();
        assert_eq!((f.id, f.msg), (9, T::A(5)));
        assert!(f.data == data, "the payload arrives whole and in order");
        assert!(matches!(read_frame::<T, _>(&mut b).await, Err(FrameError::Closed)));
    }

    #[tokio::test]
    async fn round_trip_through_a_stream() {
        let (mut a, mut b) = tokio::io::duplex(1 << 20);
        write_frame(&mut a, 7, &T::B { s: "x".into() }, b"payload")
            .await
            .unwrap();
        drop(a);
        let f: Frame<T> = read_frame(&mut b).await.unwrap();
        assert_eq!((f.id, f.msg, &f.data[..]), (7, T::B { s: "x".into() }, &b"payload"[..]));
        assert!(matches!(read_frame::<T, _>(&mut b).await, Err(FrameError::Closed)));
    }

    /// Frames read into pooled buffers arrive whole, small and large, one
    /// after another; a large frame's buffer serves the next once its
    /// payload is dropped; a truncated large frame is an error.
    #[tokio::test]
    async fn pooled_frames_arrive_whole_and_their_buffers_serve_again() {
        let (mut a, mut b) = tokio::io::duplex(8192);
        let sizes = [5usize, POOLED_MIN, 200_000, 0, 150_000, 7];
        let payload = |n: usize| -> Vec<u8> { (0..n).map(|i| (i * 31 % 253) as u8).collect() };
        let w = tokio::spawn(async move {
            for (i, n) in sizes.into_iter().enumerate() {
                write_frame(&mut a, i as u64, &T::A(n as u32), &payload(n))
                    .await
                    .unwrap();
            }
            a.write_all(&(POOLED_MIN as u32 + 100).to_le_bytes()).await.unwrap();
            a.write_all(&[0u8; 1000]).await.unwrap();
        });
        let pool = Arc::new(BufPool::default());
        for (i, n) in sizes.into_iter().enumerate() {
            let f: Frame<T> = read_frame_pooled(&mut b, Some(&pool)).await.unwrap();
            assert_eq!((f.id, f.msg), (i as u64, T::A(n as u32)));
            assert!(f.data[..] == payload(n)[..], "frame {i} of {n} bytes");
            drop(f.data);
            // The 150,000-byte frame takes the 200,000-byte one's buffer.
            assert_eq!(pool.kept(), [0, 1, 2, 2, 2, 2][i], "after frame {i}");
        }
        w.await.unwrap();
        assert!(matches!(
            read_frame_pooled::<T, _>(&mut b, Some(&pool)).await,
            Err(FrameError::Truncated)
        ));
    }

    /// A pooled payload starts on a PAYLOAD_ALIGN boundary whatever its
    /// header's length (a data server writes it O_DIRECT from there), and
    /// reads back whole; a header longer than its frame is an error.
    #[tokio::test]
    async fn pooled_payloads_start_on_a_boundary() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let payload: Vec<u8> = (0..40_000).map(|i| (i % 251) as u8).collect();
        let names: Vec<String> = (0..40).map(|n| "n".repeat(n * 7)).collect();
        let (sent, names2) = (payload.clone(), names.clone());
        let w = tokio::spawn(async move {
            for (i, s) in names2.into_iter().enumerate() {
                write_frame(&mut a, i as u64, &T::B { s }, &sent).await.unwrap();
            }
            let mut bad = BytesMut::new();
            bad.put_u32_le(POOLED_MIN as u32);
            bad.put_u64_le(9);
            bad.put_u32_le(POOLED_MIN as u32);
            a.write_all(&bad).await.unwrap();
        });
        let pool = Arc::new(BufPool::default());
        for (i, s) in names.into_iter().enumerate() {
            let f: Frame<T> = read_frame_pooled(&mut b, Some(&pool)).await.unwrap();
            assert_eq!((f.id, f.msg), (i as u64, T::B { s }));
            assert_eq!(f.data.as_ptr() as usize % PAYLOAD_ALIGN, 0, "frame {i}");
            assert!(f.data[..] == payload[..], "frame {i}");
        }
        w.await.unwrap();
        assert!(matches!(
            read_frame_pooled::<T, _>(&mut b, Some(&pool)).await,
            Err(FrameError::Short(n)) if n == POOLED_MIN
        ));
    }

    #[tokio::test]
    async fn oversized_and_truncated_frames_are_errors() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        a.write_all(&(u32::MAX).to_le_bytes()).await.unwrap();
        assert!(matches!(read_frame::<T, _>(&mut b).await, Err(FrameError::TooLarge(_))));
        let (mut a, mut b) = tokio::io::duplex(1024);
        a.write_all(&100u32.to_le_bytes()).await.unwrap();
        a.write_all(&[1, 2, 3]).await.unwrap();
        drop(a);
        assert!(matches!(read_frame::<T, _>(&mut b).await, Err(FrameError::Truncated)));
    }

    proptest! {
        /// Any bytes at all decode to a frame or an error, never a panic.
        #[test]
        fn arbitrary_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode::<T>(Bytes::from(body));
        }

        /// Frames survive encoding, and any single corrupted byte is caught or harmless.
        #[test]
        fn mutated_frames_never_panic(n in any::<u32>(), s in ".{0,20}", data in proptest::collection::vec(any::<u8>(), 0..64),
                                      pos in any::<usize>(), byte in any::<u8>()) {
            let enc = encode(3, &T::A(n), &data).unwrap().freeze();
            let f: Frame<T> = decode(enc.slice(4..)).unwrap();
            prop_assert_eq!(f.msg, T::A(n));
            prop_assert_eq!(&f.data[..], &data[..]);
            let mut m = encode(3, &T::B { s: s.clone() }, &data).unwrap();
            let i = 4 + pos % (m.len() - 4);
            m[i] = byte;
            let _ = decode::<T>(m.freeze().slice(4..));
        }
    }
}
