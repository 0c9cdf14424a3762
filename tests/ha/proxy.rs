//! A TCP forwarder on loopback whose client-to-server direction can be
//! held: what the client sends meanwhile is kept, and delivered in order
//! on [`Proxy::release`]. Put in front of a standby's replication listener
//! (`--ha-replication-advertise`), it keeps a leader's frames in flight for
//! as long as a test needs.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// One forwarded connection: the server side and the bytes held for it.
struct Conn {
    server: TcpStream,
    pending: Vec<u8>,
}

#[derive(Default)]
struct State {
    hold: bool,
    conns: Vec<Conn>,
}

/// The forwarder; its threads end with their connections.
pub struct Proxy {
    /// Where it listens.
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl Proxy {
    /// Forwards every connection to `to`.
    pub fn start(to: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("its address");
        let state: Arc<Mutex<State>> = Arc::default();
        let st = state.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(to) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else { continue };
                let k = {
                    let mut s = st.lock().unwrap();
                    s.conns.push(Conn { server: s2, pending: Vec::new() });
                    s.conns.len() - 1
                };
                let st = st.clone();
                std::thread::spawn(move || up(client, k, &st));
                std::thread::spawn(move || down(server, c2));
            }
        });
        Proxy { addr, state }
    }

    /// Holds what clients send from now on.
    pub fn hold(&self) {
        self.state.lock().unwrap().hold = true;
    }

    /// Bytes held so far.
    pub fn held(&self) -> usize {
        self.state.lock().unwrap().conns.iter().map(|c| c.pending.len()).sum()
    }

    /// Delivers what was held, and forwards again.
    pub fn release(&self) {
        let mut s = self.state.lock().unwrap();
        s.hold = false;
        for c in &mut s.conns {
            let bytes = std::mem::take(&mut c.pending);
            if c.server.write_all(&bytes).is_err() {
                let _ = c.server.shutdown(Shutdown::Both);
            }
        }
    }
}

/// Client to server, through the hold.
fn up(mut client: TcpStream, k: usize, state: &Mutex<State>) {
    let mut buf = [0u8; 64 * 1024];
    loop {
        let n = client.read(&mut buf).unwrap_or(0);
        let mut s = state.lock().unwrap();
        let hold = s.hold;
        let c = &mut s.conns[k];
        if n == 0 {
            if !hold {
                let _ = c.server.shutdown(Shutdown::Write);
            }
            return;
        }
        if hold {
            c.pending.extend_from_slice(&buf[..n]);
        } else if c.server.write_all(&buf[..n]).is_err() {
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
    }
}

/// Server to client, as it comes.
fn down(mut server: TcpStream, mut client: TcpStream) {
    let _ = std::io::copy(&mut server, &mut client);
    let _ = client.shutdown(Shutdown::Both);
    let _ = server.shutdown(Shutdown::Both);
}
