//! The ZMTP codec against malformed input, and the sockets against a
//! tiny peer written here from the codec (raw TCP on loopback).

use super::codec::{self, Decoder, Error, Frame};
use super::*;
use crate::Counters;
use bytes::{BufMut, Bytes, BytesMut};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A greeting of version 3.`minor` with `mechanism`.
fn greeting_of(minor: u8, mechanism: &[u8]) -> Vec<u8> {
    let mut g = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, minor];
    let mut m = [0u8; 20];
    m[..mechanism.len()].copy_from_slice(mechanism);
    g.extend_from_slice(&m);
    g.push(0);
    g.extend_from_slice(&[0; 31]);
    g
}

/// Everything `bytes` decodes to: the greeting's minor, then the frames,
/// until more is needed (`Ok`) or an error.
fn decode_all(bytes: &[u8], max: usize) -> Result<(Option<u8>, Vec<Frame>), Error> {
    let mut d = Decoder::new(max);
    d.buffer().extend_from_slice(bytes);
    let Some(g) = d.greeting()? else { return Ok((None, Vec::new())) };
    let mut frames = Vec::new();
    while let Some(f) = d.frame()? {
        frames.push(f);
    }
    Ok((Some(g.minor), frames))
}

#[test]
fn the_decoder_reads_greetings_and_frames_and_refuses_what_is_malformed() {
    let mut ok = greeting_of(1, b"NULL");
    let mut frames = BytesMut::new();
    codec::frame(&mut frames, true, b"topic");
    codec::frame(&mut frames, false, &[7u8; 300]); // a long frame
    codec::command(&mut frames, b"PING", &[0, 10, b'c']);
    ok.extend_from_slice(&frames);
    let (minor, got) = decode_all(&ok, 1024).unwrap();
    assert_eq!(minor, Some(1));
    assert_eq!(got.len(), 3);
    assert!(got[0].more && !got[0].command && &got[0].body[..] == b"topic");
    assert!(!got[1].more && got[1].body.len() == 300);
    let c = got[2].command().unwrap();
    assert_eq!((&c.name[..], &c.data[..]), (&b"PING"[..], &[0, 10, b'c'][..]));
    assert_eq!(codec::ping(&c.data).unwrap(), (10, Bytes::from_static(b"c")));
    // 3.0 is accepted.
    assert_eq!(decode_all(&greeting_of(0, b"NULL"), 1024).unwrap().0, Some(0));
    // Every prefix of a good stream is "more needed", never an error.
    for n in 0..ok.len() {
        assert!(decode_all(&ok[..n], 1024).is_ok(), "prefix of {n} bytes");
    }
    // Bad greetings, refused as soon as their bytes show it.
    assert!(matches!(decode_all(b"GET / HTTP/1.1\r\n", 1024), Err(Error::Greeting(_))));
    let mut v2 = greeting_of(0, b"NULL");
    v2[10] = 2;
    assert!(matches!(decode_all(&v2[..11], 1024), Err(Error::Greeting(_))), "ZMTP 2");
    assert!(matches!(decode_all(&greeting_of(1, b"PLAIN"), 1024), Err(Error::Greeting(_))));
    assert!(matches!(decode_all(&greeting_of(1, b"NULLX"), 1024), Err(Error::Greeting(_))));
    let mut sig = greeting_of(1, b"NULL");
    sig[9] = 0x7e;
    assert!(matches!(decode_all(&sig, 1024), Err(Error::Greeting(_))));
    // Bad frames: reserved flags, a command with MORE, over the limit
    // (announced: refused before its body arrives).
    let g = greeting_of(1, b"NULL");
    for bad in [&[0x08u8, 0][..], &[0x05, 1, 0], &[0x02, 0, 0, 0, 0, 0, 1, 0, 0], &[0x00, 200]] {
        let mut s = g.clone();
        s.extend_from_slice(bad);
        assert!(matches!(decode_all(&s, 100), Err(Error::Frame(_))), "{bad:?}");
    }
    let mut huge = g.clone();
    huge.extend_from_slice(&[0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
    assert!(matches!(decode_all(&huge, usize::MAX >> 1), Err(Error::Frame(_))), "2^64-1 bytes");
    // Bad commands and properties.
    let f = |b: &[u8]| Frame { more: false, command: true, body: Bytes::copy_from_slice(b) };
    assert!(f(&[]).command().is_err());
    assert!(f(&[0]).command().is_err());
    assert!(f(&[5, b'P', b'I']).command().is_err());
    assert!(codec::properties(&[11, b'S']).is_err());
    assert!(codec::properties(&[1, b'a', 0, 0, 0, 9, b'x']).is_err());
    assert_eq!(
        codec::properties(&[1, b'A', 0, 0, 0, 1, b'x']).unwrap(),
        vec![(b"a".to_vec(), Bytes::from_static(b"x"))]
    );
    assert!(codec::ping(&Bytes::from_static(&[0])).is_err());
    assert!(codec::ping(&Bytes::from(vec![0; 19])).is_err());
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Random bytes, and good streams with random bytes changed, truncated
/// or appended, fed in random pieces: the decoder answers a frame, "more
/// needed" or an error, never panics, never returns a frame over the
/// limit, and never reads past an error.
#[test]
fn the_decoder_survives_random_and_mutated_input() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut good = greeting_of(1, b"NULL");
    let mut b = BytesMut::new();
    codec::ready(&mut b, &[(b"Socket-Type", b"SUB"), (b"Identity", b"x")]);
    codec::command(&mut b, b"SUBSCRIBE", b"kv@");
    codec::command(&mut b, b"PING", &[0, 30, 1, 2, 3]);
    codec::frame(&mut b, true, &[1u8; 40]);
    codec::frame(&mut b, false, &[2u8; 600]);
    good.extend_from_slice(&b);
    let (mut frames, mut errors) = (0, 0);
    for round in 0..4000 {
        let mut input: Vec<u8> = if round % 4 == 0 {
            (0..rng.next() % 200).map(|_| rng.next() as u8).collect()
        } else {
            let mut v = good.clone();
            for _ in 0..=rng.next() % 4 {
                let i = (rng.next() as usize) % v.len();
                v[i] = rng.next() as u8;
            }
            v.truncate((rng.next() as usize) % (v.len() + 1));
            v
        };
        if round % 7 == 0 {
            input.extend((0..rng.next() % 32).map(|_| rng.next() as u8));
        }
        let max = 512;
        let mut d = Decoder::new(max);
        let mut greeted = false;
        let mut at = 0;
        'feed: while at < input.len() {
            let n = 1 + (rng.next() as usize) % 70;
            let end = (at + n).min(input.len());
            d.buffer().extend_from_slice(&input[at..end]);
            at = end;
            loop {
                let step = if greeted {
                    d.frame().map(|f| f.map(|f| (f, ())))
                } else {
                    d.greeting().map(|g| g.map(|_| (Frame { more: false, command: false, body: Bytes::new() }, ())))
                };
                match step {
                    Ok(Some((f, ()))) => {
                        if greeted {
                            assert!(f.body.len() <= max);
                            frames += 1;
                            if f.command {
                                let _ =
                                    f.command().map(|c| (codec::properties(&c.data).ok(), codec::ping(&c.data).ok()));
                            }
                        }
                        greeted = true;
                    }
                    Ok(None) => break,
                    Err(_) => {
                        errors += 1;
                        break 'feed;
                    }
                }
            }
        }
    }
    assert!(frames > 1000 && errors > 1000, "both paths taken: {frames} frames, {errors} errors");
}

/// A peer written from the codec: greets, says READY, reads frames.
struct Peer {
    s: TcpStream,
    dec: Decoder,
}

impl Peer {
    /// Connects to `endpoint` and shakes hands as a 3.`minor` `socket_type`.
    async fn connect(endpoint: &str, minor: u8, socket_type: &[u8], identity: &[u8]) -> (Peer, Bytes) {
        let s = TcpStream::connect(address(endpoint).unwrap()).await.unwrap();
        Peer::hello(s, minor, socket_type, identity).await
    }

    /// Shakes hands over `s`; the other side's socket type.
    async fn hello(mut s: TcpStream, minor: u8, socket_type: &[u8], identity: &[u8]) -> (Peer, Bytes) {
        let mut out = BytesMut::from(&greeting_of(minor, b"NULL")[..]);
        let mut props: Vec<(&[u8], &[u8])> = vec![(b"Socket-Type", socket_type)];
        if !identity.is_empty() {
            props.push((b"Identity", identity));
        }
        codec::ready(&mut out, &props);
        s.write_all(&out).await.unwrap();
        let mut p = Peer { s, dec: Decoder::new(1 << 20) };
        while p.dec.greeting().unwrap().is_none() {
            assert!(p.s.read_buf(p.dec.buffer()).await.unwrap() > 0);
        }
        let ready = p.frame().await.expect("READY").command().unwrap();
        assert_eq!(&ready.name[..], b"READY");
        let props = codec::properties(&ready.data).unwrap();
        let t = props.iter().find(|(k, _)| k == b"socket-type").unwrap().1.clone();
        (p, t)
    }

    /// The next frame; `None` once the other side closed.
    async fn frame(&mut self) -> Option<Frame> {
        loop {
            if let Some(f) = self.dec.frame().unwrap() {
                return Some(f);
            }
            if self.s.read_buf(self.dec.buffer()).await.unwrap_or(0) == 0 {
                return None;
            }
        }
    }

    /// The next message's frames (commands skipped).
    async fn message(&mut self) -> Vec<Bytes> {
        let mut parts = Vec::new();
        loop {
            let f = self.frame().await.expect("a message");
            if f.command {
                continue;
            }
            parts.push(f.body);
            if !f.more {
                return parts;
            }
        }
    }

    async fn send(&mut self, build: impl FnOnce(&mut BytesMut)) {
        let mut out = BytesMut::new();
        build(&mut out);
        self.s.write_all(&out).await.unwrap();
    }

    /// PING with `ttl` and `context`; waits for its PONG (what came
    /// before the PING was handled by then).
    async fn ping(&mut self, ttl: u16, context: &[u8]) {
        let mut data = ttl.to_be_bytes().to_vec();
        data.extend_from_slice(context);
        self.send(|o| codec::command(o, b"PING", &data)).await;
        loop {
            let f = self.frame().await.expect("the PONG");
            if f.command {
                let c = f.command().unwrap();
                assert_eq!(&c.name[..], b"PONG");
                assert_eq!(&c.data[..], context, "the PONG echoes the PING's context");
                return;
            }
        }
    }
}

fn msg(topic: &str, n: u8) -> Vec<Bytes> {
    vec![Bytes::copy_from_slice(topic.as_bytes()), Bytes::from(vec![n; 8]), Bytes::from(vec![n; 1000])]
}

/// A 3.1 SUB (SUBSCRIBE and CANCEL commands) and a 3.0 SUB (1/0
/// messages) get what matches their prefixes, in order, multipart, and
/// are answered at each PING; a subscriber that stops reading loses what
/// is past its queue (counted), and the others do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pub_filters_by_prefix_answers_pings_and_drops_past_each_peers_queue() {
    let counters = Arc::new(Counters::default());
    let publ = PubSocket::new(4, counters.clone());
    let ep = publ.bind("tcp://127.0.0.1:0").await.unwrap();
    let (mut a, t) = Peer::connect(&ep, 1, b"SUB", b"").await;
    assert_eq!(&t[..], b"PUB");
    a.send(|o| codec::command(o, b"SUBSCRIBE", b"kv@a")).await;
    a.send(|o| codec::command(o, b"SUBSCRIBE", b"kv@z")).await;
    a.send(|o| codec::command(o, b"CANCEL", b"kv@z")).await;
    a.ping(0, b"ctx-a").await;
    let (mut b, _) = Peer::connect(&ep, 0, b"XSUB", b"").await;
    b.send(|o| codec::frame(o, false, b"\x01kv@")).await;
    b.ping(0, b"").await;
    assert_eq!(counters.subscribers.load(Ordering::Relaxed), 2);
    assert_eq!(publ.send(msg("kv@z", 1)), 0);
    assert_eq!(publ.send(msg("kv@a@1", 2)), 0);
    assert_eq!(publ.send(msg("other", 3)), 0);
    assert_eq!(a.message().await, msg("kv@a@1", 2), "kv@z cancelled, other not subscribed");
    assert_eq!(b.message().await, msg("kv@z", 1));
    assert_eq!(b.message().await, msg("kv@a@1", 2));
    // b cancels (3.0 form): nothing more for it; a's PING TTL of 10 s is
    // kept while it talks.
    b.send(|o| codec::frame(o, false, b"\x00kv@")).await;
    b.ping(0, b"b").await;
    a.ping(100, b"a2").await;
    assert_eq!(publ.send(msg("kv@b", 4)), 0, "nobody subscribed to kv@b");
    // a stops reading: its queue (4) and the socket buffers fill, then
    // each message is dropped for it and counted.
    let mut dropped = 0;
    for i in 0..5000u32 {
        dropped += publ.send(msg("kv@a@2", i as u8));
        if dropped >= 3 {
            break;
        }
    }
    assert_eq!(dropped, 3, "dropped once its queue is full, never waited on");
    // Still connected, it reads in order from where it was.
    assert_eq!(a.message().await, msg("kv@a@2", 0));
    // A peer that is not a subscriber is refused with ERROR.
    let mut s = TcpStream::connect(address(&ep).unwrap()).await.unwrap();
    let mut out = BytesMut::from(&greeting_of(1, b"NULL")[..]);
    codec::ready(&mut out, &[(b"Socket-Type", b"DEALER")]);
    s.write_all(&out).await.unwrap();
    let mut p = Peer { s, dec: Decoder::new(1 << 20) };
    while p.dec.greeting().unwrap().is_none() {
        assert!(p.s.read_buf(p.dec.buffer()).await.unwrap() > 0);
    }
    assert_eq!(&p.frame().await.unwrap().command().unwrap().name[..], b"READY");
    assert_eq!(&p.frame().await.unwrap().command().unwrap().name[..], b"ERROR");
    assert!(p.frame().await.is_none(), "then closed");
    // b still served.
    b.send(|o| codec::command(o, b"SUBSCRIBE", b"")).await;
    b.ping(0, b"").await;
    publ.send(msg("anything", 9));
    assert_eq!(b.message().await, msg("anything", 9));
}

/// Garbage, a ZMTP 2 greeting, an oversized frame, a truncated frame:
/// each connection is closed, and the socket goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_peers_are_dropped_and_the_socket_goes_on() {
    let publ = PubSocket::new(16, Arc::new(Counters::default()));
    let ep = publ.bind("tcp://127.0.0.1:0").await.unwrap();
    let closed = |mut s: TcpStream| async move {
        let mut buf = vec![0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    let mut v2 = greeting_of(0, b"NULL");
    v2[10] = 2;
    let mut over = greeting_of(1, b"NULL");
    let mut r = BytesMut::new();
    codec::ready(&mut r, &[(b"Socket-Type", b"SUB")]);
    over.extend_from_slice(&r);
    over.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x10, 0, 0, 0]); // 1 MiB announced
    let mut bad_ready = greeting_of(1, b"NULL");
    bad_ready.extend_from_slice(&[0x04, 9, 5, b'R', b'E', b'A', b'D', b'Y', 1, b'x', 0]);
    for bytes in [b"GET / HTTP/1.1\r\n\r\n".to_vec(), v2, over, bad_ready] {
        let mut s = TcpStream::connect(address(&ep).unwrap()).await.unwrap();
        s.write_all(&bytes).await.unwrap();
        closed(s).await;
    }
    // Truncated: half a frame, then the peer closes; the socket notices.
    let (mut p, _) = Peer::connect(&ep, 1, b"SUB", b"").await;
    p.send(|o| o.put_slice(&[0x00, 50, 1, 2])).await;
    p.s.shutdown().await.unwrap();
    assert!(p.frame().await.is_none());
    let (mut ok, _) = Peer::connect(&ep, 1, b"SUB", b"").await;
    ok.send(|o| codec::command(o, b"SUBSCRIBE", b"t")).await;
    ok.ping(0, b"alive").await;
    publ.send(msg("t", 1));
    assert_eq!(ok.message().await, msg("t", 1));
}

/// The TTL of a peer's PING: silent past it (100 ms here), the peer is
/// dropped, never before; a peer that gave no TTL is kept, however long
/// it stays silent, and still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_silent_past_its_ttl_is_dropped() {
    let publ = PubSocket::new(16, Arc::new(Counters::default()));
    let ep = publ.bind("tcp://127.0.0.1:0").await.unwrap();
    let (mut quiet, _) = Peer::connect(&ep, 1, b"SUB", b"").await;
    quiet.send(|o| codec::command(o, b"SUBSCRIBE", b"t")).await;
    quiet.ping(0, b"q").await;
    let (mut p, _) = Peer::connect(&ep, 1, b"SUB", b"").await;
    let start = std::time::Instant::now();
    p.ping(1, b"t").await; // 100 ms
    assert!(p.frame().await.is_none(), "closed once silent past its TTL");
    assert!(start.elapsed() >= Duration::from_millis(100), "closed before its TTL: {:?}", start.elapsed());
    // The quiet peer, silent all along with no TTL, is still served.
    quiet.ping(0, b"unaffected").await;
    publ.send(msg("t", 7));
    assert_eq!(quiet.message().await, msg("t", 7));
}

/// A connecting PUB: it shakes hands as a client with the SUB that
/// listens, and connects again once that connection ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connecting_pub_reconnects() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ep = format!("tcp://{}", listener.local_addr().unwrap());
    let publ = PubSocket::new(16, Arc::new(Counters::default()));
    publ.connect(&ep).unwrap();
    for round in 0..2u8 {
        let (s, _) = listener.accept().await.unwrap();
        let (mut p, t) = Peer::hello(s, 1, b"SUB", b"").await;
        assert_eq!(&t[..], b"PUB");
        p.send(|o| codec::command(o, b"SUBSCRIBE", b"")).await;
        p.ping(0, b"").await;
        publ.send(msg("x", round));
        assert_eq!(p.message().await, msg("x", round));
        drop(p); // the connection ends: the PUB connects again
    }
}

/// A ROUTER: each message received behind its sender's identity (its
/// own, or one made for it), each answer routed by the first frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_routes_by_identity() {
    let (mut router, ep) = RouterSocket::bind("tcp://127.0.0.1:0").await.unwrap();
    let (mut named, t) = Peer::connect(&ep, 1, b"DEALER", b"me").await;
    assert_eq!(&t[..], b"ROUTER");
    let (mut anon, _) = Peer::connect(&ep, 0, b"REQ", b"").await;
    named
        .send(|o| {
            codec::frame(o, true, b"");
            codec::frame(o, false, b"hello");
        })
        .await;
    let m = router.recv().await.unwrap();
    assert_eq!(m, vec![Bytes::from_static(b"me"), Bytes::new(), Bytes::from_static(b"hello")]);
    anon.send(|o| codec::frame(o, false, b"x")).await;
    let m = router.recv().await.unwrap();
    assert_eq!(m.len(), 2);
    assert_eq!((m[0].len(), m[0][0]), (5, 0), "an identity made for it: 00 and a number");
    let anon_id = m[0].clone();
    assert!(router.send(vec![anon_id, Bytes::from_static(b"to-anon")]).await);
    assert!(
        router
            .send(vec![Bytes::from_static(b"me"), Bytes::new(), Bytes::from_static(b"a"), Bytes::from_static(b"b")])
            .await
    );
    assert!(!router.send(vec![Bytes::from_static(b"nobody"), Bytes::new()]).await, "no such peer");
    assert_eq!(anon.message().await, vec![Bytes::from_static(b"to-anon")]);
    assert_eq!(named.message().await, vec![Bytes::new(), Bytes::from_static(b"a"), Bytes::from_static(b"b")]);
    named.ping(0, b"r").await;
    // Gone: its identity routes nowhere.
    named.s.shutdown().await.unwrap();
    assert!(named.frame().await.is_none());
    while router.send(vec![Bytes::from_static(b"me"), Bytes::new()]).await {
        tokio::task::yield_now().await;
    }
}
