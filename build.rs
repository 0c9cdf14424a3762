//! Embeds the git commit the binary is built from as `HF3FS_META_COMMIT`
//! (`hf3fs-meta --version`, `/health`, `/stats`, the build-info metric and
//! the log's first line name it).
//!
//! The commit is, in order: the `HF3FS_META_COMMIT` environment variable
//! (a packager building from a tarball sets it), else `git rev-parse HEAD`
//! in the source tree, else `unknown` (a wheel or a tarball built without
//! git or outside a checkout). It never fails the build.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=HF3FS_META_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into()));
    let from_env = std::env::var("HF3FS_META_COMMIT").ok().filter(|s| !s.trim().is_empty());
    let commit = from_env.clone().or_else(|| git(&dir, &["rev-parse", "--short=12", "HEAD"]));
    if from_env.is_none() {
        // Rebuild when HEAD moves: HEAD itself (a checkout), the ref it
        // names (a commit), and packed-refs (a ref packed by gc). In a
        // worktree HEAD is in its own git dir, refs in the common one.
        let abs = |p: String| if Path::new(&p).is_absolute() { PathBuf::from(p) } else { dir.join(p) };
        if let Some(git_dir) = git(&dir, &["rev-parse", "--git-dir"]).map(abs) {
            let common = git(&dir, &["rev-parse", "--git-common-dir"]).map(abs).unwrap_or(git_dir.clone());
            let head_ref = git(&dir, &["symbolic-ref", "-q", "HEAD"]).map(|r| common.join(r));
            // Only files that exist: cargo reruns a script on every build
            // for a path that does not.
            for p in [Some(git_dir.join("HEAD")), head_ref, Some(common.join("packed-refs"))].into_iter().flatten() {
                if p.exists() {
                    println!("cargo:rerun-if-changed={}", p.display());
                }
            }
        }
    }
    println!("cargo:rustc-env=HF3FS_META_COMMIT={}", commit.as_deref().unwrap_or("unknown").trim());
}
