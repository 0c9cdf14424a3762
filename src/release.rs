//! Which release this binary is: its version, the commit it was built
//! from, and what it speaks and reads across releases (CHANGELOG.md names
//! the same for every release).
//!
//! `hf3fs-meta --version`, `/health`, `/stats`, the
//! `hf3fs_meta_build_info{version,commit}` gauge and the log's first line
//! all read this module. The replication protocol versions are
//! [`crate::ha::replicate::wire`]'s; the data-directory formats
//! [`crate::durable::format`]'s.

use crate::core::Release;
use crate::durable::format;
use crate::ha::replicate::wire;

/// The release (semver, the crate's version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit the binary was built from (12 hex digits), or `unknown`
/// when built outside a checkout without `HF3FS_META_COMMIT` (`build.rs`).
pub const COMMIT: &str = env!("HF3FS_META_COMMIT");

/// Both, as the binary passes them down to the layers (the HTTP layer's
/// settings, HA's host): only this crate embeds the commit.
pub const RELEASE: Release = Release { version: VERSION, commit: COMMIT };

/// `--version`'s text: release, commit, and what it speaks and reads.
pub static LONG_VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "{VERSION} (commit {COMMIT}; replication protocol {}-{}; data-directory format {}, reads {}-{})",
        wire::MIN_VERSION,
        wire::VERSION,
        format::CURRENT,
        format::OLDEST,
        format::CURRENT
    )
});
