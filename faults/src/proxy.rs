//! A TCP proxy in front of each node's replication listener, in the node's
//! namespace: every node advertises the proxy's port, so the leader's
//! stream to its standby passes through it. netem is not in this kernel;
//! the proxy gives delay, a blackhole and resets instead (as etcd's
//! robustness suite does with its own proxy).
//!
//! - pass: bytes go through as they come;
//! - delay: each chunk waits the given time before it is forwarded;
//! - blackhole: nothing is read on either side (the kernel's buffers fill
//!   and the sender stalls, as on a link that drops every packet; TCP
//!   delivers what was sent once the link is back);
//! - reset: every connection is closed, and new ones at once.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the proxy does to the link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward as it comes.
    Pass,
    /// Hold each chunk this many ms.
    Delay(u64),
    /// Read nothing.
    Blackhole,
    /// Close everything.
    Reset,
}

impl Mode {
    fn encode(self) -> u64 {
        match self {
            Mode::Pass => 0,
            Mode::Blackhole => 1,
            Mode::Reset => 2,
            Mode::Delay(ms) => 1000 + ms,
        }
    }
    fn decode(v: u64) -> Mode {
        match v {
            0 => Mode::Pass,
            1 => Mode::Blackhole,
            2 => Mode::Reset,
            ms => Mode::Delay(ms - 1000),
        }
    }
}

/// One proxy; its threads end with the namespace (the run removes it).
#[derive(Clone)]
pub struct Proxy {
    mode: Arc<AtomicU64>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    /// Listens at `listen` inside namespace `ns` and forwards to `to`.
    pub fn start(ns: &str, listen: SocketAddr, to: SocketAddr) -> Result<Proxy, String> {
        let p = Proxy { mode: Arc::default(), conns: Arc::default() };
        let (tx, rx) = std::sync::mpsc::channel();
        let (q, ns) = (p.clone(), ns.to_string());
        std::thread::spawn(move || {
            let l = crate::ns::enter(&ns)
                .and_then(|_| TcpListener::bind(listen).map_err(|e| format!("proxy {listen}: {e}")));
            let l = match l {
                Ok(l) => {
                    let _ = tx.send(Ok(()));
                    l
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            for c in l.incoming() {
                let Ok(client) = c else { continue };
                if q.mode() == Mode::Reset {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect_timeout(&to, Duration::from_secs(1)) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else { continue };
                {
                    let mut conns = q.conns.lock().unwrap_or_else(|p| p.into_inner());
                    conns.extend(client.try_clone().ok());
                    conns.extend(server.try_clone().ok());
                }
                let (a, b) = (q.clone(), q.clone());
                std::thread::spawn(move || a.pump(client, s2));
                std::thread::spawn(move || b.pump(server, c2));
            }
        });
        rx.recv().map_err(|_| "the proxy thread died".to_string())??;
        Ok(p)
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        Mode::decode(self.mode.load(Ordering::Relaxed))
    }

    /// Sets the mode; `Reset` closes every connection now.
    pub fn set(&self, m: Mode) {
        self.mode.store(m.encode(), Ordering::Relaxed);
        if m == Mode::Reset {
            for c in self.conns.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
    }

    fn pump(&self, mut from: TcpStream, mut to: TcpStream) {
        let mut buf = [0u8; 64 * 1024];
        loop {
            match self.mode() {
                Mode::Blackhole => {
                    std::thread::sleep(Duration::from_millis(20)); // the link is down: read nothing
                    continue;
                }
                Mode::Reset => break,
                _ => {}
            }
            let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
            let n = match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => continue,
                Err(_) => break,
            };
            if let Mode::Delay(ms) = self.mode() {
                std::thread::sleep(Duration::from_millis(ms)); // the injected delay
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    }
}
