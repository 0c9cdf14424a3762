//! Certificates made at test time (rcgen): a CA, and leaf certificates it
//! signs, written as PEM files to a temporary directory removed on drop.
//! No key is ever committed.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use std::path::{Path, PathBuf};

/// A test CA and the directory its files go to.
pub struct Pki {
    /// Where the CA's and the leaves' PEM files are (removed on drop).
    pub dir: tempfile::TempDir,
    name: String,
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its key, as files.
#[derive(Clone, Debug)]
pub struct Leaf {
    /// The certificate's PEM file.
    pub cert: PathBuf,
    /// Its private key's PEM file.
    pub key: PathBuf,
}

impl Leaf {
    /// `--<prefix>-cert C --<prefix>-key K` (prefix `tls` or `etcd`).
    pub fn flags(&self, prefix: &str) -> Vec<String> {
        vec![
            format!("--{prefix}-cert"),
            self.cert.display().to_string(),
            format!("--{prefix}-key"),
            self.key.display().to_string(),
        ]
    }
}

impl Pki {
    /// A fresh CA named `name`.
    pub fn new(name: &str) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("a CA key");
        let cert = params.self_signed(&key).expect("the CA certificate");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let ca_pem = cert.pem();
        std::fs::write(dir.path().join(format!("{name}.pem")), &ca_pem).expect("write the CA");
        Pki { dir, name: name.into(), ca_pem, issuer: Issuer::new(params, key) }
    }

    /// The CA bundle's file.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join(format!("{}.pem", self.name))
    }

    /// The CA's PEM text.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A leaf `file` for `names` (DNS names or IP addresses), valid from
    /// yesterday for a year.
    pub fn leaf(&self, file: &str, names: &[&str]) -> Leaf {
        self.leaf_valid(file, names, -1, 365)
    }

    /// A leaf valid from `from` days from today to `to` days from today.
    pub fn leaf_valid(&self, file: &str, names: &[&str], from: i64, to: i64) -> Leaf {
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, names.first().copied().unwrap_or(file));
        let ymd = |offset: i64| {
            let (y, m, d) = civil(offset);
            rcgen::date_time_ymd(y, m, d)
        };
        params.not_before = ymd(from);
        params.not_after = ymd(to);
        let key = KeyPair::generate().expect("a leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign the leaf");
        let leaf = Leaf {
            cert: self.dir.path().join(format!("{file}.pem")),
            key: self.dir.path().join(format!("{file}.key")),
        };
        write(&leaf.cert, &cert.pem());
        write(&leaf.key, &key.serialize_pem());
        leaf
    }
}

fn write(p: &Path, text: &str) {
    // Through a rename: a reader (the server reloading) sees the old file
    // or the new one, never half of one.
    let tmp = p.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write a PEM file");
    std::fs::rename(&tmp, p).expect("rename a PEM file");
}

/// The date (UTC) `offset` days from today (Howard Hinnant's
/// civil-from-days).
fn civil(offset: i64) -> (i32, u8, u8) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_secs();
    let z = (now / 86_400) as i64 + offset + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    let y = (yoe + era * 400 + i64::from(m <= 2)) as i32;
    (y, m, d)
}
