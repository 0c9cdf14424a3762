//! `hf3fs-meta ctl health`: one plain HTTP GET of a node's `/health` (or
//! `/ready`), exit 0 on a 200 and 1 on anything else, for a container's
//! health check where there is no curl (the image holds the binary and its
//! libraries only).

use clap::Args;
use std::io::{Read as _, Write as _};
use std::net::ToSocketAddrs as _;
use std::process::ExitCode;
use std::time::Duration;

/// `ctl health`'s flags.
#[derive(Debug, Clone, Args)]
pub struct HealthArgs {
    /// The node (or relay) to ask, `http://host:port`: plain HTTP only (a
    /// server on TLS has its `--plain-listen` loopback listener for this).
    #[arg(long, env = "HF3FS_META_HEALTH_URL", default_value = "http://127.0.0.1:18000")]
    pub url: String,
    /// The route: `/health` (the process serves) or `/ready` (it should get
    /// traffic).
    #[arg(long, default_value = "/health", value_parser = ["/health", "/ready"])]
    pub path: String,
    /// Seconds each step may take (connect, ask, read the answer).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=60))]
    pub timeout: u64,
}

/// Runs `ctl health`: 0 when the answer is a 200, 1 otherwise (another
/// status, no answer, no listener), with the reason on stderr.
pub(super) fn run(a: &HealthArgs) -> ExitCode {
    match status(&a.url, &a.path, Duration::from_secs(a.timeout)) {
        Ok(200) => ExitCode::SUCCESS,
        Ok(code) => {
            eprintln!("hf3fs-meta ctl health: {}{} answered {code}", a.url.trim_end_matches('/'), a.path);
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("hf3fs-meta ctl health: {}{}: {e}", a.url.trim_end_matches('/'), a.path);
            ExitCode::from(1)
        }
    }
}

/// The status code of `GET path` at `url`.
fn status(url: &str, path: &str, timeout: Duration) -> Result<u16, String> {
    if super::super::relay::parse_url(url)?.1 {
        return Err("https is not probed: point --url at the node's --plain-listen address".into());
    }
    let answer = get(url, path, timeout)?;
    parse_status(&answer)
}

/// `GET path` on the node at `url` (`http://host:port`) over plain
/// HTTP/1.1, each step bounded by `timeout`: the whole answer, head and
/// body, at most 1 MiB.
pub(super) fn get(url: &str, path: &str, timeout: Duration) -> Result<Vec<u8>, String> {
    let host = super::super::relay::target_of(url)?;
    let addr = host.to_socket_addrs().map_err(|e| e.to_string())?.next().ok_or("no address")?;
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.take(1 << 20).read_to_end(&mut buf).map_err(|e| e.to_string())?;
    Ok(buf)
}

/// The code of an HTTP/1.x status line.
fn parse_status(head: &[u8]) -> Result<u16, String> {
    let line = std::str::from_utf8(head).unwrap_or_default();
    let mut parts = line.split(' ');
    match (parts.next(), parts.next().and_then(|c| c.parse::<u16>().ok())) {
        (Some(v), Some(code)) if v.starts_with("HTTP/1.") => Ok(code),
        _ => Err(format!("not an HTTP answer: {:?}", String::from_utf8_lossy(head))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert_eq!(parse_status(b"HTTP/1.1 200 OK\r\n"), Ok(200));
        assert_eq!(parse_status(b"HTTP/1.1 503 Service Unavailable\r\n"), Ok(503));
        assert!(parse_status(b"").is_err());
        assert!(parse_status(b"SSH-2.0-OpenSSH_9.2").is_err());
    }

    #[test]
    fn answers_of_a_listener() {
        use std::net::TcpListener;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let serve = |answer: &'static str| {
            let l = l.try_clone().unwrap();
            std::thread::spawn(move || {
                let (mut c, _) = l.accept().unwrap();
                // The whole request head: one read may return part of it.
                let mut req = Vec::new();
                let mut buf = [0u8; 256];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = c.read(&mut buf).unwrap();
                    assert!(n > 0, "the client closed before its request ended");
                    req.extend_from_slice(&buf[..n]);
                }
                assert!(req.starts_with(b"GET /ready HTTP/1.1\r\n"));
                c.write_all(answer.as_bytes()).unwrap();
            })
        };
        let t = serve("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
        assert_eq!(status(&url, "/ready", Duration::from_secs(5)), Ok(200));
        t.join().unwrap();
        let t = serve("HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n");
        assert_eq!(status(&url, "/ready", Duration::from_secs(5)), Ok(503));
        t.join().unwrap();
        drop(l);
        assert!(status(&url, "/ready", Duration::from_secs(5)).is_err(), "nothing listens");
        assert!(status("https://127.0.0.1:1", "/ready", Duration::from_secs(5)).is_err());
    }
}
