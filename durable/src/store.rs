//! The embedded store (fjall) and the partitions of the current generation.
//!
//! One fjall keyspace holds the data: `<data-dir>/keyspace` at first, then
//! `<data-dir>/keyspace-<n>` after the n-th recovery from a disk fault,
//! which writes a fresh keyspace from memory beside the abandoned one
//! ([`super::snapshot`]). `<data-dir>/CURRENT` names the keyspace in use; it
//! is replaced atomically (write, fsync, rename, fsync the directory) once
//! the new keyspace is complete and synced, so a crash at any point leaves
//! one complete keyspace named by it. Without `CURRENT` (a directory that
//! never needed a recovery) the keyspace is `keyspace`. Start-up removes
//! every other `keyspace*` directory: a half-written snapshot or an
//! abandoned keyspace.
//!
//! fjall writes every batch to its journal first (checksummed, one
//! sequential file), so a batch is atomic across partitions and a crash
//! keeps a prefix of the batches: that is the property the log and the
//! checkpoint rely on.

use super::codec::{self, GENERATION_KEY};
use super::error::{guarded, Failure, OpenError};
use fjall::{CompressionType, Keyspace, PartitionCreateOptions, PartitionHandle, PersistMode};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// The keyspace of a data directory that never needed a recovery.
const FIRST: &str = "keyspace";
/// The file naming the keyspace in use.
const CURRENT: &str = "CURRENT";

/// The partitions of one generation.
pub(crate) struct Parts {
    /// The generation.
    pub(crate) generation: u64,
    /// Its log (`log_{g}`).
    pub(crate) log: PartitionHandle,
    /// Its checkpointed state (`state_{g}`).
    pub(crate) state: PartitionHandle,
    /// Set once a recovery replaced this keyspace: a checkpoint pass that
    /// finds it set does nothing.
    pub(crate) retired: bool,
}

/// The keyspace and the current generation.
pub(crate) struct Db {
    pub(crate) keyspace: Keyspace,
    /// Where the keyspace lives (`<data-dir>/<name>`).
    path: PathBuf,
    /// Its directory name (`keyspace` or `keyspace-<n>`).
    name: String,
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
    /// Partitions removed of older generations, or of the next one whose
    /// creation a crash cut short (a crash during a `/clear`).
    pub stale_partitions: usize,
    /// Keyspace directories removed: abandoned by a recovery, or a fresh
    /// one whose writing a crash interrupted.
    pub stale_keyspaces: usize,
    /// The keyspace directory in use.
    pub keyspace: String,
}

fn log_options() -> PartitionCreateOptions {
    // Log entries are short-lived (the checkpointer folds them into the
    // state) and mostly digests: compression would cost CPU for nothing.
    PartitionCreateOptions::default().compression(CompressionType::None).manual_journal_persist(true)
}

fn state_options() -> PartitionCreateOptions {
    PartitionCreateOptions::default().manual_journal_persist(true)
}

/// Opens (or creates) the fjall keyspace at `path`.
fn open_keyspace(path: &Path) -> fjall::Result<Keyspace> {
    fjall::Config::new(path)
        .manual_journal_persist(true)
        // Two cores: one background flush and one compaction thread leave
        // the rest to the server.
        .flush_workers(1)
        .compaction_workers(1)
        .open()
}

/// Where a data directory's first keyspace is laid out before it is
/// renamed to `keyspace`.
const NEW_FIRST: &str = "keyspace.new";

/// Makes a data directory's first keyspace whole under [`NEW_FIRST`] (its
/// partitions created, every file and directory synced) and renames it to
/// `path`: a power cut while fjall lays out a keyspace leaves files it
/// cannot open (a missing version file, a half-written manifest), which
/// would stop every later start-up, although nothing was acknowledged yet
/// (the crash-state explorer, forgetfs/tests/explore/, found it). A
/// leftover of an interrupted attempt is removed by the next open.
fn create_first(dir: &Path, path: &Path) -> Result<(), OpenError> {
    let tmp = dir.join(NEW_FIRST);
    let io = |what: &Path, e: std::io::Error| OpenError::Io(format!("cannot create {}: {e}", what.display()));
    match std::fs::remove_dir_all(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&tmp, e)),
        _ => {}
    }
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    {
        let fjall_err = |e: fjall::Error| OpenError::Io(format!("cannot create {}: {e}", tmp.display()));
        let keyspace = guarded(|| open_keyspace(&tmp))
            .map_err(|e| OpenError::Corrupt(format!("{}: {e}", tmp.display())))?
            .map_err(fjall_err)?;
        keyspace.open_partition("meta", PartitionCreateOptions::default()).map_err(fjall_err)?;
        keyspace.open_partition(&codec::log_partition(0), log_options()).map_err(fjall_err)?;
        keyspace.open_partition(&codec::state_partition(0), state_options()).map_err(fjall_err)?;
        keyspace.persist(PersistMode::SyncAll).map_err(fjall_err)?;
    }
    sync_tree(&tmp).map_err(|e| io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| io(path, e))?;
    sync_dir(dir).map_err(|e| io(dir, e))
}

/// `Some(n)` for `keyspace-<n>`, `Some(0)` for `keyspace`, else `None`.
fn keyspace_number(name: &str) -> Option<u64> {
    if name == FIRST {
        return Some(0);
    }
    name.strip_prefix(FIRST)?.strip_prefix('-')?.parse().ok()
}

/// Removes every keyspace directory of `dir` but `keep`, and a stray
/// `CURRENT.tmp`; returns how many keyspaces it removed.
fn remove_other_keyspaces(dir: &Path, keep: &str) -> std::io::Result<usize> {
    let mut removed = 0;
    let entries = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    for e in entries {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name == "CURRENT.tmp" || name == "probe.tmp" {
            std::fs::remove_file(e.path())?;
        } else if name == NEW_FIRST {
            std::fs::remove_dir_all(e.path())?;
        } else if name != keep && keyspace_number(&name).is_some() && e.file_type()?.is_dir() {
            match std::fs::remove_dir_all(e.path()) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => removed += 1,
            }
        }
    }
    Ok(removed)
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
        // All zeros (a preallocated tail) is told by OR-ing the chunk, which
        // compiles to wide loads; only the chunk with data is searched.
        if chunk.iter().fold(0u8, |a, &b| a | b) != 0 {
            if let Some(i) = chunk.iter().rposition(|&b| b != 0) {
                return Ok(from + i as u64 + 1);
            }
        }
        end = from;
    }
    Ok(0)
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

impl Db {
    /// Opens (or creates) the keyspace `dir/CURRENT` names, finds the
    /// current generation and removes older ones, and removes every other
    /// keyspace directory.
    pub(crate) fn open(dir: &Path) -> Result<(Db, OpenReport), OpenError> {
        let name = match std::fs::read_to_string(dir.join(CURRENT)) {
            Ok(n) => n.trim().to_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => FIRST.to_owned(),
            Err(e) => return Err(OpenError::Io(format!("{}: {e}", dir.join(CURRENT).display()))),
        };
        if keyspace_number(&name).is_none() {
            return Err(OpenError::Corrupt(format!("{} names {name:?}, not a keyspace", dir.join(CURRENT).display())));
        }
        let path = dir.join(&name);
        if name != FIRST && !path.is_dir() {
            return Err(OpenError::Corrupt(format!("{} names {name}, which is missing", dir.join(CURRENT).display())));
        }
        let mut report = OpenReport { keyspace: name.clone(), ..OpenReport::default() };
        report.stale_keyspaces = remove_other_keyspaces(dir, &name)
            .map_err(|e| OpenError::Io(format!("cannot remove an old keyspace in {}: {e}", dir.display())))?;
        if name == FIRST && !path.exists() {
            create_first(dir, &path)?;
        }
        report.stale_partitions = remove_unfinished_partitions(&path)
            .map_err(|e| OpenError::Io(format!("cannot remove an unfinished partition in {}: {e}", path.display())))?;
        let before = journal_ends(&path);
        let corrupt = |e: String| OpenError::Corrupt(format!("{}: {e}", path.display()));
        let keyspace = guarded(|| open_keyspace(&path)).map_err(corrupt)?.map_err(|e| match e {
            fjall::Error::Io(e) => OpenError::Io(format!("{}: {e}", path.display())),
            e => corrupt(e.to_string()),
        })?;
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
        // fjall fsyncs the files it makes but not every directory entry: a
        // new partition's name in `partitions/` and the keyspace's name in
        // the data directory. POSIX persists a name only by its directory's
        // fsync; without these, a power cut after the first acknowledged
        // write could lose the whole keyspace (the crash-state explorer,
        // forgetfs/tests/explore/, found it).
        for d in [path.join("partitions"), path.clone(), dir.to_path_buf()] {
            sync_dir(&d).map_err(|e| OpenError::Io(format!("fsync of {}: {e}", d.display())))?;
        }
        let db = Db { keyspace, path, name, meta, parts: Mutex::new(Parts { generation, log, state, retired: false }) };
        Ok((db, report))
    }

    /// Creates an empty keyspace `dir/name` (removing any leftover of that
    /// name) with the partitions of `generation`; for a recovery's
    /// snapshot. Nothing names it until [`Db::make_current`].
    pub(crate) fn create(dir: &Path, name: &str, generation: u64) -> Result<Db, Failure> {
        let path = dir.join(name);
        match std::fs::remove_dir_all(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Failure::io(&format!("removing {}", path.display()), &e))
            }
            _ => {}
        }
        let store = |e: fjall::Error| Failure::store(&format!("creating {}", path.display()), &e);
        let keyspace = open_keyspace(&path).map_err(store)?;
        let meta = keyspace.open_partition("meta", PartitionCreateOptions::default()).map_err(store)?;
        let log = keyspace.open_partition(&codec::log_partition(generation), log_options()).map_err(store)?;
        let state = keyspace.open_partition(&codec::state_partition(generation), state_options()).map_err(store)?;
        let parts = Mutex::new(Parts { generation, log, state, retired: false });
        Ok(Db { keyspace, path, name: name.to_owned(), meta, parts })
    }

    /// The meta partition (a snapshot records its generation there).
    pub(crate) fn meta(&self) -> &PartitionHandle {
        &self.meta
    }

    /// The keyspace's directory name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The keyspace's number (`keyspace-<n>`; 0 for `keyspace`).
    pub(crate) fn number(&self) -> u64 {
        keyspace_number(&self.name).unwrap_or(0)
    }

    /// The keyspace's directory.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The name of the keyspace a recovery writes after this one.
    pub(crate) fn next_name(&self) -> String {
        format!("{FIRST}-{}", keyspace_number(&self.name).unwrap_or(0) + 1)
    }

    /// fsyncs every file and directory of the keyspace (a snapshot's last
    /// step before it is named current: fjall syncs its journal, this also
    /// covers the directory entries of everything it created).
    pub(crate) fn sync_tree(&self) -> std::io::Result<()> {
        sync_tree(&self.path)
    }

    /// Names this keyspace in `dir/CURRENT`, atomically and durably: the
    /// last step of a recovery.
    pub(crate) fn make_current(&self, dir: &Path) -> std::io::Result<()> {
        let tmp = dir.join("CURRENT.tmp");
        let mut f = std::fs::File::create(&tmp)?;
        writeln!(f, "{}", self.name)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, dir.join(CURRENT))?;
        std::fs::File::open(dir)?.sync_all()
    }

    /// Marks the keyspace replaced, after any checkpoint pass on it ends.
    pub(crate) fn retire(&self) {
        self.parts().retired = true;
    }

    /// Where fjall keeps its journal files.
    pub(crate) fn journals_dir(&self) -> PathBuf {
        self.path.join("journals")
    }

    /// Makes the removal of an older generation's partitions durable.
    /// fjall removes a deleted partition's directory once its last handle
    /// is gone (the writer's of the old log is, when the switch returns)
    /// and syncs no directory after. Without this fsync a power cut could
    /// bring back any part of the old generation's files at any later
    /// time (start-up removes them again: nothing depends on it), and every
    /// later fsync of the crash-state explorer's run carried all those
    /// combinations (docs/durability.md, "The full enumeration").
    pub(crate) fn sync_partitions(&self) -> std::io::Result<()> {
        sync_dir(&self.path.join("partitions"))
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
        let old =
            std::mem::replace(&mut *self.parts(), Parts { generation: g, log: log.clone(), state, retired: false });
        self.keyspace.delete_partition(old.log)?;
        self.keyspace.delete_partition(old.state)?;
        Ok(log)
    }
}

/// Removes the partitions of the keyspace at `keyspace` whose creation a
/// crash cut short, and returns how many. fjall takes a partition whose
/// directory holds lsm-tree's `manifest` as made, but lsm-tree writes its
/// `levels` after it (synced, then renamed into place): a crash in between
/// leaves a partition fjall cannot open (`levels` missing, or the manifest
/// not yet written), and every later start-up would refuse the directory
/// (the crash-state explorer, forgetfs/tests/explore/, found it on a
/// `/clear`). Nothing is ever written to a partition before its creation
/// returned, so such a partition holds nothing; one marked deleted is
/// fjall's to remove.
fn remove_unfinished_partitions(keyspace: &Path) -> std::io::Result<usize> {
    let dir = keyspace.join("partitions");
    let entries = match std::fs::read_dir(&dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        r => r?,
    };
    let mut removed = 0;
    for e in entries {
        let p = e?.path();
        if p.is_dir() && !p.join(".deleted").exists() && !p.join("levels").exists() {
            std::fs::remove_dir_all(&p)?;
            removed += 1;
        }
    }
    if removed > 0 {
        sync_dir(&dir)?;
    }
    Ok(removed)
}

/// fsyncs the directory `dir`: the names in it become durable.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// fsyncs every file and directory under `path`, and `path`.
fn sync_tree(path: &Path) -> std::io::Result<()> {
    // fjall's own threads may remove a file meanwhile (a flushed
    // journal, a compacted segment): gone is fine.
    fn gone_ok(r: std::io::Result<()>) -> std::io::Result<()> {
        match r {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }
    fn walk(p: &Path) -> std::io::Result<()> {
        for e in std::fs::read_dir(p)? {
            let e = e?;
            if e.file_type()?.is_dir() {
                gone_ok(walk(&e.path()))?;
            } else {
                gone_ok(std::fs::File::open(e.path()).and_then(|f| f.sync_all()))?;
            }
        }
        std::fs::File::open(p)?.sync_all()
    }
    walk(path)
}

#[cfg(test)]
mod tests {
    use super::written_end;

    /// Where a journal's written bytes end: past its last non-zero byte,
    /// wherever that falls around the 64 KiB chunks it is read in, and 0
    /// for a file of zeros (a preallocated journal nothing was written to).
    #[test]
    fn a_journals_written_end_is_past_its_last_non_zero_byte() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("journal");
        let len = 3 * (1 << 16) + 100;
        std::fs::write(&path, vec![0u8; len]).expect("write");
        assert_eq!(written_end(&path).expect("read"), 0, "all zeros");
        for at in [0, 1, 63, 64, (1 << 16) - 1, 1 << 16, (1 << 16) + 1, 2 * (1 << 16) + 7, len - 101, len - 1] {
            let mut b = vec![0u8; len];
            b[at] = 0x80;
            b[0] |= 1;
            std::fs::write(&path, &b).expect("write");
            assert_eq!(written_end(&path).expect("read"), at as u64 + 1, "the last non-zero byte at {at}");
        }
    }
}
