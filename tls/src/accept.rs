//! The server side of a new connection on an async socket: a TLS port
//! answers a plain client with a plain 400 and handshakes with a TLS one; a
//! plain port beside a TLS one closes on a TLS client. Each refusal is
//! counted by reason ([`super::failures`]) before anything is read.

use super::failures::{self, Reason};
use rustls::ServerConfig;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// The first byte of a TLS record carrying a handshake (a ClientHello).
const HANDSHAKE: u8 = 0x16;

/// What a plain HTTP client on a TLS port is told.
const PLAIN_ON_TLS: &[u8] = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nconnection: close\r\n\
content-length: 79\r\n\r\n{\"detail\":\"This port speaks TLS only: connect with https:// and a certificate\"}";

/// A fatal TLS alert record (handshake_failure), for a TLS client on a
/// plain port: its library then reports a refused handshake.
const ALERT: &[u8] = &[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28];

/// The first byte the client sent, waiting up to `timeout`.
async fn first_byte(stream: &TcpStream, timeout: Duration) -> Option<u8> {
    let mut b = [0u8; 1];
    match tokio::time::timeout(timeout, stream.peek(&mut b)).await {
        Ok(Ok(1)) => Some(b[0]),
        _ => None,
    }
}

/// The TLS connection of a client on a TLS port, or why not (counted).
pub async fn accept(
    mut stream: TcpStream,
    cfg: Arc<ServerConfig>,
    timeout: Duration,
) -> Result<TlsStream<TcpStream>, Reason> {
    match first_byte(&stream, timeout).await {
        Some(HANDSHAKE) => {}
        Some(_) => {
            failures::count(Reason::PlainOnTls);
            let _ = tokio::time::timeout(timeout, stream.write_all(PLAIN_ON_TLS)).await;
            let _ = stream.shutdown().await;
            return Err(Reason::PlainOnTls);
        }
        None => {
            failures::count(Reason::Other);
            return Err(Reason::Other);
        }
    }
    match tokio::time::timeout(timeout, tokio_rustls::TlsAcceptor::from(cfg).accept(stream)).await {
        Ok(Ok(tls)) => Ok(tls),
        Ok(Err(e)) => {
            let reason = Reason::of_io(&e);
            failures::count(reason);
            tracing::debug!(reason = reason.label(), "TLS handshake refused: {e}");
            Err(reason)
        }
        Err(_) => {
            failures::count(Reason::Other);
            Err(Reason::Other)
        }
    }
}

/// The identity of a verified TLS connection's client certificate: its
/// first DNS subject alternative name, else its subject's common name;
/// `None` without a client certificate (what a tenant's `identities` name).
pub fn identity<IO>(tls: &TlsStream<IO>) -> Option<String> {
    let der = tls.get_ref().1.peer_certificates()?.first()?;
    certificate_identity(der)
}

/// The identity of the DER certificate `der` (see [`identity`]).
pub fn certificate_identity(der: &[u8]) -> Option<String> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let GeneralName::DNSName(dns) = name {
                return Some((*dns).to_string());
            }
        }
    }
    let cn = cert.subject().iter_common_name().next()?.as_str().ok().map(str::to_owned);
    cn
}

/// On a plain port beside a TLS one: `true` (counted, answered with an
/// alert) when the client starts a TLS handshake.
pub async fn refuse_tls(stream: &mut TcpStream, timeout: Duration) -> bool {
    if first_byte(stream, timeout).await != Some(HANDSHAKE) {
        return false;
    }
    failures::count(Reason::TlsOnPlain);
    let _ = tokio::time::timeout(timeout, stream.write_all(ALERT)).await;
    let _ = stream.shutdown().await;
    true
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_plain_answer_is_well_formed() {
        let text = std::str::from_utf8(super::PLAIN_ON_TLS).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())), "{head}");
        assert!(serde_json::from_str::<serde_json::Value>(body).is_ok());
    }
}
