//! The fuzz seeds, replayed on every `cargo test`: each file of
//! `fuzz/corpus/<target>/` (committed) and of `fuzz/artifacts/<target>/`
//! (where a fuzz run saves a crash; git-ignored, so only on the machine that
//! found it) goes through the oracles of that fuzz target, the very code of
//! `fuzz/oracles/src/<target>.rs` (the `hf3fs-meta-fuzz-oracles` crate). Exploration (libFuzzer
//! growing the corpus from these seeds) is `fuzz/run.sh`, run on demand
//! (docs/verification.md).

use hf3fs_meta_fuzz_oracles::{decode, fast, ops, router};

use std::any::Any;
use std::io::ErrorKind;
use std::panic::catch_unwind;
use std::path::{Path, PathBuf};

/// The files of `dir`, sorted by name; none when `dir` does not exist.
fn files(dir: &Path) -> Vec<PathBuf> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Vec::new(),
        Err(e) => panic!("{}: {e}", dir.display()),
    };
    let mut out: Vec<PathBuf> = entries
        .map(|e| e.unwrap_or_else(|e| panic!("{}: {e}", dir.display())).path())
        .filter(|p| p.is_file())
        .collect();
    out.sort();
    out
}

/// A panic's message (an oracle's assertion text).
fn message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("(a panic without a message)")
}

/// Runs `run` on every seed and saved artifact of `target`, each on its own
/// (a failure does not stop the others), then fails naming every input whose
/// oracle failed, with its message. A missing or empty seed directory fails:
/// the replay would otherwise pass while checking nothing.
fn replay(target: &str, run: fn(&[u8])) {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let seeds = files(&fuzz.join("corpus").join(target));
    assert!(!seeds.is_empty(), "no seed in fuzz/corpus/{target}/ (the committed corpus is gone)");
    let artifacts = files(&fuzz.join("artifacts").join(target));
    let mut failed = Vec::new();
    for path in seeds.iter().chain(&artifacts) {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if let Err(payload) = catch_unwind(|| run(&data)) {
            let name = path.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap_or(path).display().to_string();
            failed.push(format!("{name}: {}", message(&*payload)));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} inputs ({} seeds, {} artifacts) failed the `{target}` oracles; replay one with \
         `RUSTC_BOOTSTRAP=1 cargo fuzz run -O {target} <file>`:\n{}",
        failed.len(),
        seeds.len() + artifacts.len(),
        seeds.len(),
        artifacts.len(),
        failed.join("\n")
    );
}

#[test]
fn every_committed_fuzz_seed_passes_the_oracles_of_decode() {
    replay("decode", decode::run);
}

#[test]
fn every_committed_fuzz_seed_passes_the_oracles_of_fast() {
    replay("fast", fast::run);
}

#[test]
fn every_committed_fuzz_seed_passes_the_oracles_of_ops() {
    replay("ops", ops::run);
}

#[test]
fn every_committed_fuzz_seed_passes_the_oracles_of_router() {
    replay("router", router::run);
}
