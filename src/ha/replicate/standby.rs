//! The standby's side of the stream: a TCP listener (`--ha-replication-listen`)
//! that accepts one leader at a time, authenticated by the cluster secret,
//! applies its snapshot and frames to the in-memory store through the
//! store's replay operations (which journal them to this node's own durable
//! store), and acknowledges a position once this node's disk has it.
//!
//! What is refused, and counted ([`Counters`]): a hello without the secret
//! or with another one (compared in constant time), a hello or message of
//! an epoch older than the newest this node has seen (a deposed leader),
//! a hello while this node itself leads, and a frame that does not follow
//! the position this node has (a gap: the leader must send a snapshot).
//! A refused hello is answered [`Msg::Reject`] and the connection closed;
//! nothing of it is applied.
//!
//! # Memory ordering
//!
//! `epoch`, `position` and `caught_up` are written under `apply` (the
//! mutex every message is applied under) and read without it by the
//! promotion check and `/stats`: `Acquire`/`Release` so that a reader who
//! sees `caught_up` also sees the position it goes with. The counters are
//! statistics (`Relaxed`).

use super::ct_eq;
use super::wire::Msg;
use crate::core::{Freed, Store};
use crate::durable::codec::{self, Pending, Record};
use crate::App;
use std::io::{BufReader, BufWriter, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

/// How long the standby waits for its own disk before it gives up on a
/// message (the leader then sees no acknowledgement and reconnects).
const LOCAL_SYNC: Duration = Duration::from_secs(10);

/// Refusals, by reason, and what was applied.
#[derive(Debug, Default)]
pub struct Counters {
    /// Hellos with a missing or wrong cluster secret.
    pub bad_token: AtomicU64,
    /// Hellos and messages of an epoch older than the newest seen, or
    /// hellos while this node leads.
    pub old_epoch: AtomicU64,
    /// Frames that did not follow this node's position, or came before a
    /// snapshot.
    pub bad_position: AtomicU64,
    /// Frames applied.
    pub frames: AtomicU64,
    /// Snapshots applied.
    pub snapshots: AtomicU64,
}

/// The standby's replication state (see the module docs).
pub struct Standby {
    /// Weak: the listener's threads must not keep a stopped server's state
    /// (and its data directory's lock) alive.
    app: Weak<App>,
    token: Box<[u8]>,
    /// The newest leader epoch seen in an accepted hello (or promoted to).
    epoch: AtomicU64,
    /// Every leader change up to this position is applied and durable here
    /// (meaningful while `caught_up`).
    position: AtomicU64,
    /// A snapshot of the leader at `epoch` was applied: the stream since
    /// follows without a gap.
    caught_up: AtomicBool,
    /// Held while one message is applied (one leader at a time), with the
    /// pages to hold back on promotion.
    apply: Mutex<Holds>,
    /// What was refused and applied.
    pub counters: Counters,
}

impl Standby {
    /// A standby applying to `app`'s vLLM store (which must be durable:
    /// `--data-dir`), accepting leaders that present `token`.
    pub fn new(app: Arc<App>, token: Box<[u8]>) -> Arc<Self> {
        Arc::new(Standby {
            app: Arc::downgrade(&app),
            token,
            epoch: AtomicU64::new(0),
            position: AtomicU64::new(0),
            caught_up: AtomicBool::new(false),
            apply: Mutex::new(Holds::default()),
            counters: Counters::default(),
        })
    }

    /// Listens on `addr` (a thread accepts, one thread per connection);
    /// returns the bound address.
    pub fn listen(self: &Arc<Self>, addr: SocketAddr) -> std::io::Result<SocketAddr> {
        let listener = TcpListener::bind(addr)?;
        let bound = listener.local_addr()?;
        let me = self.clone();
        std::thread::Builder::new().name("ha-standby-accept".into()).spawn(move || {
            for conn in listener.incoming() {
                let Ok(stream) = conn else { continue };
                let me = me.clone();
                let _ = std::thread::Builder::new().name("ha-standby".into()).spawn(move || {
                    if let Err(e) = me.session(stream) {
                        tracing::warn!("replication session ended: {e}");
                    }
                });
            }
        })?;
        Ok(bound)
    }

    /// The newest epoch seen, the position applied, and whether this node
    /// is caught up with that epoch's leader.
    pub fn state(&self) -> (u64, u64, bool) {
        (
            self.epoch.load(Ordering::Acquire),
            self.position.load(Ordering::Acquire),
            self.caught_up.load(Ordering::Acquire),
        )
    }

    /// This node becomes leader at `epoch`: frames of any older leader are
    /// refused from now on. Returns whether it was caught up with the
    /// previous leader (the promotion rule), and the position it has.
    ///
    /// Every page the old leader unbound within the last read lease is held
    /// back here until that lease has passed (readers' leases are not
    /// replicated).
    pub fn promote(&self, epoch: u64) -> (bool, u64) {
        let holds = self.apply.lock().unwrap_or_else(PoisonError::into_inner);
        let was = self.caught_up.swap(false, Ordering::AcqRel);
        self.epoch.fetch_max(epoch, Ordering::AcqRel);
        if let Some(app) = self.app.upgrade() {
            let held = holds.apply(app.registry.vllm());
            tracing::info!(epoch, pages = held, "promotion: pages unbound within the last read lease held back");
        }
        (was, self.position.load(Ordering::Acquire))
    }

    /// The epoch this node leads at or is becoming leader at, if any.
    fn leading_epoch(&self) -> Option<u64> {
        use crate::ha::Role;
        match self.app.upgrade()?.ha.as_ref()?.role() {
            Role::Leader { epoch } | Role::Promoting { epoch } => Some(epoch),
            Role::Follower | Role::Fenced { .. } => None,
        }
    }

    /// The server's state, while it runs.
    fn app(&self) -> Result<Arc<App>, String> {
        self.app.upgrade().ok_or_else(|| "the server is stopping".to_string())
    }

    /// Checks a hello: `Err` names the refusal (already counted).
    fn admit(&self, token: &[u8], epoch: u64) -> Result<(), String> {
        if !ct_eq(token, &self.token) {
            self.counters.bad_token.fetch_add(1, Ordering::Relaxed);
            return Err("bad or missing cluster secret".into());
        }
        let _g = self.apply.lock().unwrap_or_else(PoisonError::into_inner);
        let newest = self.epoch.load(Ordering::Acquire);
        if epoch < newest || self.leading_epoch().is_some_and(|e| e >= epoch) {
            self.counters.old_epoch.fetch_add(1, Ordering::Relaxed);
            return Err(format!("epoch {epoch} is older than epoch {newest} seen here"));
        }
        if epoch > newest {
            self.caught_up.store(false, Ordering::Release);
        }
        self.epoch.store(epoch, Ordering::Release);
        Ok(())
    }

    /// Serves one leader's connection until it closes or is refused.
    fn session(&self, stream: TcpStream) -> std::io::Result<()> {
        let _ = stream.set_nodelay(true);
        let mut rd = BufReader::with_capacity(1 << 20, stream.try_clone()?);
        let mut wr = BufWriter::new(stream);
        let Msg::Hello { token, epoch, leader } = Msg::read_from(&mut rd)? else {
            self.counters.bad_token.fetch_add(1, Ordering::Relaxed);
            Msg::Reject("the first message must be a hello with the cluster secret".into()).write_to(&mut wr)?;
            return wr.flush();
        };
        if let Err(why) = self.admit(&token, epoch) {
            tracing::warn!(leader, epoch, "refused a replication hello: {why}");
            Msg::Reject(why).write_to(&mut wr)?;
            return wr.flush();
        }
        tracing::info!(leader, epoch, "replicating from the leader");
        Msg::Welcome.write_to(&mut wr)?;
        wr.flush()?;
        // Applying and acknowledging run apart: while the acknowledger waits
        // for this node's disk, the next frames are applied (and their
        // changes join the same disk write).
        let (tx, rx) = crossbeam_channel::unbounded::<u64>();
        let me = self.app.clone();
        let acker =
            std::thread::Builder::new().name("ha-standby-ack".into()).spawn(move || acknowledge(&me, rx, wr))?;
        let result = loop {
            let msg = match Msg::read_from(&mut rd) {
                Ok(m) => m,
                Err(e) => break Err(e),
            };
            match self.on_message(epoch, msg) {
                Ok(Some(upto)) => {
                    if tx.send(upto).is_err() {
                        break Err(std::io::Error::other("the acknowledgements stopped"));
                    }
                }
                Ok(None) => {}
                Err(why) => {
                    tracing::warn!(leader, epoch, "replication message refused: {why}");
                    break Err(std::io::Error::other(why));
                }
            }
        };
        drop(tx);
        let _ = rd.get_ref().shutdown(std::net::Shutdown::Both);
        let _ = acker.join();
        result
    }

    /// Applies one message of the leader at `epoch`; returns the position
    /// to acknowledge once durable, if any.
    fn on_message(&self, epoch: u64, msg: Msg) -> Result<Option<u64>, String> {
        let mut holds = self.apply.lock().unwrap_or_else(PoisonError::into_inner);
        let app = self.app()?;
        let store: &Store = app.registry.vllm();
        if msg.epoch() != epoch || self.epoch.load(Ordering::Acquire) != epoch {
            self.counters.old_epoch.fetch_add(1, Ordering::Relaxed);
            return Err(format!("a message of epoch {} on a session of epoch {epoch}", msg.epoch()));
        }
        match msg {
            Msg::SnapshotBegin { .. } => {
                // The standby evicts nothing of its own: the leader's
                // evictions arrive as unbinds (until promoted).
                store.suspend_eviction();
                self.caught_up.store(false, Ordering::Release);
                store.clear();
                Ok(None)
            }
            Msg::SnapshotPart { records, .. } => apply(store, &records, &mut holds).map(|()| None),
            Msg::SnapshotEnd { upto, .. } => {
                self.position.store(upto, Ordering::Release);
                self.caught_up.store(true, Ordering::Release);
                self.counters.snapshots.fetch_add(1, Ordering::Relaxed);
                Ok(Some(upto))
            }
            Msg::Frame { clear, from, upto, records, .. } => {
                let at = self.position.load(Ordering::Acquire);
                if !self.caught_up.load(Ordering::Acquire) || from > at {
                    self.counters.bad_position.fetch_add(1, Ordering::Relaxed);
                    self.caught_up.store(false, Ordering::Release);
                    return Err(format!("a frame from position {from} where this node is at {at}"));
                }
                if upto <= at {
                    return Ok(Some(at)); // a repeat: applied already
                }
                if clear {
                    store.clear();
                }
                if let Err(e) = apply(store, &records, &mut holds) {
                    self.caught_up.store(false, Ordering::Release);
                    return Err(e);
                }
                self.position.store(upto, Ordering::Release);
                self.counters.frames.fetch_add(1, Ordering::Relaxed);
                Ok(Some(upto))
            }
            Msg::Hello { .. } | Msg::Welcome | Msg::Reject(_) | Msg::Ack { .. } => {
                Err("an unexpected message in a session".into())
            }
        }
    }
}

/// The acknowledger of one session: takes the newest applied position,
/// waits until this node's own disk has everything applied so far, and
/// acknowledges it; ends when the session does (or the socket fails, which
/// ends the session).
fn acknowledge(app: &Weak<App>, rx: crossbeam_channel::Receiver<u64>, mut wr: BufWriter<TcpStream>) {
    while let Ok(first) = rx.recv() {
        let upto = rx.try_iter().fold(first, u64::max);
        let synced = app.upgrade().ok_or_else(|| "the server is stopping".to_string()).and_then(|app| {
            let d = app.durable.as_ref().ok_or_else(|| "a standby needs --data-dir".to_string())?;
            d.vllm.sync_blocking(LOCAL_SYNC).map_err(|e| format!("local durable store: {e}"))
        });
        let sent = synced
            .and_then(|()| Msg::Ack { upto }.write_to(&mut wr).and_then(|()| wr.flush()).map_err(|e| e.to_string()));
        if let Err(why) = sent {
            tracing::warn!("replication acknowledgements stopped: {why}");
            let _ = wr.get_ref().shutdown(std::net::Shutdown::Both);
            return;
        }
    }
}

/// When each page was last unbound by a replayed record, as the tick until
/// which a promoted standby holds it back (0: never). One `u32` per page of
/// each rank that had an unbind, indexed by rank (ranks are numbered from 0
/// up to `--max-ranks`): bounded by the ranks' sizes, O(1) per unbind, with
/// no hashing and no look-up of the rank's size but at its first unbind.
#[derive(Default)]
pub struct Holds {
    until: Vec<Vec<u32>>,
}

impl Holds {
    /// Notes that `page` of `rank` (of `num_pages()` pages, asked at the
    /// rank's first note) was unbound: held until tick `until` if promoted
    /// meanwhile.
    fn note(&mut self, rank: u32, page: u32, num_pages: impl FnOnce() -> u32, until: u32) {
        let r = rank as usize;
        if self.until.len() <= r {
            self.until.resize_with(r + 1, Vec::new);
        }
        let v = &mut self.until[r];
        if v.is_empty() {
            v.resize(num_pages() as usize, 0);
        }
        if let Some(slot) = v.get_mut(page as usize) {
            *slot = until;
        }
    }

    /// Holds back, in `store`, every page still within its hold; returns
    /// how many were held.
    pub fn apply(&self, store: &Store) -> u64 {
        let mut held = 0;
        for (rank, pages) in self.until.iter().enumerate() {
            for (page, &until) in pages.iter().enumerate() {
                if until != 0 && store.hold_free_page(rank as u32, page as u32, until) {
                    held += 1;
                }
            }
        }
        held
    }
}

/// Applies codec-encoded records to `store` (each forces a page's state),
/// noting unbinds in `holds`.
pub fn apply(store: &Store, records: &[u8], holds: &mut Holds) -> Result<(), String> {
    store.replay_batch(|| apply_records(store, records, holds))
}

fn apply_records(store: &Store, records: &[u8], holds: &mut Holds) -> Result<(), String> {
    let until = store.hold_deadline();
    let mut err = None;
    let mut hex = [0u8; codec::KEY_BUF];
    codec::decode_log(records, |r| {
        if err.is_some() {
            return;
        }
        let done = match r {
            Record::Initialize { rank, num_pages } => store.replay_initialize(rank, num_pages),
            Record::Bind { rank, page, binding } => {
                store.replay_bind(rank, page, codec::key_str(&binding.key, &mut hex), binding.world)
            }
            // Only a binding freed is held back on promotion: no lookup names
            // a reserved page, so no reader holds a released reservation.
            Record::Unbind { rank, page } => store.replay_unbind(rank, page).map(|freed| {
                if freed == Freed::Binding {
                    holds.note(rank, page, || store.rank_size(rank).unwrap_or(0), until);
                }
            }),
            Record::Pending { rank, page, pending: Pending::Reserved(tag) } => store.replay_reserve(rank, page, tag),
            // Held on the leader for a reader's lease: free here, held back
            // if this node is promoted within that lease.
            Record::Pending { rank, page, pending: Pending::Held } => store.replay_unbind(rank, page).map(|_| {
                holds.note(rank, page, || store.rank_size(rank).unwrap_or(0), until);
            }),
        };
        err = done.err();
    })
    .map_err(|e| format!("undecodable records: {e}"))?;
    err.map_or(Ok(()), |e| Err(format!("cannot apply the leader's records: {e}")))
}
