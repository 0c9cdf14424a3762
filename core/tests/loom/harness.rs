//! The harness shared by the loom models ([`crate::pages`],
//! [`crate::eviction`]; built with `--cfg loom`, see docs/verification.md):
//! the model runner, the keys, and the set-up and audit helpers on a
//! [`PageTable`].

use hf3fs_meta_core::index::MAX_IDS;
use hf3fs_meta_core::key::KeyRef;
use hf3fs_meta_core::pages::{Counts, Owned, Owner, PageTable};

pub const KA: &str = "0123456789abcdef0123456789abcdef";
pub const KB: &str = "fedcba9876543210fedcba9876543210";

/// Runs `f` under loom with `bound` preemptions (unless `LOOM_MAX_PREEMPTIONS`
/// is set) and prints how many executions it took and how long.
pub fn model<F>(name: &str, bound: usize, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut b = loom::model::Builder::new();
    if std::env::var_os("LOOM_MAX_PREEMPTIONS").is_none() {
        b.preemption_bound = Some(bound);
    }
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = runs.clone();
    let start = std::time::Instant::now();
    b.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f();
    });
    eprintln!(
        "loom model {name}: preemption bound {:?}, {} executions, {:.2?}",
        b.preemption_bound,
        runs.load(std::sync::atomic::Ordering::Relaxed),
        start.elapsed()
    );
}

/// A model's key as its pages name it: a 32-hex digest, named by an id as
/// the key index would (derived from its first digits here), so that the
/// table's side map of keys (scc, not loom-aware) is never touched inside a
/// model.
pub fn key(s: &str) -> Owner<'static> {
    assert!(matches!(KeyRef::parse(s), KeyRef::Hex(_)), "models use hex keys only, so scc is never touched");
    let digits = u32::from_str_radix(&s[..7], 16).expect("hex");
    Owner::Id(digits % (MAX_IDS - 1) + 1)
}

/// [`key`], owned (what [`PageTable::owner`] answers).
#[allow(dead_code)] // loom_eviction compares owners with `key` only
pub fn owned(s: &str) -> Owned {
    match key(s) {
        Owner::Id(id) => Owned::Id(id),
        Owner::Key(_) => unreachable!("models name keys by id"),
    }
}

/// Puts FREE `page` into `state` (RESERVED, or BOUND to `owner`) during a
/// model's single-threaded set-up, without going through the search.
pub fn put(t: &PageTable, page: u32, state: u64, owner: Option<&str>) {
    assert!(t.claim_free(page), "set-up: page {page} must be FREE");
    if let Some(k) = owner {
        t.set_owner(page, key(k));
    }
    t.settle(page, state);
}

/// The table's audit; panics with its finding.
pub fn audit(t: &PageTable) -> Counts {
    t.audit().unwrap_or_else(|e| panic!("audit failed: {e}"))
}
