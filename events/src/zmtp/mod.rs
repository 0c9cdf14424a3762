//! The publisher's own ZMTP 3.1 transport (rfc.zeromq.org/spec/37 and the
//! PUB-SUB pattern of spec/29), written for exactly what the publisher
//! needs: TCP, the NULL mechanism, a PUB socket ([`PubSocket`]) and a
//! ROUTER ([`RouterSocket`]).
//!
//! - The greeting: 3.1 sent, peers speaking 3.0 and 3.1 accepted; then
//!   READY with `Socket-Type` (and `Identity`, which a ROUTER keeps).
//! - `PING` is answered with `PONG` echoing its context, and a peer that
//!   gave a TTL and stays silent past it is dropped. `ERROR` ends the
//!   connection.
//! - Anything malformed (greeting, frame, command, a frame over
//!   [`MAX_FRAME`]) drops that connection, never more.

mod codec;
mod peer;
mod publish;
mod router;

pub(crate) use publish::PubSocket;
pub(crate) use router::RouterSocket;

/// The largest frame accepted from a peer (subscriptions and replay
/// requests are a few bytes; anything larger drops the connection).
pub(crate) const MAX_FRAME: usize = 64 * 1024;

/// The pause after a failed `accept` (out of descriptors, say).
const ACCEPT_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// `tcp://HOST:PORT` → `HOST:PORT` for tokio (brackets kept around IPv6).
fn address(endpoint: &str) -> Result<&str, String> {
    endpoint.strip_prefix("tcp://").ok_or_else(|| format!("{endpoint}: only tcp:// endpoints are supported"))
}

/// Binds `endpoint` (`tcp://HOST:PORT`); the endpoint as bound
/// (`tcp://IP:PORT`, the port chosen when 0).
async fn listen(endpoint: &str) -> Result<(tokio::net::TcpListener, String), String> {
    let l =
        tokio::net::TcpListener::bind(address(endpoint)?).await.map_err(|e| format!("cannot bind {endpoint}: {e}"))?;
    let a = l.local_addr().map_err(|e| format!("cannot bind {endpoint}: {e}"))?;
    Ok((l, format!("tcp://{a}")))
}

#[cfg(test)]
mod tests;
