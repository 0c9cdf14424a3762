//! Calls on a `Store` directly, for the tests that open stores without a
//! server (`tests/durable`), and what a data directory holds.

use hf3fs_meta::core::Store;
use hf3fs_meta::durable::Durable;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Allocates `keys` on `rank`: the page of each distinct key, in order of
/// first appearance (-1: refused).
pub fn alloc(s: &Store, rank: i64, keys: &[&str]) -> Vec<i64> {
    let mut out = Vec::new();
    s.allocate(rank, keys, &mut out).unwrap_or_else(|e| panic!("allocate on rank {rank}: {e}"));
    out.iter().map(|&(_, p)| p).collect()
}

/// Allocates `keys` on `rank` and confirms each on its page (a save); the
/// pages, as [`alloc`] gives them.
pub fn save<K: AsRef<str>>(s: &Store, rank: i64, keys: &[K]) -> Vec<i64> {
    let refs: Vec<&str> = keys.iter().map(AsRef::as_ref).collect();
    let mut out = Vec::new();
    s.allocate(rank, &refs, &mut out).unwrap_or_else(|e| panic!("allocate on rank {rank}: {e}"));
    let conf: Vec<(&str, i64)> = out.iter().map(|&(i, p)| (refs[i], p)).collect();
    s.confirm(rank, &conf, &[]).unwrap_or_else(|e| panic!("confirm on rank {rank}: {e}"));
    out.iter().map(|&(_, p)| p).collect()
}

/// Waits until every change so far is durable (30 s at most).
pub fn sync(d: &Durable) {
    d.sync_blocking(Duration::from_secs(30)).expect("durable");
}

/// Every file under `dir` with its bytes: what a read-only tool must leave
/// as it found it.
pub fn contents(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read_dir {}: {e}", d.display())) {
            let p = e.expect("a directory entry").path();
            if p.is_dir() {
                todo.push(p);
            } else {
                let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
                out.insert(p, bytes);
            }
        }
    }
    out
}
