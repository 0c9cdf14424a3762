//! The connection a request came on: which listener, from where, and the
//! identity its TLS client certificate proved. A leaf: the listener fills
//! it in, the pipeline and the tenant selection read it.

use std::net::SocketAddr;
use std::sync::Arc;

/// Which listener a connection came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// The server's port (`--host`, `--port`): TLS with `--tls-cert`.
    Main,
    /// `--plain-listen`: plain HTTP on loopback beside a TLS port.
    Plain,
    /// A tenant's `listen` address (`--tenants`), TLS as the server's port.
    Tenant,
}

/// The connection a request came on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The client's address.
    pub addr: SocketAddr,
    /// The listener it connected to.
    pub listener: Listener,
    /// Whether the connection completed a TLS handshake.
    pub tls: bool,
    /// The identity of its TLS client certificate, once the handshake
    /// verified one: its first DNS subject alternative name, else its
    /// subject's common name ([`hf3fs_meta_tls::accept::identity`]).
    pub identity: Option<Arc<str>>,
    /// The tenant whose `listen` address it came to ([`Listener::Tenant`]).
    pub tenant: Option<Arc<str>>,
}

impl Peer {
    /// A plain connection from `addr` to the server's port (tests, benches).
    pub fn plain(addr: SocketAddr) -> Peer {
        Peer { addr, listener: Listener::Main, tls: false, identity: None, tenant: None }
    }
}
