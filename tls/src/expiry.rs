//! When a certificate expires: its `notAfter`, read from the DER.
//!
//! A walk of the few fields in front of it (RFC 5280, 4.1: `Certificate`
//! → `tbsCertificate` → optional `[0]` version, serial, signature
//! algorithm, issuer, `validity`), rather than a full X.509 parser: rustls
//! verifies the certificate itself, this only reads one date of it for the
//! expiry gauge and the log.

/// The Unix time (seconds) of `der`'s `notAfter`, or `None` when `der` is
/// not a certificate this walk understands.
pub fn not_after(der: &[u8]) -> Option<i64> {
    let (cert, _) = element(der, 0x30)?;
    let (tbs, _) = element(cert, 0x30)?;
    let mut rest = tbs;
    if rest.first() == Some(&0xa0) {
        rest = element(rest, 0xa0)?.1; // version
    }
    rest = element(rest, 0x02)?.1; // serial
    rest = element(rest, 0x30)?.1; // signature algorithm
    rest = element(rest, 0x30)?.1; // issuer
    let (validity, _) = element(rest, 0x30)?;
    let tag = *validity.first()?;
    let (_, after) = element(validity, tag)?; // notBefore
    let tag = *after.first()?;
    let (t, _) = element(after, tag)?;
    time(tag, t)
}

/// The content of the DER element at the start of `b` if its tag is `tag`,
/// and what follows it.
fn element(b: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    if *b.first()? != tag {
        return None;
    }
    let first = *b.get(1)? as usize;
    let (len, head) = if first < 0x80 {
        (first, 2)
    } else {
        let n = first & 0x7f;
        if n == 0 || n > 4 {
            return None;
        }
        let len = b.get(2..2 + n)?.iter().fold(0usize, |acc, &x| (acc << 8) | x as usize);
        (len, 2 + n)
    };
    let end = head.checked_add(len)?;
    Some((b.get(head..end)?, b.get(end..)?))
}

/// A UTCTime (`YYMMDDHHMMSSZ`, tag 0x17) or GeneralizedTime
/// (`YYYYMMDDHHMMSSZ`, tag 0x18) as Unix seconds.
fn time(tag: u8, t: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(t).ok()?.strip_suffix('Z')?;
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (year, rest) = match (tag, s.len()) {
        (0x17, 12) => {
            let yy = num(0..2)?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, 2)
        }
        (0x18, 14) => (num(0..4)?, 4),
        _ => return None,
    };
    let f = |i: usize| num(rest + 2 * i..rest + 2 * i + 2);
    let (month, day, h, m, sec) = (f(0)?, f(1)?, f(2)?, f(3)?, f(4)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || h > 23 || m > 59 || sec > 60 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + h * 3600 + m * 60 + sec)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(time(0x17, b"491231235959Z"), Some(2_524_607_999));
        assert_eq!(time(0x18, b"20500101000000Z"), Some(2_524_608_000));
        assert_eq!(time(0x17, b"991301000000Z"), None);
        assert_eq!(time(0x18, b"2050010100000Z"), None);
    }

    #[test]
    fn a_generated_certificates_not_after_is_read() {
        let mut params = rcgen::CertificateParams::new(vec!["a.test".to_string()]).unwrap();
        params.not_after = rcgen::date_time_ymd(2041, 7, 9);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        // 2041-07-09T00:00:00Z
        assert_eq!(not_after(cert.der()), Some(days_from_civil(2041, 7, 9) * 86_400));
        assert_eq!(days_from_civil(2041, 7, 9) * 86_400, 2_256_940_800);
        assert_eq!(not_after(&cert.der()[..40]), None);
        assert_eq!(not_after(b"not a certificate"), None);
    }
}
