//! SGLang's page spaces under `--data-dir`.
//!
//! The spaces share one durable store of their own, in `<data-dir>/sglang`:
//! the same journal, writer, checkpoints and recovery as vLLM's store, in
//! which space number `id` is rank `id` (each space has one rank; see
//! `crate::core::spaces`). vLLM's `/clear` therefore never touches them, and
//! a space's `clear` journals the unbinding of its pages rather than a new
//! generation. Beside it, the catalog file `spaces` names each id: one line
//! `id rank num_pages namespace-as-hex` per space, appended and fsynced
//! before the space becomes visible. A last line cut short by a crash named a
//! space that was never acknowledged, and is ignored.
//!
//! At start-up the store is recovered as usual, then every space of the
//! catalog is rebuilt from the recovered rank of its id.

use super::{Durable, FsyncMode, OpenError};
use crate::core::{SpaceCatalog, SpaceName, Spaces, SpacesDurability, StoreConfig};
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The subdirectory of `--data-dir` that holds the spaces.
pub const SUBDIR: &str = "sglang";
const CATALOG: &str = "spaces";

/// One line of the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    id: u32,
    rank: u32,
    num_pages: u32,
    namespace: String,
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> =
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect();
    String::from_utf8(bytes?).ok()
}

fn parse(line: &str) -> Option<Entry> {
    let mut f = line.split(' ');
    let e = Entry {
        id: f.next()?.parse().ok()?,
        rank: f.next()?.parse().ok()?,
        num_pages: f.next()?.parse().ok()?,
        namespace: unhex(f.next()?)?,
    };
    f.next().is_none().then_some(e)
}

/// Reads the catalog: its entries, in id order. A malformed line other than
/// an unterminated last one is corruption.
fn read(path: &Path) -> Result<Vec<Entry>, OpenError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(OpenError::Io(format!("{}: {e}", path.display()))),
    };
    let complete = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        match parse(line) {
            Some(e) if e.id as usize == out.len() => out.push(e),
            _ if i + 1 == lines.len() && !complete => {
                tracing::warn!(path = %path.display(), "SGLang space catalog: ignoring a last line cut short");
            }
            _ => return Err(OpenError::Corrupt(format!("{} line {}: {line:?}", path.display(), i + 1))),
        }
    }
    Ok(out)
}

/// The catalog file, appended under a mutex.
struct Catalog {
    path: PathBuf,
    file: Mutex<File>,
}

impl SpaceCatalog for Catalog {
    fn created(&self, id: u32, rank: u32, namespace: &str, num_pages: u32) -> Result<(), String> {
        let mut f = self.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let line = format!("{id} {rank} {num_pages} {}\n", hex(namespace));
        f.write_all(line.as_bytes()).and_then(|()| f.sync_data()).map_err(|e| format!("{}: {e}", self.path.display()))
    }
}

/// Opens the spaces' durable store in `<dir>/sglang` and rebuilds every
/// space of its catalog into `spaces` (made by `make` with the durability to
/// journal through). Returns the durable store and the bindings restored.
pub fn open(
    dir: &Path,
    mode: FsyncMode,
    cfg: &StoreConfig,
    max_spaces: u32,
    make: impl FnOnce(SpacesDurability) -> Spaces,
) -> Result<(Spaces, Durable, u64), OpenError> {
    let sub = dir.join(SUBDIR);
    let shadow_cfg = StoreConfig { world_size: Some(1), max_ranks: max_spaces, ..cfg.clone() };
    let (shadow, durable, _) = Durable::open(&sub, mode, shadow_cfg)?;
    let path = sub.join(CATALOG);
    let entries = read(&path)?;
    let io = |e: std::io::Error| OpenError::Io(format!("{}: {e}", path.display()));
    let file = OpenOptions::new().create(true).append(true).open(&path).map_err(io)?;
    if let Ok(d) = File::open(&sub) {
        // The catalog's directory entry, once: a new file must survive a crash.
        let _ = d.sync_all();
    }
    let catalog = Arc::new(Catalog { path: path.clone(), file: Mutex::new(file) });
    let journal = shadow.journal().ok_or_else(|| OpenError::Io("the spaces' store has no journal".into()))?;
    let spaces = make(SpacesDurability { journal, generation: shadow.generation(), catalog });
    let mut bindings = 0u64;
    for e in &entries {
        let size = shadow.rank_size(e.id);
        let restored: Vec<_> = shadow.bindings_on(e.id).into_iter().map(|(p, k, _)| (p, k)).collect();
        bindings += restored.len() as u64;
        let name = SpaceName { rank: e.rank, namespace: e.namespace.as_str().into() };
        spaces
            .restore(e.id, name, size.unwrap_or(e.num_pages), size.is_some(), &restored)
            .map_err(|m| OpenError::Inconsistent(format!("SGLang space: {m}")))?;
    }
    if !entries.is_empty() {
        tracing::info!(spaces = entries.len(), bindings, "durable store: recovered {} SGLang spaces", entries.len());
    }
    Ok((spaces, durable, bindings))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_lines_round_trip_and_a_torn_tail_is_ignored() {
        let e = Entry { id: 3, rank: 7, num_pages: 0, namespace: "a b\n'ключ".into() };
        let line = format!("{} {} {} {}", e.id, e.rank, e.num_pages, hex(&e.namespace));
        assert_eq!(parse(&line), Some(e));
        assert_eq!(parse("1 2 3"), None);
        assert_eq!(parse("1 2 3 zz"), None);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("spaces");
        std::fs::write(&p, format!("0 0 8 {}\n1 0 8 {}\n2 1", hex("kv"), hex("mamba"))).unwrap();
        let got = read(&p).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].namespace, "mamba");
        std::fs::write(&p, format!("0 0 8 {}\nbad\n1 0 8 {}\n", hex("kv"), hex("x"))).unwrap();
        assert!(read(&p).is_err(), "a bad line in the middle is corruption");
    }
}
