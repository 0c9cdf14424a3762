//! Each rule of the forgetful file system, through a real mount and real
//! system calls: what a power cut keeps and what it drops.
//!
//! Needs root and /dev/fuse; without them every test says SKIPPED and
//! passes, unless `HF3FS_META_REQUIRE_ALL` is set (CI), where it fails. By
//! hand: `flock /work/faults.lock cargo test -p hf3fs-meta-forgetfs`.

use hf3fs_meta_forgetfs::{mounted, unavailable, Cut, Model, Mount, Names};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// A mount in a temporary directory. Fields drop in order: the mount
/// first, then the directory under it.
struct Fixture {
    fs: Mount,
    dir: tempfile::TempDir,
}

impl Fixture {
    fn p(&self, name: &str) -> PathBuf {
        self.fs.path().join(name)
    }

    /// Cuts the power and powers on again: the mount now holds what the
    /// cut kept.
    fn cut(&self, how: Cut) {
        self.fs.cut(how);
        self.fs.revive();
    }
}

fn fixture(names: Names) -> Option<Fixture> {
    if let Some(why) = unavailable() {
        assert!(
            std::env::var_os("HF3FS_META_REQUIRE_ALL").is_none(),
            "the forgetful file system cannot be mounted, and HF3FS_META_REQUIRE_ALL is set: {why}"
        );
        eprintln!("\nSKIPPED: the forgetful file system's tests: {why}\n  to run them: as root, with /dev/fuse");
        return None;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let fs = Mount::empty(dir.path(), names, false).expect("mount");
    Some(Fixture { fs, dir })
}

fn sync_dir(p: &Path) {
    File::open(p).expect("open dir").sync_all().expect("fsync dir");
}

/// Creates `name` with `data`, both the data and the name synced.
fn durable_file(f: &Fixture, name: &str, data: &[u8]) {
    let mut file = File::create(f.p(name)).expect("create");
    file.write_all(data).expect("write");
    file.sync_all().expect("fsync");
    sync_dir(f.fs.path());
}

#[test]
fn writes_are_visible_at_once_and_gone_after_a_cut_without_fsync() {
    let Some(f) = fixture(Names::Strict) else { return };
    durable_file(&f, "a", b"");
    let mut file = OpenOptions::new().write(true).open(f.p("a")).unwrap();
    file.write_all(b"not synced").unwrap();
    assert_eq!(fs::read(f.p("a")).unwrap(), b"not synced", "visible at once");
    drop(file);
    f.cut(Cut::Drop);
    assert_eq!(fs::read(f.p("a")).unwrap(), b"", "an unsynced write is gone after a cut");
}

#[test]
fn fsync_and_fdatasync_keep_a_files_data() {
    let Some(f) = fixture(Names::Strict) else { return };
    durable_file(&f, "a", b"");
    durable_file(&f, "b", b"");
    let mut a = OpenOptions::new().write(true).open(f.p("a")).unwrap();
    a.write_all(b"synced").unwrap();
    a.sync_all().unwrap();
    a.write_all(b" and then not").unwrap();
    let mut b = OpenOptions::new().write(true).open(f.p("b")).unwrap();
    b.write_all(b"datasynced").unwrap();
    b.sync_data().unwrap();
    drop((a, b));
    f.cut(Cut::Drop);
    assert_eq!(fs::read(f.p("a")).unwrap(), b"synced", "what fsync covered stays, what came after goes");
    assert_eq!(fs::read(f.p("b")).unwrap(), b"datasynced");
}

#[test]
fn a_new_files_name_needs_its_directorys_fsync() {
    let Some(f) = fixture(Names::Strict) else { return };
    let mut file = File::create(f.p("new")).unwrap();
    file.write_all(b"data").unwrap();
    file.sync_all().unwrap();
    drop(file);
    assert!(f.p("new").exists());
    f.cut(Cut::Drop);
    assert!(!f.p("new").exists(), "fsync of the file alone does not persist its name (POSIX)");

    // The directory synced but not the file: the name, with no data.
    let mut file = File::create(f.p("named")).unwrap();
    file.write_all(b"data").unwrap();
    sync_dir(f.fs.path());
    drop(file);
    f.cut(Cut::Drop);
    assert_eq!(fs::read(f.p("named")).unwrap(), b"", "the name is durable, the data is not");
}

#[test]
fn under_the_journal_model_any_fsync_persists_every_name() {
    let Some(f) = fixture(Names::Journal) else { return };
    fs::create_dir(f.p("sub")).unwrap();
    File::create(f.p("other")).unwrap();
    let mut file = File::create(f.p("sub/new")).unwrap();
    file.write_all(b"data").unwrap();
    file.sync_all().unwrap();
    drop(file);
    File::create(f.p("after")).unwrap();
    f.cut(Cut::Drop);
    assert_eq!(fs::read(f.p("sub/new")).unwrap(), b"data", "ext4's fsync commits the names with the data");
    assert!(f.p("other").exists(), "and every other name change before it");
    assert!(!f.p("after").exists(), "but none after it");
}

#[test]
fn a_rename_without_the_directorys_fsync_leaves_the_old_name() {
    let Some(f) = fixture(Names::Strict) else { return };
    durable_file(&f, "old", b"one");
    durable_file(&f, "target", b"two");
    fs::rename(f.p("old"), f.p("target")).unwrap();
    assert_eq!(fs::read(f.p("target")).unwrap(), b"one");
    assert!(!f.p("old").exists());
    f.cut(Cut::Drop);
    assert_eq!(fs::read(f.p("old")).unwrap(), b"one", "the rename is gone");
    assert_eq!(fs::read(f.p("target")).unwrap(), b"two", "and the file it replaced is back");

    fs::rename(f.p("old"), f.p("target")).unwrap();
    sync_dir(f.fs.path());
    f.cut(Cut::Drop);
    assert!(!f.p("old").exists());
    assert_eq!(fs::read(f.p("target")).unwrap(), b"one", "a synced rename stays");
}

#[test]
fn a_rename_across_directories_needs_both_fsyncs() {
    let Some(f) = fixture(Names::Strict) else { return };
    fs::create_dir(f.p("a")).unwrap();
    fs::create_dir(f.p("b")).unwrap();
    sync_dir(f.fs.path());
    durable_file(&f, "x", b"");
    let mut file = File::create(f.p("a/x")).unwrap();
    file.write_all(b"moved").unwrap();
    file.sync_all().unwrap();
    sync_dir(&f.p("a"));
    fs::rename(f.p("a/x"), f.p("b/x")).unwrap();
    sync_dir(&f.p("b"));
    f.cut(Cut::Drop);
    // Only the new directory was synced: both names (POSIX allows it).
    assert_eq!(fs::read(f.p("a/x")).unwrap(), b"moved");
    assert_eq!(fs::read(f.p("b/x")).unwrap(), b"moved");
}

#[test]
fn an_unlink_without_the_directorys_fsync_comes_back() {
    let Some(f) = fixture(Names::Strict) else { return };
    durable_file(&f, "gone", b"still here");
    fs::remove_file(f.p("gone")).unwrap();
    assert!(!f.p("gone").exists());
    f.cut(Cut::Drop);
    assert_eq!(fs::read(f.p("gone")).unwrap(), b"still here", "the unlink was not synced");
    fs::remove_file(f.p("gone")).unwrap();
    sync_dir(f.fs.path());
    f.cut(Cut::Drop);
    assert!(!f.p("gone").exists());
}

#[test]
fn a_truncation_needs_the_files_fsync() {
    let Some(f) = fixture(Names::Strict) else { return };
    durable_file(&f, "t", &[7u8; 9000]);
    let file = OpenOptions::new().write(true).open(f.p("t")).unwrap();
    file.set_len(100).unwrap();
    assert_eq!(fs::metadata(f.p("t")).unwrap().len(), 100);
    f.cut(Cut::Drop);
    assert_eq!(fs::metadata(f.p("t")).unwrap().len(), 9000, "the truncation is gone");
    let file = OpenOptions::new().write(true).open(f.p("t")).unwrap();
    file.set_len(100).unwrap();
    file.sync_data().unwrap();
    drop(file);
    f.cut(Cut::Drop);
    assert_eq!(fs::read(f.p("t")).unwrap(), vec![7u8; 100]);
}

#[test]
fn a_torn_cut_keeps_a_prefix_of_the_unsynced_writes_cut_at_a_sector() {
    let Some(f) = fixture(Names::Strict) else { return };
    let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    for sector in [512u64, 4096] {
        let mut lengths = std::collections::BTreeSet::new();
        for seed in 0..40u64 {
            durable_file(&f, "log", b"head");
            let mut file = OpenOptions::new().append(true).open(f.p("log")).unwrap();
            file.write_all(&data[..9000]).unwrap();
            file.write_all(&data[9000..]).unwrap();
            drop(file);
            f.cut(Cut::Torn { sector, seed });
            let got = fs::read(f.p("log")).unwrap();
            let mut whole = b"head".to_vec();
            whole.extend_from_slice(&data);
            assert!(whole.starts_with(&got), "a prefix of what was written (sector {sector}, seed {seed})");
            let len = got.len() as u64;
            // Nothing, the first write whole, or a write cut at a sector.
            assert!(
                len == 4 || len == 9004 || len.is_multiple_of(sector),
                "len {len}: not at a {sector}-byte boundary"
            );
            lengths.insert(len);
            fs::remove_file(f.p("log")).unwrap();
            sync_dir(f.fs.path());
        }
        assert!(lengths.len() >= 3, "the seeds pick different tears: {lengths:?}");
        assert!(lengths.iter().any(|l| l.is_multiple_of(sector) && *l > 9004), "the second write torn: {lengths:?}");
    }
}

#[test]
fn after_a_cut_everything_fails_until_the_power_is_back() {
    let Some(f) = fixture(Names::Strict) else { return };
    durable_file(&f, "a", b"x");
    let mut open = OpenOptions::new().write(true).open(f.p("a")).unwrap();
    f.fs.cut(Cut::Drop);
    let err = open.write_all(b"late").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert_eq!(fs::read(f.p("a")).unwrap_err().raw_os_error(), Some(libc::EIO));
    f.fs.revive();
    drop(open);
    assert_eq!(fs::read(f.p("a")).unwrap(), b"x");
}

#[test]
fn the_persisted_image_is_written_out_and_mounted_again() {
    let Some(f) = fixture(Names::Strict) else { return };
    fs::create_dir(f.p("d")).unwrap();
    sync_dir(f.fs.path());
    durable_file(&f, "top", b"top");
    let mut file = File::create(f.p("d/inner")).unwrap();
    file.write_all(b"inner").unwrap();
    file.sync_all().unwrap();
    sync_dir(&f.p("d"));
    File::create(f.p("lost")).unwrap();
    let report = f.fs.cut(Cut::Drop);
    let out = tempfile::tempdir().unwrap();
    report.image.write_to(out.path()).unwrap();
    let Fixture { fs: mount, dir } = f;
    mount.unmount().unwrap();
    assert!(!mounted(dir.path()));
    let again = Mount::new(dir.path(), Model::load(out.path(), Names::Strict, false).unwrap()).unwrap();
    assert_eq!(fs::read(dir.path().join("top")).unwrap(), b"top");
    assert_eq!(fs::read(dir.path().join("d/inner")).unwrap(), b"inner");
    assert!(!dir.path().join("lost").exists());
    // Loaded is persisted: a cut right away keeps it all.
    again.cut(Cut::Drop);
    again.revive();
    assert_eq!(fs::read(dir.path().join("d/inner")).unwrap(), b"inner");
    drop(again);
    assert!(!mounted(dir.path()), "dropping the mount unmounts it");
}

/// `last_sync` stamps each applied fsync of a file (what the fault
/// harness holds a `batch` node's losses to), not a directory's.
#[test]
fn the_last_file_fsync_is_stamped() {
    let Some(f) = fixture(Names::Strict) else { return };
    assert_eq!(f.fs.last_sync(), None);
    let before = std::time::Instant::now();
    durable_file(&f, "a", b"x");
    let first = f.fs.last_sync().expect("the file's fsync is stamped");
    assert!(first >= before);
    sync_dir(f.fs.path());
    assert_eq!(f.fs.last_sync(), Some(first), "a directory's fsync is not a file's");
    let mut a = OpenOptions::new().write(true).open(f.p("a")).unwrap();
    a.write_all(b"y").unwrap();
    a.sync_data().unwrap();
    let second = f.fs.last_sync().expect("stamped");
    assert!(second > first);
    // Per directory: a file synced in d/ stamps d/, not the root's files.
    fs::create_dir(f.p("d")).unwrap();
    let mut b = File::create(f.p("d/b")).unwrap();
    b.write_all(b"z").unwrap();
    assert_eq!(f.fs.last_sync_in(Path::new("d")), None, "nothing in d/ synced yet");
    b.sync_data().unwrap();
    let in_d = f.fs.last_sync_in(Path::new("d")).expect("d/b synced");
    assert!(in_d > second);
    assert_eq!(f.fs.last_sync_in(Path::new("")), Some(second), "the root's own files");
    assert_eq!(f.fs.last_sync_in(Path::new("nope")), None);
    // The earliest of a directory's files: d/c synced after d/b leaves
    // d/b's stamp, and a file in d/ never synced leaves none.
    let c = File::create(f.p("d/c")).unwrap();
    assert_eq!(f.fs.last_sync_in(Path::new("d")), None, "d/c never synced");
    c.sync_data().unwrap();
    assert_eq!(f.fs.last_sync_in(Path::new("d")), Some(in_d), "d/b's sync is the earlier");
    b.sync_data().unwrap();
    assert!(f.fs.last_sync_in(Path::new("d")).expect("both synced") > in_d);
}

/// The full crash-state explorer's states of one inode (the model alone,
/// no mount): the durable content plus any prefix of the pending changes,
/// each prefix ending in a write also with that write torn at every
/// sector boundary inside it, and nothing else.
#[test]
fn an_inodes_crash_states_are_its_prefixes_and_their_torn_last_writes() {
    use hf3fs_meta_forgetfs::model::{Content, Keep, ROOT};
    let mut m = Model::new(Names::Strict, false);
    let f = m.make(ROOT, "f".as_ref(), false, 0o644).expect("make");
    m.write(f, 0, b"ab").expect("write");
    m.sync(f).expect("fsync");
    m.write(f, 0, &[1; 1024]).expect("write"); // one boundary inside: 512
    m.set_len(f, 100).expect("truncate");
    m.write(f, 1000, &[2; 600]).expect("write"); // 1024 and 1536: 24 and 536 bytes in
    let pending = m.pending();
    let (_, changes) = pending.iter().find(|(i, _)| *i == f).expect("pending");
    let keep = |changes, torn| Keep { changes, torn };
    assert_eq!(
        Model::every_keep(changes, 512),
        [
            Keep::NONE,
            keep(1, Some(512)),
            keep(1, None),
            keep(2, None),
            keep(3, Some(24)),
            keep(3, Some(536)),
            keep(3, None)
        ]
    );
    let file = |k| match m.kept(f, k) {
        Some(Content::File(b)) => b,
        other => panic!("{other:?}"),
    };
    assert_eq!(file(Keep::NONE), b"ab", "nothing unsynced: the last fsync's content");
    assert_eq!(file(keep(1, Some(512))), [1; 512], "torn: the first sector of the write only");
    assert_eq!(file(keep(2, None)), [1; 100], "the truncation after the write");
    let torn = file(keep(3, Some(24)));
    assert_eq!((torn.len(), &torn[..100], &torn[1000..]), (1024, &[1; 100][..], &[2; 24][..]));
    assert!(torn[100..1000].iter().all(|b| *b == 0), "the extension is zeros");
    assert_eq!(m.durable(f), Some(&Content::File(b"ab".to_vec())), "the durable content itself is untouched");
}

/// The explorer's materialization (`write_crash_image`, which writes each
/// file's durable bytes and then its kept changes over them) leaves on disk
/// what the image itself does, for every keep of every inode: files with
/// torn writes, truncations and holes, a directory's unsynced names, a file
/// in a directory whose name is not persisted (the model alone, no mount).
#[test]
fn the_written_crash_image_is_the_crash_image() {
    use hf3fs_meta_forgetfs::model::{Keep, ROOT};
    use std::collections::HashMap;
    let mut m = Model::new(Names::Strict, false);
    let d = m.make(ROOT, "d".as_ref(), true, 0o755).expect("mkdir");
    let f = m.make(d, "f".as_ref(), false, 0o644).expect("make");
    let j = m.make(ROOT, "journal".as_ref(), false, 0o644).expect("make");
    m.set_len(j, 1 << 20).expect("preallocate");
    m.write(f, 0, &[7; 700]).expect("write");
    m.sync(f).expect("fsync");
    m.sync(j).expect("fsync");
    m.sync(d).expect("fsync");
    m.sync(ROOT).expect("fsync");
    m.write(f, 0, &[1; 1024]).expect("write");
    m.set_len(f, 300).expect("truncate");
    m.write(f, 1000, &[2; 600]).expect("write");
    m.write(j, 4096, &[3; 2000]).expect("write");
    let e = m.make(d, "e".as_ref(), false, 0o644).expect("make");
    m.write(e, 0, b"new").expect("write");
    m.remove(ROOT, "journal".as_ref(), false).expect("unlink");
    let pending: Vec<(u64, Vec<Keep>)> = m.pending().iter().map(|(i, ch)| (*i, Model::every_keep(ch, 512))).collect();
    // Each inode's keeps in turn, everything else kept whole and kept not at all.
    let mut tried = 0;
    for (ino, keeps) in &pending {
        for k in keeps {
            for rest_all in [false, true] {
                let choice: HashMap<u64, Keep> = pending
                    .iter()
                    .map(|(i, ks)| {
                        (
                            *i,
                            if i == ino {
                                *k
                            } else if rest_all {
                                *ks.last().unwrap()
                            } else {
                                Keep::NONE
                            },
                        )
                    })
                    .collect();
                let pick = |i, _: &[_]| choice.get(&i).copied().unwrap_or(Keep::NONE);
                let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
                m.crash_image(&pick).write_to(a.path()).unwrap();
                m.write_crash_image(&pick, b.path()).unwrap();
                assert_eq!(
                    read_tree(a.path()),
                    read_tree(b.path()),
                    "inode {ino} keeping {k:?} (the rest: {rest_all})"
                );
                tried += 1;
            }
        }
    }
    assert!(tried > 20, "{tried}");
}

/// Every path under `dir` with its bytes (`None`: a directory).
fn read_tree(dir: &Path) -> Vec<(PathBuf, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        for e in fs::read_dir(&p).unwrap() {
            let e = e.unwrap().path();
            if e.is_dir() {
                out.push((e.strip_prefix(dir).unwrap().to_path_buf(), None));
                stack.push(e);
            } else {
                out.push((e.strip_prefix(dir).unwrap().to_path_buf(), Some(fs::read(&e).unwrap())));
            }
        }
    }
    out.sort();
    out
}

/// A file's bytes short of their trailing zeros (how images write holes
/// and how the explorer digests files), at every position of a last
/// non-zero byte around the 64-byte chunks it is scanned in.
#[test]
fn a_files_used_length_stops_at_its_last_non_zero_byte() {
    use hf3fs_meta_forgetfs::model::used_len;
    assert_eq!(used_len(&[]), 0);
    for len in [1, 63, 64, 65, 130, 1000] {
        assert_eq!(used_len(&vec![0; len]), 0, "all zeros, {len}");
        for at in 0..len {
            let mut b = vec![0; len];
            b[at] = 9;
            assert_eq!(used_len(&b), at + 1, "the last non-zero byte at {at} of {len}");
            b[0] = 1;
            assert_eq!(used_len(&b), at + 1, "and one before it, {at} of {len}");
        }
    }
}
