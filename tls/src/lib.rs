//! TLS on every hop: one stack (rustls with its `ring` provider, tokio-rustls
//! on the async sockets), certificates, keys and CA bundles from PEM files
//! named by flags (docs/security.md).
//!
//! - [`load`]: reading PEM files and building rustls configurations, with
//!   errors that name the flag and the file.
//! - [`reload`]: configurations rebuilt when their files change (SIGHUP, a
//!   periodic check), their expiry in `/metrics` and load errors in `/health`.
//! - [`accept`]: the server side of an async socket: a peek that tells a
//!   plain client from a TLS one, the handshake, the refusal counted.
//! - [`duplex`]: a blocking TLS stream shared by a reading and a writing
//!   thread (the replication sessions).
//! - [`failures`]: refused handshakes by reason.
//!
//! Architecture invariant: without a TLS flag nothing here runs, and the
//! plain path is the code it was (no peek, no wrapper). This crate knows
//! nothing of the server: the HTTP layer's port and HA's etcd client, relay
//! and replication stream use it.

pub mod accept;
pub mod duplex;
pub mod expiry;
pub mod failures;
pub mod load;
pub mod reload;

pub use failures::Reason;
pub use load::{Identity, PemFile};
pub use reload::Reloadable;

use clap::Args;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ServerConfig};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A client configuration that follows its files.
pub type TlsClient = Arc<Reloadable<ClientConfig>>;
/// A server configuration that follows its files.
pub type Server = Arc<Reloadable<ServerConfig>>;

/// The server's TLS flags.
#[derive(Debug, Clone, Default, Args)]
pub struct TlsArgs {
    /// PEM certificate chain of this node (its leaf first): with it, the
    /// server's port, and the replication listener with `--ha etcd`, speak
    /// only TLS.
    #[arg(long, env = "HF3FS_META_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of `--tls-cert`.
    #[arg(long, env = "HF3FS_META_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA bundle: every connection to the TLS port (and every leader's
    /// replication stream) must present a certificate it signed; without
    /// one the handshake fails and nothing is read.
    #[arg(long, env = "HF3FS_META_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// PEM CA bundle this node verifies the standby it streams to against
    /// (default: `--tls-client-ca`).
    #[arg(long, env = "HF3FS_META_TLS_CA", requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,

    /// A second, plain-HTTP listener, on a loopback address only (for a
    /// local engine or probe beside a TLS port).
    #[arg(long, env = "HF3FS_META_PLAIN_LISTEN", requires = "tls_cert")]
    pub plain_listen: Option<SocketAddr>,
}

impl TlsArgs {
    /// Whether the server's port speaks TLS.
    pub fn enabled(&self) -> bool {
        self.tls_cert.is_some()
    }

    fn identity(&self) -> Option<Identity> {
        Some(Identity {
            cert: PemFile::new("--tls-cert", self.tls_cert.as_deref()?),
            key: PemFile::new("--tls-key", self.tls_key.as_deref()?),
        })
    }

    /// Checks what clap cannot: the plain listener is on loopback.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(a) = self.plain_listen {
            if !a.ip().is_loopback() {
                return Err(format!(
                    "--plain-listen {a}: a plain listener may only bind a loopback address (127.0.0.1 or ::1); \
                     every other address must use the TLS port"
                ));
            }
        }
        Ok(())
    }

    /// The server's configuration (role `server`), with `--tls-cert`.
    pub fn server(&self) -> Result<Option<Server>, String> {
        self.server_as("server")
    }

    /// [`TlsArgs::server`] registered as `role` (the replication listener's).
    pub fn server_as(&self, role: &'static str) -> Result<Option<Server>, String> {
        let Some(id) = self.identity() else { return Ok(None) };
        let ca = self.tls_client_ca.as_deref().map(|p| PemFile::new("--tls-client-ca", p));
        let mut files = id.files();
        files.extend(ca.iter().map(|c| c.path.clone()));
        let expiring = id.cert.clone();
        Reloadable::new(role, files, expiring, move || load::server_config(&id, ca.as_ref())).map(Some)
    }

    /// The configuration this node streams to its standby with (role
    /// `replication_client`): its own certificate as the client's, the standby
    /// verified against `--tls-ca` (or `--tls-client-ca`).
    pub fn replication_client(&self) -> Result<Option<TlsClient>, String> {
        let Some(id) = self.identity() else { return Ok(None) };
        let ca = match (&self.tls_ca, &self.tls_client_ca) {
            (Some(p), _) => PemFile::new("--tls-ca", p),
            (None, Some(p)) => PemFile::new("--tls-client-ca", p),
            (None, None) => {
                return Err("--tls-cert with --ha etcd needs --tls-client-ca (or --tls-ca): the CA the replication \
                            peers' certificates are checked against"
                    .into())
            }
        };
        client("replication_client", &ca, Some(id)).map(Some)
    }
}

/// A reloadable client configuration of `role`: servers verified against
/// `ca`, `identity` as the client certificate.
pub fn client(role: &'static str, ca: &PemFile, identity: Option<Identity>) -> Result<TlsClient, String> {
    let mut files = vec![ca.path.clone()];
    files.extend(identity.iter().flat_map(Identity::files));
    let expiring = identity.as_ref().map_or_else(|| ca.clone(), |i| i.cert.clone());
    let ca = ca.clone();
    Reloadable::new(role, files, expiring, move || load::client_config(&ca, identity.as_ref()))
}

/// The client flags of a TLS hop: a CA and an optional client certificate,
/// named by three flags (`--etcd-ca`/`--etcd-cert`/`--etcd-key`, or the
/// relay's `--tls-ca`/`--tls-cert`/`--tls-key`).
pub fn client_from_flags(
    role: &'static str,
    ca: Option<(&'static str, &Path)>,
    cert: Option<(&'static str, &Path)>,
    key: Option<(&'static str, &Path)>,
) -> Result<Option<TlsClient>, String> {
    let identity = match (cert, key) {
        (Some((cf, c)), Some((kf, k))) => Some(Identity { cert: PemFile::new(cf, c), key: PemFile::new(kf, k) }),
        (None, None) => None,
        (Some((f, _)), None) | (None, Some((f, _))) => {
            return Err(format!("{f} needs its pair: a client certificate and its key go together"))
        }
    };
    match ca {
        Some((f, p)) => client(role, &PemFile::new(f, p), identity).map(Some),
        None if identity.is_some() => Err(format!(
            "a client certificate for {role} needs the CA to verify the server with ({})",
            if role == "etcd" { "--etcd-ca" } else { "--tls-ca" }
        )),
        None => Ok(None),
    }
}

/// The name a server is verified as: the host of `host:port` (an IP
/// address or a DNS name; IPv6 in brackets).
pub fn server_name(authority: &str) -> Result<ServerName<'static>, String> {
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string()).map_err(|e| format!("'{host}' cannot be verified as a TLS name: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        tls: TlsArgs,
    }

    #[test]
    fn flags_come_in_pairs_and_the_plain_listener_stays_on_loopback() {
        assert!(Cli::try_parse_from(["x", "--tls-cert", "c.pem"]).is_err());
        assert!(Cli::try_parse_from(["x", "--tls-client-ca", "ca.pem"]).is_err());
        assert!(Cli::try_parse_from(["x", "--plain-listen", "127.0.0.1:1"]).is_err());
        let ok =
            |a: &str| Cli::parse_from(["x", "--tls-cert", "c", "--tls-key", "k", "--plain-listen", a]).tls.validate();
        assert!(ok("127.0.0.1:18000").is_ok());
        assert!(ok("[::1]:18000").is_ok());
        let e = ok("0.0.0.0:18000").unwrap_err();
        assert!(e.contains("loopback"), "{e}");
        assert!(ok("10.1.2.3:18000").is_err());
        assert!(!Cli::parse_from(["x"]).tls.enabled());
    }

    #[test]
    fn names_of_authorities() {
        assert_eq!(server_name("etcd-0.svc:2379").unwrap(), ServerName::try_from("etcd-0.svc").unwrap());
        assert!(matches!(server_name("127.0.0.1:2379").unwrap(), ServerName::IpAddress(_)));
        assert!(matches!(server_name("[::1]:2379").unwrap(), ServerName::IpAddress(_)));
        assert!(server_name("bad name:1").is_err());
    }

    #[test]
    fn missing_or_wrong_files_say_which_flag() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.pem");
        let e = load::client_config(&PemFile::new("--etcd-ca", &missing), None).unwrap_err();
        assert!(e.starts_with("--etcd-ca ") && e.contains("none.pem"), "{e}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "hello\n").unwrap();
        let e = load::client_config(&PemFile::new("--tls-ca", &empty), None).unwrap_err();
        assert!(e.contains("no PEM certificate"), "{e}");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["a".into()]).unwrap().self_signed(&key).unwrap();
        let other = rcgen::KeyPair::generate().unwrap();
        let (c, k, o) = (dir.path().join("c.pem"), dir.path().join("k.pem"), dir.path().join("o.pem"));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        std::fs::write(&o, other.serialize_pem()).unwrap();
        let id = |key: &Path| Identity { cert: PemFile::new("--tls-cert", &c), key: PemFile::new("--tls-key", key) };
        assert!(load::server_config(&id(&k), None).is_ok());
        let e = load::server_config(&id(&o), None).unwrap_err();
        assert!(e.contains("do not belong together"), "{e}");
        let e = load::server_config(&id(&c), None).unwrap_err();
        assert!(e.contains("--tls-key") && e.contains("no PEM private key"), "{e}");
        assert!(client_from_flags("etcd", None, Some(("--etcd-cert", &c)), None).unwrap_err().contains("pair"));
        let e = client_from_flags("etcd", None, Some(("--etcd-cert", &c)), Some(("--etcd-key", &k))).unwrap_err();
        assert!(e.contains("--etcd-ca"), "{e}");
        assert!(client_from_flags("etcd", None, None, None).unwrap().is_none());
    }
}
