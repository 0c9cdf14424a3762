//! The embedded store (fjall) and the partitions of the current generation.
//!
//! One fjall keyspace lives in `<data-dir>/keyspace`. fjall writes every batch
//! to its journal first (checksummed, one sequential file), so a batch is
//! atomic across partitions and a crash keeps a prefix of the batches: that
//! is the property the log and the checkpoint rely on.

use super::codec::{self, GENERATION_KEY};
use super::error::{guarded, OpenError};
use fjall::{CompressionType, Keyspace, PartitionCreateOptions, PartitionHandle, PersistMode};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// The partitions of one generation.
pub(crate) struct Parts {
    /// The generation.
    pub(crate) generation: u64,
    /// Its log (`log_{g}`).
    pub(crate) log: PartitionHandle,
    /// Its checkpointed state (`state_{g}`).
    pub(crate) state: PartitionHandle,
}

/// The keyspace and the current generation.
pub(crate) struct Db {
    pub(crate) keyspace: Keyspace,
    /// Where the keyspace lives.
    path: PathBuf,
    meta: PartitionHandle,
    /// The current generation's partitions. A std `Mutex`, held by the
    /// checkpointer for one pass and by the writer while it switches
    /// generation (a `/clear`); requests never touch it.
    parts: Mutex<Parts>,
}

/// What opening the keyspace found.
#[derive(Debug, Default, Clone)]
pub struct OpenReport {
    /// Bytes of journal tail fjall discarded as incomplete (a batch the
    /// process was writing when it died), if any.
    pub dropped_tail_bytes: u64,
    /// Partitions of older generations removed (a crash during a `/clear`).
    pub stale_partitions: usize,
}

fn log_options() -> PartitionCreateOptions {
    // Log entries are short-lived (the checkpointer folds them into the
    // state) and mostly digests: compression would cost CPU for nothing.
    PartitionCreateOptions::default().compression(CompressionType::None).manual_journal_persist(true)
}

fn state_options() -> PartitionCreateOptions {
    PartitionCreateOptions::default().manual_journal_persist(true)
}

/// For each journal file, where its written bytes end: fjall preallocates
/// journal files with zeros and, on recovery, cuts each one at the end of its
/// last complete batch. Cutting zeros drops nothing; cutting written bytes
/// drops a torn batch, which we want to report.
fn journal_ends(dir: &Path) -> Vec<(PathBuf, u64)> {
    let Ok(rd) = std::fs::read_dir(dir.join("journals")) else { return Vec::new() };
    rd.filter_map(Result::ok).filter_map(|e| Some((e.path(), written_end(&e.path()).ok()?))).collect()
}

/// The offset just past the last nonzero byte of `path`.
fn written_end(path: &Path) -> std::io::Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path)?;
    let mut end = f.metadata()?.len();
    let mut buf = vec![0u8; 1 << 16];
    while end > 0 {
        let from = end.saturating_sub(buf.len() as u64);
        let chunk = &mut buf[..(end - from) as usize];
        f.seek(SeekFrom::Start(from))?;
        f.read_exact(chunk)?;
        if let Some(i) = chunk.iter().rposition(|&b| b != 0) {
            return Ok(from + i as u64 + 1);
        }
        end = from;
    }
    Ok(0)
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

impl Db {
    /// Opens (or creates) the keyspace in `dir`, finds the current
    /// generation and removes older ones.
    pub(crate) fn open(dir: &Path) -> Result<(Db, OpenReport), OpenError> {
        let path = dir.join("keyspace");
        std::fs::create_dir_all(&path).map_err(|e| OpenError::Io(format!("cannot create {}: {e}", path.display())))?;
        let before = journal_ends(&path);
        let corrupt = |e: String| OpenError::Corrupt(format!("{}: {e}", path.display()));
        let keyspace = guarded(|| {
            fjall::Config::new(&path)
                .manual_journal_persist(true)
                // Two cores: one background flush and one compaction thread
                // leave the rest to the server.
                .flush_workers(1)
                .compaction_workers(1)
                .open()
        })
        .map_err(corrupt)?
        .map_err(|e| corrupt(e.to_string()))?;
        let mut report = OpenReport::default();
        for (p, written) in &before {
            // A journal fjall removed entirely was fully flushed: nothing lost.
            if p.exists() {
                report.dropped_tail_bytes += written.saturating_sub(file_len(p));
            }
        }
        let fjall_err = |e: fjall::Error| corrupt(e.to_string());
        let meta = guarded(|| keyspace.open_partition("meta", PartitionCreateOptions::default()))
            .map_err(corrupt)?
            .map_err(fjall_err)?;
        let generation = match meta.get(GENERATION_KEY).map_err(fjall_err)? {
            None => 0,
            Some(v) => {
                let b: [u8; 8] = v.as_ref().try_into().map_err(|_| corrupt("corrupt generation record".into()))?;
                u64::from_le_bytes(b)
            }
        };
        for name in keyspace.list_partitions() {
            if codec::partition_generation(&name).is_some_and(|g| g != generation) {
                let h = keyspace.open_partition(&name, PartitionCreateOptions::default()).map_err(fjall_err)?;
                keyspace.delete_partition(h).map_err(fjall_err)?;
                report.stale_partitions += 1;
            }
        }
        let log = keyspace.open_partition(&codec::log_partition(generation), log_options()).map_err(fjall_err)?;
        let state = keyspace.open_partition(&codec::state_partition(generation), state_options()).map_err(fjall_err)?;
        let db = Db { keyspace, path, meta, parts: Mutex::new(Parts { generation, log, state }) };
        Ok((db, report))
    }

    /// Where fjall keeps its journal files.
    pub(crate) fn journals_dir(&self) -> PathBuf {
        self.path.join("journals")
    }

    /// The current generation's partitions, locked.
    pub(crate) fn parts(&self) -> MutexGuard<'_, Parts> {
        self.parts.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Makes `g` the current generation: creates its (empty) partitions,
    /// records `g` in `meta` with `durability`, then drops the old
    /// partitions. A crash at any point leaves either the old generation or
    /// the new, empty one. Returns the new log partition.
    pub(crate) fn switch_generation(&self, g: u64, durability: PersistMode) -> fjall::Result<PartitionHandle> {
        let log = self.keyspace.open_partition(&codec::log_partition(g), log_options())?;
        let state = self.keyspace.open_partition(&codec::state_partition(g), state_options())?;
        // Make the new partitions' directory entries durable before the
        // journal can hold anything that refers to them.
        if let Ok(d) = std::fs::File::open(self.path.join("partitions")) {
            d.sync_all()?;
        }
        let mut b = self.keyspace.batch().durability(Some(durability));
        b.insert(&self.meta, GENERATION_KEY.to_vec(), g.to_le_bytes().to_vec());
        b.commit()?;
        let old = std::mem::replace(&mut *self.parts(), Parts { generation: g, log: log.clone(), state });
        self.keyspace.delete_partition(old.log)?;
        self.keyspace.delete_partition(old.state)?;
        Ok(log)
    }
}
