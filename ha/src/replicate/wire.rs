//! The replication stream's messages on the wire.
//!
//! A message is `u32 length (little-endian) | u8 kind | payload`, the
//! length counting the kind and the payload, at most [`MAX_MESSAGE`]. The
//! leader speaks first ([`Msg::Hello`], with the protocol [`VERSION`], the
//! store the connection streams and the cluster secret), the standby
//! answers [`Msg::Welcome`] or [`Msg::Reject`]; then the leader sends a
//! snapshot ([`Msg::SnapshotBegin`], parts, [`Msg::SnapshotEnd`]) and
//! frames, and the standby sends [`Msg::Ack`]s. Every message of the leader
//! after the hello names its epoch. Integers are little-endian.
//!
//! One connection streams one durable store ([`Dialect`]): vLLM's, or
//! SGLang's spaces', whose connection also carries the catalog naming each
//! space ([`Msg::Space`]: in the snapshot, and before the first record of a
//! space created since). Version 1 (before SGLang's spaces were replicated)
//! had a hello of kind 1 without version or store: it decodes as version 1
//! of vLLM's store, which a standby refuses by its version.

use crate::core::Dialect;
use std::io::{self, Read, Write};

/// The protocol version this build speaks; a standby refuses a hello of
/// any other, naming both.
pub const VERSION: u16 = 2;

/// The largest message accepted (a frame of one writer batch, a snapshot
/// part): 64 MiB.
pub const MAX_MESSAGE: usize = 64 << 20;

/// One message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// Leader → standby: who speaks, at which epoch, with which secret,
    /// streaming which store in which protocol version.
    Hello {
        /// The protocol version ([`VERSION`]).
        version: u16,
        /// The durable store this connection streams.
        store: Dialect,
        /// The cluster secret (`--ha-token-file`).
        token: Vec<u8>,
        /// The leader's epoch.
        epoch: u64,
        /// The leader's node id.
        leader: String,
    },
    /// Standby → leader: the hello is accepted.
    Welcome,
    /// Standby → leader: refused, and why; the standby closes.
    Reject(String),
    /// A snapshot starts: the standby forgets its state.
    SnapshotBegin {
        /// The leader's epoch.
        epoch: u64,
    },
    /// Records of the snapshot (rank creations and bindings, codec-encoded).
    SnapshotPart {
        /// The leader's epoch.
        epoch: u64,
        /// The encoded records.
        records: Vec<u8>,
    },
    /// The snapshot is complete: it covers every change up to `upto`.
    SnapshotEnd {
        /// The leader's epoch.
        epoch: u64,
        /// The position it covers.
        upto: u64,
    },
    /// One written log entry ([`crate::durable::tap::Frame`]).
    Frame {
        /// The leader's epoch.
        epoch: u64,
        /// The generation of the records.
        generation: u64,
        /// A `/clear` came first.
        clear: bool,
        /// The position the previous frame ended at.
        from: u64,
        /// The last position covered.
        upto: u64,
        /// The encoded records.
        records: Vec<u8>,
    },
    /// Standby → leader: every position up to this one is applied and
    /// durable here.
    Ack {
        /// The position.
        upto: u64,
    },
    /// Leader → standby, on SGLang's connection only: space `id` is SGLang's
    /// `(rank, namespace)` of `num_pages` pages (a line of the catalog).
    Space {
        /// The leader's epoch.
        epoch: u64,
        /// The space's id (its rank in the spaces' durable store).
        id: u32,
        /// SGLang's rank.
        rank: u32,
        /// Its size.
        num_pages: u32,
        /// SGLang's namespace.
        namespace: String,
    },
}

const HELLO: u8 = 1;
const WELCOME: u8 = 2;
const REJECT: u8 = 3;
const SNAP_BEGIN: u8 = 4;
const SNAP_PART: u8 = 5;
const SNAP_END: u8 = 6;
const FRAME: u8 = 7;
const ACK: u8 = 8;
/// A hello with a version and a store (version 2 on).
const HELLO2: u8 = 9;
const SPACE: u8 = 10;

/// Bytes before a frame's records: kind, four `u64`s, the clear flag.
const FRAME_HEAD: usize = 1 + 4 * 8 + 1;
/// Bytes before a snapshot part's records: kind, epoch.
const PART_HEAD: usize = 1 + 8;

impl Msg {
    /// The leader's epoch this message names (0 for the standby's messages).
    pub fn epoch(&self) -> u64 {
        match self {
            Msg::Hello { epoch, .. }
            | Msg::SnapshotBegin { epoch }
            | Msg::SnapshotPart { epoch, .. }
            | Msg::SnapshotEnd { epoch, .. }
            | Msg::Frame { epoch, .. }
            | Msg::Space { epoch, .. } => *epoch,
            Msg::Welcome | Msg::Reject(_) | Msg::Ack { .. } => 0,
        }
    }

    /// Appends the encoded message to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        match self {
            Msg::Hello { version, store, token, epoch, leader } => {
                out.push(HELLO2);
                out.extend_from_slice(&version.to_le_bytes());
                out.push(store.index() as u8);
                out.extend_from_slice(&(token.len() as u32).to_le_bytes());
                out.extend_from_slice(token);
                out.extend_from_slice(&epoch.to_le_bytes());
                out.extend_from_slice(leader.as_bytes());
            }
            Msg::Welcome => out.push(WELCOME),
            Msg::Reject(why) => {
                out.push(REJECT);
                out.extend_from_slice(why.as_bytes());
            }
            Msg::SnapshotBegin { epoch } => {
                out.push(SNAP_BEGIN);
                out.extend_from_slice(&epoch.to_le_bytes());
            }
            Msg::SnapshotPart { epoch, records } => {
                out.push(SNAP_PART);
                out.extend_from_slice(&epoch.to_le_bytes());
                out.extend_from_slice(records);
            }
            Msg::SnapshotEnd { epoch, upto } => {
                out.push(SNAP_END);
                out.extend_from_slice(&epoch.to_le_bytes());
                out.extend_from_slice(&upto.to_le_bytes());
            }
            Msg::Frame { epoch, generation, clear, from, upto, records } => {
                out.push(FRAME);
                for v in [*epoch, *generation, *from, *upto] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                out.push(u8::from(*clear));
                out.extend_from_slice(records);
            }
            Msg::Ack { upto } => {
                out.push(ACK);
                out.extend_from_slice(&upto.to_le_bytes());
            }
            Msg::Space { epoch, id, rank, num_pages, namespace } => {
                out.push(SPACE);
                out.extend_from_slice(&epoch.to_le_bytes());
                for v in [*id, *rank, *num_pages] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                out.extend_from_slice(namespace.as_bytes());
            }
        }
        let len = (out.len() - start - 4) as u32;
        out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    }

    /// Writes the message.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let mut buf = Vec::new();
        self.encode(&mut buf);
        w.write_all(&buf)
    }

    /// Reads one message; `InvalidData` for a malformed one. The body is
    /// read into one buffer, not zeroed first, which a frame's or snapshot
    /// part's records then keep ([`Msg::decode_owned`]).
    pub fn read_from(r: &mut impl Read) -> io::Result<Msg> {
        let mut len = [0; 4];
        r.read_exact(&mut len)?;
        let len = u32::from_le_bytes(len) as usize;
        if len == 0 || len > MAX_MESSAGE {
            return Err(bad(format!("a message of {len} bytes")));
        }
        let mut body = Vec::with_capacity(len);
        r.take(len as u64).read_to_end(&mut body)?;
        if body.len() < len {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the connection ended inside a message"));
        }
        Self::decode_owned(body)
    }

    /// Decodes one message body, as [`Msg::decode`] does, reusing `body`'s
    /// buffer for the records of a frame or a snapshot part (no copy of
    /// them beyond moving them to the buffer's start).
    pub fn decode_owned(mut body: Vec<u8>) -> io::Result<Msg> {
        let m = Self::decode_with(&body, false)?;
        Ok(match m {
            Msg::Frame { epoch, generation, clear, from, upto, .. } => {
                body.drain(..FRAME_HEAD);
                Msg::Frame { epoch, generation, clear, from, upto, records: body }
            }
            Msg::SnapshotPart { epoch, .. } => {
                body.drain(..PART_HEAD);
                Msg::SnapshotPart { epoch, records: body }
            }
            m => m,
        })
    }

    /// Decodes one message body (kind and payload).
    pub fn decode(body: &[u8]) -> io::Result<Msg> {
        Self::decode_with(body, true)
    }

    /// Decodes `body`; the records of a frame or snapshot part are copied
    /// only if `copy` (else left empty for [`Msg::decode_owned`]).
    fn decode_with(body: &[u8], copy: bool) -> io::Result<Msg> {
        let records = |p: &[u8]| if copy { p.to_vec() } else { Vec::new() };
        let (&kind, mut p) = body.split_first().ok_or_else(|| bad("an empty message".into()))?;
        let m = match kind {
            HELLO | HELLO2 => {
                let (version, store) = if kind == HELLO {
                    (1, Dialect::Vllm)
                } else {
                    let version = u16::from_le_bytes(take(&mut p, 2)?.try_into().expect("2 bytes"));
                    let store = match take(&mut p, 1)?[0] {
                        0 => Dialect::Vllm,
                        1 => Dialect::Sglang,
                        s => return Err(bad(format!("a store of {s}"))),
                    };
                    (version, store)
                };
                let n = take_u32(&mut p)? as usize;
                let token = take(&mut p, n)?.to_vec();
                let epoch = take_u64(&mut p)?;
                let leader = String::from_utf8(p.to_vec()).map_err(|_| bad("a leader id not in UTF-8".into()))?;
                Msg::Hello { version, store, token, epoch, leader }
            }
            WELCOME if p.is_empty() => Msg::Welcome,
            REJECT => Msg::Reject(String::from_utf8_lossy(p).into_owned()),
            SNAP_BEGIN => Msg::SnapshotBegin { epoch: take_u64(&mut p)? },
            SNAP_PART => Msg::SnapshotPart { epoch: take_u64(&mut p)?, records: records(p) },
            SNAP_END => Msg::SnapshotEnd { epoch: take_u64(&mut p)?, upto: take_u64(&mut p)? },
            FRAME => {
                let (epoch, generation) = (take_u64(&mut p)?, take_u64(&mut p)?);
                let (from, upto) = (take_u64(&mut p)?, take_u64(&mut p)?);
                let clear = match take(&mut p, 1)?[0] {
                    0 => false,
                    1 => true,
                    c => return Err(bad(format!("a clear flag of {c}"))),
                };
                if from > upto {
                    return Err(bad(format!("a frame from {from} to {upto}")));
                }
                Msg::Frame { epoch, generation, clear, from, upto, records: records(p) }
            }
            ACK => Msg::Ack { upto: take_u64(&mut p)? },
            SPACE => {
                let epoch = take_u64(&mut p)?;
                let (id, rank, num_pages) = (take_u32(&mut p)?, take_u32(&mut p)?, take_u32(&mut p)?);
                let namespace = String::from_utf8(p.to_vec()).map_err(|_| bad("a namespace not in UTF-8".into()))?;
                Msg::Space { epoch, id, rank, num_pages, namespace }
            }
            k => return Err(bad(format!("a message of kind {k}"))),
        };
        let fixed = matches!(m, Msg::SnapshotBegin { .. } | Msg::SnapshotEnd { .. } | Msg::Ack { .. });
        if fixed && !p.is_empty() {
            return Err(bad("trailing bytes after a message".into()));
        }
        Ok(m)
    }
}

fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("malformed replication message: {what}"))
}

fn take<'a>(p: &mut &'a [u8], n: usize) -> io::Result<&'a [u8]> {
    if p.len() < n {
        return Err(bad(format!("{} bytes where {n} were expected", p.len())));
    }
    let (head, rest) = p.split_at(n);
    *p = rest;
    Ok(head)
}

fn take_u32(p: &mut &[u8]) -> io::Result<u32> {
    Ok(u32::from_le_bytes(take(p, 4)?.try_into().expect("4 bytes")))
}

fn take_u64(p: &mut &[u8]) -> io::Result<u64> {
    Ok(u64::from_le_bytes(take(p, 8)?.try_into().expect("8 bytes")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips_and_garbage_is_refused() {
        let all = [
            Msg::Hello {
                version: VERSION,
                store: Dialect::Vllm,
                token: b"secret-secret-16".to_vec(),
                epoch: 7,
                leader: "a".into(),
            },
            Msg::Hello { version: 3, store: Dialect::Sglang, token: vec![], epoch: 1, leader: "ключ".into() },
            Msg::Space { epoch: 7, id: 2, rank: 1, num_pages: 64, namespace: "kv \" ключ".into() },
            Msg::Welcome,
            Msg::Reject("no".into()),
            Msg::SnapshotBegin { epoch: 7 },
            Msg::SnapshotPart { epoch: 7, records: vec![1, 2, 3] },
            Msg::SnapshotEnd { epoch: 7, upto: 99 },
            Msg::Frame { epoch: 7, generation: 2, clear: true, from: 3, upto: 9, records: vec![4] },
            Msg::Ack { upto: 12 },
        ];
        let mut buf = Vec::new();
        for m in &all {
            m.encode(&mut buf);
        }
        let mut r = &buf[..];
        for m in &all {
            assert_eq!(&Msg::read_from(&mut r).unwrap(), m);
        }
        assert!(r.is_empty());
        for body in [&[][..], &[99], &[ACK, 1], &[SNAP_END, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]] {
            assert_eq!(Msg::decode(body).unwrap_err().kind(), io::ErrorKind::InvalidData, "{body:?}");
        }
        let huge = ((MAX_MESSAGE + 1) as u32).to_le_bytes();
        assert!(Msg::read_from(&mut &huge[..]).is_err());
    }

    #[test]
    fn a_hello_names_its_version_and_store_and_forged_ones_are_refused() {
        // Version 1's hello (no version, no store) reads as version 1 of
        // vLLM's store: a standby then refuses it by its version.
        let mut v1 = vec![HELLO];
        v1.extend_from_slice(&3u32.to_le_bytes());
        v1.extend_from_slice(b"abc");
        v1.extend_from_slice(&9u64.to_le_bytes());
        v1.extend_from_slice(b"old");
        let old = Msg::decode(&v1).unwrap();
        assert_eq!(
            old,
            Msg::Hello { version: 1, store: Dialect::Vllm, token: b"abc".to_vec(), epoch: 9, leader: "old".into() }
        );
        // A store byte that names no store, a token longer than the message,
        // a cut version, a namespace not in UTF-8: refused.
        let mut forged = Vec::new();
        Msg::Hello { version: VERSION, store: Dialect::Sglang, token: b"t".to_vec(), epoch: 1, leader: "a".into() }
            .encode(&mut forged);
        let body = &mut forged[4..];
        assert_eq!(body[3], 1, "the store byte");
        body[3] = 2;
        assert!(Msg::decode(body).unwrap_err().to_string().contains("a store of 2"));
        body[3] = 1;
        body[4] = 200;
        assert!(Msg::decode(body).is_err(), "a token length beyond the message");
        assert!(Msg::decode(&[HELLO2, 2]).is_err(), "a version cut short");
        let mut space = Vec::new();
        Msg::Space { epoch: 1, id: 0, rank: 0, num_pages: 1, namespace: "kv".into() }.encode(&mut space);
        let n = space.len();
        space[n - 1] = 0xFF;
        assert!(Msg::decode(&space[4..]).is_err(), "a namespace not in UTF-8");
        assert!(Msg::decode(&space[4..4 + 1 + 8 + 8]).is_err(), "a space cut short");
    }
}
