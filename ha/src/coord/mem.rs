//! An in-memory etcd for the calls of [`Coordinator`]: the HA tests and the
//! simulation run the real election, hook and relay on it, in process.
//!
//! What it models, as etcd 3.4 does it:
//! - **Revisions.** One store revision, starting at 1, bumped once by every
//!   put, by every delete that removed something, and once per transaction
//!   that wrote; a key's create revision is the revision that created it
//!   (again after a delete), its mod revision that of its last change.
//! - **Leases** of whole seconds, expiring on the injected clock: a lease
//!   granted or renewed at `t` with TTL `s` expires at `t + s`, and its keys
//!   are deleted in one revision then. A put without a lease detaches the
//!   key from its lease; a put on an unknown lease is refused (code 5, as
//!   etcd's "requested lease not found"), and so is the transaction that
//!   holds one.
//! - **Transactions** are atomic: compares on create revision (0: absent) or
//!   value (an absent key has none), then one branch, reads seeing the
//!   branch's own writes.
//! - **Watches** deliver every matching change after their start revision,
//!   in revision order, once each; a lease expiry wakes them.
//! - **Quorum loss** ([`MemEtcd::set_quorum`]): every call fails and leases
//!   do not expire; when quorum returns every lease gets a fresh TTL (etcd's
//!   new raft leader does the same).
//!
//! Each node talks through its own [`MemClient`], whose knobs make faults of
//! its link: [`Knobs::unreachable`] (every call fails after the client's
//! timeout, watches go quiet), [`Knobs::delay`] (each call waits before it
//! is applied), [`Knobs::lose_keepalives`] (the next keep-alives never
//! reach etcd), [`Knobs::lose_answers`] (the next calls are applied but
//! their answers lost). All waits are on the clock, so a test moves them.

use super::{
    Batch, BoxFuture, Compare, Coordinator, Error, Kv, LeaseId, Txn, TxnOp, TxnResult, Watch, WatchEvent, Watcher,
};
use crate::clock::HaClock;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;

/// One lease.
#[derive(Debug)]
struct Lease {
    ttl_s: i64,
    /// Clock nanoseconds at which it expires.
    expires: u64,
    keys: BTreeSet<Vec<u8>>,
}

#[derive(Debug)]
struct State {
    revision: i64,
    next_lease: LeaseId,
    kvs: BTreeMap<Vec<u8>, Kv>,
    leases: BTreeMap<LeaseId, Lease>,
    /// Every change, in revision order (never compacted: tests are short).
    history: Vec<(i64, WatchEvent)>,
    quorum: bool,
    /// Calls applied, for tests that wait for a node to act.
    calls: u64,
}

#[derive(Debug)]
struct Shared {
    clock: HaClock,
    state: Mutex<State>,
    /// The revision after the last change (watches wait on it).
    changed: watch::Sender<i64>,
}

/// An in-memory etcd (see the module docs); clones share the store.
#[derive(Debug, Clone)]
pub struct MemEtcd {
    shared: Arc<Shared>,
}

impl MemEtcd {
    /// An empty store whose leases expire on `clock`.
    pub fn new(clock: HaClock) -> Self {
        let state = State {
            revision: 1,
            next_lease: 0x7a00_0000_0000_0001,
            kvs: BTreeMap::new(),
            leases: BTreeMap::new(),
            history: Vec::new(),
            quorum: true,
            calls: 0,
        };
        MemEtcd { shared: Arc::new(Shared { clock, state: Mutex::new(state), changed: watch::channel(1).0 }) }
    }

    /// A client of this store with its own fault knobs; each failed attempt
    /// takes `timeout` on the clock (as the gateway client's per-attempt bound).
    pub fn client(&self, timeout: Duration) -> MemClient {
        MemClient { etcd: self.clone(), knobs: Arc::new(Knobs::default()), timeout }
    }

    /// Loses (`false`) or regains etcd's quorum (see the module docs).
    pub fn set_quorum(&self, quorum: bool) {
        let mut s = self.lock();
        if quorum && !s.quorum {
            let now = self.shared.clock.now();
            for l in s.leases.values_mut() {
                l.expires = now.saturating_add(secs(l.ttl_s));
            }
        }
        s.quorum = quorum;
    }

    /// The current revision.
    pub fn revision(&self) -> i64 {
        self.lock().revision
    }

    /// Calls applied so far (by every client).
    pub fn calls(&self) -> u64 {
        self.lock().calls
    }

    /// A key as stored now (no call counted, no fault applied).
    pub fn peek(&self, key: &[u8]) -> Option<Kv> {
        self.lock().kvs.get(key).cloned()
    }

    /// Every key with its value, in key order (no call counted).
    pub fn dump(&self) -> Vec<Kv> {
        self.lock().kvs.values().cloned().collect()
    }

    /// When `lease` expires (clock nanoseconds), if it lives.
    pub fn lease_expires(&self, lease: LeaseId) -> Option<u64> {
        self.lock().leases.get(&lease).map(|l| l.expires)
    }

    /// Expires the leases whose time has come (every call does it first).
    pub fn expire(&self) {
        let mut s = self.lock();
        let now = self.shared.clock.now();
        self.expire_locked(&mut s, now);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn expire_locked(&self, s: &mut State, now: u64) {
        if !s.quorum {
            return;
        }
        let due: Vec<LeaseId> = s.leases.iter().filter(|(_, l)| l.expires <= now).map(|(&id, _)| id).collect();
        for id in due {
            self.drop_lease(s, id);
        }
    }

    /// Removes lease `id` and its keys (one revision if any key went).
    fn drop_lease(&self, s: &mut State, id: LeaseId) {
        let Some(lease) = s.leases.remove(&id) else { return };
        let keys: Vec<_> = lease.keys.into_iter().filter(|k| s.kvs.contains_key(k)).collect();
        if keys.is_empty() {
            return;
        }
        s.revision += 1;
        let rev = s.revision;
        for k in keys {
            s.kvs.remove(&k);
            s.history.push((rev, WatchEvent::Delete { key: k, mod_revision: rev }));
        }
        self.shared.changed.send_replace(rev);
    }

    /// The earliest lease expiry, if any lease lives.
    fn next_expiry(&self) -> Option<u64> {
        let s = self.lock();
        s.quorum.then(|| s.leases.values().map(|l| l.expires).min()).flatten()
    }

    /// Applies one call to the store: expires due leases, checks the quorum.
    fn apply<T>(&self, f: impl FnOnce(&Self, &mut State, u64) -> Result<T, Error>) -> Result<T, Error> {
        let mut s = self.lock();
        if !s.quorum {
            return Err(Error::Unavailable("etcdserver: no leader (the in-memory etcd lost its quorum)".into()));
        }
        let now = self.shared.clock.now();
        self.expire_locked(&mut s, now);
        s.calls += 1;
        let before = s.revision;
        let r = f(self, &mut s, now);
        if s.revision != before {
            self.shared.changed.send_replace(s.revision);
        }
        r
    }
}

fn secs(s: i64) -> u64 {
    (s.max(0) as u64).saturating_mul(1_000_000_000)
}

fn lease_not_found() -> Error {
    Error::Refused { status: 404, code: 5, message: "etcdserver: requested lease not found".into() }
}

/// A write of one transaction branch (or a plain call), at `rev`.
fn put_at(s: &mut State, rev: i64, key: &[u8], value: &[u8], lease: Option<LeaseId>) {
    let lease = lease.unwrap_or(0);
    let old = s.kvs.get(key).cloned();
    if let Some(old) = &old {
        if old.lease != 0 && old.lease != lease {
            if let Some(l) = s.leases.get_mut(&old.lease) {
                l.keys.remove(key);
            }
        }
    }
    if lease != 0 {
        if let Some(l) = s.leases.get_mut(&lease) {
            l.keys.insert(key.to_vec());
        }
    }
    let kv = Kv {
        key: key.to_vec(),
        value: value.to_vec(),
        create_revision: old.map_or(rev, |o| o.create_revision),
        mod_revision: rev,
        lease,
    };
    s.kvs.insert(key.to_vec(), kv.clone());
    s.history.push((rev, WatchEvent::Put(kv)));
}

fn delete_at(s: &mut State, rev: i64, key: &[u8]) -> bool {
    let Some(old) = s.kvs.remove(key) else { return false };
    if let Some(l) = s.leases.get_mut(&old.lease) {
        l.keys.remove(key);
    }
    s.history.push((rev, WatchEvent::Delete { key: key.to_vec(), mod_revision: rev }));
    true
}

fn holds(s: &State, c: &Compare) -> bool {
    match c {
        Compare::Created { key, revision } => s.kvs.get(key).map_or(0, |kv| kv.create_revision) == *revision,
        Compare::Value { key, value } => s.kvs.get(key).is_some_and(|kv| kv.value == *value),
    }
}

/// The fault knobs of one [`MemClient`] (every knob is off by default).
#[derive(Debug, Default)]
pub struct Knobs {
    unreachable: AtomicBool,
    delay_ns: AtomicU64,
    lose_keepalives: AtomicU32,
    lose_answers: AtomicU32,
    /// Bumped to break the client's open watches.
    cut: AtomicU64,
}

impl Knobs {
    /// Cuts the link (`true`) or mends it: while cut, every call fails after
    /// the client's timeout and watches deliver nothing.
    pub fn unreachable(&self, cut: bool) {
        self.unreachable.store(cut, Ordering::SeqCst);
    }

    /// Whether the link is cut.
    pub fn is_unreachable(&self) -> bool {
        self.unreachable.load(Ordering::SeqCst)
    }

    /// Every call waits `d` on the clock before it reaches etcd (a slow link).
    pub fn delay(&self, d: Duration) {
        self.delay_ns.store(d.as_nanos() as u64, Ordering::SeqCst);
    }

    /// The next `n` keep-alives are lost on the way (never applied); each
    /// fails after the client's timeout.
    pub fn lose_keepalives(&self, n: u32) {
        self.lose_keepalives.store(n, Ordering::SeqCst);
    }

    /// The next `n` calls are applied but their answers lost (they fail
    /// after the client's timeout).
    pub fn lose_answers(&self, n: u32) {
        self.lose_answers.store(n, Ordering::SeqCst);
    }

    /// Breaks every watch this client has open (a reset connection): their
    /// next read fails.
    pub fn cut_watches(&self) {
        self.cut.fetch_add(1, Ordering::SeqCst);
    }

    fn take(counter: &AtomicU32) -> bool {
        counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
    }
}

/// One node's client of a [`MemEtcd`], with the knobs of its link.
#[derive(Debug, Clone)]
pub struct MemClient {
    etcd: MemEtcd,
    knobs: Arc<Knobs>,
    timeout: Duration,
}

impl MemClient {
    /// The knobs of this client's link.
    pub fn knobs(&self) -> &Arc<Knobs> {
        &self.knobs
    }

    /// The store.
    pub fn etcd(&self) -> &MemEtcd {
        &self.etcd
    }

    fn clock(&self) -> &HaClock {
        &self.etcd.shared.clock
    }

    /// One call through the link: the delay, the cut, the lost request or
    /// answer, then `f` on the store.
    async fn call<T>(
        &self,
        keepalive: bool,
        f: impl FnOnce(&MemEtcd, &mut State, u64) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let delay = self.knobs.delay_ns.load(Ordering::SeqCst);
        if delay > 0 {
            self.clock().sleep(Duration::from_nanos(delay)).await;
        }
        if self.knobs.is_unreachable() || (keepalive && Knobs::take(&self.knobs.lose_keepalives)) {
            return self.fail("the in-memory etcd is unreachable from this client").await;
        }
        let r = self.etcd.apply(f)?;
        if Knobs::take(&self.knobs.lose_answers) {
            return self.fail("the answer was lost").await;
        }
        Ok(r)
    }

    async fn fail<T>(&self, why: &str) -> Result<T, Error> {
        self.clock().sleep(self.timeout).await;
        Err(Error::Unavailable(format!("{why} (timed out after {:?})", self.timeout)))
    }
}

impl Coordinator for MemClient {
    fn grant(&self, ttl: Duration) -> BoxFuture<'_, Result<LeaseId, Error>> {
        Box::pin(self.call(false, move |_, s, now| {
            let ttl_s = ttl.as_secs().max(1) as i64;
            let id = s.next_lease;
            s.next_lease += 1;
            s.leases.insert(id, Lease { ttl_s, expires: now.saturating_add(secs(ttl_s)), keys: BTreeSet::new() });
            Ok(id)
        }))
    }

    fn keepalive(&self, lease: LeaseId) -> BoxFuture<'_, Result<Option<i64>, Error>> {
        Box::pin(self.call(true, move |_, s, now| {
            Ok(s.leases.get_mut(&lease).map(|l| {
                l.expires = now.saturating_add(secs(l.ttl_s));
                l.ttl_s
            }))
        }))
    }

    fn revoke(&self, lease: LeaseId) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(self.call(false, move |e, s, _| {
            e.drop_lease(s, lease);
            Ok(())
        }))
    }

    fn get<'a>(&'a self, key: &'a [u8]) -> BoxFuture<'a, Result<Option<Kv>, Error>> {
        Box::pin(self.call(false, move |_, s, _| Ok(s.kvs.get(key).cloned())))
    }

    fn get_prefix<'a>(&'a self, prefix: &'a [u8]) -> BoxFuture<'a, Result<Vec<Kv>, Error>> {
        Box::pin(self.call(false, move |_, s, _| {
            Ok(s.kvs
                .range(prefix.to_vec()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .map(|(_, v)| v.clone())
                .collect())
        }))
    }

    fn put<'a>(&'a self, key: &'a [u8], value: &'a [u8], lease: Option<LeaseId>) -> BoxFuture<'a, Result<i64, Error>> {
        Box::pin(self.call(false, move |_, s, _| {
            if lease.is_some_and(|l| !s.leases.contains_key(&l)) {
                return Err(lease_not_found());
            }
            s.revision += 1;
            let rev = s.revision;
            put_at(s, rev, key, value, lease);
            Ok(rev)
        }))
    }

    fn delete<'a>(&'a self, key: &'a [u8]) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.call(false, move |_, s, _| {
            if !s.kvs.contains_key(key) {
                return Ok(false);
            }
            s.revision += 1;
            let rev = s.revision;
            Ok(delete_at(s, rev, key))
        }))
    }

    fn txn<'a>(&'a self, txn: &'a Txn) -> BoxFuture<'a, Result<TxnResult, Error>> {
        Box::pin(self.call(false, move |_, s, _| {
            let succeeded = txn.compare.iter().all(|c| holds(s, c));
            let ops = if succeeded { &txn.success } else { &txn.failure };
            let lease_missing =
                |op: &TxnOp| matches!(op, TxnOp::Put { lease: Some(l), .. } if !s.leases.contains_key(l));
            if ops.iter().any(lease_missing) {
                return Err(lease_not_found());
            }
            let writes = ops.iter().any(|op| match op {
                TxnOp::Put { .. } => true,
                TxnOp::Delete(k) => s.kvs.contains_key(k),
                TxnOp::Get(_) => false,
            });
            let rev = if writes { s.revision + 1 } else { s.revision };
            let mut gets = Vec::new();
            for op in ops {
                match op {
                    TxnOp::Put { key, value, lease } => put_at(s, rev, key, value, *lease),
                    TxnOp::Delete(key) => {
                        delete_at(s, rev, key);
                    }
                    TxnOp::Get(key) => gets.push(s.kvs.get(key).cloned()),
                }
            }
            s.revision = rev;
            Ok(TxnResult { succeeded, revision: rev, gets })
        }))
    }

    fn watch<'a>(&'a self, key: &'a [u8], prefix: bool, start_revision: i64) -> BoxFuture<'a, Result<Watch, Error>> {
        Box::pin(async move {
            let from = self.call(false, |_, s, _| Ok(if start_revision > 0 { start_revision } else { s.revision + 1 }));
            let from = from.await?;
            let w = MemWatch {
                client: self.clone(),
                key: key.to_vec(),
                prefix,
                from,
                changed: self.etcd.shared.changed.subscribe(),
                cut: self.knobs.cut.load(Ordering::SeqCst),
            };
            Ok(Box::new(w) as Watch)
        })
    }
}

/// A watch on a [`MemEtcd`].
struct MemWatch {
    client: MemClient,
    key: Vec<u8>,
    prefix: bool,
    /// The first revision not yet delivered.
    from: i64,
    changed: watch::Receiver<i64>,
    /// The client's cut count when the watch opened.
    cut: u64,
}

impl MemWatch {
    fn matches(&self, key: &[u8]) -> bool {
        if self.prefix {
            key.starts_with(&self.key)
        } else {
            key == self.key
        }
    }

    /// The pending events, if any (and the link is up).
    fn pending(&mut self) -> Option<Batch> {
        let etcd = &self.client.etcd;
        let mut s = etcd.lock();
        let now = etcd.shared.clock.now();
        etcd.expire_locked(&mut s, now);
        if self.client.knobs.is_unreachable() {
            return None;
        }
        let start = s.history.partition_point(|(rev, _)| *rev < self.from);
        let events: Vec<WatchEvent> = s.history[start..]
            .iter()
            .filter(|(_, e)| match e {
                WatchEvent::Put(kv) => self.matches(&kv.key),
                WatchEvent::Delete { key, .. } => self.matches(key),
            })
            .map(|(_, e)| e.clone())
            .collect();
        self.from = s.revision + 1;
        (!events.is_empty()).then_some((s.revision, events))
    }
}

impl Watcher for MemWatch {
    fn next(&mut self) -> BoxFuture<'_, Result<Option<Batch>, Error>> {
        Box::pin(async move {
            loop {
                if self.client.knobs.cut.load(Ordering::SeqCst) != self.cut {
                    return Err(Error::Unavailable("watch stream: connection reset".into()));
                }
                self.changed.borrow_and_update();
                if let Some(batch) = self.pending() {
                    return Ok(Some(batch));
                }
                // Wake on a change, on the next lease expiry, or on any move
                // of the clock (a mended link, a cut).
                let clock = self.client.clock().clone();
                let expiry = self.client.etcd.next_expiry();
                let tick = match (&clock, expiry) {
                    (_, Some(at)) => clock.sleep_until(at),
                    (HaClock::Manual(_), None) => clock.sleep_until(clock.now().saturating_add(1)),
                    (HaClock::Boot, None) => Box::pin(std::future::pending()),
                };
                tokio::select! {
                    r = self.changed.changed() => {
                        if r.is_err() {
                            return Ok(None);
                        }
                    }
                    () = tick => {}
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn store() -> (ManualClock, MemEtcd, MemClient) {
        let clock = ManualClock::new();
        let etcd = MemEtcd::new(HaClock::Manual(clock.clone()));
        let c = etcd.client(Duration::from_millis(500));
        (clock, etcd, c)
    }

    #[tokio::test]
    async fn revisions_leases_and_transactions() {
        let (clock, etcd, c) = store();
        let lease = c.grant(Duration::from_secs(2)).await.unwrap();
        let r1 = c.put(b"/t/a", b"1", Some(lease)).await.unwrap();
        assert_eq!(r1, 2);
        let r2 = c.put(b"/t/a", b"2", Some(lease)).await.unwrap();
        let kv = c.get(b"/t/a").await.unwrap().unwrap();
        assert_eq!((kv.create_revision, kv.mod_revision, kv.lease, kv.value.as_slice()), (r1, r2, lease, &b"2"[..]));
        assert!(matches!(c.put(b"/t/b", b"x", Some(12345)).await, Err(Error::Refused { code: 5, .. })));
        // A campaign: absent key, then present.
        let take = |v: &[u8]| Txn {
            compare: vec![Compare::Created { key: b"/t/l".to_vec(), revision: 0 }],
            success: vec![
                TxnOp::Put { key: b"/t/l".to_vec(), value: v.to_vec(), lease: Some(lease) },
                TxnOp::Get(b"/t/l".to_vec()),
            ],
            failure: vec![TxnOp::Get(b"/t/l".to_vec())],
        };
        let won = c.txn(&take(b"me")).await.unwrap();
        assert!(won.succeeded);
        assert_eq!(won.gets[0].as_ref().unwrap().create_revision, won.revision, "reads see the branch's writes");
        let lost = c.txn(&take(b"other")).await.unwrap();
        assert!(!lost.succeeded);
        assert_eq!((lost.revision, lost.gets[0].as_ref().unwrap().value.as_slice()), (won.revision, &b"me"[..]));
        // Expiry on the clock: one TTL after the last renewal.
        clock.advance(Duration::from_millis(1500));
        assert_eq!(c.keepalive(lease).await.unwrap(), Some(2));
        clock.advance(Duration::from_millis(1999));
        etcd.expire();
        assert!(etcd.peek(b"/t/l").is_some());
        clock.advance(Duration::from_millis(1));
        assert_eq!(c.get(b"/t/l").await.unwrap(), None, "the lease's keys go with it");
        assert_eq!(c.get(b"/t/a").await.unwrap(), None);
        assert_eq!(etcd.revision(), won.revision + 1, "one revision for the expiry");
        assert_eq!(c.keepalive(lease).await.unwrap(), None);
        c.revoke(lease).await.unwrap();
    }

    #[tokio::test]
    async fn watches_deliver_in_order_and_faults_bite() {
        let (clock, etcd, c) = store();
        let mut w = c.watch(b"/p/", true, 0).await.unwrap();
        let lease = c.grant(Duration::from_secs(1)).await.unwrap();
        c.put(b"/p/x", b"1", Some(lease)).await.unwrap();
        c.put(b"/q", b"no", None).await.unwrap();
        c.put(b"/p/y", b"2", None).await.unwrap();
        let (_, evs) = w.next().await.unwrap().unwrap();
        let keys: Vec<_> = evs
            .iter()
            .map(|e| match e {
                WatchEvent::Put(kv) => kv.key.clone(),
                WatchEvent::Delete { key, .. } => key.clone(),
            })
            .collect();
        assert_eq!(keys, vec![b"/p/x".to_vec(), b"/p/y".to_vec()]);
        // A lease expiry wakes the watch with the deletion.
        let next = tokio::spawn(async move { (w.next().await, w) });
        tokio::task::yield_now().await;
        clock.advance(Duration::from_secs(1));
        let (r, mut w) = next.await.unwrap();
        assert!(matches!(&r.unwrap().unwrap().1[..], [WatchEvent::Delete { key, .. }] if key == b"/p/x"));
        // Lost keep-alives never reach etcd; lost answers were applied.
        let lease = c.grant(Duration::from_secs(1)).await.unwrap();
        c.knobs().lose_keepalives(1);
        let ka = tokio::spawn({
            let c = c.clone();
            async move { c.keepalive(lease).await }
        });
        tokio::task::yield_now().await;
        clock.advance(Duration::from_millis(500));
        assert!(matches!(ka.await.unwrap(), Err(Error::Unavailable(_))));
        c.knobs().lose_answers(1);
        let put = tokio::spawn({
            let c = c.clone();
            async move { c.put(b"/p/z", b"3", None).await }
        });
        tokio::task::yield_now().await;
        clock.advance(Duration::from_millis(500));
        assert!(put.await.unwrap().is_err());
        assert!(etcd.peek(b"/p/z").is_some(), "applied, answer lost");
        assert!(matches!(&w.next().await.unwrap().unwrap().1[..], [WatchEvent::Put(kv)] if kv.key == b"/p/z"));
        c.knobs().cut_watches();
        assert!(w.next().await.is_err());
        // Quorum loss: calls fail, leases survive and get a fresh TTL.
        assert_eq!(c.keepalive(lease).await.unwrap(), None, "a lease not renewed for its TTL is gone");
        let lease = c.grant(Duration::from_secs(1)).await.unwrap();
        etcd.set_quorum(false);
        assert!(c.get(b"/p/y").await.is_err());
        clock.advance(Duration::from_secs(5));
        etcd.set_quorum(true);
        assert_eq!(c.keepalive(lease).await.unwrap(), Some(1), "the lease survived the quorum loss");
    }
}
