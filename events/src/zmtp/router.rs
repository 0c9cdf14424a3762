//! The ROUTER socket: each peer known by its identity (its READY's, or
//! one made for it), every message received with its sender's identity
//! first, every message sent to the peer its first frame names.

use super::peer::{self, Incoming, Out, Role};
use crate::lock;
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

const ROLE: Role = Role { socket_type: b"ROUTER", accepts: &[b"DEALER", b"REQ", b"ROUTER"] };

/// Messages queued for one peer (a replay waits for room, never drops).
const PEER_QUEUE: usize = 1024;

/// Messages received and not yet taken by [`RouterSocket::recv`].
const INBOX: usize = 1024;

struct Shared {
    peers: Mutex<HashMap<Bytes, mpsc::Sender<Out>>>,
    /// The number in the next identity made for a peer that gave none.
    next: Mutex<u32>,
}

/// A bound ROUTER socket.
pub(crate) struct RouterSocket {
    shared: Arc<Shared>,
    inbox: mpsc::Receiver<Vec<Bytes>>,
}

impl RouterSocket {
    /// Binds `endpoint`; the socket and the endpoint as bound.
    pub(crate) async fn bind(endpoint: &str) -> Result<(Self, String), String> {
        let (listener, bound) = super::listen(endpoint).await?;
        let shared = Arc::new(Shared { peers: Mutex::default(), next: Mutex::new(0) });
        let (tx, inbox) = mpsc::channel(INBOX);
        let s = shared.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    // Out of descriptors, say: a pause, not a spin.
                    tokio::time::sleep(super::ACCEPT_PAUSE).await;
                    continue;
                };
                if tx.is_closed() {
                    return;
                }
                tokio::spawn(serve(s.clone(), stream, tx.clone()));
            }
        });
        Ok((RouterSocket { shared, inbox }, bound))
    }

    /// The next message, its sender's identity first (`None`: never again).
    pub(crate) async fn recv(&mut self) -> Option<Vec<Bytes>> {
        self.inbox.recv().await
    }

    /// Sends `msg` (frames after the first) to the peer its first frame
    /// names, waiting for room in its queue; `false` when no such peer is
    /// connected (any more).
    pub(crate) async fn send(&self, mut msg: Vec<Bytes>) -> bool {
        if msg.is_empty() {
            return false;
        }
        let id = msg.remove(0);
        let Some(tx) = lock(&self.shared.peers).get(&id).cloned() else { return false };
        tx.send(Arc::new(msg)).await.is_ok()
    }
}

/// One peer's connection, from the handshake to its end.
async fn serve(shared: Arc<Shared>, stream: TcpStream, inbox: mpsc::Sender<Vec<Bytes>>) {
    let (reader, writer, hello) = match peer::handshake(stream, &ROLE, true).await {
        Ok(h) => h,
        Err(e) => {
            tracing::debug!(error = %e, "kv events: a replay peer's handshake failed");
            return;
        }
    };
    let (tx, mut rx) = mpsc::channel(PEER_QUEUE);
    let id = {
        let mut peers = lock(&shared.peers);
        // Its own identity unless it gave none, or one starting with 0
        // (those are made here), or one in use: then `00` + a number.
        let own = &hello.identity;
        let id = if own.is_empty() || own[0] == 0 || peers.contains_key(own) {
            let mut n = lock(&shared.next);
            loop {
                *n = n.wrapping_add(1);
                let mut made = vec![0u8];
                made.extend_from_slice(&n.to_be_bytes());
                let made = Bytes::from(made);
                if !peers.contains_key(&made) {
                    break made;
                }
            }
        } else {
            own.clone()
        };
        peers.insert(id.clone(), tx);
        id
    };
    let who = id.clone();
    let why = peer::run(reader, writer, &mut rx, move |got| {
        let inbox = inbox.clone();
        let who = who.clone();
        async move {
            if let Incoming::Message(m) = got {
                let mut framed = Vec::with_capacity(m.len() + 1);
                framed.push(who);
                framed.extend(m);
                inbox.send(framed).await.map_err(|_| "the ROUTER is gone".to_string())?;
            }
            Ok(())
        }
    })
    .await;
    lock(&shared.peers).remove(&id);
    tracing::debug!(reason = %why, zmtp = %format!("3.{}", hello.minor), "kv events: a replay peer left");
}
