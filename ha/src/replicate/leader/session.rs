//! The sender's sessions with the standby (the module docs of
//! [`super`] say what one holds): connect, hello, snapshot, frames, and
//! the thread that reads the standby's acknowledgements.

#[allow(clippy::wildcard_imports)]
use super::*;

impl Replicator {
    /// The sender thread: one session after another, for as long as the
    /// process runs.
    pub(super) fn run(self: Arc<Self>, rx: Receiver<Item>) {
        let mut backoff = Backoff::default();
        while !self.stopped.load(Ordering::Acquire) {
            let (n, target) = self.current();
            let Some(t) = target else {
                // Nobody to stream to: frames are dropped (a standby that
                // comes gets a snapshot).
                let _ = rx.recv_timeout(POLL);
                while rx.try_recv().is_ok() {}
                continue;
            };
            let syncs = self.syncs.load(Ordering::Relaxed);
            if let Err(e) = self.run_session(n, &t, &rx) {
                self.note_failure(&t.node);
                tracing::warn!(standby = %t.node, epoch = t.epoch, store = self.dialect.label(), "replication session ended: {e}");
            }
            self.end_session(n);
            if self.syncs.load(Ordering::Relaxed) != syncs {
                backoff.reset();
            }
            // The back-off, cut short by a new target; frames queued
            // meanwhile are in the next session's snapshot.
            let until = Instant::now() + backoff.wait();
            while self.session.load(Ordering::Acquire) == n && Instant::now() < until {
                let _ = rx.recv_timeout(POLL);
                while rx.try_recv().is_ok() {}
            }
        }
    }

    /// Session `n` is over: its standby is no longer in sync (unless a
    /// newer session is already running, which says for itself).
    fn end_session(&self, n: u64) {
        let _a = self.ack_lock.lock().unwrap_or_else(PoisonError::into_inner);
        if self.session.load(Ordering::Acquire) == n {
            self.in_sync.store(false, Ordering::Release);
        }
        drop(_a);
        self.waiters.wake_all();
    }

    /// One session with `t`, until it fails or the target changes; the
    /// connection is shut down on the way out (which ends its reader).
    fn run_session(self: &Arc<Self>, n: u64, t: &Target, rx: &Receiver<Item>) -> Result<(), String> {
        if self.tenant.is_some() && !self.speaks_tenants(t) {
            // Not a failure of the standby: it cannot apply a tenant's
            // store, and is never asked to (its requests are refused).
            return Ok(());
        }
        if Session::agree(Range::THIS, t.range).is_none() {
            self.incompatible.fetch_add(1, Ordering::Relaxed);
            return Err(format!(
                "standby {} speaks replication protocol {}, this node {}: no version in common, not streaming to it",
                t.node,
                t.range,
                Range::THIS
            ));
        }
        let connect = liveness::CONNECT.min(self.wait);
        let stream = TcpStream::connect_timeout(&t.addr, connect).map_err(|e| format!("connecting: {e}"))?;
        let stream = self.secure(stream, t)?;
        let closer = stream.try_clone().map_err(|e| e.to_string())?;
        let r = self.stream_to(n, t, rx, stream);
        let _ = closer.shutdown(std::net::Shutdown::Both);
        *self.session_info.lock().unwrap_or_else(PoisonError::into_inner) = None;
        r
    }

    /// `sock` as this node streams: over TLS with `--tls-cert` (the
    /// standby's certificate verified as `t.host`, this node's presented),
    /// else plain.
    fn secure(&self, sock: TcpStream, t: &Target) -> Result<Conn, String> {
        let Some(tls) = self.tls.get() else { return Ok(Conn::Plain(sock)) };
        let name = hf3fs_meta_tls::server_name(&t.host)?;
        let _ = sock.set_read_timeout(Some(Duration::from_secs(10)));
        let _ = sock.set_write_timeout(Some(Duration::from_secs(10)));
        Conn::client(sock, tls.get(), name).map_err(|e| {
            let reason = hf3fs_meta_tls::Reason::of_io(&e);
            hf3fs_meta_tls::failures::count(reason);
            format!("TLS handshake with the standby ({}) failed ({}): {e}", t.host, reason.label())
        })
    }

    /// Streams over TLS from now on (with `--tls-cert`).
    pub fn set_tls(&self, tls: hf3fs_meta_tls::TlsClient) {
        let _ = self.tls.set(tls);
    }

    /// Hello, snapshot, then frames, on `stream`.
    fn stream_to(self: &Arc<Self>, n: u64, t: &Target, rx: &Receiver<Item>, stream: Conn) -> Result<(), String> {
        let _ = stream.set_nodelay(true);
        // A standby that stops reading (paused) must not hold this thread
        // forever: the write fails and the session starts over.
        let _ = stream.set_write_timeout(Some(self.wait.max(Duration::from_secs(1))));
        // Every read has a short timeout (see `AckReader`): the standby's
        // silence is timed, and a wait ends early when the target changes.
        let _ = stream.set_read_timeout(Some(TICK));
        let mut acks = AckReader { stream: stream.try_clone().map_err(|e| e.to_string())?, buf: Vec::new() };
        let mut wr = BufWriter::with_capacity(1 << 20, stream.try_clone().map_err(|e| e.to_string())?);
        let Some((session, release)) = self.hello(n, t, &mut wr, &mut acks)? else { return Ok(()) };
        *self.session_info.lock().unwrap_or_else(PoisonError::into_inner) = Some((session.version(), release));
        // Frames queued before the snapshot begins are in it.
        while rx.try_recv().is_ok() {}
        self.broken.store(false, Ordering::Release);
        {
            let _a = self.ack_lock.lock().unwrap_or_else(PoisonError::into_inner);
            if self.session.load(Ordering::Acquire) != n {
                return Ok(());
            }
            self.acked.store(0, Ordering::Release);
        }
        // The leader's tenants before the snapshot (read after the queue
        // was emptied: a later change is queued), so a standby caught up
        // has followed them.
        let tenants = session.has(Feature::Tenants);
        if let Some(m) = self.tenants_message(t.epoch).filter(|_| tenants) {
            send(&mut wr, &m)?;
        }
        let r = (self.head)();
        send_snapshot(&mut wr, self.catalog.as_deref(), &*self.store, t.epoch, r)?;
        // The first heartbeat, at once: it tells the standby that this
        // leader sends them (it times the session from then on).
        send(&mut wr, &liveness::heartbeat(t.epoch, 0, r))?;
        wr.flush().map_err(|e| e.to_string())?;
        let dead = Arc::new(AtomicBool::new(false));
        self.spawn_acks(acks, &t.node, r, dead.clone(), stream);
        tracing::info!(standby = %t.node, epoch = t.epoch, position = r, store = self.dialect.label(), "sent a snapshot; streaming");
        self.stream_frames(n, t, rx, &mut wr, &dead, (r, tenants))
    }

    /// The hello of session `n` to `t` and the standby's answer: the
    /// session agreed and the standby's release, or `None` when the target
    /// changed meanwhile.
    fn hello(
        &self,
        n: u64,
        t: &Target,
        wr: &mut BufWriter<Conn>,
        acks: &mut AckReader,
    ) -> Result<Option<(Session, String)>, String> {
        let expected = Session::agree(Range::THIS, t.range).expect("checked by run_session");
        let hello = outbound::hello(expected, self.dialect, self.tenant.as_deref(), &self.token, t.epoch, &self.node);
        send(wr, &hello)?;
        wr.flush().map_err(|e| e.to_string())?;
        // The answer is due within the sync timeout: a listener reached
        // through a black hole never answers.
        let due = Instant::now() + self.wait.max(Duration::from_millis(100));
        let answer = loop {
            if let Some(m) = acks.next().map_err(|e| format!("reading the hello's answer: {e}"))? {
                break m;
            }
            if self.session.load(Ordering::Acquire) != n {
                return Ok(None);
            }
            if Instant::now() >= due {
                return Err(format!("the standby did not answer the hello within {:?}", self.wait));
            }
        };
        match outbound::agreed(expected, answer) {
            Ok(agreed) => Ok(Some(agreed)),
            Err(Refused { why, incompatible }) => {
                if incompatible {
                    self.incompatible.fetch_add(1, Ordering::Relaxed);
                }
                Err(why)
            }
        }
    }

    /// Streams the frames after the snapshot at `r`, and a heartbeat when
    /// idle, until session `n` ends (the target changed, the writer rebuilt
    /// its keyspace, the sender's queue closed) or fails (the standby's
    /// connection closed: `dead`; a write failed; a clear raced the
    /// snapshot).
    fn stream_frames(
        &self,
        n: u64,
        t: &Target,
        rx: &Receiver<Item>,
        wr: &mut BufWriter<Conn>,
        dead: &AtomicBool,
        (r, tenants): (u64, bool),
    ) -> Result<(), String> {
        let (mut at, mut generation) = (r, 0);
        let mut sent = Instant::now();
        loop {
            if dead.load(Ordering::Acquire) {
                return Err("the standby's connection closed".into());
            }
            if self.session.load(Ordering::Acquire) != n || self.broken.load(Ordering::Acquire) {
                return Ok(());
            }
            let every = self.heartbeat_every();
            let f = match rx.recv_timeout(POLL.min(every)) {
                Ok(f) => f,
                Err(RecvTimeoutError::Timeout) => {
                    if sent.elapsed() >= every {
                        send(wr, &liveness::heartbeat(t.epoch, generation, at))?;
                        wr.flush().map_err(|e| e.to_string())?;
                        sent = Instant::now();
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            };
            for f in std::iter::once(f).chain(rx.try_iter()) {
                let f = match f {
                    Item::Frame(f) => f,
                    Item::Space(e) => {
                        send(wr, &space(t.epoch, e))?;
                        continue;
                    }
                    Item::Tenants => {
                        if let Some(m) = self.tenants_message(t.epoch).filter(|_| tenants) {
                            send(wr, &m)?;
                        }
                        continue;
                    }
                };
                if f.upto <= r {
                    if f.clear {
                        return Err("a /clear raced the snapshot; starting over".into());
                    }
                    continue;
                }
                (at, generation) = (f.upto, f.generation);
                let m = Msg::Frame {
                    epoch: t.epoch,
                    generation: f.generation,
                    clear: f.clear,
                    from: f.from,
                    upto: f.upto,
                    records: f.records,
                };
                send(wr, &m)?;
            }
            wr.flush().map_err(|e| e.to_string())?;
            sent = Instant::now();
        }
    }

    /// Reads acknowledgements until the connection ends or the standby
    /// misses its deadline (then the session is dropped and counted); the
    /// standby is in sync from its acknowledgement of `r` on.
    fn spawn_acks(self: &Arc<Self>, mut rd: AckReader, node: &str, r: u64, dead: Arc<AtomicBool>, s: Conn) {
        let (me, node) = (self.clone(), node.to_string());
        let n = self.session.load(Ordering::Acquire);
        let spawned = std::thread::Builder::new().name("ha-replicator-acks".into()).spawn(move || {
            let mut silence = Silence::new(crate::node::now());
            loop {
                let upto = match rd.next() {
                    Ok(Some(Msg::Ack { upto })) => upto,
                    Ok(None) => {
                        let now = crate::node::now();
                        if me.session.load(Ordering::Acquire) != n {
                            break;
                        }
                        if silence.expired(now, me.wait) {
                            // Noted before the session ends: whoever sees
                            // the standby out of sync sees the failure too.
                            me.note_failure(&node);
                            me.dropped.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(
                                standby = %node,
                                store = me.dialect.label(),
                                silent_ms = silence.silent_for(now) / 1_000_000,
                                "the standby acknowledged nothing within its deadline: dropping it"
                            );
                            break;
                        }
                        continue;
                    }
                    Ok(Some(m)) => {
                        tracing::warn!(store = me.dialect.label(), "an unexpected message from the standby: {m:?}");
                        break;
                    }
                    Err(_) => break,
                };
                silence.heard(crate::node::now(), upto >= r);
                let a = me.ack_lock.lock().unwrap_or_else(PoisonError::into_inner);
                if me.session.load(Ordering::Acquire) != n {
                    break;
                }
                // Before `acked` rises: a change answered on this
                // acknowledgement no longer counts in the lag.
                me.lag.acked(upto);
                me.acked.fetch_max(upto, Ordering::AcqRel);
                let synced = upto >= r && !me.in_sync.swap(true, Ordering::AcqRel);
                drop(a);
                if synced {
                    me.syncs.fetch_add(1, Ordering::Relaxed);
                    me.waiters.wake_all();
                } else {
                    // Only the requests this acknowledgement covers.
                    me.waiters.wake_upto(upto);
                }
            }
            dead.store(true, Ordering::Release);
            me.end_session(n);
            let _ = s.shutdown(std::net::Shutdown::Both);
        });
        if spawned.is_err() {
            tracing::error!("cannot start the replication acknowledgement thread");
        }
    }
}
