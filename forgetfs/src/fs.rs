//! The model served over FUSE ([`fuser`]), and the mount's handle.
//!
//! Every entry and attribute is answered with a TTL of zero and every file
//! is opened `FOPEN_DIRECT_IO`, so the kernel caches nothing: each read,
//! write and lookup reaches the model (after a cut, nobody reads a page the
//! cut dropped), and each `write(2)` is one recorded write.

use crate::model::{tears, Content, Image, Ino, Keep, Model};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

const TTL: Duration = Duration::ZERO;

/// What the FUSE threads and the handle share.
struct Shared {
    model: Mutex<Model>,
    /// Open handles per inode: an unlinked file still open stays.
    open: Mutex<HashMap<Ino, usize>>,
    /// Set by a cut: every operation fails with EIO until [`Mount::revive`]
    /// (the processes that used the file system are dead; the cut's image
    /// must not change before they are).
    dead: AtomicBool,
    /// The model's size after the last collection of unreachable inodes.
    collected: Mutex<usize>,
    /// When the last fsync of each file (not a directory) was applied.
    last_sync: Mutex<HashMap<Ino, Instant>>,
    uid: u32,
    gid: u32,
}

impl Shared {
    fn model(&self) -> MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn alive(&self) -> Result<(), Errno> {
        // Acquire: pairs with the cut's Release store; a cut's image is
        // taken under the model's lock anyway, this only ends the calls.
        if self.dead.load(Ordering::Acquire) {
            Err(Errno::EIO)
        } else {
            Ok(())
        }
    }

    fn attr(&self, m: &Model, ino: Ino) -> Result<FileAttr, Errno> {
        let c = m.content(ino).ok_or(Errno::ENOENT)?;
        let (kind, size, nlink) = match c {
            Content::File(b) => (FileType::RegularFile, b.len() as u64, 1),
            Content::Dir(e) => (FileType::Directory, e.len() as u64, 2),
        };
        let t = SystemTime::UNIX_EPOCH;
        Ok(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind,
            perm: m.perm(ino),
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn opened(&self, ino: Ino) {
        *self.open.lock().unwrap_or_else(PoisonError::into_inner).entry(ino).or_default() += 1;
    }

    /// Drops unreachable inodes once the model has doubled since the last time.
    fn maybe_collect(&self, m: &mut Model) {
        let mut last = self.collected.lock().unwrap_or_else(PoisonError::into_inner);
        if m.inodes() > 2 * *last + 64 {
            let open: HashSet<Ino> = self.open.lock().unwrap_or_else(PoisonError::into_inner).keys().copied().collect();
            m.collect(&open);
            *last = m.inodes();
        }
    }
}

struct Fs(Arc<Shared>);

fn errno(e: i32) -> Errno {
    Errno::from_i32(e)
}

impl Fs {
    fn entry(&self, m: &Model, ino: Ino, reply: ReplyEntry) {
        match self.0.attr(m, ino) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn empty(&self, reply: ReplyEmpty, f: impl FnOnce(&mut Model) -> Result<(), i32>) {
        if let Err(e) = self.0.alive() {
            return reply.error(e);
        }
        let mut m = self.0.model();
        match f(&mut m) {
            Ok(()) => {
                self.0.maybe_collect(&mut m);
                reply.ok()
            }
            Err(e) => reply.error(errno(e)),
        }
    }
}

impl Filesystem for Fs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if let Err(e) = self.0.alive() {
            return reply.error(e);
        }
        let m = self.0.model();
        match m.lookup(parent.0, name) {
            Ok(ino) => self.entry(&m, ino, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if let Err(e) = self.0.alive() {
            return reply.error(e);
        }
        match self.0.attr(&self.0.model(), ino.0) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if let Err(e) = self.0.alive() {
            return reply.error(e);
        }
        let mut m = self.0.model();
        if let Some(len) = size {
            if let Err(e) = m.set_len(ino.0, len) {
                return reply.error(errno(e));
            }
        }
        match self.0.attr(&m, ino.0) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if let Err(e) = self.0.alive() {
            return reply.error(e);
        }
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        let mut m = self.0.model();
        match m.make(parent.0, name, false, (mode & 0o7777) as u16) {
            Ok(ino) => self.entry(&m, ino, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        if let Err(e) = self.0.alive() {
            return reply.error(e);
        }
        let mut m = self.0.model();
        match m.make(parent.0, name, true, (mode & 0o7777) as u16) {
            Ok(ino) => self.entry(&m, ino, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.empty(reply, |m| m.remove(parent.0, name, false))
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.empty(reply, |m| m.remove(parent.0, name, true))
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.contains(RenameFlags::RENAME_EXCHANGE) || flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::EINVAL);
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        self.empty(reply, |m| m.rename(parent.0, name, newparent.0, newname, noreplace))
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if let Err(e) = self.0.alive() {
            return reply.error(e);
        }
        let mut m = self.0.model();
        if m.content(ino.0).is_none() {
            return reply.error(Errno::ENOENT);
        }
        if flags.0 & libc::O_TRUNC != 0 {
            if let Err(e) = m.set_len(ino.0, 0) {
                return reply.error(errno(e));
            }
        }
        self.0.opened(ino.0);
        reply.opened(FileHandle(ino.0), FopenFlags::FOPEN_DIRECT_IO)
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        if let Err(e) = self.0.alive() {
            return reply.error(e);
        }
        let mut m = self.0.model();
        let made = m.make(parent.0, name, false, (mode & 0o7777) as u16).map_err(errno);
        match made.and_then(|ino| self.0.attr(&m, ino)) {
            Ok(a) => {
                self.0.opened(a.ino.0);
                reply.created(&TTL, &a, Generation(0), FileHandle(a.ino.0), FopenFlags::FOPEN_DIRECT_IO)
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if let Err(e) = self.0.alive() {
            return reply.error(e);
        }
        match self.0.model().read(ino.0, offset, size as usize) {
            Ok(b) => reply.data(b),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if let Err(e) = self.0.alive() {
            return reply.error(e);
        }
        match self.0.model().write(ino.0, offset, data) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok()
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut open = self.0.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = open.get_mut(&ino.0) {
            *n -= 1;
            if *n == 0 {
                open.remove(&ino.0);
            }
        }
        reply.ok()
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.empty(reply, |m| {
            m.sync(ino.0)?;
            // Under the model's lock: a cut's image, taken under it too,
            // holds every sync stamped before it.
            if matches!(m.content(ino.0), Some(Content::File(_))) {
                self.0.last_sync.lock().unwrap_or_else(PoisonError::into_inner).insert(ino.0, Instant::now());
            }
            Ok(())
        })
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        if let Err(e) = self.0.alive() {
            return reply.error(e);
        }
        let m = self.0.model();
        let Some(Content::Dir(e)) = m.content(ino.0) else { return reply.error(Errno::ENOTDIR) };
        let dots = [(ino.0, FileType::Directory, OsStr::new(".")), (ino.0, FileType::Directory, OsStr::new(".."))];
        let children = e.iter().map(|(name, child)| {
            let kind = match m.content(*child) {
                Some(Content::Dir(_)) => FileType::Directory,
                _ => FileType::RegularFile,
            };
            (*child, kind, name.as_os_str())
        });
        for (i, (child, kind, name)) in dots.into_iter().chain(children).enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok()
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.empty(reply, |m| m.sync(ino.0))
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 24, 1 << 23, 1 << 23, 1 << 20, 1 << 19, 4096, 255, 4096)
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if mode != 0 {
            return reply.error(Errno::EOPNOTSUPP);
        }
        self.empty(reply, |m| {
            let len = m.read(ino.0, 0, usize::MAX)?.len() as u64;
            m.set_len(ino.0, len.max(offset + length))
        })
    }
}

/// How a power cut treats what was not synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// Everything not synced is gone.
    Drop,
    /// Each file keeps a prefix of its unsynced writes, in order, the last
    /// of them torn at a `sector` boundary (a disk that wrote part of its
    /// queue, and part of the last request, in order); `seed` picks how
    /// much. Unsynced name changes are gone.
    Torn {
        /// 512 or 4096.
        sector: u64,
        /// Picks each file's prefix and tear.
        seed: u64,
    },
}

/// What a cut kept: the image, and how many bytes of unsynced writes it
/// tore into and dropped.
#[derive(Debug)]
pub struct CutReport {
    /// The persisted image the file system now holds.
    pub image: Image,
    /// Inodes whose unsynced changes were dropped (in part or whole).
    pub inodes_with_losses: usize,
}

/// A mounted file system; unmounted when dropped.
pub struct Mount {
    path: PathBuf,
    shared: Arc<Shared>,
    session: Option<fuser::BackgroundSession>,
}

/// Why FUSE cannot be mounted here (`None`: it can).
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("mounting the forgetful file system needs root (mount(2) on /dev/fuse)".into());
    }
    match std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        Ok(_) => None,
        Err(e) => Some(format!("/dev/fuse cannot be opened: {e}")),
    }
}

impl Mount {
    /// Mounts `model` at `path` (an existing empty directory).
    pub fn new(path: &Path, model: Model) -> std::io::Result<Mount> {
        // SAFETY: getuid and getgid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let shared = Arc::new(Shared {
            model: Mutex::new(model),
            open: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
            collected: Mutex::new(0),
            last_sync: Mutex::new(HashMap::new()),
            uid,
            gid,
        });
        let mut cfg = fuser::Config::default();
        cfg.mount_options = vec![
            fuser::MountOption::FSName("forgetfs".into()),
            fuser::MountOption::Subtype("forgetfs".into()),
            fuser::MountOption::DefaultPermissions,
        ];
        cfg.acl = fuser::SessionACL::All;
        cfg.n_threads = Some(2);
        let session = fuser::spawn_mount(Fs(shared.clone()), path, &cfg)?;
        Ok(Mount { path: path.to_path_buf(), shared, session: Some(session) })
    }

    /// Mounts an empty file system at `path`.
    pub fn empty(path: &Path, names: crate::model::Names, record: bool) -> std::io::Result<Mount> {
        Self::new(path, Model::new(names, record))
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on the model (the log, the image, the pending changes).
    pub fn with<R>(&self, f: impl FnOnce(&mut Model) -> R) -> R {
        f(&mut self.shared.model())
    }

    /// How many operations were recorded so far.
    pub fn log_len(&self) -> usize {
        self.with(|m| m.log_len())
    }

    /// Cuts the power: every later operation fails with EIO until
    /// [`Mount::revive`], and the file system holds only what `how` keeps.
    /// Kill the processes that used it before reviving it.
    pub fn cut(&self, how: Cut) -> CutReport {
        let mut m = self.shared.model();
        self.shared.dead.store(true, Ordering::Release);
        let losses = m.pending().len();
        let image = match how {
            Cut::Drop => m.crash_image(&|_, _| Keep::NONE),
            Cut::Torn { sector, seed } => m.crash_image(&|ino, pending| torn_keep(ino, pending, sector, seed)),
        };
        m.cut(image.clone());
        CutReport { image, inodes_with_losses: losses }
    }

    /// When the last fsync of a file was applied (`None`: never): after a
    /// cut, the last one the cut kept. Every write to a file applied
    /// before its fsync is persisted by it.
    pub fn last_sync(&self) -> Option<Instant> {
        self.shared.last_sync.lock().unwrap_or_else(PoisonError::into_inner).values().copied().max()
    }

    /// The earliest of the last fsyncs of the files in the directory `rel`
    /// (relative to the mount): every write applied to any of them before
    /// it is persisted, e.g. everything a store wrote to its journals.
    /// `None`: no such directory, no file in it, or one never synced.
    pub fn last_sync_in(&self, rel: &Path) -> Option<Instant> {
        let m = self.shared.model();
        let mut ino = crate::model::ROOT;
        for part in rel.iter() {
            ino = m.lookup(ino, part).ok()?;
        }
        let Some(Content::Dir(entries)) = m.content(ino) else { return None };
        let stamps = self.shared.last_sync.lock().unwrap_or_else(PoisonError::into_inner);
        let files = entries.values().filter(|c| matches!(m.content(**c), Some(Content::File(_))));
        files.map(|child| stamps.get(child).copied()).collect::<Option<Vec<Instant>>>()?.into_iter().min()
    }

    /// Powers the file system on again after a [`Mount::cut`].
    pub fn revive(&self) {
        self.shared.dead.store(false, Ordering::Release);
    }

    /// Unmounts (what dropping does, with the error).
    pub fn unmount(mut self) -> std::io::Result<()> {
        self.unmount_inner()
    }

    fn unmount_inner(&mut self) -> std::io::Result<()> {
        let Some(s) = self.session.take() else { return Ok(()) };
        // A plain unmount may find the mount busy (EBUSY: the kernel still
        // holds an inode of it); then detach it, which ends the session once
        // the last reference goes.
        let res = s.umount_and_join();
        if res.is_err() || mounted(&self.path) {
            force_unmount(&self.path);
        }
        match res {
            Err(e) if mounted(&self.path) => Err(e),
            _ => Ok(()),
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = self.unmount_inner();
    }
}

/// Whether `path` is a mount point now (`/proc/self/mounts`).
pub fn mounted(path: &Path) -> bool {
    let Ok(p) = path.canonicalize().or_else(|_| Ok::<_, ()>(path.to_path_buf())) else { return false };
    let want = p.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mounts")
        .map(|t| t.lines().any(|l| l.split_whitespace().nth(1) == Some(want.as_str())))
        .unwrap_or(false)
}

/// Detaches whatever is mounted at `path`: `umount2(MNT_DETACH)`, else
/// `fusermount3 -u -z` (a stale FUSE mount blocks whoever touches it).
pub fn force_unmount(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    if let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) {
        // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
            return;
        }
    }
    let _ = std::process::Command::new("fusermount3").arg("-u").arg("-z").arg(path).status();
}

/// A deterministic pick, from `seed` and the inode, of a prefix of its
/// unsynced changes whose last write is torn at a `sector` boundary.
fn torn_keep(ino: Ino, pending: &[crate::model::FsChange], sector: u64, seed: u64) -> Keep {
    if pending.iter().any(|c| !matches!(c, crate::model::FsChange::Write { .. } | crate::model::FsChange::SetLen(_))) {
        // A directory: names are never torn; unsynced ones are gone.
        return Keep::NONE;
    }
    let mut x = seed ^ ino.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let n = (next() % (pending.len() as u64 + 1)) as usize;
    if n == 0 {
        return Keep::NONE;
    }
    let torn = match &pending[n - 1] {
        crate::model::FsChange::Write { off, data } => {
            let t = tears(*off, data.len(), sector);
            (!t.is_empty()).then(|| t[(next() % t.len() as u64) as usize])
        }
        _ => None,
    };
    Keep { changes: n, torn }
}
