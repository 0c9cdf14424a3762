//! Offline tools on a data directory, subcommands of the binary:
//! `hf3fs-meta inspect` prints what a `--data-dir` holds, `hf3fs-meta
//! verify` checks every invariant of its recovered state.
//!
//! Both are read-only. They refuse (exit 2) while a server holds the
//! directory's lock, copy the directory (vLLM's store and SGLang's in
//! `sglang/`) to a scratch directory while holding that lock themselves, and
//! open the copy with the server's own recovery path ([`open::open_copy`]):
//! opening the embedded store may write (journal recovery, compaction), so
//! the original is never opened.
//!
//! - [`open`]: the lock check, the copy, the recovery of the copy.
//! - [`inspect`]: what the recovered state holds, as a table or JSON.
//! - [`verify`]: the invariants, each checked and named.
//!
//! A directory of a server with `--tenants` holds each tenant's state in
//! `tenants/<name>/`, a data directory of its own: both tools look at the
//! directory (the tenant `default`'s state), then at each tenant's.

pub mod inspect;
pub mod open;
pub mod verify;

use std::path::{Path, PathBuf};

/// The tenants' data directories of data directory `dir` (a server's
/// `--tenants` state, `<dir>/tenants/<name>/`), by name; the tenant
/// `default`'s state is `dir` itself. A removal in progress (a name
/// starting with `.`) is not a tenant.
pub fn tenant_dirs(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir.join(crate::durable::TENANTS_SUBDIR)) else { return Vec::new() };
    let mut out: Vec<_> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .filter(|(name, path)| !name.starts_with('.') && open::is_data_dir(path).unwrap_or(false))
        .collect();
    out.sort();
    out
}

/// Exit status of `verify` when the state breaks an invariant (or recovery
/// refuses it).
pub const EXIT_VIOLATION: u8 = 1;
/// Exit status when the tool could not look: the directory is in use by a
/// server, missing, not a data directory, or unreadable.
pub const EXIT_CANNOT: u8 = 2;

/// The arguments of `inspect` and `verify`.
#[derive(Debug, Clone, clap::Args)]
pub struct DirArgs {
    /// The data directory a server ran with (`--data-dir`). It is not
    /// opened: a copy is, after checking that no server holds it.
    #[arg(long)]
    pub data_dir: PathBuf,

    /// Print one JSON object on stdout instead of text.
    #[arg(long)]
    pub json: bool,

    /// Where the copy goes (default: the system's temporary directory). It
    /// needs as much room as the data directory; it is removed on exit.
    #[arg(long)]
    pub scratch: Option<PathBuf>,
}
