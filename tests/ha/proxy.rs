//! A TCP forwarder on loopback that can hold what crosses it: what is sent
//! meanwhile is kept, and delivered in order later. Put in front of a
//! standby's replication listener (`--ha-replication-advertise`), it keeps
//! a leader's frames in flight for as long as a test needs
//! ([`Proxy::hold`]: the leader-to-standby direction), or blackholes the
//! link both ways ([`Proxy::cut`]: nothing crosses, new connections
//! included, and both processes stay alive; [`Proxy::heal`] delivers what
//! was held, closes included, as TCP's retransmissions would).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// One direction of a forwarded connection: where it writes, the bytes
/// held for it, and whether its sender closed meanwhile.
struct Side {
    to: TcpStream,
    pending: Vec<u8>,
    closed: bool,
}

impl Side {
    /// Delivers what was held (and the close, if one came).
    fn flush(&mut self) {
        let bytes = std::mem::take(&mut self.pending);
        if self.to.write_all(&bytes).is_err() || self.closed {
            let _ = self.to.shutdown(Shutdown::Write);
        }
    }
}

/// One forwarded connection: client to server, server to client.
struct Conn {
    up: Side,
    down: Side,
}

#[derive(Default)]
struct State {
    /// Client-to-server bytes are held.
    hold: bool,
    /// Both directions are held (a black hole).
    cut: bool,
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
                    let side = |to| Side { to, pending: Vec::new(), closed: false };
                    s.conns.push(Conn { up: side(s2), down: side(c2) });
                    s.conns.len() - 1
                };
                let (st1, st2) = (st.clone(), st.clone());
                std::thread::spawn(move || pump(client, k, true, &st1));
                std::thread::spawn(move || pump(server, k, false, &st2));
            }
        });
        Proxy { addr, state }
    }

    /// Holds what clients send from now on.
    pub fn hold(&self) {
        self.state.lock().unwrap().hold = true;
    }

    /// Bytes held so far, both directions.
    pub fn held(&self) -> usize {
        let s = self.state.lock().unwrap();
        s.conns.iter().map(|c| c.up.pending.len() + c.down.pending.len()).sum()
    }

    /// Delivers what clients sent while held, and forwards again (unless
    /// the link is cut).
    pub fn release(&self) {
        let mut s = self.state.lock().unwrap();
        s.hold = false;
        if !s.cut {
            s.conns.iter_mut().for_each(|c| c.up.flush());
        }
    }

    /// Blackholes the link: nothing crosses either way from now on.
    pub fn cut(&self) {
        self.state.lock().unwrap().cut = true;
    }

    /// Ends [`Proxy::cut`]: what was held is delivered, and forwarded again.
    pub fn heal(&self) {
        let mut s = self.state.lock().unwrap();
        s.cut = false;
        let hold = s.hold;
        for c in &mut s.conns {
            c.down.flush();
            if !hold {
                c.up.flush();
            }
        }
    }
}

/// One direction of connection `k` (`up`: client to server), through the
/// hold and the cut.
fn pump(mut from: TcpStream, k: usize, up: bool, state: &Mutex<State>) {
    let mut buf = [0u8; 64 * 1024];
    loop {
        let n = from.read(&mut buf).unwrap_or(0);
        let mut s = state.lock().unwrap();
        let held = s.cut || (up && s.hold);
        let c = &mut s.conns[k];
        let side = if up { &mut c.up } else { &mut c.down };
        if n == 0 {
            side.closed = true;
            if !held {
                let _ = side.to.shutdown(Shutdown::Write);
            }
            return;
        }
        if held {
            side.pending.extend_from_slice(&buf[..n]);
        } else if side.to.write_all(&buf[..n]).is_err() {
            let _ = from.shutdown(Shutdown::Both);
            return;
        }
    }
}
