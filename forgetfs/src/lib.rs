//! A file system that forgets what was never synced: power loss for tests.
//!
//! `SIGKILL` loses nothing a process wrote (the page cache survives it), so
//! it cannot test a promise about power loss. This crate serves, over FUSE,
//! a file system whose writes, creations, renames, truncations and unlinks
//! are visible at once but persist only when an fsync says so
//! ([`model`]: the rules, POSIX's strictly, optionally ext4's journal). On
//! command ([`Mount::cut`]) it cuts the power: it drops everything not
//! persisted, or keeps a prefix of each file's unsynced writes torn at a
//! 512-byte or 4 KiB boundary, and holds the persisted image from then on
//! (a restart runs on it; [`model::Image::write_to`] writes it out).
//!
//! With recording on, every operation is logged ([`model::FsOp`]); the
//! crash-state explorer (`tests/explore/`) replays a run's log through a
//! fresh [`Model`] and, at every fsync, materializes the crash states POSIX
//! allows and opens each with the durable layer's real recovery.
//!
//! Used by tests and the fault harness only. Mounting needs root and
//! `/dev/fuse` ([`unavailable`] says why not); the mount is the pure-Rust one
//! of `fuser` (mount(2) as root), and every [`Mount`] unmounts when dropped,
//! falling back to `umount2(MNT_DETACH)` and `fusermount3 -u -z`.

mod fs;
pub mod model;

pub use fs::{force_unmount, mounted, unavailable, Cut, CutReport, Mount};
pub use model::{Image, Model, Names};
