//! Refused handshakes, counted by reason (`hf3fs_meta_tls_handshake_failures_total{reason}`).

use hf3fs_meta_metrics::{counter, Family, Samples};
use std::sync::atomic::{AtomicU64, Ordering};

/// Why a handshake failed (or a connection was refused before one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A plain (non-TLS) client on a TLS port: answered with a plain 400.
    PlainOnTls,
    /// A TLS client on a plain port: closed before anything is read.
    TlsOnPlain,
    /// The peer's certificate has expired (or is not valid yet).
    Expired,
    /// The peer's certificate is not signed by a trusted CA.
    UnknownCa,
    /// The server's certificate does not name the host it was reached at.
    WrongName,
    /// The client presented no certificate where one is required.
    NoClientCert,
    /// Another certificate problem (revoked, wrong usage, bad signature…).
    BadCertificate,
    /// Any other failure: the peer closed, timed out, or spoke no TLS.
    Other,
}

impl Reason {
    /// Every reason, in the order the metrics list them.
    pub const ALL: [Reason; 8] = [
        Reason::PlainOnTls,
        Reason::TlsOnPlain,
        Reason::Expired,
        Reason::UnknownCa,
        Reason::WrongName,
        Reason::NoClientCert,
        Reason::BadCertificate,
        Reason::Other,
    ];

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Reason::PlainOnTls => "plain_on_tls_port",
            Reason::TlsOnPlain => "tls_on_plain_port",
            Reason::Expired => "expired_certificate",
            Reason::UnknownCa => "unknown_ca",
            Reason::WrongName => "wrong_name",
            Reason::NoClientCert => "missing_client_certificate",
            Reason::BadCertificate => "bad_certificate",
            Reason::Other => "other",
        }
    }

    /// The reason of a rustls error, seen from either side: a certificate
    /// this side refused, or the alert the other side sent about ours.
    pub fn of(e: &rustls::Error) -> Reason {
        use rustls::{AlertDescription as A, CertificateError as C, Error as E};
        match e {
            E::NoCertificatesPresented | E::AlertReceived(A::CertificateRequired) => Reason::NoClientCert,
            E::InvalidCertificate(
                C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. },
            )
            | E::AlertReceived(A::CertificateExpired) => Reason::Expired,
            E::InvalidCertificate(C::UnknownIssuer) | E::AlertReceived(A::UnknownCA) => Reason::UnknownCa,
            E::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => Reason::WrongName,
            E::InvalidCertificate(_) | E::AlertReceived(A::BadCertificate | A::UnsupportedCertificate) => {
                Reason::BadCertificate
            }
            _ => Reason::Other,
        }
    }

    /// The reason of an I/O error from a TLS stream (a rustls error inside,
    /// or a transport failure).
    pub fn of_io(e: &std::io::Error) -> Reason {
        e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()).map_or(Reason::Other, Reason::of)
    }
}

static COUNTS: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];

/// Counts one failure of `reason`. Relaxed: a statistic.
pub fn count(reason: Reason) {
    let i = Reason::ALL.iter().position(|&r| r == reason).unwrap_or(Reason::ALL.len() - 1);
    COUNTS[i].fetch_add(1, Ordering::Relaxed);
}

/// The count of `reason` so far.
pub fn get(reason: Reason) -> u64 {
    let i = Reason::ALL.iter().position(|&r| r == reason).unwrap_or(Reason::ALL.len() - 1);
    COUNTS[i].load(Ordering::Relaxed)
}

/// Refused handshakes by reason.
const FAILURES: Family =
    counter("tls_handshake_failures_total", "Connections refused before any request was read, by reason.");

/// Appends the series.
pub(crate) fn render(out: &mut String) {
    let mut w = Samples::start(out, &FAILURES);
    for r in Reason::ALL {
        w.put(&[("reason", &r.label())], get(r));
    }
}
