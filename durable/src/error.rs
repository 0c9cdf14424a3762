//! The durable layer's errors and the guard that turns the embedded store's
//! panics into them.
//!
//! A leaf: every other file of `durable/` may use it, it uses none of them.
//! [`OpenError`] is what start-up reports; `Failure` is what a failure while
//! serving is, sorted into the two paths of docs/durability.md ("When the
//! disk fails"); `guarded` and `panic_message` make a panic inside fjall (it
//! asserts on some malformed files) one clear log line rather than a
//! backtrace.

use std::cell::{Cell, RefCell};

/// Why the durable store could not be opened. The server logs it and exits
/// non-zero rather than start with state it cannot vouch for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// The directory could not be created or read.
    #[error("I/O error: {0}")]
    Io(String),
    /// The store's files are damaged (beyond a torn tail, which is dropped
    /// with a warning).
    #[error("the data is corrupt: {0}")]
    Corrupt(String),
    /// The data decodes but describes an impossible state.
    #[error("the data is inconsistent: {0}")]
    Inconsistent(String),
    /// The state does not fit this configuration (e.g. a smaller `--max-ranks`).
    #[error("cannot restore: {0}")]
    Restore(String),
    /// The directory is in a data-directory format newer than this release
    /// reads ([`super::format`]); nothing in it was changed.
    #[error("a data directory of a newer release: {0}")]
    Newer(String),
}

/// A failure of the durable store while serving, sorted by what can be done
/// about it in process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Writing or syncing failed: a full disk, an I/O error, a read-only
    /// file system, or the embedded store poisoned by one of those. The
    /// memory is intact, so the durable layer abandons the store and, once
    /// writes succeed again, writes a fresh one from memory.
    Io(String),
    /// Only a bug or corruption explains it: a panic in a durable thread,
    /// data that was written and does not read back, a memory state that
    /// fails its own checks, a writer stuck inside the store. No in-process
    /// path is safe: the server exits for its supervisor to restart it into
    /// recovery from the disk.
    Fatal(String),
}

impl Failure {
    /// Sorts an error of the embedded store: I/O and the poisoning that
    /// follows it are [`Failure::Io`]; anything that says the data itself is
    /// wrong (a checksum, a decode error, a version, a deleted partition in
    /// use) is [`Failure::Fatal`].
    pub(crate) fn store(what: &str, e: &fjall::Error) -> Failure {
        let msg = format!("{what}: {e}");
        match e {
            fjall::Error::Io(_) | fjall::Error::Poisoned | fjall::Error::Storage(fjall::LsmError::Io(_)) => {
                Failure::Io(msg)
            }
            _ => Failure::Fatal(msg),
        }
    }

    /// An I/O error of our own file operations.
    pub(crate) fn io(what: &str, e: &std::io::Error) -> Failure {
        Failure::Io(format!("{what}: {e}"))
    }

    /// The message.
    pub(crate) fn message(&self) -> &str {
        match self {
            Failure::Io(m) | Failure::Fatal(m) => m,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

/// The text of a caught panic's payload.
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

thread_local! {
    /// Set while this thread runs [`guarded`] code.
    static GUARDED: Cell<bool> = const { Cell::new(false) };
    /// The message of the last panic caught by [`guarded`] on this thread.
    static CAUGHT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Runs `f`, turning a panic into an error message without printing a
/// panic report: the embedded store asserts on some malformed files, and a
/// damaged data directory must produce one clear log line, not a backtrace.
pub(crate) fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if GUARDED.with(Cell::get) {
                let mut msg = panic_message(info.payload()).replace('\n', " ");
                if let Some(l) = info.location() {
                    msg = format!("{msg} ({}:{})", l.file(), l.line());
                }
                CAUGHT.with(|c| *c.borrow_mut() = Some(msg));
            } else {
                previous(info);
            }
        }));
    });
    let was = GUARDED.with(|g| g.replace(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(was));
    r.map_err(|p| {
        let caught = CAUGHT.with(|c| c.borrow_mut().take());
        format!("the embedded store refused its files: {}", caught.unwrap_or_else(|| panic_message(&*p)))
    })
}
