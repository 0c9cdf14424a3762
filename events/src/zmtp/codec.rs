//! ZMTP 3.x on the wire: the greeting, frames and commands, decoded from
//! a byte buffer incrementally (no I/O here) and encoded into one.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The greeting's length: signature (10), version (2), mechanism (20),
/// as-server (1), filler (31).
pub(crate) const GREETING: usize = 64;

/// A frame's flags: more frames follow, an 8-byte size, a command.
const MORE: u8 = 0x01;
const LONG: u8 = 0x02;
const COMMAND: u8 = 0x04;

/// Why a connection is dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Error {
    /// The greeting is not ZMTP's, or a version below 3, or a mechanism
    /// other than NULL.
    Greeting(&'static str),
    /// A frame with reserved flags set, a command with MORE, a frame over
    /// the limit.
    Frame(&'static str),
    /// A command that does not parse, or out of place.
    Command(&'static str),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Greeting(s) => write!(f, "bad greeting: {s}"),
            Error::Frame(s) => write!(f, "bad frame: {s}"),
            Error::Command(s) => write!(f, "bad command: {s}"),
        }
    }
}

/// The peer's greeting (what this side needs of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Greeting {
    /// The minor version (0: ZMTP 3.0, subscriptions as messages).
    pub(crate) minor: u8,
}

/// One frame: a message part or a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    pub(crate) more: bool,
    pub(crate) command: bool,
    pub(crate) body: Bytes,
}

/// A command: its name and data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Command {
    pub(crate) name: Bytes,
    pub(crate) data: Bytes,
}

impl Frame {
    /// The command this frame holds.
    pub(crate) fn command(&self) -> Result<Command, Error> {
        let b = &self.body;
        let Some(&n) = b.first() else { return Err(Error::Command("empty")) };
        let n = usize::from(n);
        if n == 0 || b.len() < 1 + n {
            return Err(Error::Command("name longer than the frame"));
        }
        Ok(Command { name: b.slice(1..1 + n), data: b.slice(1 + n..) })
    }
}

/// Decodes the peer's greeting, then its frames, from what was read.
pub(crate) struct Decoder {
    buf: BytesMut,
    greeted: bool,
    max: usize,
}

impl Decoder {
    /// A decoder that refuses frames over `max` bytes.
    pub(crate) fn new(max: usize) -> Self {
        Decoder { buf: BytesMut::with_capacity(4096), greeted: false, max }
    }

    /// The buffer to read into.
    pub(crate) fn buffer(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// The greeting, once its 64 bytes are read (`None`: more needed). A
    /// bad signature is refused from its first 10 bytes.
    pub(crate) fn greeting(&mut self) -> Result<Option<Greeting>, Error> {
        debug_assert!(!self.greeted);
        let b = &self.buf[..];
        if !b.is_empty() && b[0] != 0xff {
            return Err(Error::Greeting("not a ZMTP signature"));
        }
        if b.len() >= 10 && b[9] & 1 != 1 {
            return Err(Error::Greeting("not a ZMTP signature"));
        }
        if b.len() >= 11 && b[10] < 3 {
            return Err(Error::Greeting("ZMTP 3 or later required"));
        }
        if b.len() < GREETING {
            return Ok(None);
        }
        let minor = b[11];
        let mechanism = &b[12..32];
        let null = mechanism.starts_with(b"NULL") && mechanism[4..].iter().all(|&c| c == 0);
        if !null {
            return Err(Error::Greeting("only the NULL mechanism is supported"));
        }
        self.buf.advance(GREETING);
        self.greeted = true;
        Ok(Some(Greeting { minor }))
    }

    /// The next whole frame (`None`: more needed).
    pub(crate) fn frame(&mut self) -> Result<Option<Frame>, Error> {
        debug_assert!(self.greeted);
        let Some(&flags) = self.buf.first() else { return Ok(None) };
        if flags & !(MORE | LONG | COMMAND) != 0 {
            return Err(Error::Frame("reserved flags set"));
        }
        if flags & COMMAND != 0 && flags & MORE != 0 {
            return Err(Error::Frame("a command with more frames"));
        }
        let (head, size) = if flags & LONG != 0 {
            if self.buf.len() < 9 {
                return Ok(None);
            }
            (9, u64::from_be_bytes(self.buf[1..9].try_into().expect("8 bytes")))
        } else {
            if self.buf.len() < 2 {
                return Ok(None);
            }
            (2, u64::from(self.buf[1]))
        };
        if size > self.max as u64 {
            return Err(Error::Frame("larger than the limit"));
        }
        let size = size as usize;
        if self.buf.len() < head + size {
            self.buf.reserve(head + size - self.buf.len());
            return Ok(None);
        }
        self.buf.advance(head);
        let body = self.buf.split_to(size).freeze();
        Ok(Some(Frame { more: flags & MORE != 0, command: flags & COMMAND != 0, body }))
    }
}

/// This side's greeting: ZMTP 3.1, NULL.
pub(crate) fn greeting(out: &mut BytesMut, as_server: bool) {
    out.put_u8(0xff);
    out.put_bytes(0, 8);
    out.put_u8(0x7f);
    out.put_slice(&[3, 1]);
    let mut mechanism = [0u8; 20];
    mechanism[..4].copy_from_slice(b"NULL");
    out.put_slice(&mechanism);
    out.put_u8(u8::from(as_server));
    out.put_bytes(0, 31);
}

/// A frame's header: flags and size.
pub(crate) fn header(out: &mut BytesMut, more: bool, command: bool, len: usize) {
    let flags = if more { MORE } else { 0 } | if command { COMMAND } else { 0 };
    if len > 255 {
        out.put_u8(flags | LONG);
        out.put_u64(len as u64);
    } else {
        out.put_u8(flags);
        out.put_u8(len as u8);
    }
}

/// A whole frame.
pub(crate) fn frame(out: &mut BytesMut, more: bool, body: &[u8]) {
    header(out, more, false, body.len());
    out.put_slice(body);
}

/// A command frame `name` with `data`.
pub(crate) fn command(out: &mut BytesMut, name: &[u8], data: &[u8]) {
    header(out, false, true, 1 + name.len() + data.len());
    out.put_u8(name.len() as u8);
    out.put_slice(name);
    out.put_slice(data);
}

/// READY with its properties.
pub(crate) fn ready(out: &mut BytesMut, properties: &[(&[u8], &[u8])]) {
    let mut data = BytesMut::new();
    for (name, value) in properties {
        data.put_u8(name.len() as u8);
        data.put_slice(name);
        data.put_u32(value.len() as u32);
        data.put_slice(value);
    }
    command(out, b"READY", &data);
}

/// ERROR with its reason (at most 255 bytes of it).
pub(crate) fn error(out: &mut BytesMut, reason: &str) {
    let r = &reason.as_bytes()[..reason.len().min(255)];
    let mut data = Vec::with_capacity(1 + r.len());
    data.push(r.len() as u8);
    data.extend_from_slice(r);
    command(out, b"ERROR", &data);
}

/// READY's properties: names (compared without case, as the spec says)
/// and values.
pub(crate) fn properties(mut data: &[u8]) -> Result<Vec<(Vec<u8>, Bytes)>, Error> {
    let mut out = Vec::new();
    while let Some((&n, rest)) = data.split_first() {
        let n = usize::from(n);
        if n == 0 || rest.len() < n + 4 {
            return Err(Error::Command("a READY property is truncated"));
        }
        let name = rest[..n].to_ascii_lowercase();
        let len = u32::from_be_bytes(rest[n..n + 4].try_into().expect("4 bytes")) as usize;
        let rest = &rest[n + 4..];
        if rest.len() < len {
            return Err(Error::Command("a READY property's value is truncated"));
        }
        out.push((name, Bytes::copy_from_slice(&rest[..len])));
        data = &rest[len..];
    }
    Ok(out)
}

/// A PING's TTL (deciseconds; 0: none) and context.
pub(crate) fn ping(data: &Bytes) -> Result<(u16, Bytes), Error> {
    if data.len() < 2 || data.len() > 2 + 16 {
        return Err(Error::Command("a PING is a TTL and at most 16 bytes of context"));
    }
    Ok((u16::from_be_bytes([data[0], data[1]]), data.slice(2..)))
}
