//! Opening a data directory for the offline tools: refuse while a server
//! holds it, copy it under its lock, recover the copy as a server would.
//!
//! The lock is the server's own (`LOCK` in the directory and in `sglang/`,
//! an exclusive `flock`; see [`crate::durable::LOCK_FILE`]), tried without
//! waiting and held only while the files are copied, so a server cannot
//! start writing into the directory mid-copy. The copy is recovered with
//! [`Durable::open`] and [`durable::spaces::open`] with no periodic
//! checkpoint, no retry and no fsync: whatever they write goes to the copy,
//! which is removed when the [`OpenedCopy`] value is dropped.

use crate::core::{Spaces, SpacesConfig, Store, StoreConfig};
use crate::durable::{self, Durable, FsyncMode, OpenError, Recovered};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why a data directory could not be opened.
#[derive(Debug)]
pub enum Failure {
    /// A server (or another tool) holds its lock.
    InUse(String),
    /// Missing, not a data directory, or an I/O error.
    Io(String),
    /// Recovery refused the state: damaged files, an impossible state, or
    /// a state beyond every limit a server accepts.
    Refused(OpenError),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::InUse(m) | Failure::Io(m) => f.write_str(m),
            Failure::Refused(e) => write!(f, "recovery refused the directory: {e}"),
        }
    }
}

/// The recovered copy of a data directory. Fields drop in order: the
/// durable stores close before the copy is removed.
pub struct OpenedCopy {
    /// vLLM's store.
    pub vllm: Arc<Store>,
    /// What recovering vLLM's store found.
    pub vllm_recovered: Recovered,
    /// SGLang's spaces.
    pub spaces: Spaces,
    /// What recovering the spaces' store found.
    pub sglang_recovered: Recovered,
    /// The spaces' catalog, in id order.
    pub catalog: Vec<durable::spaces::CatalogEntry>,
    _vllm_durable: Durable,
    _sglang_durable: Durable,
    _copy: Scratch,
}

/// A directory removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The store configuration the copy is recovered with: every limit as wide
/// as a server accepts, so that any state a server wrote fits; no eviction
/// and a clock that does not move (nothing runs on the copy).
fn store_config() -> StoreConfig {
    StoreConfig {
        world_size: None,
        max_ranks: u32::from(u16::MAX),
        max_pages_per_rank: u32::MAX - 1,
        eviction: false,
        manual_clock: true,
        ..StoreConfig::default()
    }
}

/// Copies `dir` into a fresh directory under `scratch` (default: the
/// system's temporary directory) while holding its locks, and recovers the
/// copy.
pub fn open_copy(dir: &Path, scratch: Option<&Path>) -> Result<OpenedCopy, Failure> {
    let io = |what: &Path, e: std::io::Error| Failure::Io(format!("{}: {e}", what.display()));
    let meta = std::fs::metadata(dir).map_err(|e| io(dir, e))?;
    if !meta.is_dir() {
        return Err(Failure::Io(format!("{} is not a directory", dir.display())));
    }
    if !is_data_dir(dir).map_err(|e| io(dir, e))? {
        return Err(Failure::Io(format!(
            "{} is not a data directory of hf3fs-meta (no keyspace in it)",
            dir.display()
        )));
    }
    let base = scratch.map_or_else(std::env::temp_dir, Path::to_path_buf);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let copy = Scratch(base.join(format!("hf3fs-meta-inspect-{}-{nanos}", std::process::id())));
    {
        let _locks = [try_lock(dir)?, try_lock(&dir.join(durable::spaces::SUBDIR))?];
        copy_tree(dir, &copy.0)
            .map_err(|e| Failure::Io(format!("copying {} to {}: {e}", dir.display(), copy.0.display())))?;
    }
    let opts = durable::Options {
        checkpoint_every: None,
        retry_after: None,
        ..durable::Options::new(FsyncMode::None, store_config())
    };
    let (vllm, vllm_durable, vllm_recovered) = Durable::open(&copy.0, opts.clone()).map_err(refused)?;
    let catalog = durable::spaces::catalog(&copy.0).map_err(refused)?;
    let max_spaces = u32::try_from(catalog.len()).unwrap_or(u32::MAX).max(u32::from(u16::MAX));
    let cfg = SpacesConfig { max_spaces, store: store_config() };
    let (spaces, sglang_durable, sglang_recovered) =
        durable::spaces::open(&copy.0, FsyncMode::None, cfg, vllm.clock(), opts).map_err(refused)?;
    Ok(OpenedCopy {
        vllm,
        vllm_recovered,
        spaces,
        sglang_recovered,
        catalog,
        _vllm_durable: vllm_durable,
        _sglang_durable: sglang_durable,
        _copy: copy,
    })
}

fn refused(e: OpenError) -> Failure {
    match e {
        OpenError::Io(m) => Failure::Io(format!("opening the copy: {m}")),
        e => Failure::Refused(e),
    }
}

/// Whether `dir` holds a keyspace (`keyspace`, `keyspace-<n>` or `CURRENT`).
pub fn is_data_dir(dir: &Path) -> std::io::Result<bool> {
    for e in std::fs::read_dir(dir)? {
        let name = e?.file_name();
        let name = name.to_string_lossy();
        if name == "CURRENT" || name == "keyspace" || name.starts_with("keyspace-") {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Takes `dir`'s lock without waiting, when it has a lock file (a
/// directory copied without one, or never served, has none; nothing is
/// created). A lock someone holds is [`Failure::InUse`].
fn try_lock(dir: &Path) -> Result<Option<File>, Failure> {
    let path = dir.join(durable::LOCK_FILE);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Failure::Io(format!("{}: {e}", path.display()))),
    };
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Err(Failure::InUse(format!(
            "{} is in use by a running hf3fs-meta (its {} file is locked); stop the server first",
            dir.display(),
            durable::LOCK_FILE
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(Failure::Io(format!("{}: {e}", path.display()))),
    }
}

/// Copies the files and directories under `from` into `to` (created), but
/// the lock files; anything else (a symlink, a socket) is skipped.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let ty = e.file_type()?;
        if ty.is_dir() && from.join(durable::TENANTS_SUBDIR) == src {
            // The tenants' directories: each is opened (and copied) on its own.
        } else if ty.is_dir() {
            copy_tree(&src, &dst)?;
        } else if ty.is_file() && e.file_name() != durable::LOCK_FILE {
            std::fs::copy(&src, &dst)?;
        }
    }
    Ok(())
}
