//! Recovery from a disk fault: a fresh keyspace written from memory.
//!
//! Once a write or an fsync has failed, nothing the old keyspace holds is
//! trusted: the embedded store may be poisoned, and (PostgreSQL's fsync
//! lesson) pages whose fsync failed may never reach the disk although a
//! later fsync succeeds. The in-memory store is the authority and is
//! intact, so the writer rebuilds the disk copy from it instead: a new
//! keyspace directory beside the old one, filled with the state chunks of
//! every bound, reserved and held page ([`crate::core::Store::snapshot`]), synced file by file,
//! and only then named in `CURRENT` ([`Db::make_current`]). A crash at any
//! point leaves either the old keyspace (with everything acknowledged before
//! the fault) or the complete new one.
//!
//! Why the snapshot plus the log that follows it is exact, while requests
//! keep changing the store: call T the moment the writer starts the
//! snapshot. Every change the writer drained before T (and dropped, being
//! degraded) was recorded while its page was held BUSY, so the snapshot,
//! which claims each page it reads, sees it. Every change drained after T
//! is written to the new log after the snapshot, and replaying a change
//! over a state that already has it is harmless: each record names a page's
//! whole new state, and the last one wins. Rank creations and clears are
//! the exception: they are recorded *before* they become visible, so one
//! drained before T may not be visible to the scan yet. A degraded writer
//! therefore keeps those (few) records and writes them first into the new
//! log.
//!
//! The cost: room for one compact copy of the state beside the old
//! keyspace (about 25 bytes per binding), and the time to scan and write it
//! (seconds for 10^7 bindings).

use super::codec::{self, Binding, Pending, CHUNK_PAGES, CHUNK_SHIFT, GENERATION_KEY};
use super::error::Failure;
use super::faults::Point;
use super::shared::{Shared, Who};
use super::store::Db;
use crate::core::{PageSource, Visit};
use fjall::PersistMode;
use std::time::{Duration, Instant};

/// A store batch is committed once it holds about this many bytes.
const BATCH_BYTES: usize = 4 << 20;

/// A fresh keyspace, complete, synced and named current.
pub(crate) struct Written {
    pub(crate) db: Db,
    pub(crate) generation: u64,
    pub(crate) ranks: u64,
    pub(crate) bindings: u64,
    pub(crate) elapsed: Duration,
}

/// The snapshot being written.
struct Builder<'a> {
    shared: &'a Shared,
    name: String,
    db: Option<Db>,
    /// The new generation's state partition.
    state: Option<fjall::PartitionHandle>,
    batch: Option<fjall::Batch>,
    batch_bytes: usize,
    /// The chunk being gathered: `(rank, chunk)` and its entries.
    at: Option<(u32, u32)>,
    entries: Vec<(u16, Binding)>,
    /// The chunk's reserved and held pages.
    pending: Vec<(u16, Pending)>,
    buf: Vec<u8>,
    ranks: u64,
    bindings: u64,
    generation: u64,
    err: Option<Failure>,
}

/// Writes `store` into a fresh keyspace after `current` and names it
/// current. On failure the fresh directory is left for the next attempt
/// (or start-up) to remove, and `CURRENT` still names the old keyspace.
pub(crate) fn write(shared: &Shared, current: &Db, store: &dyn PageSource) -> Result<Written, Failure> {
    let start = Instant::now();
    let mut b = Builder {
        shared,
        name: current.next_name(),
        db: None,
        state: None,
        batch: None,
        batch_bytes: 0,
        at: None,
        entries: Vec::new(),
        pending: Vec::new(),
        buf: Vec::new(),
        ranks: 0,
        bindings: 0,
        generation: 0,
        err: None,
    };
    let scan = store.snapshot(&mut |v| b.visit(v));
    if let Some(e) = b.err.take() {
        return Err(e);
    }
    scan.map_err(|m| Failure::Fatal(format!("the in-memory state fails its own checks: {m}")))?;
    b.finish(start)
}

impl Builder<'_> {
    fn visit(&mut self, v: Visit) -> bool {
        let r = match v {
            Visit::Generation(g) => self.begin(g),
            Visit::Rank { rank, num_pages } => self.rank(rank, num_pages),
            Visit::Binding { rank, page, key, world } => self.binding(rank, page, Binding { world, key }),
            Visit::Reserved { rank, page, tag } => self.pending(rank, page, Pending::Reserved(tag)),
            Visit::Held { rank, page } => self.pending(rank, page, Pending::Held),
        };
        match r {
            Ok(()) => true,
            Err(e) => {
                self.err = Some(e);
                false
            }
        }
    }

    fn begin(&mut self, generation: u64) -> Result<(), Failure> {
        let db = Db::create(&self.shared.root, &self.name, generation)?;
        self.batch = Some(db.keyspace.batch());
        self.state = Some(db.parts().state.clone());
        self.db = Some(db);
        self.generation = generation;
        Ok(())
    }

    fn insert(&mut self, key: Vec<u8>, value: Vec<u8>) -> Result<(), Failure> {
        self.batch_bytes += key.len() + value.len();
        let (Some(batch), Some(state)) = (self.batch.as_mut(), self.state.as_ref()) else {
            return Err(Failure::Fatal("a snapshot visited a page before its generation".into()));
        };
        batch.insert(state, key, value);
        if self.batch_bytes >= BATCH_BYTES {
            self.commit()?;
        }
        Ok(())
    }

    fn commit(&mut self) -> Result<(), Failure> {
        let (Some(db), Some(batch)) = (self.db.as_ref(), self.batch.take()) else { return Ok(()) };
        self.batch = Some(db.keyspace.batch());
        self.batch_bytes = 0;
        let _call = self.shared.watch.enter(Who::Writer, Instant::now());
        self.shared.check(Point::Write).map_err(|e| Failure::io("writing a snapshot", &e))?;
        batch.commit().map_err(|e| Failure::store("writing a snapshot", &e))
    }

    fn rank(&mut self, rank: u32, num_pages: u32) -> Result<(), Failure> {
        self.flush_chunk()?;
        self.ranks += 1;
        self.insert(codec::rank_key(rank).to_vec(), num_pages.to_le_bytes().to_vec())
    }

    fn binding(&mut self, rank: u32, page: u32, b: Binding) -> Result<(), Failure> {
        self.enter_chunk(rank, page)?;
        self.entries.push(((page & (CHUNK_PAGES - 1)) as u16, b));
        self.bindings += 1;
        Ok(())
    }

    fn pending(&mut self, rank: u32, page: u32, p: Pending) -> Result<(), Failure> {
        self.enter_chunk(rank, page)?;
        self.pending.push(((page & (CHUNK_PAGES - 1)) as u16, p));
        Ok(())
    }

    /// Flushes the chunk gathered so far when `page` of `rank` is in another.
    fn enter_chunk(&mut self, rank: u32, page: u32) -> Result<(), Failure> {
        let at = (rank, page >> CHUNK_SHIFT);
        if self.at != Some(at) {
            self.flush_chunk()?;
            self.at = Some(at);
        }
        Ok(())
    }

    /// Encodes the chunk gathered so far (pages arrive in order, so its
    /// entries are sorted) and adds it to the batch, with its pending
    /// pages when it has any.
    fn flush_chunk(&mut self) -> Result<(), Failure> {
        let Some((rank, chunk)) = self.at.take() else { return Ok(()) };
        if !self.entries.is_empty() {
            codec::encode_chunk(&self.entries, &mut self.buf);
            self.entries.clear();
            let value = self.buf.clone();
            self.insert(codec::chunk_key(chunk, rank).to_vec(), value)?;
        }
        if !self.pending.is_empty() {
            codec::encode_pending(&self.pending, &mut self.buf);
            self.pending.clear();
            let value = self.buf.clone();
            self.insert(codec::pending_key(chunk, rank).to_vec(), value)?;
        }
        Ok(())
    }

    fn finish(mut self, start: Instant) -> Result<Written, Failure> {
        self.flush_chunk()?;
        let generation = self.generation;
        let (Some(db), Some(batch)) = (self.db.as_ref(), self.batch.as_mut()) else {
            return Err(Failure::Fatal("a snapshot ended before it began".into()));
        };
        batch.insert(db.meta(), GENERATION_KEY.to_vec(), generation.to_le_bytes().to_vec());
        self.commit()?;
        let Some(db) = self.db.take() else { return Err(Failure::Fatal("a snapshot lost its keyspace".into())) };
        {
            let _call = self.shared.watch.enter(Who::Writer, Instant::now());
            let sync = |e: &std::io::Error| Failure::io("syncing a snapshot", e);
            self.shared.check(Point::Sync).map_err(|e| sync(&e))?;
            db.keyspace.persist(PersistMode::SyncAll).map_err(|e| Failure::store("syncing a snapshot", &e))?;
            db.sync_tree().map_err(|e| sync(&e))?;
            db.make_current(&self.shared.root).map_err(|e| sync(&e))?;
        }
        Ok(Written { db, generation, ranks: self.ranks, bindings: self.bindings, elapsed: start.elapsed() })
    }
}
