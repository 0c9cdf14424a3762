//! Which release a server is, as the binary names it: a build fact every
//! layer may report (`/health`, `/stats`, the build-info metric, HA's
//! `P/nodes/` record) but only the binary knows, so it is passed down and
//! only the binary embeds the commit (a new commit rebuilds no layer).

/// A release: its version and the commit it was built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    /// The release (semver).
    pub version: &'static str,
    /// The git commit it was built from (12 hex digits), or `unknown`.
    pub commit: &'static str,
}
