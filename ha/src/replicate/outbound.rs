//! What a leader writes on a replication stream and reads back: messages,
//! the snapshot of a store in parts, the catalog's spaces, and the
//! standby's acknowledgements.

use super::wire::{Feature, Msg, Range, Session};
use crate::core::{Dialect, PageSource, Visit};
use crate::durable::codec;
use crate::durable::spaces::{Catalog, CatalogEntry};
use hf3fs_meta_tls::duplex::Stream as Conn;
use std::io::{BufWriter, Read as _, Write as _};

/// The hello of a session at `expected` (the version the standby's
/// published range agrees on): to a version-2 standby, version 2's hello,
/// byte for byte. A tenant's store (`tenant`) is streamed only on a
/// session with [`Feature::Tenants`] (checked by the caller).
pub(super) fn hello(
    expected: Session,
    store: Dialect,
    tenant: Option<&str>,
    token: &[u8],
    epoch: u64,
    leader: &str,
) -> Msg {
    debug_assert!(tenant.is_none() || expected.has(Feature::Tenants));
    if expected.has(Feature::Agreed) {
        Msg::HelloRange {
            range: Range::THIS,
            store,
            token: token.to_vec(),
            epoch,
            release: crate::RELEASE.into(),
            leader: leader.to_string(),
            tenant: tenant.map(str::to_string),
        }
    } else {
        Msg::Hello { version: expected.version(), store, token: token.to_vec(), epoch, leader: leader.to_string() }
    }
}

/// Why the standby's answer to the hello ends the session.
pub(super) struct Refused {
    /// What to log.
    pub(super) why: String,
    /// The standby speaks no version this node does.
    pub(super) incompatible: bool,
}

/// The session the standby's `answer` to the hello of [`hello`] agrees
/// on, and the standby's release.
pub(super) fn agreed(expected: Session, answer: Msg) -> Result<(Session, String), Refused> {
    let refused = |why: String| Refused { why, incompatible: false };
    match answer {
        Msg::Welcome if !expected.has(Feature::Agreed) => Ok((expected, "a release of protocol 2".to_string())),
        Msg::Agreed { version, release } if expected.has(Feature::Agreed) && Range::THIS.contains(version) => {
            Ok((Session::at(version), release))
        }
        Msg::Reject(why) => Err(Refused {
            incompatible: why.contains("no version in common"),
            why: format!("the standby refused: {why}"),
        }),
        m => Err(refused(format!("an unexpected answer {m:?} to a hello of protocol {}", expected.version()))),
    }
}

/// Bytes of records per snapshot part.
const PART_BYTES: usize = 4 << 20;

/// Sends the store's state as of (at least) position `r` (with SGLang's
/// catalog, read now: after `r`) on `wr`.
pub(super) fn send_snapshot(
    wr: &mut BufWriter<Conn>,
    catalog: Option<&Catalog>,
    store: &dyn PageSource,
    epoch: u64,
    r: u64,
) -> Result<(), String> {
    send(wr, &Msg::SnapshotBegin { epoch })?;
    // Spaces beyond the catalog read here were made after it, after `r`:
    // their records, and their names, come in the stream.
    let mut spaces = u32::MAX;
    if let Some(c) = catalog {
        let entries = c.entries();
        spaces = entries.len() as u32;
        for e in entries {
            send(wr, &space(epoch, e))?;
        }
    }
    let mut buf = Vec::with_capacity(PART_BYTES + 1024);
    let mut failed = None;
    store.snapshot(&mut |v| {
        let rank = match v {
            Visit::Generation(_) => 0,
            Visit::Rank { rank, .. }
            | Visit::Binding { rank, .. }
            | Visit::Reserved { rank, .. }
            | Visit::Held { rank, .. } => rank,
        };
        if rank >= spaces {
            return true;
        }
        match v {
            Visit::Generation(_) => {}
            Visit::Rank { rank, num_pages } => codec::put_initialize(&mut buf, rank, num_pages),
            Visit::Binding { rank, page, key, world } => codec::put_bind(&mut buf, rank, page, world, key.as_ref()),
            Visit::Reserved { rank, page, tag } => codec::put_reserve(&mut buf, rank, page, tag),
            Visit::Held { rank, page } => codec::put_hold(&mut buf, rank, page),
        }
        if buf.len() >= PART_BYTES {
            let part = Msg::SnapshotPart { epoch, records: std::mem::take(&mut buf) };
            if let Err(e) = send(wr, &part) {
                failed = Some(e);
                return false;
            }
        }
        true
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    send(wr, &Msg::SnapshotPart { epoch, records: buf })?;
    send(wr, &Msg::SnapshotEnd { epoch, upto: r })?;
    wr.flush().map_err(|e| e.to_string())
}

/// The catalog's line `e` as a message of `epoch`.
pub(super) fn space(epoch: u64, e: CatalogEntry) -> Msg {
    Msg::Space { epoch, id: e.id, rank: e.rank, num_pages: e.num_pages, namespace: e.namespace }
}

/// Writes `m`.
pub(super) fn send(wr: &mut BufWriter<Conn>, m: &Msg) -> Result<(), String> {
    m.write_to(wr).map_err(|e| format!("writing to the standby: {e}"))
}

/// The standby's messages, read from a socket with a short read timeout
/// ([`super::leader`]'s tick) so that its silence can be timed: bytes are kept across
/// timeouts and a message is decoded once whole, so a timeout never cuts
/// one.
pub(super) struct AckReader {
    pub(super) stream: Conn,
    pub(super) buf: Vec<u8>,
}

impl AckReader {
    /// The next message; `Ok(None)` when the read timed out first.
    pub(super) fn next(&mut self) -> std::io::Result<Option<Msg>> {
        use std::io::ErrorKind;
        loop {
            if self.buf.len() >= 4 {
                let len = u32::from_le_bytes(self.buf[..4].try_into().expect("4 bytes")) as usize;
                if len == 0 || len > super::wire::MAX_MESSAGE {
                    return Err(std::io::Error::new(ErrorKind::InvalidData, format!("a message of {len} bytes")));
                }
                if self.buf.len() >= 4 + len {
                    let m = Msg::decode(&self.buf[4..4 + len]);
                    self.buf.drain(..4 + len);
                    return m.map(Some);
                }
            }
            let mut chunk = [0u8; 512];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(k) => self.buf.extend_from_slice(&chunk[..k]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return Ok(None),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}
