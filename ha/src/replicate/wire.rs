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
//!
//! # Versions across releases
//!
//! A build speaks a [`Range`] of versions, [`MIN_VERSION`] to [`VERSION`]:
//! its own release's and the previous release's, so that a cluster can be
//! upgraded node by node (CHANGELOG.md names each release's). A session
//! runs at the highest version both ends speak:
//!
//! - To a peer that speaks version 2 at most (0.1.0, which publishes no
//!   range in etcd), the leader sends version 2's hello
//!   ([`Msg::Hello`] of kind 9, version 2) and the standby answers
//!   [`Msg::Welcome`]: the session is version 2's, byte for byte.
//! - To a peer that speaks 3 or later, the leader sends its range and
//!   release ([`Msg::HelloRange`]); the standby picks the highest version in
//!   both ranges and answers it with its release ([`Msg::Agreed`]), or
//!   refuses ([`Msg::Reject`]) naming both ranges when they do not overlap.
//!
//! Everything a session sends beyond version 2's messages is a
//! [`Feature`] checked through [`Session::has`], the one gate: a feature
//! of version 3 (the heartbeats of the liveness work, say) is sent only on
//! a session that agreed on 3, so a version-3 node speaks plain version 2
//! to a version-2 peer. Version 3 is release 0.2.0's protocol: every wire
//! feature that 0.2.0 adds belongs to it. A feature that outlives a session
//! (a new record kind in the journal, which a later standby reads in its
//! snapshot) is gated by the cluster's version instead, the highest that
//! every member speaks, recorded in etcd ([`crate::version`]).

use crate::core::Dialect;
use std::io::{self, Read, Write};

/// The newest protocol version this build speaks (the unreleased tree's:
/// version 3, release 0.2.0's, and the tenants' streams, [`Feature::Tenants`]).
pub const VERSION: u16 = 4;

/// The oldest protocol version this build speaks (release 0.1.0's, the
/// previous release).
pub const MIN_VERSION: u16 = 2;

/// A range of protocol versions, `min` to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// The oldest version spoken.
    pub min: u16,
    /// The newest version spoken.
    pub max: u16,
}

impl Range {
    /// This build's range.
    pub const THIS: Range = Range { min: MIN_VERSION, max: VERSION };

    /// The range of a node that publishes none: a release before ranges
    /// (0.1.0), which speaks version 2 only.
    pub const LEGACY: Range = Range { min: 2, max: 2 };

    /// The versions both speak, if any.
    pub fn common(self, other: Range) -> Option<Range> {
        let (min, max) = (self.min.max(other.min), self.max.min(other.max));
        (min <= max).then_some(Range { min, max })
    }

    /// Whether `v` is in the range.
    pub fn contains(self, v: u16) -> bool {
        self.min <= v && v <= self.max
    }
}

impl std::fmt::Display for Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}-{}", self.min, self.max)
        }
    }
}

/// What a session may send beyond version 2's messages, by the version
/// that brought it. Check it through [`Session::has`] only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// The standby's answer names the version agreed and its release
    /// ([`Msg::Agreed`] instead of [`Msg::Welcome`]).
    Agreed,
    /// A connection may stream a tenant's store ([`Msg::HelloRange`] with
    /// a `tenant`, kind 13): a standby that speaks it applies the records
    /// into that tenant's state; and the server's own vLLM connection
    /// carries the leader's tenants ([`Msg::Tenants`], kind 14), which the
    /// standby's tenants follow.
    Tenants,
}

impl Feature {
    /// The first protocol version with it.
    pub const fn since(self) -> u16 {
        match self {
            Feature::Agreed => 3,
            Feature::Tenants => 4,
        }
    }
}

/// The version one replication session runs at: the highest both ends
/// speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    version: u16,
}

impl Session {
    /// The session of a leader speaking `leader` with a standby speaking
    /// `standby`; `None` when they have no version in common.
    pub fn agree(leader: Range, standby: Range) -> Option<Session> {
        leader.common(standby).map(|c| Session { version: c.max })
    }

    /// A session at `version` (a legacy hello names one version only).
    pub fn at(version: u16) -> Session {
        Session { version }
    }

    /// The version.
    pub fn version(self) -> u16 {
        self.version
    }

    /// Whether this session may send `f`: the one gate of every message
    /// beyond version 2's.
    pub fn has(self, f: Feature) -> bool {
        self.version >= f.since()
    }
}

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
    /// Leader → standby (version 3 on): a hello naming the range of
    /// versions the leader speaks and its release; answered
    /// [`Msg::Agreed`] or [`Msg::Reject`].
    HelloRange {
        /// The versions the leader speaks.
        range: Range,
        /// The durable store this connection streams.
        store: Dialect,
        /// The cluster secret (`--ha-token-file`).
        token: Vec<u8>,
        /// The leader's epoch.
        epoch: u64,
        /// The leader's release (`0.2.0`).
        release: String,
        /// The leader's node id.
        leader: String,
        /// The tenant whose store this connection streams (version 4 on,
        /// [`Feature::Tenants`]; encoded as kind 13); `None`: the server's
        /// own stores (the tenant `default`'s).
        tenant: Option<String>,
    },
    /// Standby → leader: the hello is accepted (version 2's answer).
    Welcome,
    /// Standby → leader, to a [`Msg::HelloRange`]: accepted; the session
    /// runs at `version` (a version-2 session is answered
    /// [`Msg::Welcome`] instead).
    Agreed {
        /// The version agreed: the highest both speak.
        version: u16,
        /// The standby's release.
        release: String,
    },
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
    /// Leader → standby, on the server's own vLLM connection only
    /// ([`Feature::Tenants`]): the leader's tenants (`--tenants`), before
    /// every snapshot and again whenever a reload changes them. The
    /// standby serves and holds only these: a tenant of its own that is in
    /// neither list is removed there, its state deleted.
    Tenants {
        /// The leader's epoch.
        epoch: u64,
        /// The tenants the leader serves (but `default`).
        served: Vec<String>,
        /// The tenants the leader keeps but does not serve (disabled).
        kept: Vec<String>,
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
/// A hello with a range of versions and a release (version 3 on).
const HELLO_RANGE: u8 = 11;
const AGREED: u8 = 12;
/// A hello of a tenant's store: [`HELLO_RANGE`]'s, then the tenant's name
/// (version 4 on).
const HELLO_TENANT: u8 = 13;
/// The leader's tenants (version 4 on).
const TENANTS: u8 = 14;

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
            | Msg::Space { epoch, .. }
            | Msg::Tenants { epoch, .. } => *epoch,
            Msg::HelloRange { epoch, .. } => *epoch,
            Msg::Welcome | Msg::Agreed { .. } | Msg::Reject(_) | Msg::Ack { .. } => 0,
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
            Msg::HelloRange { range, store, token, epoch, release, leader, tenant } => {
                out.push(if tenant.is_some() { HELLO_TENANT } else { HELLO_RANGE });
                out.extend_from_slice(&range.min.to_le_bytes());
                out.extend_from_slice(&range.max.to_le_bytes());
                out.push(store.index() as u8);
                out.extend_from_slice(&(token.len() as u32).to_le_bytes());
                out.extend_from_slice(token);
                out.extend_from_slice(&epoch.to_le_bytes());
                put_short(out, release);
                if let Some(t) = tenant {
                    put_short(out, t);
                }
                out.extend_from_slice(leader.as_bytes());
            }
            Msg::Welcome => out.push(WELCOME),
            Msg::Agreed { version, release } => {
                out.push(AGREED);
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(release.as_bytes());
            }
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
            Msg::Tenants { epoch, served, kept } => {
                out.push(TENANTS);
                out.extend_from_slice(&epoch.to_le_bytes());
                for list in [served, kept] {
                    out.extend_from_slice(&(list.len() as u32).to_le_bytes());
                    for name in list {
                        put_short(out, name);
                    }
                }
            }
        }
        let len = (out.len() - start - 4) as u32;
        out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    }

    /// Writes the message (the bytes [`Msg::encode`] appends). A frame's or
    /// snapshot part's records are written from where they are, after
    /// their message's head, rather than copied into one buffer first.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let (records, head) = match self {
            Msg::Frame { records, .. } => (records, FRAME_HEAD),
            Msg::SnapshotPart { records, .. } => (records, PART_HEAD),
            _ => {
                let mut buf = Vec::new();
                self.encode(&mut buf);
                return w.write_all(&buf);
            }
        };
        // The head as `encode` writes it: the length prefix counts the records.
        let mut buf = Vec::with_capacity(4 + head);
        let body = match self {
            Msg::Frame { epoch, generation, clear, from, upto, .. } => Msg::Frame {
                epoch: *epoch,
                generation: *generation,
                clear: *clear,
                from: *from,
                upto: *upto,
                records: Vec::new(),
            },
            _ => Msg::SnapshotPart { epoch: self.epoch(), records: Vec::new() },
        };
        body.encode(&mut buf);
        let len = u32::try_from(buf.len() - 4 + records.len()).map_err(|_| bad("a message over 4 GiB".into()))?;
        buf[..4].copy_from_slice(&len.to_le_bytes());
        w.write_all(&buf)?;
        w.write_all(records)
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
                    (version, take_store(&mut p)?)
                };
                let n = take_u32(&mut p)? as usize;
                let token = take(&mut p, n)?.to_vec();
                let epoch = take_u64(&mut p)?;
                let leader = String::from_utf8(p.to_vec()).map_err(|_| bad("a leader id not in UTF-8".into()))?;
                Msg::Hello { version, store, token, epoch, leader }
            }
            HELLO_RANGE | HELLO_TENANT => {
                let min = u16::from_le_bytes(take(&mut p, 2)?.try_into().expect("2 bytes"));
                let max = u16::from_le_bytes(take(&mut p, 2)?.try_into().expect("2 bytes"));
                if min > max {
                    return Err(bad(format!("a range of versions from {min} to {max}")));
                }
                let store = take_store(&mut p)?;
                let n = take_u32(&mut p)? as usize;
                let token = take(&mut p, n)?.to_vec();
                let epoch = take_u64(&mut p)?;
                let release = take_short(&mut p)?;
                let tenant = match kind {
                    HELLO_TENANT => Some(take_short(&mut p)?).filter(|t| !t.is_empty()),
                    _ => None,
                };
                if kind == HELLO_TENANT && tenant.is_none() {
                    return Err(bad("a tenant's hello naming no tenant".into()));
                }
                let leader = String::from_utf8(p.to_vec()).map_err(|_| bad("a leader id not in UTF-8".into()))?;
                Msg::HelloRange { range: Range { min, max }, store, token, epoch, release, leader, tenant }
            }
            WELCOME if p.is_empty() => Msg::Welcome,
            AGREED => {
                let version = u16::from_le_bytes(take(&mut p, 2)?.try_into().expect("2 bytes"));
                let release = String::from_utf8(p.to_vec()).map_err(|_| bad("a release not in UTF-8".into()))?;
                Msg::Agreed { version, release }
            }
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
            TENANTS => {
                let epoch = take_u64(&mut p)?;
                let mut lists = [Vec::new(), Vec::new()];
                for list in &mut lists {
                    let n = take_u32(&mut p)? as usize;
                    if n > p.len() {
                        return Err(bad(format!("{n} tenants in {} bytes", p.len())));
                    }
                    for _ in 0..n {
                        list.push(take_short(&mut p)?);
                    }
                }
                let [served, kept] = lists;
                Msg::Tenants { epoch, served, kept }
            }
            k => return Err(bad(format!("a message of kind {k}"))),
        };
        let fixed =
            matches!(m, Msg::SnapshotBegin { .. } | Msg::SnapshotEnd { .. } | Msg::Ack { .. } | Msg::Tenants { .. });
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

fn take_store(p: &mut &[u8]) -> io::Result<Dialect> {
    match take(p, 1)?[0] {
        0 => Ok(Dialect::Vllm),
        1 => Ok(Dialect::Sglang),
        s => Err(bad(format!("a store of {s}"))),
    }
}

/// A string of at most 255 bytes, after its `u8` length (cut at a
/// character boundary when longer).
fn put_short(out: &mut Vec<u8>, s: &str) {
    let mut n = s.len().min(255);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    out.push(n as u8);
    out.extend_from_slice(&s.as_bytes()[..n]);
}

fn take_short(p: &mut &[u8]) -> io::Result<String> {
    let n = take(p, 1)?[0] as usize;
    String::from_utf8(take(p, n)?.to_vec()).map_err(|_| bad("a string not in UTF-8".into()))
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
            Msg::HelloRange {
                range: Range::THIS,
                store: Dialect::Sglang,
                token: b"secret-secret-16".to_vec(),
                epoch: 8,
                release: "0.2.0".into(),
                leader: "ключ".into(),
                tenant: None,
            },
            Msg::HelloRange {
                range: Range::THIS,
                store: Dialect::Vllm,
                token: b"secret-secret-16".to_vec(),
                epoch: 8,
                release: "0.3.0".into(),
                leader: "b".into(),
                tenant: Some("team-a".into()),
            },
            Msg::Agreed { version: 3, release: "0.2.0".into() },
            Msg::Welcome,
            Msg::Reject("no".into()),
            Msg::SnapshotBegin { epoch: 7 },
            Msg::SnapshotPart { epoch: 7, records: vec![1, 2, 3] },
            Msg::SnapshotEnd { epoch: 7, upto: 99 },
            Msg::Frame { epoch: 7, generation: 2, clear: true, from: 3, upto: 9, records: vec![4] },
            Msg::Ack { upto: 12 },
            Msg::Tenants { epoch: 7, served: vec!["a".into(), "team-b".into()], kept: vec!["off".into()] },
            Msg::Tenants { epoch: 8, served: vec![], kept: vec![] },
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
        // A list of tenants longer than its message, a trailing byte.
        let many = [TENANTS, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff];
        assert!(Msg::decode(&many).unwrap_err().to_string().contains("tenants in 0 bytes"));
        let mut t = Vec::new();
        Msg::Tenants { epoch: 1, served: vec!["a".into()], kept: vec![] }.encode(&mut t);
        t.push(0);
        assert!(Msg::decode(&t[4..]).unwrap_err().to_string().contains("trailing"));
        let huge = ((MAX_MESSAGE + 1) as u32).to_le_bytes();
        assert!(Msg::read_from(&mut &huge[..]).is_err());
    }

    #[test]
    fn write_to_writes_the_bytes_encode_appends() {
        let records: Vec<u8> = (0..=255).collect();
        for m in [
            Msg::Frame { epoch: 7, generation: 2, clear: true, from: 3, upto: 9, records: records.clone() },
            Msg::Frame { epoch: 7, generation: 0, clear: false, from: 9, upto: 9, records: vec![] },
            Msg::SnapshotPart { epoch: 7, records },
            Msg::SnapshotPart { epoch: 1, records: vec![] },
            Msg::Ack { upto: 12 },
            Msg::Reject("no".into()),
        ] {
            let (mut encoded, mut written) = (Vec::new(), Vec::new());
            m.encode(&mut encoded);
            m.write_to(&mut written).unwrap();
            assert_eq!(written, encoded, "{m:?}");
        }
    }

    #[test]
    fn a_session_runs_at_the_highest_version_both_speak() {
        let prev = Range::LEGACY;
        let future = Range { min: VERSION + 1, max: VERSION + 2 };
        assert_eq!(Session::agree(Range::THIS, Range::THIS).map(Session::version), Some(VERSION));
        assert_eq!(Session::agree(Range::THIS, prev).map(Session::version), Some(2));
        assert_eq!(Session::agree(prev, Range::THIS).map(Session::version), Some(2));
        assert_eq!(Session::agree(Range::THIS, future), None, "no version in common");
        assert_eq!(Session::agree(Range { min: 2, max: 9 }, Range::THIS).map(Session::version), Some(VERSION));
        // A version-2 session sends nothing of version 3.
        assert!(!Session::at(2).has(Feature::Agreed));
        assert!(Session::at(3).has(Feature::Agreed));
        // Tenants' streams: version 4 only (release 0.2.0 speaks 2-3).
        assert!(!Session::at(3).has(Feature::Tenants));
        assert!(Session::agree(Range::THIS, Range { min: 2, max: 3 }).is_some_and(|s| !s.has(Feature::Tenants)));
        assert!(Session::at(4).has(Feature::Tenants));
        assert_eq!((Range::THIS.to_string(), prev.to_string()), ("2-4".to_string(), "2".to_string()));
        // The range hello refuses a range upside down and a cut release.
        let mut b = Vec::new();
        Msg::HelloRange {
            range: Range::THIS,
            store: Dialect::Vllm,
            token: vec![],
            epoch: 1,
            release: "r".into(),
            leader: "a".into(),
            tenant: None,
        }
        .encode(&mut b);
        let body = &mut b[4..];
        body[1] = 9; // min 9 > max 4
        assert!(Msg::decode(body).unwrap_err().to_string().contains("from 9 to 4"));
        // A tenant's hello naming an empty tenant is refused.
        let mut t = vec![HELLO_TENANT, 2, 0, 4, 0, 0, 0, 0, 0, 0];
        t.extend_from_slice(&1u64.to_le_bytes());
        t.extend_from_slice(&[1, b'r', 0, b'a']);
        assert!(Msg::decode(&t).unwrap_err().to_string().contains("naming no tenant"));
        assert!(Msg::decode(&[HELLO_RANGE, 2, 0, 3, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 5, b'x']).is_err());
    }

    #[test]
    fn the_hello_of_version_2_is_byte_for_byte_the_previous_releases() {
        // What release 0.1.0 (protocol 2) sends and expects, written out by
        // hand: kind 9, version 2, store, token, epoch, leader.
        let mut want = vec![HELLO2, 2, 0, 1];
        want.extend_from_slice(&4u32.to_le_bytes());
        want.extend_from_slice(b"tokn");
        want.extend_from_slice(&7u64.to_le_bytes());
        want.extend_from_slice(b"lead");
        let mut got = Vec::new();
        Msg::Hello { version: 2, store: Dialect::Sglang, token: b"tokn".to_vec(), epoch: 7, leader: "lead".into() }
            .encode(&mut got);
        assert_eq!(&got[4..], &want[..]);
        let mut welcome = Vec::new();
        Msg::Welcome.encode(&mut welcome);
        assert_eq!(welcome, [1, 0, 0, 0, WELCOME], "version 2's answer: an empty welcome");
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
