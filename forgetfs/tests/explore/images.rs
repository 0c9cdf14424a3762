//! The crash images of one position: the digests that tell two images
//! apart without copying them, each inode's pieces, and the product over
//! the inodes with pending changes that a crash image can hold.

use hf3fs_meta_forgetfs::model::{used_len, Content, FsChange, Ino, Keep};
use hf3fs_meta_forgetfs::Model;
use std::collections::HashMap;
use std::sync::Arc;

/// A digest of an image or of one inode's content: 128 bits (two SipHash
/// streams over the same bytes), so that two different images of one
/// exploration colliding is out of reach (~2^-100 for a million images).
pub(super) type Digest = u128;

pub(super) struct Hasher2(std::collections::hash_map::DefaultHasher, std::collections::hash_map::DefaultHasher);

impl Hasher2 {
    pub(super) fn new() -> Self {
        use std::hash::Hasher;
        let (mut a, mut b) = (Default::default(), std::collections::hash_map::DefaultHasher::default());
        Hasher::write_u8(&mut a, 0xA5);
        b.write_u8(0x5A);
        Hasher2(a, b)
    }

    pub(super) fn finish128(&self) -> Digest {
        use std::hash::Hasher;
        (u128::from(self.0.finish()) << 64) | u128::from(self.1.finish())
    }
}

impl std::hash::Hasher for Hasher2 {
    fn write(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
        self.1.write(bytes);
    }

    fn finish(&self) -> u64 {
        self.0.finish()
    }
}

/// The digest of a file of `len` bytes that holds `bytes` and zeros after
/// them (`bytes.len() <= len`): trailing zeros count by the length only,
/// as [`Image::write_to`] writes them as a hole.
pub(super) fn file_digest(len: usize, bytes: &[u8]) -> Digest {
    use std::hash::Hash;
    let used = used_len(bytes);
    let mut h = Hasher2::new();
    (len, &bytes[..used]).hash(&mut h);
    h.finish128()
}

/// One inode's piece of a crash image, for the digest of a combination.
#[derive(Clone, PartialEq)]
pub(super) enum Piece {
    File(Digest),
    Dir(Arc<Vec<(std::ffi::OsString, Ino)>>),
}

pub(super) fn piece(c: &Content) -> Piece {
    match c {
        Content::File(b) => Piece::File(file_digest(b.len(), b)),
        Content::Dir(e) => Piece::Dir(Arc::new(e.iter().map(|(n, i)| (n.clone(), *i)).collect())),
    }
}

/// The pieces of one file's crash states ([`Model::every_keep`]'s order),
/// computed on one buffer: each change applied once, in order, a torn
/// write's prefix before the whole of it (every torn keep of a change is
/// followed by longer ones of the same change and then by the change
/// whole, so applying each over the last leaves exactly that keep's
/// content). No copy of the file per state.
pub(super) fn file_pieces(base: &[u8], changes: &[FsChange], keeps: &[Keep]) -> Vec<Piece> {
    let used = used_len(base);
    let (mut buf, mut len) = (base[..used].to_vec(), base.len());
    let mut apply = |buf: &mut Vec<u8>, ch: &FsChange, torn: Option<usize>| match ch {
        FsChange::Write { off, data } => {
            let d = &data[..torn.unwrap_or(data.len()).min(data.len())];
            let (off, end) = (*off as usize, *off as usize + d.len());
            if buf.len() < end {
                buf.resize(end, 0);
            }
            buf[off..end].copy_from_slice(d);
            len = len.max(end);
            len
        }
        FsChange::SetLen(l) => {
            buf.truncate(*l as usize);
            len = *l as usize;
            len
        }
        _ => len,
    };
    let mut applied = 0;
    let mut now = base.len();
    keeps
        .iter()
        .map(|k| {
            let whole = if k.torn.is_some() { k.changes - 1 } else { k.changes };
            assert!(applied <= whole, "every_keep's order: prefixes grow");
            while applied < whole {
                now = apply(&mut buf, &changes[applied], None);
                applied += 1;
            }
            if let Some(t) = k.torn {
                now = apply(&mut buf, &changes[k.changes - 1], Some(t));
            }
            Piece::File(file_digest(now, &buf))
        })
        .collect()
}

/// Every crash state of one position: for each inode with pending
/// changes, its crash states ([`Model::every_keep`]: any prefix of its
/// changes, the last kept write torn at any 512-byte boundary) folded to
/// those that differ in what the inode holds (two keeps leaving the same
/// bytes, or the same entries, are one state of it); the combinations are
/// their product. The bounded run's choices are looked up in it.
pub(super) struct Product {
    pub(super) inos: Vec<Ino>,
    /// Per inode: its different kept contents, each with one keep.
    pub(super) keeps: Vec<Vec<(Keep, Piece)>>,
    /// Per inode: every keep (`(changes, torn)`) to its index in `keeps`.
    pub(super) index: Vec<HashMap<(usize, Option<usize>), usize>>,
    /// The combinations the rules allow, before the folding.
    pub(super) allowed: u128,
    /// The pieces of inodes without pending changes (their durable content).
    pub(super) settled: HashMap<Ino, Piece>,
}

impl Product {
    pub(super) fn new(model: &Model, pending: &[(Ino, &[FsChange])]) -> Self {
        let mut p =
            Product { inos: Vec::new(), keeps: Vec::new(), index: Vec::new(), allowed: 1, settled: HashMap::new() };
        for (ino, changes) in pending {
            let every = Model::every_keep(changes, 512);
            p.allowed = p.allowed.saturating_mul(every.len() as u128);
            let pieces: Vec<Piece> = match model.durable(*ino) {
                Some(Content::File(base)) => file_pieces(base, changes, &every),
                _ => every.iter().map(|k| piece(&model.kept(*ino, *k).expect("a pending inode"))).collect(),
            };
            let mut kinds: Vec<(Keep, Piece)> = Vec::new();
            let mut index = HashMap::new();
            for (k, pc) in every.into_iter().zip(pieces) {
                let at = match kinds.iter().position(|(_, q)| *q == pc) {
                    Some(at) => at,
                    None => {
                        kinds.push((k, pc));
                        kinds.len() - 1
                    }
                };
                index.insert((k.changes, k.torn), at);
            }
            p.inos.push(*ino);
            p.keeps.push(kinds);
            p.index.push(index);
        }
        p
    }

    pub(super) fn different(&self) -> u64 {
        self.keeps.iter().map(|k| k.len() as u64).product()
    }

    /// The combination (an index per inode) a choice of keeps makes.
    pub(super) fn pick_of(&self, keep: &HashMap<Ino, Keep>) -> Vec<usize> {
        self.inos
            .iter()
            .zip(&self.index)
            .map(|(ino, index)| {
                let k = keep.get(ino).copied().unwrap_or(Keep::NONE);
                *index.get(&(k.changes, k.torn)).expect("a keep of every_keep's")
            })
            .collect()
    }

    /// The digest of the image combination `pick` (an index per inode)
    /// leaves: its tree from the root, in order, each directory's names
    /// and each file's content digest (what [`Image::write_to`] writes).
    pub(super) fn digest(&mut self, model: &Model, pick: &[usize]) -> Digest {
        use std::hash::Hash;
        let mut h = Hasher2::new();
        let mut stack = vec![hf3fs_meta_forgetfs::model::ROOT];
        while let Some(ino) = stack.pop() {
            let pc = match self.inos.iter().position(|i| *i == ino) {
                Some(at) => self.keeps[at][pick[at]].1.clone(),
                None => match self.settled.get(&ino) {
                    Some(pc) => pc.clone(),
                    None => match model.durable(ino) {
                        Some(c) => self.settled.entry(ino).or_insert_with(|| piece(c)).clone(),
                        None => {
                            // A name whose inode is gone: not written.
                            2u8.hash(&mut h);
                            continue;
                        }
                    },
                },
            };
            match pc {
                Piece::File(d) => (0u8, d).hash(&mut h),
                Piece::Dir(e) => {
                    (1u8, e.len()).hash(&mut h);
                    for (name, child) in e.iter().rev() {
                        name.hash(&mut h);
                        stack.push(*child);
                    }
                }
            }
        }
        h.finish128()
    }

    pub(super) fn keep(&self, pick: &[usize]) -> HashMap<Ino, Keep> {
        self.inos.iter().enumerate().map(|(at, ino)| (*ino, self.keeps[at][pick[at]].0)).collect()
    }

    /// The next combination after `pick` (an odometer), `false` after the last.
    pub(super) fn advance(&self, pick: &mut [usize]) -> bool {
        for (at, p) in pick.iter_mut().enumerate() {
            *p += 1;
            if *p < self.keeps[at].len() {
                return true;
            }
            *p = 0;
        }
        false
    }
}

/// The pending inodes some crash image can hold: those reachable from the
/// root through durable entries or pending links (a superset of every
/// image's entries: a kept prefix of a directory's changes only adds
/// linked inodes, renames or removes names). The others (a directory whose
/// removal is synced, and every inode only it names) are in no image, and
/// their pending changes are no part of any crash state.
pub(super) fn held<'m>(model: &Model, pending: Vec<(Ino, &'m [FsChange])>) -> Vec<(Ino, &'m [FsChange])> {
    let changes: HashMap<Ino, &[FsChange]> = pending.iter().copied().collect();
    let mut reach = std::collections::HashSet::new();
    let mut stack = vec![hf3fs_meta_forgetfs::model::ROOT];
    while let Some(ino) = stack.pop() {
        if !reach.insert(ino) {
            continue;
        }
        if let Some(Content::Dir(e)) = model.durable(ino) {
            stack.extend(e.values().copied());
        }
        for c in changes.get(&ino).copied().unwrap_or_default() {
            if let FsChange::Link { ino, .. } = c {
                stack.push(*ino);
            }
        }
    }
    pending.into_iter().filter(|(ino, _)| reach.contains(ino)).collect()
}

/// The stats of one position (`HF3FS_META_EXPLORE_STATS`): which inodes
/// carry the pending changes that multiply the states, each one's path,
/// changes and different contents (`=changes`: the changes too).
pub(super) fn print_pending(model: &Model, pending: &[(Ino, &[FsChange])], product: &Product, p: usize) {
    let names = names_of(model);
    let list = std::env::var_os("HF3FS_META_EXPLORE_STATS").is_some_and(|v| v == "changes");
    for (at, (ino, changes)) in pending.iter().enumerate() {
        eprintln!(
            "  op {p}: inode {ino} {}: {} changes, {} kinds",
            names.get(ino).map_or("(no name)", String::as_str),
            changes.len(),
            product.keeps[at].len()
        );
        for c in changes.iter().filter(|_| list) {
            match c {
                FsChange::Write { off, data } => eprintln!("    write @{off} +{}", data.len()),
                c => eprintln!("    {c:?}"),
            }
        }
    }
}

/// Each inode's path (live names first, then durable ones): for the stats.
pub(super) fn names_of(model: &Model) -> HashMap<Ino, String> {
    let mut out = HashMap::new();
    let mut stack = vec![(hf3fs_meta_forgetfs::model::ROOT, String::new())];
    while let Some((ino, path)) = stack.pop() {
        if out.contains_key(&ino) {
            continue;
        }
        for c in [model.content(ino), model.durable(ino)].into_iter().flatten() {
            if let Content::Dir(e) = c {
                for (n, i) in e {
                    stack.push((*i, format!("{path}/{}", n.to_string_lossy())));
                }
            }
        }
        out.insert(ino, path);
    }
    out
}
