//! The publisher's queue, numbering and replay buffer, without sockets;
//! and one publisher on loopback, end to end.

use super::*;
use hf3fs_meta_core::KeyRef;
use std::collections::VecDeque;
// The `zeromq` crate: an independent peer (SUB, DEALER) of this crate's own transport.
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

fn key(i: u8) -> Block {
    Block::of(KeyRef::parse(&format!("{:032x}", u128::from(i) + 1))).unwrap()
}

fn ring(cap: usize) -> Ring {
    Ring { entries: VecDeque::new(), cap, bytes: 0, next: 100, base: 100, resync: None }
}

#[test]
fn a_full_queue_drops_the_batch_counts_it_and_the_next_number_skips_it() {
    let counters = Arc::new(Counters::default());
    let (tx, mut rx) = mpsc::channel(1);
    let stream = Arc::new(StreamCounters::default());
    let sink =
        Sink { tx, counters: counters.clone(), topic: 3, stream: stream.clone(), tracked: true, pool: Arc::default() };
    sink.publish(0, vec![Event::Stored(key(1))]);
    sink.publish(0, vec![Event::Stored(key(2)), Event::Removed(key(1))]);
    assert_eq!(counters.dropped_batches(), 1);
    assert_eq!(counters.dropped_events.load(Ordering::Relaxed), 2);
    assert_eq!(stream.lost.load(Ordering::Relaxed), 1, "the next batch of its topic skips one number");
    assert_eq!(stream.dropped(), 2, "counted for its tenant too");
    assert_eq!(counters.queued(), 1, "only the first is queued");
    let q = rx.try_recv().expect("the first batch");
    assert_eq!(q.topic, 3, "queued with its sink's topic");
    assert_eq!(q.events, vec![Event::Stored(key(1))]);
    let mut text = String::new();
    counters.render(&mut text);
    assert!(text.contains("hf3fs_meta_kv_events_dropped_total 2\n"), "{text}");
    assert!(text.contains("hf3fs_meta_kv_events_dropped_batches_total 1\n"), "{text}");
}

#[test]
fn a_replay_answers_from_the_start_or_asks_for_a_resync() {
    let mut r = ring(3);
    for s in 100..105 {
        r.push(s, Bytes::from(vec![s as u8; 10]));
        r.next = s + 1;
    }
    assert_eq!(r.bytes, 30, "three batches of 10 bytes buffered");
    let seqs = |v: Option<Vec<(u64, Bytes)>>| v.map(|v| v.into_iter().map(|(s, _)| s).collect::<Vec<_>>());
    assert_eq!(seqs(r.from(102)), Some(vec![102, 103, 104]));
    assert_eq!(seqs(r.from(104)), Some(vec![104]));
    assert_eq!(seqs(r.from(105)), Some(vec![]), "nothing missed: the end marker only");
    assert_eq!(seqs(r.from(101)), None, "older than the buffer: resync");
    assert_eq!(seqs(r.from(7)), None, "from before this leadership: resync");
    // A dropped batch (a number skipped) is not buffered: resync.
    r.push(106, Bytes::from_static(b"x"));
    r.next = 107;
    assert_eq!(seqs(r.from(105)), None);
    assert_eq!(seqs(r.from(106)), Some(vec![106]));
}

#[test]
fn the_resync_mark_goes_with_its_batch() {
    let mut r = ring(2);
    r.push(100, Bytes::new());
    r.resync = Some(100);
    r.push(101, Bytes::new());
    assert_eq!(r.resync, Some(100));
    r.push(102, Bytes::new());
    assert_eq!(r.resync, None, "its first batch left the buffer");
}

#[test]
fn the_endpoint_decides_bind_or_connect() {
    assert_eq!(plan("tcp://*:5557", false), Ok((true, "tcp://0.0.0.0:5557".into())));
    assert_eq!(plan("tcp://[::]:5557", false), Ok((true, "tcp://[::]:5557".into())));
    assert_eq!(plan("tcp://10.0.0.1:5557", false), Ok((false, "tcp://10.0.0.1:5557".into())));
    assert_eq!(plan("tcp://127.0.0.1:5557", true), Ok((true, "tcp://127.0.0.1:5557".into())));
    assert!(plan("ipc:///tmp/x", false).is_err());
    assert!(plan("tcp://host:port", false).is_err());
    assert!(plan("tcp://host", false).is_err());
}

fn settings(endpoint: &str, replay: Option<&str>) -> EventSettings {
    EventSettings {
        endpoint: endpoint.into(),
        bind: true,
        replay_endpoint: replay.map(Into::into),
        topic: "kv@t@m".into(),
        buffer_steps: 16,
        hwm: 16,
        layout: Layout { format: wire::Format::Map, medium: "STORAGE".into(), block_size: 0, dp_rank: 0 },
        hash: HashForm::U64,
        heartbeat: None,
    }
}

/// The `zeromq` crate's SUB and DEALER against the
/// publisher: the start-up resync, a batch, a replay and its end marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_sees_the_resync_then_each_batch_and_replays_it() {
    let keys = Arc::new(Mutex::new(vec![key(7)]));
    let k = keys.clone();
    let snapshot: Snapshot = Arc::new(move |f| k.lock().unwrap().iter().cloned().for_each(&mut *f));
    let counters = Arc::new(Counters::default());
    // Port 0: the OS picks; the endpoints as bound come back.
    let p =
        start(settings("tcp://127.0.0.1:0", Some("tcp://127.0.0.1:0")), counters.clone(), Arc::new(|| true), snapshot)
            .await
            .expect("publisher");
    let mut sub = zeromq::SubSocket::new();
    sub.subscribe("kv@").await.unwrap();
    sub.connect(&p.endpoint).await.unwrap();
    // The start-up resync went out before the subscriber joined; a replay
    // from 0 brings it: AllBlocksCleared, then key 7.
    let mut dealer = zeromq::DealerSocket::new();
    dealer.connect(p.replay_endpoint.as_deref().unwrap()).await.unwrap();
    let ask =
        |start: u64| ZmqMessage::try_from(vec![Bytes::new(), Bytes::copy_from_slice(&start.to_be_bytes())]).unwrap();
    dealer.send(ask(0)).await.unwrap();
    let mut got = Vec::new();
    loop {
        let m = dealer.recv().await.unwrap().into_vec();
        assert_eq!(m.len(), 4, "[\"\", topic, seq, payload]");
        if m[2][..] == END_SEQ {
            assert!(m[1].is_empty() && m[3].is_empty());
            break;
        }
        assert_eq!(&m[1][..], b"kv@t@m");
        got.push((u64::from_be_bytes(m[2][..].try_into().unwrap()), m[3].clone()));
    }
    assert_eq!(got.len(), 2, "AllBlocksCleared, then the snapshot's one batch");
    let start = got[0].0;
    assert!(start > 1_600_000_000_000_000, "numbers count from the time in microseconds: {start}");
    assert_eq!(got[1].0, start + 1);
    let layout = settings("", None).layout;
    assert_eq!(&got[0].1[..], &layout.encode(decode_ts(&got[0].1), &[WireEvent::Cleared])[..]);
    let h = HashForm::U64.of(&key(7));
    assert_eq!(&got[1].1[..], &layout.encode(decode_ts(&got[1].1), &[WireEvent::Stored(vec![h.clone()])])[..]);
    // Until the SUB's handshake is done, the PUB drops its messages:
    // publish until one arrives, then check the numbering from there.
    let mut seq = 0;
    for i in 0u8..=250 {
        p.vllm.publish(0, vec![Event::Stored(key(i)), Event::Removed(key(i))]);
        if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(200), sub.recv()).await {
            let m = m.into_vec();
            assert_eq!(m.len(), 3, "[topic, seq, payload]");
            assert_eq!(&m[0][..], b"kv@t@m");
            seq = u64::from_be_bytes(m[1][..].try_into().unwrap());
            let ts = decode_ts(&m[2]);
            // A SUB whose handshake was done in time sees a resync first
            // (the start-up one, or the one the replay from 0 sent on the
            // PUB too, as it asked for what is no longer buffered): the
            // same two batches. Skip it.
            let resync =
                [layout.encode(ts, &[WireEvent::Cleared]), layout.encode(ts, &[WireEvent::Stored(vec![h.clone()])])];
            if resync.iter().any(|r| m[2][..] == r[..]) {
                continue;
            }
            // The operations queued when the publisher woke make one
            // batch: the first to arrive holds those of publishes j..=k.
            let batch_of = |j: u8, k: u8| {
                let events: Vec<WireEvent> = (j..=k)
                    .flat_map(|x| {
                        let h = HashForm::U64.of(&key(x));
                        [WireEvent::Stored(vec![h.clone()]), WireEvent::Removed(vec![h])]
                    })
                    .collect();
                layout.encode(ts, &events)
            };
            assert!((0..=i).any(|j| (j..=i).any(|k| m[2][..] == batch_of(j, k)[..])), "{:?}", &m[2]);
            break;
        }
    }
    assert!(seq > got[1].0);
    // A replay from that number answers it and what followed.
    dealer.send(ask(seq)).await.unwrap();
    let first = dealer.recv().await.unwrap().into_vec();
    assert_eq!(u64::from_be_bytes(first[2][..].try_into().unwrap()), seq);
    assert!(counters.batches() >= 3);
}

/// The `ts` of an encoded batch (its bytes 2..10 after `93 cb`).
fn decode_ts(payload: &[u8]) -> f64 {
    assert_eq!(&payload[..2], &[0x93, 0xcb]);
    f64::from_be_bytes(payload[2..10].try_into().unwrap())
}

#[test]
fn a_tenant_topic_comes_from_its_table_or_the_pattern() {
    assert_eq!(tenant_topic("kv@h@{tenant}", "h", "default"), "kv@h@default");
    assert_eq!(tenant_topic("kv@h@{tenant}", "h", "team-a"), "kv@h@team-a");
    assert_eq!(tenant_topic("kv@SHARED_STORAGE@{tenant}", "h", "a"), "kv@SHARED_STORAGE@a");
    // A pattern without the placeholder is the default tenant's topic.
    assert_eq!(tenant_topic("kv@SHARED_STORAGE@Qwen/Qwen3-8B", "h", "default"), "kv@SHARED_STORAGE@Qwen/Qwen3-8B");
    assert_eq!(tenant_topic("kv@SHARED_STORAGE@Qwen/Qwen3-8B", "h", "a"), "kv@h@a");
    let t = tenant_topics("kv@h@{tenant}", "h", [("default", None), ("a", Some("kv@S@m")), ("b", None)]).unwrap();
    assert_eq!(t["default"], "kv@h@default");
    assert_eq!(t["a"], "kv@S@m");
    assert_eq!(t["b"], "kv@h@b");
    let e = tenant_topics("kv@h@{tenant}", "h", [("a", Some("kv@h@b")), ("b", None)]).unwrap_err();
    assert!(e.contains("'kv@h@b' is given to tenants 'a' and 'b'"), "{e}");
    let e = tenant_topics("x", "h", [("default", None), ("a", Some("x"))]).unwrap_err();
    assert!(e.contains("'x' is given to tenants 'default' and 'a'"), "{e}");
    let e = tenant_topics("kv@h@{tenant}", "h", [("a", Some(""))]).unwrap_err();
    assert!(e.contains("[tenants.a]: its KV-events topic is empty"), "{e}");
}

#[test]
fn a_replay_request_names_its_topic_or_the_default_one() {
    let b = |x: &[u8]| Bytes::copy_from_slice(x);
    let start = 42u64.to_be_bytes();
    assert_eq!(request(&[b(b"id"), b(b""), b(&start)]), Some((b(b"id"), None, 42)), "vLLM's: the default topic");
    assert_eq!(request(&[b(b"id"), b(b""), b(b"kv@h@a"), b(&start)]), Some((b(b"id"), Some(b(b"kv@h@a")), 42)));
    assert_eq!(request(&[b(b"id"), b(b""), b(b""), b(&start)]), None, "an empty topic");
    assert_eq!(request(&[b(b"id"), b(b"x"), b(&start)]), None, "no delimiter");
    assert_eq!(request(&[b(b"id"), b(b""), b(b"1234567")]), None, "7 bytes");
    assert_eq!(request(&[b(b"id"), b(b""), b(b"t"), b(&start), b(b"")]), None, "five frames");
}

/// Two tenants' topics on one publisher, seen through replay (reliable,
/// unlike a SUB's first messages): each numbered on its own, each replay
/// answering its own topic's batches; a removed topic's last batch is
/// AllBlocksCleared, and it answers nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_topic_is_numbered_replayed_and_removed_on_its_own() {
    let of = |keys: Vec<Block>| -> Snapshot { Arc::new(move |f| keys.iter().cloned().for_each(&mut *f)) };
    let counters = Arc::new(Counters::default());
    let p = start(
        settings("tcp://127.0.0.1:0", Some("tcp://127.0.0.1:0")),
        counters.clone(),
        Arc::new(|| true),
        of(vec![key(1)]),
    )
    .await
    .expect("publisher");
    let b = p.topics.add("team-b", "kv@t@b", of(vec![key(1), key(2)]));
    let mut dealer = zeromq::DealerSocket::new();
    dealer.connect(p.replay_endpoint.as_deref().unwrap()).await.unwrap();
    let layout = settings("", None).layout;
    let h = |i| HashForm::U64.of(&key(i));
    // Every batch of a topic's replay from `start`, with its topic frame.
    async fn replay(d: &mut zeromq::DealerSocket, topic: Option<&[u8]>, start: u64) -> Vec<(Bytes, u64, Bytes)> {
        let mut frames = vec![Bytes::new()];
        frames.extend(topic.map(Bytes::copy_from_slice));
        frames.push(Bytes::copy_from_slice(&start.to_be_bytes()));
        d.send(ZmqMessage::try_from(frames).unwrap()).await.unwrap();
        let mut got = Vec::new();
        loop {
            let m = d.recv().await.unwrap().into_vec();
            if m[2][..] == END_SEQ {
                return got;
            }
            got.push((m[1].clone(), u64::from_be_bytes(m[2][..].try_into().unwrap()), m[3].clone()));
        }
    }
    // Both start-up resyncs done (each is marked before it is counted): a
    // replay from 0 is answered from them and asks for no other.
    while counters.resyncs.load(Ordering::Relaxed) < 2 {
        tokio::task::yield_now().await;
    }
    let a0 = replay(&mut dealer, None, 0).await;
    let b0 = replay(&mut dealer, Some(b"kv@t@b"), 0).await;
    assert_eq!(a0.len(), 2, "the default topic's resync: AllBlocksCleared, key 1");
    assert_eq!(b0.len(), 2, "team-b's resync: AllBlocksCleared, keys 1 and 2");
    assert!(a0.iter().all(|(t, _, _)| &t[..] == b"kv@t@m"));
    assert!(b0.iter().all(|(t, _, _)| &t[..] == b"kv@t@b"));
    assert_eq!(&b0[1].2[..], &layout.encode(decode_ts(&b0[1].2), &[WireEvent::Stored(vec![h(1), h(2)])])[..]);
    // Batches of one topic leave no gap in the other's numbers.
    p.vllm.publish(0, vec![Event::Removed(key(1))]);
    b.sglang.publish(0, vec![Event::Stored(key(3))]);
    b.vllm.publish(0, vec![Event::Removed(key(2))]);
    p.sglang.publish(0, vec![Event::Stored(key(4))]);
    // Replayed once published (`queued` is 0 only then).
    while counters.queued() > 0 {
        tokio::task::yield_now().await;
    }
    let a1 = replay(&mut dealer, None, a0[1].1 + 1).await;
    let b1 = replay(&mut dealer, Some(b"kv@t@b"), b0[1].1 + 1).await;
    let events = |v: &[(Bytes, u64, Bytes)]| v.iter().map(|(_, _, p)| p.clone()).collect::<Vec<_>>();
    let seqs = |v: &[(Bytes, u64, Bytes)]| v.iter().map(|(_, s, _)| *s).collect::<Vec<_>>();
    // The two operations of a topic make one or two batches (coalesced or not).
    let all_a = [WireEvent::Removed(vec![h(1)]), WireEvent::Stored(vec![h(4)])];
    let all_b = [WireEvent::Stored(vec![h(3)]), WireEvent::Removed(vec![h(2)])];
    for (got, all, before, topic) in [(&a1, &all_a, a0[1].1, &b"kv@t@m"[..]), (&b1, &all_b, b0[1].1, &b"kv@t@b"[..])] {
        let s = seqs(got);
        assert!(!s.is_empty() && s[0] == before + 1, "{s:?}");
        assert!(s.windows(2).all(|w| w[1] == w[0] + 1), "no gap: {s:?}");
        assert!(got.iter().all(|(t, _, _)| &t[..] == topic));
        let p = events(got);
        let whole = p.len() == 1 && p[0][..] == layout.encode(decode_ts(&p[0]), all)[..];
        let split = p.len() == 2
            && p[0][..] == layout.encode(decode_ts(&p[0]), &all[..1])[..]
            && p[1][..] == layout.encode(decode_ts(&p[1]), &all[1..])[..];
        assert!(whole || split, "{p:?}");
    }
    let mut text = String::new();
    counters.render(&mut text);
    assert!(text.contains("hf3fs_meta_tenant_kv_events_published_total{tenant=\"team-b\"} 4\n"), "{text}");
    assert!(text.contains("hf3fs_meta_tenant_kv_events_published_total{tenant=\"default\"} 4\n"), "{text}");
    // An unknown topic: the end marker alone.
    assert!(replay(&mut dealer, Some(b"kv@t@none"), 0).await.is_empty());
    // Removed: AllBlocksCleared on its topic (seen from the default
    // topic's replay, which the control message precedes), then nothing.
    p.topics.remove(b.id);
    b.vllm.publish(0, vec![Event::Stored(key(9))]);
    p.vllm.publish(0, vec![Event::Stored(key(5))]);
    let last_a = *seqs(&a1).last().unwrap();
    // The default topic's batch after the removal went out once the
    // removal was handled (one task, in order): wait for it by replay.
    while replay(&mut dealer, None, last_a + 1).await.is_empty() {
        tokio::task::yield_now().await;
    }
    assert!(replay(&mut dealer, Some(b"kv@t@b"), 0).await.is_empty(), "a removed topic answers nothing");
    let mut text = String::new();
    counters.render(&mut text);
    assert!(!text.contains("team-b"), "its series left: {text}");
}
