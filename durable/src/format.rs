//! The data directory's format marker: which state format a directory is
//! in and which release last wrote it, in a small text file at its root
//! (`FORMAT`).
//!
//! ```text
//! hf3fs-meta data directory
//! format 2
//! written_by 0.2.0 0123456789ab
//! ```
//!
//! The formats: **1**, bindings only (before reservations and held pages
//! were durable); **2**, `P` chunks of reserved and held pages in the
//! checkpoint and the reserve and hold records in the log
//! ([`super::codec`]). A directory without the file was written by a
//! release before the marker (0.1.0 or earlier, format 1 or 2): it opens as
//! before, and gets the file on its first open by this release.
//!
//! A release opens every format up to [`CURRENT`] and refuses a directory
//! of a newer one *before it changes anything in it* (no lock file made,
//! no keyspace opened): [`check`] reads the file and nothing else. The file
//! is written ([`record`]) once the directory has opened, by a rename of a
//! complete temporary file, so it is never seen half-written. The previous
//! release (0.1.0) ignores the file: it looks only at `CURRENT`, its
//! keyspace directories and its `LOCK` at the root.

use super::OpenError;
use std::path::Path;

/// The file's name, at the data directory's root.
pub const FILE: &str = "FORMAT";

/// The state format this release writes.
pub const CURRENT: u32 = 2;

/// The oldest state format this release opens.
pub const OLDEST: u32 = 1;

/// The first line of the file.
const HEADER: &str = "hf3fs-meta data directory";

/// What a directory's marker says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    /// The state format.
    pub format: u32,
    /// The release that last wrote the directory, and its commit.
    pub written_by: Option<(String, String)>,
}

impl Marker {
    /// The marker of release `version` built from `commit` (the binary's).
    pub fn this_release(version: &str, commit: &str) -> Self {
        Marker { format: CURRENT, written_by: Some((version.to_string(), commit.to_string())) }
    }

    /// The file's text.
    pub fn encode(&self) -> String {
        let mut s = format!("{HEADER}\nformat {}\n", self.format);
        if let Some((v, c)) = &self.written_by {
            s.push_str(&format!("written_by {v} {c}\n"));
        }
        s
    }

    /// Reads the file's text; `Err` names what is wrong. Lines it does not
    /// know are ignored (a later release may add some).
    pub fn decode(text: &str) -> Result<Marker, String> {
        let mut lines = text.lines();
        if lines.next().map(str::trim) != Some(HEADER) {
            return Err(format!("its first line is not {HEADER:?}"));
        }
        let (mut format, mut written_by) = (None, None);
        for line in lines {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("format") => {
                    let n = words.next().and_then(|w| w.parse::<u32>().ok());
                    format = Some(n.ok_or_else(|| format!("a format line that names no number: {line:?}"))?);
                }
                Some("written_by") => {
                    let v = words.next().unwrap_or("unknown").to_string();
                    written_by = Some((v, words.next().unwrap_or("unknown").to_string()));
                }
                _ => {}
            }
        }
        Ok(Marker { format: format.ok_or("no format line")?, written_by })
    }
}

/// The marker of `dir` (`Ok(None)`: no file, a directory of a release
/// before the marker, or no directory yet). Reads one file, changes
/// nothing.
pub fn read(dir: &Path) -> Result<Option<Marker>, OpenError> {
    let path = dir.join(FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => Marker::decode(&text)
            .map(Some)
            .map_err(|e| OpenError::Corrupt(format!("{}: {e}; nothing in the directory was changed", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(OpenError::Io(format!("{}: {e}", path.display()))),
    }
}

/// Refuses a directory of a format newer than this release knows, naming
/// both formats and the release that wrote it; reads the marker only, so
/// a refused directory is left exactly as it was.
pub fn check(dir: &Path) -> Result<Option<Marker>, OpenError> {
    let marker = read(dir)?;
    if let Some(m) = marker.as_ref().filter(|m| m.format > CURRENT) {
        let by = m.written_by.as_ref().map_or_else(String::new, |(v, c)| format!(" by hf3fs-meta {v} (commit {c})"));
        return Err(OpenError::Newer(format!(
            "{} is in data-directory format {}, written{by}; this release ({}) reads formats {OLDEST} to \
             {CURRENT}: run a release that knows format {} (CHANGELOG.md); nothing in the directory was changed",
            dir.display(),
            m.format,
            env!("CARGO_PKG_VERSION"),
            m.format
        )));
    }
    Ok(marker)
}

/// Records this release as the last to write `dir` (format [`CURRENT`]):
/// a temporary file renamed over the marker, then the directory synced.
/// Skipped when the marker already says so.
pub fn record(dir: &Path, version: &str, commit: &str) -> std::io::Result<()> {
    let me = Marker::this_release(version, commit);
    if read(dir).ok().flatten().as_ref() == Some(&me) {
        return Ok(());
    }
    let tmp = dir.join(format!("{FILE}.tmp"));
    {
        use std::io::Write as _;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(me.encode().as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join(FILE))?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_round_trips_and_a_newer_format_is_refused_untouched() {
        let m = Marker::this_release("0.2.0", "0123456789ab");
        assert_eq!(Marker::decode(&m.encode()), Ok(m.clone()));
        assert_eq!(
            Marker::decode("hf3fs-meta data directory\nformat 1\nlater_key x\n"),
            Ok(Marker { format: 1, written_by: None })
        );
        assert!(Marker::decode("something else\nformat 2\n").is_err());
        assert!(Marker::decode("hf3fs-meta data directory\nformat two\n").is_err());
        assert!(Marker::decode("hf3fs-meta data directory\n").is_err());

        let dir = tempfile::tempdir().unwrap();
        assert_eq!(check(dir.path()).unwrap(), None, "no marker: a directory of an older release");
        record(dir.path(), "0.2.0", "0123456789ab").unwrap();
        assert_eq!(check(dir.path()).unwrap(), Some(m));
        let newer = Marker { format: CURRENT + 1, written_by: Some(("9.0.0".into(), "abc".into())) };
        std::fs::write(dir.path().join(FILE), newer.encode()).unwrap();
        let e = check(dir.path()).unwrap_err().to_string();
        assert!(e.contains(&format!("format {}", CURRENT + 1)) && e.contains(&format!("{OLDEST} to {CURRENT}")), "{e}");
        assert!(e.contains("9.0.0"), "{e}");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from(FILE)], "nothing made beside the marker");
    }
}
