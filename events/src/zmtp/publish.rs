//! The PUB socket: each subscriber's prefixes, and its own bounded queue
//! (the high-water mark): a message goes to every peer with a matching
//! prefix whose queue has room, and is dropped (counted) for the others.
//! Sending never waits.

use super::peer::{self, Incoming, Out, Role};
use crate::lock;
use crate::Counters;
use bytes::Bytes;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

const ROLE: Role = Role { socket_type: b"PUB", accepts: &[b"SUB", b"XSUB"] };

/// The wait before connecting again (libzmq's default reconnect interval).
const RECONNECT: Duration = Duration::from_millis(100);

struct Peer {
    id: u64,
    /// Its subscriptions (a prefix subscribed twice is there twice).
    prefixes: Vec<Bytes>,
    tx: mpsc::Sender<Out>,
}

struct Shared {
    peers: Mutex<Vec<Peer>>,
    next: Mutex<u64>,
    hwm: usize,
    counters: Arc<Counters>,
}

/// A PUB socket: bound (peers connect to it) or connecting, or both.
pub(crate) struct PubSocket {
    shared: Arc<Shared>,
}

impl PubSocket {
    /// A socket whose peers each queue at most `hwm` messages; `counters`
    /// counts its subscribers.
    pub(crate) fn new(hwm: usize, counters: Arc<Counters>) -> Self {
        let shared = Shared { peers: Mutex::default(), next: Mutex::new(0), hwm: hwm.max(1), counters };
        PubSocket { shared: Arc::new(shared) }
    }

    /// Binds `endpoint` and accepts subscribers; the endpoint as bound.
    pub(crate) async fn bind(&self, endpoint: &str) -> Result<String, String> {
        let (listener, bound) = super::listen(endpoint).await?;
        let weak = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    // Out of descriptors, say: a pause, not a spin.
                    tokio::time::sleep(super::ACCEPT_PAUSE).await;
                    continue;
                };
                let Some(shared) = weak.upgrade() else { return };
                tokio::spawn(serve(shared, stream, true));
            }
        });
        Ok(bound)
    }

    /// Connects to `endpoint`, again after each disconnection or failure,
    /// until the socket is dropped.
    pub(crate) fn connect(&self, endpoint: &str) -> Result<(), String> {
        let address = super::address(endpoint)?.to_string();
        let weak: Weak<Shared> = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            loop {
                let stream = TcpStream::connect(&address).await;
                let Some(shared) = weak.upgrade() else { return };
                match stream {
                    Ok(s) => serve(shared, s, false).await,
                    Err(e) => tracing::debug!(endpoint = %address, error = %e, "kv events: PUB connect failed"),
                }
                tokio::time::sleep(RECONNECT).await;
            }
        });
        Ok(())
    }

    /// Queues `msg` for every peer subscribed to a prefix of its first
    /// frame; returns how many of them dropped it (their queue full).
    pub(crate) fn send(&self, msg: Vec<Bytes>) -> u64 {
        let msg = Arc::new(msg);
        let topic = msg.first().cloned().unwrap_or_default();
        let mut dropped = 0;
        for p in lock(&self.shared.peers).iter() {
            if !p.prefixes.iter().any(|s| topic.starts_with(s)) {
                continue;
            }
            if let Err(mpsc::error::TrySendError::Full(_)) = p.tx.try_send(msg.clone()) {
                dropped += 1;
            }
        }
        dropped
    }
}

/// One subscriber's connection, from the handshake to its end.
async fn serve(shared: Arc<Shared>, stream: TcpStream, as_server: bool) {
    let (reader, writer, hello) = match peer::handshake(stream, &ROLE, as_server).await {
        Ok(h) => h,
        Err(e) => {
            tracing::debug!(error = %e, "kv events: a subscriber's handshake failed");
            return;
        }
    };
    let id = {
        let mut n = lock(&shared.next);
        *n += 1;
        *n
    };
    let (tx, mut rx) = mpsc::channel(shared.hwm);
    lock(&shared.peers).push(Peer { id, prefixes: Vec::new(), tx });
    shared.counters.subscribers.fetch_add(1, Ordering::Relaxed);
    let s = shared.clone();
    let why = peer::run(reader, writer, &mut rx, move |got| {
        let s = s.clone();
        async move {
            // ZMTP 3.1's SUBSCRIBE and CANCEL commands, and 3.0's
            // messages (a first byte of 1 or 0; 3.1 peers may send them
            // too); any other message is ignored.
            let (on, prefix) = match got {
                Incoming::Command(c) if &c.name[..] == b"SUBSCRIBE" => (true, c.data),
                Incoming::Command(c) if &c.name[..] == b"CANCEL" => (false, c.data),
                Incoming::Command(_) => return Ok(()),
                Incoming::Message(m) => match m.first().map(|f| (f.first().copied(), f)) {
                    Some((Some(1), f)) if m.len() == 1 => (true, f.slice(1..)),
                    Some((Some(0), f)) if m.len() == 1 => (false, f.slice(1..)),
                    _ => return Ok(()),
                },
            };
            let mut peers = lock(&s.peers);
            if let Some(p) = peers.iter_mut().find(|p| p.id == id) {
                if on {
                    p.prefixes.push(prefix);
                } else if let Some(i) = p.prefixes.iter().position(|x| *x == prefix) {
                    p.prefixes.swap_remove(i);
                }
            }
            Ok(())
        }
    })
    .await;
    lock(&shared.peers).retain(|p| p.id != id);
    let _ = shared.counters.subscribers.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    tracing::debug!(reason = %why, zmtp = %format!("3.{}", hello.minor), "kv events: a subscriber left");
}
