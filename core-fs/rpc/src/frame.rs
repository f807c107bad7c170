//! Wire frames and a pure, I/O-free decoder.
//!
//! # Layout
//!
//! Every frame is a fixed 32-byte little-endian header followed by a body and
//! a bulk payload:
//!
//! | offset | size | field                                                        |
//! |-------:|-----:|--------------------------------------------------------------|
//! | 0      | 4    | magic `b"3FSR"`                                              |
//! | 4      | 1    | version (currently 1)                                        |
//! | 5      | 1    | kind: 1 request, 2 response, 3 cancel                        |
//! | 6      | 2    | flags (see [`FLAG_PAYLOAD_REMOTE`]); unknown bits are kept   |
//! | 8      | 8    | request id, chosen by the client, unique per connection      |
//! | 16     | 4    | request: method id (`u16` widened); response: status code (0 = ok, else an [`ErrorCode`](fskv_types::ErrorCode)); cancel: 0 |
//! | 20     | 4    | request: timeout in ms relative to receipt (0 = none); else 0 |
//! | 24     | 4    | body length in bytes                                         |
//! | 28     | 4    | payload length in bytes                                      |
//! | 32     | body | request/ok response: bincode of the typed message; error response: UTF-8 message |
//! | 32+body| payload | raw bulk bytes, never re-encoded                          |
//!
//! # Decoder invariants
//!
//! * The total frame size (header + body + payload) is computed in `u64` from
//!   the header and compared with `max_frame_bytes` **before** any buffer is
//!   grown, so a hostile header cannot make us allocate.
//! * Once a valid header is seen, a frame of up to the eager-reserve size
//!   ([`EAGER_RESERVE_BYTES`] by default) gets its whole buffer at once; a
//!   larger one's buffer grows as bytes arrive (doubling, at least
//!   [`GROW_MIN_BYTES`]), never to the size a header merely claims. Socket
//!   reads land in it directly (one copy from the kernel).
//! * Body and payload are returned as [`Bytes`] split off the receive buffer:
//!   no copy.
//! * No input makes the decoder panic.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Frame magic, first four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"3FSR";
/// Wire format version carried in every header.
pub const VERSION: u8 = 1;
/// Size of the fixed header in bytes.
pub const HEADER_BYTES: usize = 32;
/// Default frame size limit: 80 MiB (a 64 MiB chunk plus headers and body).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 80 << 20;
/// Flag: the payload is not data but a list of encoded
/// [`RemoteBuf`](crate::transport::RemoteBuf) descriptors that the peer reads
/// or writes through the transport's remote-memory seam (RDMA). TCP never
/// sets it.
pub const FLAG_PAYLOAD_REMOTE: u16 = 1 << 0;

/// Status code value meaning success in a response header.
pub const STATUS_OK: u32 = 0;

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    Request = 1,
    Response = 2,
    Cancel = 3,
}

impl FrameKind {
    fn from_u8(v: u8) -> Option<FrameKind> {
        match v {
            1 => Some(FrameKind::Request),
            2 => Some(FrameKind::Response),
            3 => Some(FrameKind::Cancel),
            _ => None,
        }
    }
}

/// The decoded fixed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub flags: u16,
    pub request_id: u64,
    /// Method id for requests, status code for responses, 0 for cancels.
    pub code: u32,
    /// Request timeout in ms relative to receipt; 0 means none.
    pub timeout_ms: u32,
    pub body_len: u32,
    pub payload_len: u32,
}

impl FrameHeader {
    /// Header + body + payload, computed without overflow.
    pub fn frame_bytes(&self) -> u64 {
        HEADER_BYTES as u64 + u64::from(self.body_len) + u64::from(self.payload_len)
    }

    /// Writes the 32-byte header.
    pub fn encode(&self, out: &mut impl BufMut) {
        out.put_slice(&MAGIC);
        out.put_u8(VERSION);
        out.put_u8(self.kind as u8);
        out.put_u16_le(self.flags);
        out.put_u64_le(self.request_id);
        out.put_u32_le(self.code);
        out.put_u32_le(self.timeout_ms);
        out.put_u32_le(self.body_len);
        out.put_u32_le(self.payload_len);
    }

    /// Parses a header from exactly the first [`HEADER_BYTES`] of `raw`.
    fn parse(mut raw: &[u8]) -> Result<FrameHeader, FrameError> {
        if raw.len() < HEADER_BYTES {
            return Err(FrameError::Truncated);
        }
        let mut magic = [0u8; 4];
        raw.copy_to_slice(&mut magic);
        if magic != MAGIC {
            return Err(FrameError::BadMagic(u32::from_le_bytes(magic)));
        }
        let version = raw.get_u8();
        if version != VERSION {
            return Err(FrameError::BadVersion(version));
        }
        let kind_raw = raw.get_u8();
        let kind = FrameKind::from_u8(kind_raw).ok_or(FrameError::UnknownKind(kind_raw))?;
        Ok(FrameHeader {
            kind,
            flags: raw.get_u16_le(),
            request_id: raw.get_u64_le(),
            code: raw.get_u32_le(),
            timeout_ms: raw.get_u32_le(),
            body_len: raw.get_u32_le(),
            payload_len: raw.get_u32_le(),
        })
    }
}

/// A complete frame; body and payload share the receive buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub header: FrameHeader,
    pub body: Bytes,
    pub payload: Bytes,
}

/// Why a byte stream is not a valid frame sequence. Any of these means the
/// stream cannot be resynchronised: the connection must be closed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("bad frame magic {0:#010x}")]
    BadMagic(u32),
    #[error("unsupported frame version {0}")]
    BadVersion(u8),
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("frame of {frame_bytes} bytes exceeds the limit of {max_frame_bytes} bytes")]
    TooLarge { frame_bytes: u64, max_frame_bytes: usize },
    #[error("truncated frame header")]
    Truncated,
}

/// The least a buffer holding a partial frame is grown by.
pub const GROW_MIN_BYTES: usize = 256 * 1024;

/// Frames up to this size are reserved whole once their header is known (on
/// a server too): one allocation, no regrowth. Larger ones grow with the
/// bytes that arrive. The server's in-flight byte budget, charged at the
/// header, bounds what such reservations can add up to.
pub const EAGER_RESERVE_BYTES: usize = 4 << 20;

/// Stateless frame decoder; only holds the size limits.
#[derive(Clone, Copy, Debug)]
pub struct FrameDecoder {
    max_frame_bytes: usize,
    /// Frames up to this size are reserved whole at their header.
    eager_reserve_bytes: usize,
}

impl FrameDecoder {
    /// A decoder reserving frames of up to [`EAGER_RESERVE_BYTES`] whole.
    pub fn new(max_frame_bytes: usize) -> Self {
        FrameDecoder { max_frame_bytes, eager_reserve_bytes: EAGER_RESERVE_BYTES }
    }

    /// Sets the largest frame reserved whole at its header (a client reading
    /// the replies to its own requests trusts their sizes: `usize::MAX`).
    pub fn with_eager_reserve(mut self, bytes: usize) -> Self {
        self.eager_reserve_bytes = bytes;
        self
    }

    pub fn max_frame_bytes(&self) -> usize {
        self.max_frame_bytes
    }

    /// The header at the front of `buf`, checked against the size limit,
    /// if all of its bytes are there.
    pub fn peek_header(&self, buf: &[u8]) -> Result<Option<FrameHeader>, FrameError> {
        if buf.len() < HEADER_BYTES {
            return Ok(None);
        }
        let header = FrameHeader::parse(&buf[..HEADER_BYTES])?;
        let frame_bytes = header.frame_bytes();
        if frame_bytes > self.max_frame_bytes as u64 {
            return Err(FrameError::TooLarge { frame_bytes, max_frame_bytes: self.max_frame_bytes });
        }
        Ok(Some(header))
    }

    /// Decodes one frame from the front of `buf`.
    ///
    /// * `Ok(None)`: more bytes are needed; if the header is complete and
    ///   valid, `buf` has been reserved for the whole frame if it is at most
    ///   the eager-reserve size, else grown towards it by at most what it
    ///   holds (or [`GROW_MIN_BYTES`]), so a header alone (which a peer can
    ///   send for free) never makes us reserve much more than the bytes it
    ///   actually sent.
    /// * `Ok(Some(frame))`: the frame's bytes were split off `buf`.
    /// * `Err(_)`: the stream is corrupt or the frame is too large; `buf` was
    ///   not grown.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        if buf.len() < HEADER_BYTES {
            return Ok(None);
        }
        let header = FrameHeader::parse(&buf[..HEADER_BYTES])?;
        let frame_bytes = header.frame_bytes();
        // Invariant: the limit is checked before any reservation.
        if frame_bytes > self.max_frame_bytes as u64 {
            return Err(FrameError::TooLarge { frame_bytes, max_frame_bytes: self.max_frame_bytes });
        }
        // Cannot truncate: frame_bytes <= max_frame_bytes which is a usize.
        let frame_len = frame_bytes as usize;
        if buf.len() < frame_len {
            let missing = frame_len - buf.len();
            let room = buf.capacity() - buf.len();
            if frame_len <= self.eager_reserve_bytes {
                if room < missing {
                    buf.reserve(missing);
                }
            } else if room < missing && room < GROW_MIN_BYTES / 4 {
                // Grow as bytes arrive: double what we hold (large
                // buffers are grown by the allocator in place, mremap).
                buf.reserve(missing.min(buf.len().max(GROW_MIN_BYTES)));
            }
            return Ok(None);
        }
        let mut frame = buf.split_to(frame_len);
        frame.advance(HEADER_BYTES);
        let body = frame.split_to(header.body_len as usize).freeze();
        let payload = frame.freeze();
        Ok(Some(Frame { header, body, payload }))
    }
}

/// Encodes header + body into one small contiguous buffer. The payload is
/// deliberately not included: writers send it as a separate slice
/// (vectored write) so it is never copied.
pub fn encode_head(header: &FrameHeader, body: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(HEADER_BYTES + body.len());
    header.encode(&mut out);
    out.put_slice(body);
    out.freeze()
}

/// An encoded frame ready to write: `head` (header + body) then `payload`.
#[derive(Clone, Debug)]
pub struct OutFrame {
    pub head: Bytes,
    pub payload: Bytes,
}

impl OutFrame {
    /// Builds a frame, filling in the body and payload lengths. Fails with
    /// [`FrameError::TooLarge`] if the frame would exceed `max_frame_bytes`
    /// (checked before anything is written).
    pub fn build(
        kind: FrameKind,
        request_id: u64,
        code: u32,
        timeout_ms: u32,
        body: &[u8],
        payload: Bytes,
        max_frame_bytes: usize,
    ) -> Result<OutFrame, FrameError> {
        let frame_bytes = HEADER_BYTES as u64 + body.len() as u64 + payload.len() as u64;
        let too_large = || FrameError::TooLarge { frame_bytes, max_frame_bytes };
        if frame_bytes > max_frame_bytes as u64 {
            return Err(too_large());
        }
        let body_len = u32::try_from(body.len()).map_err(|_| too_large())?;
        let payload_len = u32::try_from(payload.len()).map_err(|_| too_large())?;
        let header = FrameHeader { kind, flags: 0, request_id, code, timeout_ms, body_len, payload_len };
        Ok(OutFrame { head: encode_head(&header, body), payload })
    }

    /// A cancel frame for `request_id`.
    pub fn cancel(request_id: u64) -> OutFrame {
        let header = FrameHeader { kind: FrameKind::Cancel, flags: 0, request_id, code: 0, timeout_ms: 0, body_len: 0, payload_len: 0 };
        OutFrame { head: encode_head(&header, &[]), payload: Bytes::new() }
    }

    pub fn len(&self) -> usize {
        self.head.len() + self.payload.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame_bytes(f: &OutFrame) -> Vec<u8> {
        let mut v = f.head.to_vec();
        v.extend_from_slice(&f.payload);
        v
    }

    #[test]
    fn round_trip_split_is_zero_copy() {
        let f = OutFrame::build(FrameKind::Request, 7, 3, 100, b"body", Bytes::from_static(b"payload"), 1024).unwrap();
        let mut buf = BytesMut::from(&frame_bytes(&f)[..]);
        let base = buf.as_ptr() as usize;
        let got = FrameDecoder::new(1024).decode(&mut buf).unwrap().unwrap();
        assert_eq!(got.header.request_id, 7);
        assert_eq!(got.header.code, 3);
        assert_eq!(got.header.timeout_ms, 100);
        assert_eq!(&got.body[..], b"body");
        assert_eq!(&got.payload[..], b"payload");
        // The payload points into the original receive buffer.
        assert_eq!(got.payload.as_ptr() as usize, base + HEADER_BYTES + 4);
        assert!(buf.is_empty());
    }

    #[test]
    fn oversized_header_rejected_without_growing_buffer() {
        let header = FrameHeader {
            kind: FrameKind::Request,
            flags: 0,
            request_id: 1,
            code: 1,
            timeout_ms: 0,
            body_len: u32::MAX,
            payload_len: u32::MAX,
        };
        let mut buf = BytesMut::with_capacity(HEADER_BYTES);
        header.encode(&mut buf);
        let cap = buf.capacity();
        let err = FrameDecoder::new(1 << 20).decode(&mut buf).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { .. }));
        assert_eq!(buf.capacity(), cap);
    }

    #[test]
    fn a_large_frame_header_alone_reserves_little_and_the_buffer_grows_with_the_bytes() {
        let body = vec![7u8; 3 << 20];
        let f = OutFrame::build(FrameKind::Request, 1, 1, 0, &[], Bytes::from(body), 80 << 20).unwrap();
        let raw = frame_bytes(&f);
        let decoder = FrameDecoder::new(80 << 20).with_eager_reserve(1 << 20);
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&raw[..HEADER_BYTES]);
        assert!(decoder.decode(&mut buf).unwrap().is_none());
        assert!(buf.capacity() <= HEADER_BYTES + GROW_MIN_BYTES, "a header alone reserved {} bytes", buf.capacity());
        // Feed the rest in pieces, as a socket would, until the frame is whole.
        let mut at = HEADER_BYTES;
        let got = loop {
            if let Some(frame) = decoder.decode(&mut buf).unwrap() {
                break frame;
            }
            // Reserving doubles at most (BytesMut may round up to twice its
            // old capacity): the buffer stays within a small multiple of
            // what arrived.
            assert!(buf.capacity() <= 2 * (buf.len() + GROW_MIN_BYTES), "{} reserved for {} received", buf.capacity(), buf.len());
            let end = (at + 100_000).min(raw.len());
            buf.extend_from_slice(&raw[at..end]);
            at = end;
        };
        assert_eq!(got.payload.len(), 3 << 20);
        assert_eq!(decoder.peek_header(&raw).unwrap().map(|h| h.payload_len), Some(3 << 20));
        assert!(matches!(FrameDecoder::new(1 << 20).peek_header(&raw), Err(FrameError::TooLarge { .. })));
    }

    #[test]
    fn bad_magic_and_kind() {
        let mut buf = BytesMut::from(&[0u8; 40][..]);
        assert!(matches!(FrameDecoder::new(100).decode(&mut buf), Err(FrameError::BadMagic(0))));
        let f = OutFrame::cancel(1);
        let mut raw = frame_bytes(&f);
        raw[5] = 9;
        let mut buf = BytesMut::from(&raw[..]);
        assert_eq!(FrameDecoder::new(100).decode(&mut buf), Err(FrameError::UnknownKind(9)));
    }

    #[test]
    fn build_rejects_oversized() {
        let err = OutFrame::build(FrameKind::Request, 1, 1, 0, &[0u8; 10], Bytes::from(vec![0u8; 100]), 64).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { frame_bytes: 142, .. }));
    }

    proptest! {
        /// Arbitrary bytes with an arbitrary limit never panic, and a rejected
        /// buffer is never grown past what it held.
        #[test]
        fn decoder_never_panics(data in proptest::collection::vec(any::<u8>(), 0..512), max in 0usize..4096) {
            let mut buf = BytesMut::from(&data[..]);
            let dec = FrameDecoder::new(max);
            for _ in 0..64 {
                match dec.decode(&mut buf) {
                    Ok(Some(_)) => continue,
                    Ok(None) | Err(_) => break,
                }
            }
        }

        /// Valid frames fed in random chunks decode to exactly what was sent.
        #[test]
        fn valid_frames_round_trip_with_random_splits(
            frames in proptest::collection::vec(
                (any::<u64>(), 0u8..3, any::<u32>(), any::<u32>(),
                 proptest::collection::vec(any::<u8>(), 0..64),
                 proptest::collection::vec(any::<u8>(), 0..256)),
                1..8),
            splits in proptest::collection::vec(1usize..97, 1..32),
        ) {
            let kinds = [FrameKind::Request, FrameKind::Response, FrameKind::Cancel];
            let mut wire = Vec::new();
            let mut expected = Vec::new();
            for (id, k, code, timeout_ms, body, payload) in &frames {
                let f = OutFrame::build(kinds[*k as usize], *id, *code, *timeout_ms, body,
                    Bytes::from(payload.clone()), 4096).unwrap();
                wire.extend_from_slice(&frame_bytes(&f));
                expected.push((*id, *code, body.clone(), payload.clone()));
            }
            let dec = FrameDecoder::new(4096);
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            let mut pos = 0;
            let mut i = 0;
            while pos < wire.len() {
                let n = splits[i % splits.len()].min(wire.len() - pos);
                i += 1;
                buf.extend_from_slice(&wire[pos..pos + n]);
                pos += n;
                while let Some(f) = dec.decode(&mut buf).unwrap() {
                    got.push((f.header.request_id, f.header.code, f.body.to_vec(), f.payload.to_vec()));
                }
            }
            prop_assert!(buf.is_empty());
            prop_assert_eq!(got, expected);
        }
    }
}
