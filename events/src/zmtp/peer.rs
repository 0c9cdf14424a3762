//! One connection: the handshake, then its reading side (messages and
//! commands, PING answered, the TTL kept) and its writing side (queued
//! messages, PONGs), run together until either ends.

use super::codec::{self, Command, Decoder, Error, Frame};
use super::MAX_FRAME;
use bytes::{Bytes, BytesMut};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// A message on its way out: its frames (shared by every peer it goes to).
pub(crate) type Out = Arc<Vec<Bytes>>;

/// What the peer said in its READY.
pub(crate) struct Hello {
    /// Its greeting's minor version (0: ZMTP 3.0).
    pub(crate) minor: u8,
    /// Its `Identity` property (empty when it gave none).
    pub(crate) identity: Bytes,
}

/// What this side is: its socket type, the peers' types it accepts.
pub(crate) struct Role {
    pub(crate) socket_type: &'static [u8],
    pub(crate) accepts: &'static [&'static [u8]],
}

/// The reading side, past the handshake.
pub(crate) struct Reader {
    rd: OwnedReadHalf,
    dec: Decoder,
    /// The peer's PING's TTL: silent longer, it is dropped.
    ttl: Option<Duration>,
    /// The parts of the message being read.
    parts: Vec<Bytes>,
    pong: mpsc::Sender<Bytes>,
}

/// What a peer sent, PING, PONG and ERROR handled.
pub(crate) enum Incoming {
    Message(Vec<Bytes>),
    Command(Command),
}

/// Reads into the decoder; `Ok(false)` at the end of the stream.
async fn fill(rd: &mut OwnedReadHalf, dec: &mut Decoder, ttl: Option<Duration>) -> Result<bool, String> {
    let read = rd.read_buf(dec.buffer());
    let n = match ttl {
        Some(t) => tokio::time::timeout(t, read).await.map_err(|_| "silent past its TTL".to_string())?,
        None => read.await,
    };
    match n {
        Ok(0) => Ok(false),
        Ok(_) => Ok(true),
        Err(e) => Err(e.to_string()),
    }
}

/// The handshake over `stream`: greetings and READYs exchanged. Returns
/// the reading side, the writing side and what the peer said; an error
/// (its ERROR sent when it is the peer's fault) drops the connection.
pub(crate) async fn handshake(
    stream: TcpStream,
    role: &Role,
    as_server: bool,
) -> Result<(Reader, Writer, Hello), String> {
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let mut out = BytesMut::new();
    codec::greeting(&mut out, as_server);
    codec::ready(&mut out, &[(b"Socket-Type", role.socket_type)]);
    wr.write_all(&out).await.map_err(|e| e.to_string())?;
    let mut dec = Decoder::new(MAX_FRAME);
    let minor = loop {
        if let Some(g) = dec.greeting().map_err(|e| e.to_string())? {
            break g.minor;
        }
        if !fill(&mut rd, &mut dec, None).await? {
            return Err("closed during the greeting".into());
        }
    };
    let frame = loop {
        if let Some(f) = dec.frame().map_err(|e| e.to_string())? {
            break f;
        }
        if !fill(&mut rd, &mut dec, None).await? {
            return Err("closed before READY".into());
        }
    };
    let hello = match ready(&frame, role) {
        Ok(identity) => Hello { minor, identity },
        Err(e) => {
            let mut out = BytesMut::new();
            codec::error(&mut out, &e);
            let _ = wr.write_all(&out).await;
            return Err(e);
        }
    };
    let (pong, pongs) = mpsc::channel(8);
    Ok((Reader { rd, dec, ttl: None, parts: Vec::new(), pong }, Writer { wr, pongs }, hello))
}

/// The peer's READY: its identity, when its socket type fits `role`.
fn ready(frame: &Frame, role: &Role) -> Result<Bytes, String> {
    let c =
        if frame.command { frame.command().map_err(|e| e.to_string())? } else { return Err("READY expected".into()) };
    if &c.name[..] == b"ERROR" {
        return Err(format!("the peer's ERROR: {}", String::from_utf8_lossy(c.data.get(1..).unwrap_or_default())));
    }
    if &c.name[..] != b"READY" {
        return Err("READY expected".into());
    }
    let props = codec::properties(&c.data).map_err(|e| e.to_string())?;
    let get = |n: &[u8]| props.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let Some(t) = get(b"socket-type") else { return Err("READY without Socket-Type".into()) };
    if !role.accepts.iter().any(|a| a[..] == t[..]) {
        return Err(format!(
            "a {} cannot talk to a {}",
            String::from_utf8_lossy(&t),
            String::from_utf8_lossy(role.socket_type)
        ));
    }
    Ok(get(b"identity").unwrap_or_default())
}

impl Reader {
    /// The peer's next message or command (PING answered, PONG ignored);
    /// an error or its end drops the connection.
    pub(crate) async fn next(&mut self) -> Result<Incoming, String> {
        loop {
            while let Some(f) = self.dec.frame().map_err(|e| e.to_string())? {
                if let Some(got) = self.take(f)? {
                    return Ok(got);
                }
            }
            if !fill(&mut self.rd, &mut self.dec, self.ttl).await? {
                return Err("closed".into());
            }
        }
    }

    fn take(&mut self, f: Frame) -> Result<Option<Incoming>, String> {
        if !f.command {
            self.parts.push(f.body);
            if f.more {
                return Ok(None);
            }
            return Ok(Some(Incoming::Message(std::mem::take(&mut self.parts))));
        }
        if !self.parts.is_empty() {
            return Err("a command inside a message".into());
        }
        let c = f.command().map_err(|e| e.to_string())?;
        match &c.name[..] {
            b"PING" => {
                let (ttl, context) = codec::ping(&c.data).map_err(|e| e.to_string())?;
                self.ttl = (ttl > 0).then(|| Duration::from_millis(u64::from(ttl) * 100));
                // A full queue of PONGs: the peer is not reading them.
                let _ = self.pong.try_send(context);
                Ok(None)
            }
            b"PONG" => Ok(None),
            b"ERROR" => {
                Err(format!("the peer's ERROR: {}", String::from_utf8_lossy(c.data.get(1..).unwrap_or_default())))
            }
            b"READY" => Err(Error::Command("a second READY").to_string()),
            _ => Ok(Some(Incoming::Command(c))),
        }
    }
}

/// The writing side: queued messages and PONGs.
pub(crate) struct Writer {
    wr: OwnedWriteHalf,
    pongs: mpsc::Receiver<Bytes>,
}

/// What one write gathers at most (more messages queued wait for the next).
const WRITE_CHUNK: usize = 256 * 1024;

impl Writer {
    /// Writes what `rx` brings (and the PONGs) until it ends or a write
    /// fails.
    pub(crate) async fn run(mut self, rx: &mut mpsc::Receiver<Out>) -> String {
        let mut out = BytesMut::new();
        loop {
            tokio::select! {
                biased;
                p = self.pongs.recv() => {
                    let Some(ctx) = p else { return "closed".into() };
                    codec::command(&mut out, b"PONG", &ctx);
                }
                m = rx.recv() => {
                    let Some(m) = m else { return "closed".into() };
                    put(&mut out, &m);
                    while out.len() < WRITE_CHUNK {
                        let Ok(m) = rx.try_recv() else { break };
                        put(&mut out, &m);
                    }
                }
            }
            if let Err(e) = self.wr.write_all_buf(&mut out).await {
                return e.to_string();
            }
            out.clear();
        }
    }
}

/// A multipart message's frames.
fn put(out: &mut BytesMut, m: &[Bytes]) {
    for (i, part) in m.iter().enumerate() {
        codec::frame(out, i + 1 < m.len(), part);
    }
}

/// Runs a connection: `read` handles what the peer sends, the writer
/// writes what `rx` brings; returns why it ended.
pub(crate) async fn run<F, Fut>(mut reader: Reader, writer: Writer, rx: &mut mpsc::Receiver<Out>, mut read: F) -> String
where
    F: FnMut(Incoming) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let reading = async {
        loop {
            let got = match reader.next().await {
                Ok(got) => got,
                Err(e) => return e,
            };
            if let Err(e) = read(got).await {
                return e;
            }
        }
    };
    tokio::select! {
        e = reading => e,
        e = writer.run(rx) => e,
    }
}
