//! Fault injection at the durable store's boundary, for tests.
//!
//! Every call the durable layer makes that writes to or syncs the disk (a
//! log append, a checkpoint, a snapshot, a generation switch, the syncer's
//! fdatasync, the health probe) first asks [`Faults::check`] whether it
//! should fail instead. A server runs without any (`None` where the store
//! keeps its `Option<Arc<Faults>>`): the cost is one branch per store call,
//! and store calls are per batch of requests, never per request.
//!
//! Two ways to drive it, one type:
//! - in process ([`Faults::manual`], then [`Faults::set`]), for tests that
//!   open the store through the API;
//! - from a file ([`Faults::from_file`]), for tests of the real binary: the
//!   hidden `--durable-faults PATH` flag (`HF3FS_META_DURABLE_FAULTS`). The
//!   file is read at every check, so a test turns a fault on and off by
//!   rewriting it. Its words name the faults in force, e.g. `write=enospc
//!   sync=eio`; an empty or missing file means none. Kinds: `enospc` (disk
//!   full), `eio` (an I/O error), `panic` (a bug in the durable layer: the
//!   path that exits the process). Points: `write`, `sync`.
//!
//! An injected fault fails the call *before* the embedded store sees it,
//! so it does not poison fjall the way a real failure does; the durable
//! layer treats both alike (it abandons the keyspace either way), and the
//! size-limited tmpfs test (`tests/durable/faults.rs`) covers the real thing.
//!
//! # Memory ordering
//!
//! The in-process switches and the counter are `Relaxed`: a test sets a
//! switch and then makes the call that should fail from the same thread, or
//! waits for the outcome through the durable layer's own synchronization
//! (`/health`, a failed wait); no data hangs off them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

const EIO: i32 = 5;
const ENOSPC: i32 = 28;

/// Where a fault strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// Writing: a store batch, a snapshot, the probe's write.
    Write,
    /// Syncing: fdatasync of the journal, `persist`, the probe's fsync.
    Sync,
}

/// What an injected fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fails with ENOSPC, as on a full disk.
    NoSpace,
    /// Fails with EIO, as on a failing device.
    Io,
    /// Panics: stands for a bug in the durable layer.
    Panic,
}

impl Fault {
    fn code(self) -> u8 {
        match self {
            Fault::NoSpace => 1,
            Fault::Io => 2,
            Fault::Panic => 3,
        }
    }

    fn from_code(c: u8) -> Option<Fault> {
        match c {
            1 => Some(Fault::NoSpace),
            2 => Some(Fault::Io),
            3 => Some(Fault::Panic),
            _ => None,
        }
    }

    fn parse(s: &str) -> Option<Fault> {
        match s {
            "enospc" => Some(Fault::NoSpace),
            "eio" => Some(Fault::Io),
            "panic" => Some(Fault::Panic),
            _ => None,
        }
    }
}

/// The faults in force; see the module note.
#[derive(Debug, Default)]
pub struct Faults {
    /// With [`Faults::from_file`], the control file.
    file: Option<PathBuf>,
    /// The in-process switches (`Fault::code`, 0 for none).
    write: AtomicU8,
    sync: AtomicU8,
    /// Faults injected so far.
    injected: AtomicU64,
}

impl Faults {
    /// Faults switched from the test's own process.
    pub fn manual() -> Arc<Faults> {
        Arc::new(Faults::default())
    }

    /// Faults named by the words of `path`, read at every check.
    pub fn from_file(path: PathBuf) -> Arc<Faults> {
        Arc::new(Faults { file: Some(path), ..Faults::default() })
    }

    /// Makes every call at `point` fail with `fault` (`None`: succeed again).
    pub fn set(&self, point: Point, fault: Option<Fault>) {
        let slot = match point {
            Point::Write => &self.write,
            Point::Sync => &self.sync,
        };
        slot.store(fault.map_or(0, Fault::code), Ordering::Relaxed);
    }

    /// Lifts every in-process fault.
    pub fn clear(&self) {
        self.set(Point::Write, None);
        self.set(Point::Sync, None);
    }

    /// How many calls failed on purpose so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// The fault in force at `point`, if any.
    fn current(&self, point: Point) -> Result<Option<Fault>, String> {
        let Some(path) = &self.file else {
            let slot = match point {
                Point::Write => &self.write,
                Point::Sync => &self.sync,
            };
            return Ok(Fault::from_code(slot.load(Ordering::Relaxed)));
        };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("fault file {}: {e}", path.display())),
        };
        let want = match point {
            Point::Write => "write",
            Point::Sync => "sync",
        };
        let mut found = None;
        for word in text.split(|c: char| c.is_whitespace() || c == ',').filter(|w| !w.is_empty()) {
            let parsed = word.split_once('=').and_then(|(p, f)| Some((p, Fault::parse(f)?)));
            match parsed {
                Some((p, f)) if p == want => found = Some(f),
                Some((p, _)) if p == "write" || p == "sync" => {}
                _ => return Err(format!("fault file {}: cannot read {word:?}", path.display())),
            }
        }
        Ok(found)
    }

    /// Fails (or panics) if a fault is in force at `point`.
    pub(crate) fn check(&self, point: Point) -> std::io::Result<()> {
        let fault = self.current(point).map_err(std::io::Error::other)?;
        let Some(fault) = fault else { return Ok(()) };
        self.injected.fetch_add(1, Ordering::Relaxed);
        match fault {
            // The errno values of Linux (the same on every architecture),
            // so the messages read like the real ones.
            Fault::NoSpace => Err(std::io::Error::from_raw_os_error(ENOSPC)),
            Fault::Io => Err(std::io::Error::from_raw_os_error(EIO)),
            Fault::Panic => panic!("injected panic at {point:?} (a bug in the durable layer)"),
        }
    }
}

/// Runs [`Faults::check`] when there are faults; nothing otherwise.
#[inline]
pub(crate) fn check(faults: &Option<Arc<Faults>>, point: Point) -> std::io::Result<()> {
    match faults {
        None => Ok(()),
        Some(f) => f.check(point),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_switches() {
        let f = Faults::manual();
        assert!(f.check(Point::Write).is_ok());
        f.set(Point::Write, Some(Fault::NoSpace));
        let e = f.check(Point::Write).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::StorageFull);
        assert!(f.check(Point::Sync).is_ok());
        f.clear();
        assert!(f.check(Point::Write).is_ok());
        assert_eq!(f.injected(), 1);
    }

    #[test]
    fn file_words() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("faults");
        let f = Faults::from_file(path.clone());
        assert!(f.check(Point::Write).is_ok(), "a missing file is no fault");
        std::fs::write(&path, "sync=eio\n").unwrap();
        assert!(f.check(Point::Write).is_ok());
        assert_eq!(f.check(Point::Sync).unwrap_err().raw_os_error(), Some(EIO));
        std::fs::write(&path, "write=enospc, sync=eio").unwrap();
        assert_eq!(f.check(Point::Write).unwrap_err().kind(), std::io::ErrorKind::StorageFull);
        std::fs::write(&path, "write=melt").unwrap();
        assert!(f.check(Point::Write).unwrap_err().to_string().contains("cannot read"));
        std::fs::write(&path, "").unwrap();
        assert!(f.check(Point::Write).is_ok() && f.check(Point::Sync).is_ok());
    }
}
