//! The file system's state, apart from FUSE: what every process sees now
//! (`live`), what a power cut would keep (`durable`), and the changes in
//! between (`pending`, per inode, in the order they were made).
//!
//! The rules (POSIX's, strictly; [`Names::Journal`] adds ext4's):
//!
//! - A write, a truncation, a creation, a rename or an unlink is visible at
//!   once to every reader ([`Model::read`], [`Model::lookup`]).
//! - `fsync`/`fdatasync` of a file persists its data and its size: every
//!   pending change of that inode is applied to its durable content. It
//!   does not persist the file's *name*: POSIX (`fsync(2)`: "it does not
//!   necessarily ensure that the entry in the directory containing the file
//!   has also reached disk; for that an explicit fsync() on a file
//!   descriptor for the directory is also needed").
//! - `fsync` of a directory persists its entries: the creations, renames
//!   and unlinks of names in it. A file whose name is persisted but whose
//!   data is not comes back empty (or with the data last synced).
//! - A rename within one directory is one change of that directory (after
//!   a cut: the old name or the new one, never both, never neither). A
//!   rename across directories is an unlink in one and a link in the other,
//!   each persisted by its own directory's fsync.
//! - [`Names::Journal`] models ext4's journal (`data=ordered`): metadata
//!   changes go into one running transaction that any fsync commits, so an
//!   fsync of any file or directory also persists every pending name
//!   change of every directory (a new file's name included). The strict
//!   model ([`Names::Strict`], the default) is what the tests hold the
//!   durable layer to: code correct under it is correct on any POSIX file
//!   system.
//!
//! A power cut ([`Model::crash_image`] with [`Model::cut`]) keeps the
//! durable content of every inode reachable from the root through durable
//! entries, plus whatever a [`Choice`] says of the pending changes: none
//! (everything not synced is gone), a prefix of each inode's, the last of
//! them a write torn at a sector boundary.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::path::Path;

/// An inode number (1 is the root).
pub type Ino = u64;

/// The root directory's inode.
pub const ROOT: Ino = 1;

/// What an inode holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Content {
    /// A regular file's bytes.
    File(Vec<u8>),
    /// A directory's entries.
    Dir(BTreeMap<OsString, Ino>),
}

impl Content {
    fn is_dir(&self) -> bool {
        matches!(self, Content::Dir(_))
    }
}

/// One change of an inode not yet persisted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FsChange {
    /// A file's bytes at an offset.
    Write {
        /// Where.
        off: u64,
        /// What.
        data: Vec<u8>,
    },
    /// A file's new length (truncation or extension with zeros).
    SetLen(u64),
    /// A name in a directory now names `ino` (replacing what it named).
    Link {
        /// The name.
        name: OsString,
        /// The inode.
        ino: Ino,
    },
    /// A name removed from a directory.
    Unlink(OsString),
    /// A rename within one directory: `from` now named `to` (which it replaces).
    Move {
        /// The old name.
        from: OsString,
        /// The new name.
        to: OsString,
    },
}

impl FsChange {
    fn apply(&self, c: &mut Content) {
        match (self, c) {
            (FsChange::Write { off, data }, Content::File(bytes)) => {
                let end = *off as usize + data.len();
                if bytes.len() < end {
                    bytes.resize(end, 0);
                }
                bytes[*off as usize..end].copy_from_slice(data);
            }
            (FsChange::SetLen(len), Content::File(bytes)) => bytes.resize(*len as usize, 0),
            (FsChange::Link { name, ino }, Content::Dir(e)) => {
                e.insert(name.clone(), *ino);
            }
            (FsChange::Unlink(name), Content::Dir(e)) => {
                e.remove(name);
            }
            (FsChange::Move { from, to }, Content::Dir(e)) => {
                if let Some(ino) = e.remove(from) {
                    e.insert(to.clone(), ino);
                }
            }
            // A change is only ever recorded for an inode of its kind.
            _ => {}
        }
    }
}

/// How directory entries become durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Names {
    /// POSIX: only an fsync of the directory persists its entries.
    #[default]
    Strict,
    /// ext4 (`data=ordered`): any fsync commits every pending name change.
    Journal,
}

/// One operation as the file system received it: the record a run leaves
/// for the crash-state explorer, which replays it through a fresh model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FsOp {
    /// A file or directory made.
    Make {
        /// The directory.
        parent: Ino,
        /// Its name there.
        name: OsString,
        /// A directory (`true`) or a regular file.
        dir: bool,
    },
    /// Bytes written.
    Write {
        /// The file.
        ino: Ino,
        /// Where.
        off: u64,
        /// What.
        data: Vec<u8>,
    },
    /// A file's length set.
    SetLen {
        /// The file.
        ino: Ino,
        /// The length.
        len: u64,
    },
    /// A rename.
    Rename {
        /// The old directory.
        parent: Ino,
        /// The old name.
        name: OsString,
        /// The new directory.
        newparent: Ino,
        /// The new name.
        newname: OsString,
    },
    /// An unlink or rmdir.
    Remove {
        /// The directory.
        parent: Ino,
        /// The name.
        name: OsString,
    },
    /// An fsync or fdatasync of a file, or an fsync of a directory.
    Sync {
        /// The inode.
        ino: Ino,
    },
}

/// An error of the file system, as an errno.
pub type Errno = i32;

/// What a crash keeps of one inode's pending changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keep {
    /// How many of the pending changes, in order (0: none).
    pub changes: usize,
    /// If the last change kept is a write: only its first `n` bytes (a
    /// torn write; `n` a sector boundary inside it).
    pub torn: Option<usize>,
}

impl Keep {
    /// Nothing of the pending changes.
    pub const NONE: Keep = Keep { changes: 0, torn: None };
}

/// Says, for each inode with pending changes, what a crash keeps of them.
pub type Choice<'a> = &'a dyn Fn(Ino, &[FsChange]) -> Keep;

struct Inode {
    live: Content,
    durable: Content,
    /// [`used_len`] of `durable` (0 for a directory): kept, so that writing
    /// an image does not scan a preallocated file's zeros every time.
    durable_used: usize,
    pending: Vec<FsChange>,
    perm: u16,
}

/// A persisted image: the inodes reachable from the root after a crash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    nodes: BTreeMap<Ino, Content>,
}

impl Image {
    /// A digest of the whole image (paths, lengths, bytes), cheap for
    /// large preallocated files: their trailing zeros count by length.
    pub fn digest(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for (path, c) in self.paths() {
            path.hash(&mut h);
            if let Some(b) = c {
                (b.len(), &b[..used_len(b)]).hash(&mut h);
            }
        }
        h.finish()
    }

    fn paths(&self) -> Vec<(String, Option<&Vec<u8>>)> {
        let mut out = Vec::new();
        let mut stack = vec![(ROOT, String::new())];
        while let Some((ino, path)) = stack.pop() {
            if let Some(Content::Dir(e)) = self.nodes.get(&ino) {
                for (name, child) in e {
                    let p = format!("{path}/{}", name.to_string_lossy());
                    match self.nodes.get(child) {
                        Some(Content::File(b)) => out.push((p, Some(b))),
                        Some(Content::Dir(_)) => {
                            out.push((p.clone(), None));
                            stack.push((*child, p));
                        }
                        None => {}
                    }
                }
            }
        }
        out.sort();
        out
    }

    /// Every regular file, by its path from the root, with its bytes (a
    /// directory maps to `None`). For tests and comparisons.
    pub fn files(&self) -> BTreeMap<String, Option<Vec<u8>>> {
        self.paths().into_iter().map(|(p, c)| (p, c.cloned())).collect()
    }

    /// Writes the image under `dir` (which must exist and be empty), files
    /// synced, so that the real code can open it.
    pub fn write_to(&self, dir: &Path) -> std::io::Result<()> {
        let mut stack = vec![(ROOT, dir.to_path_buf())];
        while let Some((ino, path)) = stack.pop() {
            if let Some(Content::Dir(e)) = self.nodes.get(&ino) {
                for (name, child) in e {
                    let p = path.join(name);
                    match self.nodes.get(child) {
                        Some(Content::File(b)) => {
                            // Trailing zeros as a hole: a preallocated 32 MiB
                            // journal costs what it holds, not its length.
                            let f = std::fs::File::create(&p)?;
                            std::io::Write::write_all(&mut &f, &b[..used_len(b)])?;
                            f.set_len(b.len() as u64)?;
                        }
                        Some(Content::Dir(_)) => {
                            std::fs::create_dir(&p)?;
                            stack.push((*child, p));
                        }
                        None => {}
                    }
                }
            }
        }
        Ok(())
    }
}

/// The whole file system's state.
pub struct Model {
    nodes: HashMap<Ino, Inode>,
    next: Ino,
    names: Names,
    log: Option<Vec<FsOp>>,
}

impl Model {
    /// An empty file system (a root directory, persisted), recording its
    /// operations if `record`.
    pub fn new(names: Names, record: bool) -> Self {
        let mut nodes = HashMap::new();
        let root = Content::Dir(BTreeMap::new());
        nodes.insert(
            ROOT,
            Inode { live: root.clone(), durable: root, durable_used: 0, pending: Vec::new(), perm: 0o755 },
        );
        Self { nodes, next: ROOT + 1, names, log: record.then(Vec::new) }
    }

    /// A file system holding the tree under `dir`, all of it persisted (a
    /// restart on a persisted image written out by [`Image::write_to`]).
    pub fn load(dir: &Path, names: Names, record: bool) -> std::io::Result<Self> {
        let mut m = Self::new(names, record);
        let mut stack = vec![(ROOT, dir.to_path_buf())];
        while let Some((parent, path)) = stack.pop() {
            for entry in std::fs::read_dir(&path)? {
                let entry = entry?;
                let ino = m.next;
                m.next += 1;
                let content = if entry.file_type()?.is_dir() {
                    stack.push((ino, entry.path()));
                    Content::Dir(BTreeMap::new())
                } else {
                    Content::File(std::fs::read(entry.path())?)
                };
                let perm = if content.is_dir() { 0o755 } else { 0o644 };
                m.nodes.insert(
                    ino,
                    Inode {
                        live: content.clone(),
                        durable_used: content_used(&content),
                        durable: content,
                        pending: Vec::new(),
                        perm,
                    },
                );
                let p = m.nodes.get_mut(&parent).expect("parent");
                let link = FsChange::Link { name: entry.file_name(), ino };
                link.apply(&mut p.live);
                link.apply(&mut p.durable);
            }
        }
        Ok(m)
    }

    /// The operations recorded so far (empty when not recording).
    pub fn log(&self) -> &[FsOp] {
        self.log.as_deref().unwrap_or(&[])
    }

    /// How many operations were recorded so far: a position in the log.
    pub fn log_len(&self) -> usize {
        self.log().len()
    }

    fn record(&mut self, op: FsOp) {
        if let Some(log) = &mut self.log {
            log.push(op);
        }
    }

    fn change(&mut self, ino: Ino, c: FsChange) {
        let node = self.nodes.get_mut(&ino).expect("a live inode");
        c.apply(&mut node.live);
        node.pending.push(c);
    }

    /// What `ino` holds now.
    pub fn content(&self, ino: Ino) -> Option<&Content> {
        self.nodes.get(&ino).map(|n| &n.live)
    }

    /// `ino`'s permission bits.
    pub fn perm(&self, ino: Ino) -> u16 {
        self.nodes.get(&ino).map_or(0, |n| n.perm)
    }

    /// The inode `name` names in `parent` now.
    pub fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Ino, Errno> {
        match self.content(parent) {
            Some(Content::Dir(e)) => e.get(name).copied().ok_or(libc::ENOENT),
            Some(Content::File(_)) => Err(libc::ENOTDIR),
            None => Err(libc::ENOENT),
        }
    }

    /// Makes a file or directory `name` in `parent`.
    pub fn make(&mut self, parent: Ino, name: &OsStr, dir: bool, perm: u16) -> Result<Ino, Errno> {
        match self.lookup(parent, name) {
            Ok(_) => return Err(libc::EEXIST),
            Err(libc::ENOENT) if self.content(parent).is_some() => {}
            Err(e) => return Err(e),
        }
        self.record(FsOp::Make { parent, name: name.to_owned(), dir });
        let ino = self.next;
        self.next += 1;
        let content = if dir { Content::Dir(BTreeMap::new()) } else { Content::File(Vec::new()) };
        self.nodes
            .insert(ino, Inode { live: content.clone(), durable: content, durable_used: 0, pending: Vec::new(), perm });
        self.change(parent, FsChange::Link { name: name.to_owned(), ino });
        Ok(ino)
    }

    fn file(&self, ino: Ino) -> Result<&Vec<u8>, Errno> {
        match self.content(ino) {
            Some(Content::File(b)) => Ok(b),
            Some(Content::Dir(_)) => Err(libc::EISDIR),
            None => Err(libc::ENOENT),
        }
    }

    /// Writes `data` at `off` of file `ino`.
    pub fn write(&mut self, ino: Ino, off: u64, data: &[u8]) -> Result<(), Errno> {
        self.file(ino)?;
        if data.is_empty() {
            return Ok(());
        }
        self.record(FsOp::Write { ino, off, data: data.to_vec() });
        self.change(ino, FsChange::Write { off, data: data.to_vec() });
        Ok(())
    }

    /// Sets the length of file `ino`.
    pub fn set_len(&mut self, ino: Ino, len: u64) -> Result<(), Errno> {
        if self.file(ino)?.len() as u64 == len {
            return Ok(());
        }
        self.record(FsOp::SetLen { ino, len });
        self.change(ino, FsChange::SetLen(len));
        Ok(())
    }

    /// Up to `size` bytes of file `ino` from `off`.
    pub fn read(&self, ino: Ino, off: u64, size: usize) -> Result<&[u8], Errno> {
        let b = self.file(ino)?;
        let start = (off as usize).min(b.len());
        Ok(&b[start..(start + size).min(b.len())])
    }

    /// Renames `parent/name` to `newparent/newname` (replacing it, unless
    /// `noreplace`).
    pub fn rename(
        &mut self,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
        newname: &OsStr,
        noreplace: bool,
    ) -> Result<(), Errno> {
        let ino = self.lookup(parent, name)?;
        match self.lookup(newparent, newname) {
            Ok(_) if noreplace => return Err(libc::EEXIST),
            Ok(old) if old == ino => return Ok(()),
            Ok(old) => {
                let (a, b) = (self.nodes[&ino].live.is_dir(), self.nodes[&old].live.is_dir());
                match (a, b) {
                    (false, true) => return Err(libc::EISDIR),
                    (true, false) => return Err(libc::ENOTDIR),
                    (true, true) if matches!(&self.nodes[&old].live, Content::Dir(e) if !e.is_empty()) => {
                        return Err(libc::ENOTEMPTY)
                    }
                    _ => {}
                }
            }
            Err(libc::ENOENT) if self.content(newparent).is_some_and(Content::is_dir) => {}
            Err(e) => return Err(e),
        }
        self.record(FsOp::Rename { parent, name: name.to_owned(), newparent, newname: newname.to_owned() });
        if parent == newparent {
            self.change(parent, FsChange::Move { from: name.to_owned(), to: newname.to_owned() });
        } else {
            self.change(newparent, FsChange::Link { name: newname.to_owned(), ino });
            self.change(parent, FsChange::Unlink(name.to_owned()));
        }
        Ok(())
    }

    /// Removes `name` from `parent` (`dir`: rmdir, which needs it empty).
    pub fn remove(&mut self, parent: Ino, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let ino = self.lookup(parent, name)?;
        match (&self.nodes[&ino].live, dir) {
            (Content::Dir(_), false) => return Err(libc::EISDIR),
            (Content::File(_), true) => return Err(libc::ENOTDIR),
            (Content::Dir(e), true) if !e.is_empty() => return Err(libc::ENOTEMPTY),
            _ => {}
        }
        self.record(FsOp::Remove { parent, name: name.to_owned() });
        self.change(parent, FsChange::Unlink(name.to_owned()));
        Ok(())
    }

    /// fsync, fdatasync or a directory's fsync of `ino`: its pending
    /// changes become durable (with [`Names::Journal`], every directory's too).
    pub fn sync(&mut self, ino: Ino) -> Result<(), Errno> {
        if !self.nodes.contains_key(&ino) {
            return Err(libc::ENOENT);
        }
        self.record(FsOp::Sync { ino });
        let mut which = vec![ino];
        if self.names == Names::Journal {
            which.extend(self.nodes.iter().filter(|(_, n)| n.live.is_dir()).map(|(i, _)| *i));
        }
        for i in which {
            let node = self.nodes.get_mut(&i).expect("checked");
            if node.pending.is_empty() {
                continue;
            }
            for c in std::mem::take(&mut node.pending) {
                c.apply(&mut node.durable);
            }
            node.durable_used = content_used(&node.durable);
        }
        Ok(())
    }

    /// Every inode with pending changes, with them, in inode order.
    pub fn pending(&self) -> Vec<(Ino, &[FsChange])> {
        let mut out: Vec<_> =
            self.nodes.iter().filter(|(_, n)| !n.pending.is_empty()).map(|(i, n)| (*i, &n.pending[..])).collect();
        out.sort_by_key(|(i, _)| *i);
        out
    }

    /// What a crash now would leave, with `choice` saying what it keeps of
    /// each inode's pending changes.
    pub fn crash_image(&self, choice: Choice<'_>) -> Image {
        let mut nodes = BTreeMap::new();
        let mut stack = vec![ROOT];
        let mut seen = HashSet::new();
        while let Some(ino) = stack.pop() {
            if !seen.insert(ino) {
                continue;
            }
            let Some(node) = self.nodes.get(&ino) else { continue };
            let c = if node.pending.is_empty() {
                node.durable.clone()
            } else {
                Self::keep(node, choice(ino, &node.pending))
            };
            if let Content::Dir(e) = &c {
                stack.extend(e.values().copied());
            }
            nodes.insert(ino, c);
        }
        Image { nodes }
    }

    /// Writes into `dir` what a crash now would leave, as
    /// `crash_image(choice).write_to(dir)` does, without copying any file's
    /// bytes in memory: each file gets its durable bytes (trailing zeros as
    /// a hole) and then the kept part of its pending changes written over
    /// them, in their order. The crash-state explorer's materialization
    /// (a preallocated journal is not cloned for every state).
    pub fn write_crash_image(&self, choice: Choice<'_>, dir: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let entries = |ino: Ino| -> Option<BTreeMap<OsString, Ino>> {
            let node = self.nodes.get(&ino)?;
            let kept;
            let c = if node.pending.is_empty() {
                &node.durable
            } else {
                kept = Self::keep(node, choice(ino, &node.pending));
                &kept
            };
            match c {
                Content::Dir(e) => Some(e.clone()),
                Content::File(_) => None,
            }
        };
        let mut stack = vec![(ROOT, dir.to_path_buf())];
        while let Some((ino, path)) = stack.pop() {
            let Some(e) = entries(ino) else { continue };
            for (name, child) in e {
                let p = path.join(&name);
                let Some(node) = self.nodes.get(&child) else { continue };
                match &node.durable {
                    Content::File(b) => {
                        let f = std::fs::File::create(&p)?;
                        f.write_all_at(&b[..node.durable_used], 0)?;
                        f.set_len(b.len() as u64)?;
                        if node.pending.is_empty() {
                            continue;
                        }
                        let keep = choice(child, &node.pending);
                        let n = keep.changes.min(node.pending.len());
                        for (i, ch) in node.pending[..n].iter().enumerate() {
                            match ch {
                                FsChange::Write { off, data } => {
                                    let data = match keep.torn {
                                        Some(t) if i + 1 == n => &data[..t.min(data.len())],
                                        _ => &data[..],
                                    };
                                    f.write_all_at(data, *off)?;
                                }
                                FsChange::SetLen(len) => f.set_len(*len)?,
                                _ => {}
                            }
                        }
                    }
                    Content::Dir(_) => {
                        std::fs::create_dir(&p)?;
                        stack.push((child, p));
                    }
                }
            }
        }
        Ok(())
    }

    /// What a crash keeps of one inode: its durable content with `keep` of
    /// its pending changes applied.
    fn keep(node: &Inode, keep: Keep) -> Content {
        let mut c = node.durable.clone();
        let n = keep.changes.min(node.pending.len());
        for (i, ch) in node.pending[..n].iter().enumerate() {
            match (ch, keep.torn) {
                (FsChange::Write { off, data }, Some(t)) if i + 1 == n => {
                    FsChange::Write { off: *off, data: data[..t.min(data.len())].to_vec() }.apply(&mut c)
                }
                _ => ch.apply(&mut c),
            }
        }
        c
    }

    /// What a crash that keeps `keep` of `ino`'s pending changes leaves
    /// of `ino` (its durable content when it has none): the crash-state
    /// explorer's per-inode piece of [`Model::crash_image`].
    pub fn kept(&self, ino: Ino, keep: Keep) -> Option<Content> {
        self.nodes.get(&ino).map(|n| if n.pending.is_empty() { n.durable.clone() } else { Self::keep(n, keep) })
    }

    /// What `ino` holds on disk now (as of its last fsync).
    pub fn durable(&self, ino: Ino) -> Option<&Content> {
        self.nodes.get(&ino).map(|n| &n.durable)
    }

    /// Every crash state POSIX allows of one inode's pending changes, in
    /// the model's terms: any prefix of them (none to all, in the order
    /// they were made), and each prefix whose last change is a write also
    /// with that write torn at every `sector` boundary inside it.
    pub fn every_keep(pending: &[FsChange], sector: u64) -> Vec<Keep> {
        let mut out = vec![Keep::NONE];
        for (i, ch) in pending.iter().enumerate() {
            if let FsChange::Write { off, data } = ch {
                out.extend(tears(*off, data.len(), sector).into_iter().map(|t| Keep { changes: i + 1, torn: Some(t) }));
            }
            out.push(Keep { changes: i + 1, torn: None });
        }
        out
    }

    /// The state now, as a crash that kept everything would leave it
    /// (what the processes see).
    pub fn live_image(&self) -> Image {
        self.crash_image(&|_, p| Keep { changes: p.len(), torn: None })
    }

    /// Cuts the power: from now on the file system holds `image` (one of
    /// [`Model::crash_image`]'s), all of it persisted, and nothing else.
    pub fn cut(&mut self, image: Image) {
        let perms: HashMap<Ino, u16> = self.nodes.iter().map(|(i, n)| (*i, n.perm)).collect();
        self.nodes = image
            .nodes
            .into_iter()
            .map(|(ino, c)| {
                let perm = perms.get(&ino).copied().unwrap_or(0o644);
                (ino, Inode { live: c.clone(), durable_used: content_used(&c), durable: c, pending: Vec::new(), perm })
            })
            .collect();
    }

    /// Drops inodes that no name reaches, live or durable (unlinked files
    /// whose unlink is persisted). `open` are inodes some process still
    /// has open; they stay.
    pub fn collect(&mut self, open: &HashSet<Ino>) {
        let mut reach: HashSet<Ino> = HashSet::new();
        let mut stack: Vec<Ino> = open.iter().copied().chain([ROOT]).collect();
        while let Some(ino) = stack.pop() {
            if !reach.insert(ino) {
                continue;
            }
            let Some(n) = self.nodes.get(&ino) else { continue };
            for c in [&n.live, &n.durable] {
                if let Content::Dir(e) = c {
                    stack.extend(e.values().copied());
                }
            }
            for ch in &n.pending {
                if let FsChange::Link { ino, .. } = ch {
                    stack.push(*ino);
                }
            }
        }
        self.nodes.retain(|i, _| reach.contains(i));
    }

    /// How many inodes the model holds.
    pub fn inodes(&self) -> usize {
        self.nodes.len()
    }

    /// Replays one recorded operation (the explorer's replay). The inode
    /// numbers come out the same as in the recorded run because the
    /// replay starts from the same state and makes inodes in the same order.
    pub fn replay(&mut self, op: &FsOp) -> Result<(), Errno> {
        match op {
            FsOp::Make { parent, name, dir } => {
                self.make(*parent, name, *dir, if *dir { 0o755 } else { 0o644 }).map(drop)
            }
            FsOp::Write { ino, off, data } => self.write(*ino, *off, data),
            FsOp::SetLen { ino, len } => self.set_len(*ino, *len),
            FsOp::Rename { parent, name, newparent, newname } => self.rename(*parent, name, *newparent, newname, false),
            FsOp::Remove { parent, name } => {
                let dir = self.lookup(*parent, name).ok().and_then(|i| self.content(i)).is_some_and(Content::is_dir);
                self.remove(*parent, name, dir)
            }
            FsOp::Sync { ino } => self.sync(*ino),
        }
    }
}

/// How many bytes of `b` are left once its trailing zeros are dropped:
/// what a file's bytes are short of their hole (a preallocated journal's
/// tens of MiB of zeros are scanned 64 bytes at a time).
pub fn used_len(b: &[u8]) -> usize {
    let whole = b.len() / 64 * 64;
    if let Some(i) = b[whole..].iter().rposition(|x| *x != 0) {
        return whole + i + 1;
    }
    for (k, c) in b[..whole].chunks_exact(64).enumerate().rev() {
        if c.iter().fold(0u8, |a, x| a | x) != 0 {
            return k * 64 + c.iter().rposition(|x| *x != 0).map_or(0, |i| i + 1);
        }
    }
    0
}

fn content_used(c: &Content) -> usize {
    match c {
        Content::File(b) => used_len(b),
        Content::Dir(_) => 0,
    }
}

/// The sector boundaries strictly inside a write of `len` bytes at `off`,
/// as byte counts from the write's start: where a power cut may tear it.
pub fn tears(off: u64, len: usize, sector: u64) -> Vec<usize> {
    let end = off + len as u64;
    let first = (off / sector + 1) * sector;
    (0..).map(|k| first + k * sector).take_while(|b| *b < end).map(|b| (b - off) as usize).collect()
}
