//! The rendezvous's frames: a kind byte, a little-endian `u32` length, the bytes.
//!
//! Reading a frame checks its kind and length against what may come at that point of
//! the protocol before a byte of it is allocated, and then grows its buffer only as
//! bytes arrive: a peer that announces 4 GiB costs nothing, one that sends a lot costs
//! what it sent, up to the limit of that frame's kind.

use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

/// A rank's payload of the current round (to the hub).
pub(crate) const PAYLOAD: u8 = 1;
/// Every rank's payload of the round (from the hub).
pub(crate) const ALL: u8 = 2;
/// The group failed, and why (JSON).
pub(crate) const FAILURE: u8 = 3;
/// The sender left cleanly.
pub(crate) const BYE: u8 = 4;
/// A rank's first frame: the protocol, whether it has a secret, its nonce.
pub(crate) const HELLO: u8 = 5;
/// The hub's nonce.
pub(crate) const CHALLENGE: u8 = 6;
/// A rank's number, world size and proof.
pub(crate) const JOIN: u8 = 7;
/// The hub's proof: the rank is in.
pub(crate) const WELCOME: u8 = 8;
/// The hub turned the rank away, and why (JSON).
pub(crate) const REFUSED: u8 = 9;

/// The longest failure or refusal (JSON of a typed error) a peer may send.
pub(crate) const MAX_REPORT: u64 = 64 * 1024;

/// Why a frame could not be read.
#[derive(Debug)]
pub(crate) enum FrameError {
    /// The connection closed (or was reset) before the frame was whole.
    Closed,
    /// Nothing whole arrived before the deadline.
    Silent,
    /// A kind that cannot come here.
    Unexpected,
    /// Longer than its kind may be here.
    Oversized { kind: u8, len: u64, max: u64 },
}

impl From<io::Error> for FrameError {
    fn from(error: io::Error) -> Self {
        match error.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => FrameError::Silent,
            _ => FrameError::Closed,
        }
    }
}

/// Writes one frame; a body longer than a frame can say is an error, never truncated.
pub(crate) fn write_frame(out: &mut impl Write, kind: u8, bytes: &[u8]) -> io::Result<()> {
    let len = u32::try_from(bytes.len())
        .map_err(|_| io::Error::new(ErrorKind::InvalidInput, "a frame longer than 4 GiB"))?;
    let mut frame = Vec::with_capacity(5 + bytes.len());
    frame.push(kind);
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(bytes);
    out.write_all(&frame)
}

/// Reads one frame whose kind `max` allows (`Some(longest)`), refusing any other kind
/// and any longer frame before reading its body.
pub(crate) fn read_frame(
    input: &mut impl Read,
    max: impl Fn(u8) -> Option<u64>,
) -> Result<(u8, Vec<u8>), FrameError> {
    let mut head = [0u8; 5];
    input.read_exact(&mut head)?;
    let kind = head[0];
    let len = u64::from(u32::from_le_bytes([head[1], head[2], head[3], head[4]]));
    let longest = max(kind).ok_or(FrameError::Unexpected)?;
    if len > longest {
        return Err(FrameError::Oversized {
            kind,
            len,
            max: longest,
        });
    }
    let mut bytes = Vec::new();
    input.take(len).read_to_end(&mut bytes)?;
    if (bytes.len() as u64) < len {
        return Err(FrameError::Closed);
    }
    Ok((kind, bytes))
}

/// A stream whose reads give up at `deadline`, however slowly the peer sends: each read
/// waits only for what is left of the time.
pub(crate) struct Until<'a> {
    pub(crate) stream: &'a TcpStream,
    pub(crate) deadline: Instant,
}

impl Read for Until<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        let mut stream = self.stream;
        stream.read(buf)
    }
}

/// The hub's answer to a round: the count, then each payload's length and bytes.
pub(crate) fn encode_all(all: &[Vec<u8>]) -> Vec<u8> {
    let mut bytes = (all.len() as u32).to_le_bytes().to_vec();
    for payload in all {
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(payload);
    }
    bytes
}

/// The payloads of a hub's answer; `None` unless the bytes hold exactly what their
/// count and lengths say (a count is checked against the bytes before it is believed).
pub(crate) fn decode_all(bytes: &[u8]) -> Option<Vec<Vec<u8>>> {
    let word = |at: usize| -> Option<usize> {
        Some(u32::from_le_bytes(bytes.get(at..at.checked_add(4)?)?.try_into().ok()?) as usize)
    };
    let count = word(0)?;
    // Every payload takes at least its 4-byte length.
    if count > (bytes.len() - 4) / 4 {
        return None;
    }
    let mut at = 4;
    let mut all = Vec::with_capacity(count);
    for _ in 0..count {
        let len = word(at)?;
        let start = at + 4;
        all.push(bytes.get(start..start.checked_add(len)?)?.to_vec());
        at = start + len;
    }
    (at == bytes.len()).then_some(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that fails the test if more than `budget` bytes are read from it.
    struct Budget<'a> {
        bytes: &'a [u8],
        read: usize,
    }

    impl Read for Budget<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = buf.len().min(self.bytes.len() - self.read);
            buf[..n].copy_from_slice(&self.bytes[self.read..self.read + n]);
            self.read += n;
            Ok(n)
        }
    }

    #[test]
    fn a_frame_longer_than_its_kind_allows_is_refused_before_its_body_is_read() {
        let mut head = vec![PAYLOAD];
        head.extend_from_slice(&u32::MAX.to_le_bytes());
        head.extend_from_slice(&[0; 1000]);
        let mut input = Budget {
            bytes: &head,
            read: 0,
        };
        let error = read_frame(&mut input, |_| Some(100)).unwrap_err();
        assert!(
            matches!(error, FrameError::Oversized { kind: PAYLOAD, len, max: 100 } if len == u64::from(u32::MAX)),
            "{error:?}"
        );
        assert_eq!(input.read, 5, "only the header was read");

        let mut input = Budget {
            bytes: &[HELLO, 0, 0, 0, 0],
            read: 0,
        };
        let error = read_frame(&mut input, |kind| (kind == PAYLOAD).then_some(10)).unwrap_err();
        assert!(matches!(error, FrameError::Unexpected), "{error:?}");
    }

    #[test]
    fn frames_round_trip_and_a_short_body_is_a_closed_connection() {
        let mut out = Vec::new();
        write_frame(&mut out, JOIN, b"abc").unwrap();
        let (kind, bytes) = read_frame(&mut out.as_slice(), |_| Some(3)).unwrap();
        assert_eq!((kind, bytes.as_slice()), (JOIN, &b"abc"[..]));
        let error = read_frame(&mut &out[..6], |_| Some(3)).unwrap_err();
        assert!(matches!(error, FrameError::Closed), "{error:?}");
    }

    #[test]
    fn an_answer_is_only_what_its_count_and_lengths_say() {
        let all = vec![vec![1, 2, 3], vec![], vec![9; 300]];
        assert_eq!(decode_all(&encode_all(&all)), Some(all.clone()));
        // A count the bytes cannot hold, a length past the end, bytes left over.
        assert_eq!(decode_all(&[5, 0, 0, 0]), None);
        assert_eq!(decode_all(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]), None);
        assert_eq!(decode_all(&[1, 0, 0, 0, 9, 0, 0, 0, 1]), None);
        let mut longer = encode_all(&all);
        longer.push(0);
        assert_eq!(decode_all(&longer), None);
        assert_eq!(decode_all(&[1, 0]), None);
        assert_eq!(decode_all(&[]), None);
    }
}
