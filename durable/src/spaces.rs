//! SGLang's page spaces under `--data-dir`.
//!
//! The spaces share one durable store of their own, in `<data-dir>/sglang`:
//! the same journal, writer, checkpoints, health and recovery as vLLM's
//! store, in which space number `id` is rank `id` (each space has one rank;
//! see `crate::core::spaces`). It is apart from vLLM's store so that neither
//! dialect's `clear` touches the other's state: vLLM's `/clear` starts a new
//! generation of vLLM's store, and an SGLang space's `clear` unbinds its
//! keys one by one in the spaces' store, which keeps one generation for
//! good.
//!
//! Beside the store, the catalog file `spaces` names each id: one line
//! `id rank num_pages namespace-as-hex` per space, appended and fsynced
//! before the space is journaled or visible. A last line cut short by a
//! crash named a space that was never acknowledged, and is ignored; a failed
//! append is cut back off the file at once.
//!
//! At start-up the store is recovered as usual into a store of
//! `--max-spaces` ranks, every space of the catalog is rebuilt from the
//! recovered rank of its id, and from then on the durable layer reads the
//! spaces back through [`crate::core::SpaceSource`].

use super::{Durable, FsyncMode, OpenError, Options, Recovered};
use crate::core::{Clock, PageSource, SpaceCatalog, SpaceName, Spaces, SpacesConfig, SpacesDurability, StoreConfig};
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// The subdirectory of `--data-dir` that holds the spaces.
pub const SUBDIR: &str = "sglang";
const CATALOG: &str = "spaces";

/// One line of the catalog: what names space `id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogEntry {
    /// The space's number (its rank in the spaces' durable store).
    pub id: u32,
    /// SGLang's rank.
    pub rank: u32,
    /// The size it was created with.
    pub num_pages: u32,
    /// SGLang's namespace.
    pub namespace: String,
}

/// The catalog of the data directory `dir` (its `sglang/spaces`), in id
/// order, without a torn last line; empty when there is none. Read only
/// (`hf3fs-meta inspect` names the spaces by it).
pub fn catalog(dir: &Path) -> Result<Vec<CatalogEntry>, OpenError> {
    read(&dir.join(SUBDIR).join(CATALOG))
}

fn hex(s: &str) -> String {
    let mut out = String::with_capacity(2 * s.len());
    for b in s.bytes() {
        out.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        out.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
    }
    out
}

fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> =
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect();
    String::from_utf8(bytes?).ok()
}

fn parse(line: &str) -> Option<CatalogEntry> {
    let mut f = line.split(' ');
    let e = CatalogEntry {
        id: f.next()?.parse().ok()?,
        rank: f.next()?.parse().ok()?,
        num_pages: f.next()?.parse().ok()?,
        namespace: unhex(f.next()?)?,
    };
    f.next().is_none().then_some(e)
}

/// Reads the catalog: its entries, in id order. A malformed line other than
/// an unterminated last one is corruption.
fn read(path: &Path) -> Result<Vec<CatalogEntry>, OpenError> {
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

/// Who hears of each space the catalog records, in the order recorded: a
/// leader's replication of the spaces (the HA crate's `replicate`), which must
/// send a space's name before the records that use it. Called under the
/// catalog's mutex, after the line is durable: must only queue.
pub type Tap = Box<dyn Fn(&CatalogEntry) + Send + Sync>;

/// The catalog file, appended under a mutex, with its entries.
pub struct Catalog {
    path: PathBuf,
    /// The file and the entries it holds, in id order.
    file: Mutex<(File, Vec<CatalogEntry>)>,
    tap: std::sync::OnceLock<Tap>,
}

impl Catalog {
    /// Opens `path` for appending, without the torn last line a crash may
    /// have left (so that the next line starts on a line of its own).
    fn open(path: PathBuf, entries: &[CatalogEntry]) -> Result<Self, OpenError> {
        let io = |e: std::io::Error| OpenError::Io(format!("{}: {e}", path.display()));
        let file = OpenOptions::new().create(true).read(true).write(true).truncate(false).open(&path).map_err(io)?;
        let whole: u64 = entries.iter().map(|e| line(e).len() as u64).sum();
        file.set_len(whole).map_err(io)?;
        file.sync_all().map_err(io)?;
        if let Some(dir) = path.parent() {
            // The catalog's directory entry: a new file must survive a crash.
            File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
        }
        let mut file = file;
        std::io::Seek::seek(&mut file, std::io::SeekFrom::End(0)).map_err(io)?;
        Ok(Self { path, file: Mutex::new((file, entries.to_vec())), tap: std::sync::OnceLock::new() })
    }

    /// Every space recorded so far, in id order.
    pub fn entries(&self) -> Vec<CatalogEntry> {
        self.file.lock().unwrap_or_else(PoisonError::into_inner).1.clone()
    }

    /// From now on, `tap` hears of every space recorded (once only; a second
    /// call is refused, `false`).
    pub fn attach(&self, tap: Tap) -> bool {
        self.tap.set(tap).is_ok()
    }
}

fn line(e: &CatalogEntry) -> String {
    format!("{} {} {} {}\n", e.id, e.rank, e.num_pages, hex(&e.namespace))
}

impl SpaceCatalog for Catalog {
    fn created(&self, id: u32, rank: u32, namespace: &str, num_pages: u32) -> Result<(), String> {
        let mut guard = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        let (f, entries) = &mut *guard;
        let entry = CatalogEntry { id, rank, num_pages, namespace: namespace.into() };
        let text = line(&entry);
        let at = std::io::Seek::stream_position(f).map_err(|e| format!("{}: {e}", self.path.display()))?;
        let written = f.write_all(text.as_bytes()).and_then(|()| f.sync_data());
        written.map_err(|e| {
            // Cut a partial line back off, so the next one starts clean.
            let _ = f.set_len(at).and_then(|()| std::io::Seek::seek(f, std::io::SeekFrom::Start(at)).map(drop));
            format!("{}: {e}", self.path.display())
        })?;
        if let Some(tap) = self.tap.get() {
            tap(&entry);
        }
        entries.push(entry);
        Ok(())
    }

    fn reset(&self) -> Result<(), String> {
        let mut guard = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        let (f, entries) = &mut *guard;
        let emptied = f.set_len(0).and_then(|()| f.sync_data()).and_then(|()| {
            std::io::Seek::seek(f, std::io::SeekFrom::Start(0))?;
            Ok(())
        });
        emptied.map_err(|e| format!("{}: {e}", self.path.display()))?;
        entries.clear();
        Ok(())
    }
}

/// Opens the spaces' durable store in `<dir>/sglang` and rebuilds every
/// space of its catalog. Returns the spaces (configured by `cfg`, timed by
/// `clock`), the durable store and what it recovered.
pub fn open(
    dir: &Path,
    mode: FsyncMode,
    cfg: SpacesConfig,
    clock: Arc<Clock>,
    opts: Options,
) -> Result<(Spaces, Durable, Recovered), OpenError> {
    open_with_catalog(dir, mode, cfg, clock, opts).map(|(spaces, _, durable, recovered)| (spaces, durable, recovered))
}

/// The spaces, their catalog, the durable store and what it recovered, as
/// [`open_with_catalog`] returns them.
pub type Opened = (Spaces, Arc<Catalog>, Durable, Recovered);

/// [`open`], with the catalog (the server's: replication sends it).
pub fn open_with_catalog(
    dir: &Path,
    mode: FsyncMode,
    cfg: SpacesConfig,
    clock: Arc<Clock>,
    opts: Options,
) -> Result<Opened, OpenError> {
    let sub = dir.join(SUBDIR);
    std::fs::create_dir_all(&sub).map_err(|e| OpenError::Io(format!("{}: {e}", sub.display())))?;
    // The subdirectory's name must survive a power cut (POSIX: its parent's fsync).
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| OpenError::Io(format!("fsync of {}: {e}", dir.display())))?;
    // The recovered state: space `id` is rank `id`, each key of world 1.
    let recovered_cfg = StoreConfig { world_size: Some(1), max_ranks: cfg.max_spaces.max(1), ..cfg.store.clone() };
    let path = sub.join(CATALOG);
    let max_spaces = cfg.max_spaces;
    let opened =
        Durable::open_source(&sub, Options { fsync: mode, store: recovered_cfg, ..opts }, move |recovered, journal| {
            let entries = read(&path)?;
            let catalog = Arc::new(Catalog::open(path, &entries)?);
            let durability = SpacesDurability { journal, generation: recovered.generation(), catalog: catalog.clone() };
            let spaces = Spaces::durable(cfg, clock, durability);
            for e in &entries {
                let size = recovered.rank_size(e.id);
                let mut bindings = Vec::new();
                recovered
                    .read_pages(recovered.generation(), e.id, 0..u32::MAX, |page, read| bindings.push((page, read)))
                    .map_err(|m| OpenError::Inconsistent(format!("SGLang space {}: {m:?}", e.id)))?;
                let name = SpaceName { rank: e.rank, namespace: e.namespace.as_str().into() };
                spaces
                    .restore(e.id, name, size.unwrap_or(e.num_pages), size.is_some(), &bindings)
                    .map_err(|m| OpenError::Inconsistent(format!("SGLang {m}")))?;
            }
            if !entries.is_empty() {
                tracing::info!(spaces = entries.len(), "durable store: rebuilt {} SGLang spaces", entries.len());
            }
            let source = spaces.source().ok_or_else(|| OpenError::Inconsistent("the spaces are not durable".into()))?;
            Ok((source as Arc<dyn PageSource>, (spaces, catalog)))
        });
    // Its ranks are space ids, bounded by --max-spaces, not --max-ranks.
    opened.map(|((spaces, catalog), durable, recovered)| (spaces, catalog, durable, recovered)).map_err(|e| match e {
        OpenError::Restore(m) => {
            OpenError::Restore(format!("SGLang spaces (space id = rank, at most --max-spaces {max_spaces}): {m}"))
        }
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_lines_round_trip_and_a_torn_tail_is_ignored() {
        let e = CatalogEntry { id: 3, rank: 7, num_pages: 0, namespace: "a b\n'ключ".into() };
        assert_eq!(parse(line(&e).trim_end()), Some(e));
        assert_eq!(parse("1 2 3"), None);
        assert_eq!(parse("1 2 3 zz"), None);
        assert_eq!(parse("1 2 3 6b76 extra"), None);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("spaces");
        std::fs::write(&p, format!("0 0 8 {}\n1 0 8 {}\n2 1", hex("kv"), hex("mamba"))).unwrap();
        let got = read(&p).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].namespace, "mamba");
        // Reopened, the torn line is cut off and the next append is whole.
        let c = Catalog::open(p.clone(), &got).unwrap();
        c.created(2, 1, "kv", 4).unwrap();
        let got = read(&p).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!((got[2].rank, got[2].num_pages, got[2].namespace.as_str()), (1, 4, "kv"));
        std::fs::write(&p, format!("0 0 8 {}\nbad\n1 0 8 {}\n", hex("kv"), hex("x"))).unwrap();
        assert!(read(&p).is_err(), "a bad line in the middle is corruption");
        std::fs::write(&p, format!("1 0 8 {}\n", hex("kv"))).unwrap();
        assert!(read(&p).is_err(), "ids start at 0 and follow each other");
    }

    #[test]
    fn the_catalog_keeps_its_entries_taps_each_new_one_and_resets_durably() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("spaces");
        let c = Catalog::open(p.clone(), &[]).unwrap();
        c.created(0, 0, "kv", 8).unwrap();
        let heard = Arc::new(Mutex::new(Vec::new()));
        let h = heard.clone();
        assert!(c.attach(Box::new(move |e: &CatalogEntry| h.lock().unwrap().push(e.id))));
        assert!(!c.attach(Box::new(|_: &CatalogEntry| ())), "one tap");
        c.created(1, 3, "mamba", 4).unwrap();
        assert_eq!(*heard.lock().unwrap(), [1], "only what is recorded after the tap");
        assert_eq!(c.entries(), read(&p).unwrap());
        assert_eq!(c.entries().len(), 2);
        // A standby's reset: the file is empty, and the next line is id 0.
        c.reset().unwrap();
        assert!(c.entries().is_empty());
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "");
        c.created(0, 7, "x", 2).unwrap();
        let got = read(&p).unwrap();
        assert_eq!(got, c.entries());
        assert_eq!((got.len(), got[0].rank, got[0].namespace.as_str()), (1, 7, "x"));
    }
}
