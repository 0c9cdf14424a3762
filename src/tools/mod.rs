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

pub mod inspect;
pub mod open;
pub mod verify;

use std::path::PathBuf;

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
