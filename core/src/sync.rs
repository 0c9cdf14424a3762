//! The one place the core takes its atomics and locks from.
//!
//! Under `cfg(loom)` every atomic, every lock and every spin hint is swapped
//! for loom's model-checked version, so the page-state machine in
//! [`super::pages`], the key index in [`super::index`] (its arena, tables
//! and shard mutexes) and the stores run unchanged inside loom models. Call
//! sites never name `std::sync::atomic`, `std::sync::Mutex` or
//! `std::sync::RwLock` directly; they import from here. The test at the
//! bottom of this file reads every source file of the core and fails
//! naming the file that does.
//!
//! # The one exception: statics
//!
//! A `static` needs a `const` constructor, which loom's atomics and locks do
//! not have (each registers itself with the running model when made). The
//! core's only statics are the table of SGLang pool names that
//! `key/digest.rs` interns process-wide; they take std's types through
//! [`statics`], the one module allowed to. No loom model parses a key with
//! a pool suffix (models use 32-hex keys), so nothing a model checks runs
//! on them.
//!
//! `OnceLock` is std's in both builds: loom has none, and the core's
//! initializers (a rank's page table, the index's shards) make loom objects
//! without yielding to the model's scheduler, so no model thread can meet
//! one half-run.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicI64, AtomicPtr, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard, RwLock};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicI64, AtomicPtr, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard, RwLock};

pub(crate) use std::sync::{OnceLock, PoisonError};

/// std's atomics and locks for `static`s, which loom's cannot be (module
/// note): only `key/digest.rs`'s pool-name table uses them.
pub(crate) mod statics {
    pub(crate) use std::sync::atomic::{AtomicUsize, Ordering};
    pub(crate) use std::sync::Mutex;
}

/// Waits a little before looking again at a page another request holds BUSY.
///
/// The holder is inside a short, non-blocking commit (a few hundred
/// nanoseconds), so we spin first and yield the thread after that, in case the
/// holder was preempted by the OS. Under loom, every wait is a yield, which is
/// what lets the model checker schedule the holder.
#[derive(Default)]
pub(crate) struct Backoff {
    step: u32,
}

impl Backoff {
    /// Spins, then yields, a little longer each call.
    pub(crate) fn snooze(&mut self) {
        #[cfg(loom)]
        {
            loom::thread::yield_now();
        }
        #[cfg(not(loom))]
        {
            if self.step < 6 {
                for _ in 0..(1u32 << self.step) {
                    std::hint::spin_loop();
                }
            } else {
                std::thread::yield_now();
            }
        }
        self.step = self.step.saturating_add(1);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::path::{Path, PathBuf};

    /// What only this file may name: std's atomics and locks.
    const FORBIDDEN: [&str; 4] = ["atomic", "Mutex", "RwLock", "Condvar"];

    /// Every `.rs` file under `dir`.
    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("the core's src is readable") {
            let p = e.expect("a directory entry").path();
            if p.is_dir() {
                sources(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    /// The std sync items `text` names: what follows each `std::sync::`,
    /// whether one path (`std::sync::Mutex`) or a group (`std::sync::{..}`).
    fn std_sync_names(text: &str) -> Vec<String> {
        let mut names = Vec::new();
        for (at, _) in text.match_indices("std::sync::") {
            let rest = &text[at + "std::sync::".len()..];
            let item = match rest.strip_prefix('{') {
                Some(group) => &group[..group.find('}').unwrap_or(group.len())],
                None => &rest[..rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len())],
            };
            names.extend(item.split(|c: char| !(c.is_alphanumeric() || c == '_')).map(str::to_owned));
        }
        names.retain(|n| !n.is_empty());
        names
    }

    #[test]
    fn the_finder_sees_paths_and_groups() {
        let names =
            std_sync_names("use std::sync::atomic::AtomicU8; use std::sync::{Arc, Mutex};\nx: std::sync::RwLock<()>");
        assert_eq!(names, ["atomic", "Arc", "Mutex", "RwLock"]);
        assert!(std_sync_names("use super::sync::{Mutex, OnceLock};").is_empty());
    }

    /// The architecture invariant: no file of the core but this one names
    /// std's atomics or locks, so loom sees every one the core uses.
    #[test]
    fn no_other_file_of_the_core_names_std_atomics_or_locks() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&src, &mut files);
        assert!(files.len() > 10, "found the core's sources: {files:?}");
        let shim = src.join("sync.rs");
        let mut offenders = Vec::new();
        for f in files.iter().filter(|f| **f != shim) {
            let text = std::fs::read_to_string(f).expect("a source file is readable");
            for name in std_sync_names(&text) {
                if FORBIDDEN.contains(&name.as_str()) {
                    offenders.push(format!("{} names std::sync::{name}", f.display()));
                }
            }
        }
        assert!(offenders.is_empty(), "take atomics and locks from src/sync.rs:\n{}", offenders.join("\n"));
    }
}
