//! Certificates, keys and CA bundles read from PEM files, and the rustls
//! configurations built from them. Every error names the flag and the file.

use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The one crypto provider of the process: rustls's `ring`.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A PEM file named by a flag: the error messages name both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PemFile {
    /// The flag that named it (`--tls-cert`, …).
    pub flag: &'static str,
    /// The file.
    pub path: PathBuf,
}

impl PemFile {
    /// `path`, named by `flag`.
    pub fn new(flag: &'static str, path: &Path) -> Self {
        PemFile { flag, path: path.to_path_buf() }
    }

    fn error(&self, what: impl std::fmt::Display) -> String {
        format!("{} {}: {what}", self.flag, self.path.display())
    }

    /// Every certificate of the file, in order (a chain: the leaf first).
    pub fn certs(&self) -> Result<Vec<CertificateDer<'static>>, String> {
        let certs = CertificateDer::pem_file_iter(&self.path)
            .map_err(|e| self.error(e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.error(e))?;
        if certs.is_empty() {
            return Err(self.error("no PEM certificate (-----BEGIN CERTIFICATE-----) in the file"));
        }
        Ok(certs)
    }

    /// The private key of the file (PKCS#8, PKCS#1 or SEC1).
    pub fn key(&self) -> Result<PrivateKeyDer<'static>, String> {
        PrivateKeyDer::from_pem_file(&self.path).map_err(|e| match e {
            rustls_pki_types::pem::Error::NoItemsFound => {
                self.error("no PEM private key (-----BEGIN PRIVATE KEY-----) in the file")
            }
            e => self.error(e),
        })
    }

    /// The certificates of the file as a trust store (a CA bundle).
    pub fn roots(&self) -> Result<Arc<RootCertStore>, String> {
        let mut roots = RootCertStore::empty();
        for c in self.certs()? {
            roots.add(c).map_err(|e| self.error(format!("not a usable CA certificate: {e}")))?;
        }
        Ok(Arc::new(roots))
    }
}

/// A certificate chain and its key, named by two flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The chain (`--tls-cert`, …).
    pub cert: PemFile,
    /// Its key (`--tls-key`, …).
    pub key: PemFile,
}

impl Identity {
    /// The chain and key, checked to belong together.
    pub fn load(&self) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
        let certs = self.cert.certs()?;
        let key = self.key.key()?;
        let signing = provider()
            .key_provider
            .load_private_key(key.clone_key())
            .map_err(|e| self.key.error(format!("not a usable private key: {e}")))?;
        let ck = rustls::sign::CertifiedKey::new(certs.clone(), signing);
        match ck.keys_match() {
            Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok((certs, key)),
            Err(e) => Err(format!(
                "{} {} and {} {} do not belong together: {e}",
                self.cert.flag,
                self.cert.path.display(),
                self.key.flag,
                self.key.path.display()
            )),
        }
    }

    /// The files, for change detection.
    pub fn files(&self) -> Vec<PathBuf> {
        vec![self.cert.path.clone(), self.key.path.clone()]
    }
}

/// A server's configuration: its identity and, with `client_ca`, the CA
/// every client must present a certificate of (without one the handshake
/// fails). `alpn`: the protocols offered (none: HTTP/1.1 implied).
pub fn server_config(identity: &Identity, client_ca: Option<&PemFile>) -> Result<ServerConfig, String> {
    let (certs, key) = identity.load()?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca {
        Some(ca) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(ca.roots()?, provider())
                .build()
                .map_err(|e| ca.error(format!("cannot verify clients with it: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    builder.with_single_cert(certs, key).map_err(|e| identity.cert.error(e))
}

/// A client's configuration: servers are verified against `ca`, their
/// name included; `identity` is the client certificate, if any.
pub fn client_config(ca: &PemFile, identity: Option<&Identity>) -> Result<ClientConfig, String> {
    let verifier = WebPkiServerVerifier::builder_with_provider(ca.roots()?, provider())
        .build()
        .map_err(|e| ca.error(format!("cannot verify servers with it: {e}")))?;
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_webpki_verifier(verifier);
    match identity {
        Some(id) => {
            let (certs, key) = id.load()?;
            builder.with_client_auth_cert(certs, key).map_err(|e| id.cert.error(e))
        }
        None => Ok(builder.with_no_client_auth()),
    }
}
