//! Data directories across releases, through the real binary: the format
//! marker a server writes (`FORMAT`: the format and the release that last
//! wrote the directory), a directory of a newer format refused untouched
//! (exit 2, a message naming both formats), the committed directories of
//! an older release opened and marked, and `inspect` showing both.

use hf3fs_meta::durable::format;
use hf3fs_meta::release;
use serde_json::{json, Value};
use std::path::Path;
use testkit::process::{command, ServerProcess, Started};
use testkit::store::contents;

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
        }
    }
}

fn inspect(dir: &Path) -> (Option<i32>, Value, String) {
    let o = command().args(["inspect", "--json", "--data-dir"]).arg(dir).output().expect("inspect");
    let v = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (o.status.code(), v, String::from_utf8_lossy(&o.stderr).into_owned())
}

fn this_release() -> Value {
    json!({"format": format::CURRENT, "written_by": {"version": release::VERSION, "commit": release::COMMIT}})
}

#[test]
fn a_directory_of_a_newer_format_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = ServerProcess::serve_durable(dir.path(), &[]);
    let r = s.client().request("POST", "/rank/0/initialize", &[], br#"{"num_pages": 8}"#);
    assert_eq!(r.status, 200, "{r:?}");
    s.signal("TERM");
    s.assert_exit_0();
    // The server recorded the format and itself as the last writer.
    let marker = std::fs::read_to_string(dir.path().join(format::FILE)).expect("the marker");
    assert!(marker.contains(&format!("format {}", format::CURRENT)), "{marker}");
    assert!(marker.contains(&format!("written_by {} {}", release::VERSION, release::COMMIT)), "{marker}");
    let (code, v, err) = inspect(dir.path());
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["format"], this_release(), "{v}");

    // A later release wrote it: its format is one this release does not know.
    let newer = format::CURRENT + 1;
    let bumped = marker.replace(&format!("format {}", format::CURRENT), &format!("format {newer}"));
    let bumped = bumped
        .replace(&format!("written_by {} {}", release::VERSION, release::COMMIT), "written_by 9.9.0 0f0f0f0f0f0f");
    std::fs::write(dir.path().join(format::FILE), bumped).unwrap();
    let before = contents(dir.path());
    let Started::Exited(status, log) = ServerProcess::start_durable(dir.path(), &[]) else {
        panic!("a server started on a directory of format {newer}");
    };
    assert_eq!(status.code(), Some(2), "{}", log.join("\n"));
    let line = log.iter().find(|l| l.contains("cannot open the data directory")).expect("the refusal").clone();
    assert!(line.contains(&format!("format {newer}")), "names the directory's format: {line}");
    assert!(line.contains(&format!("formats {} to {}", format::OLDEST, format::CURRENT)), "and this release's: {line}");
    assert!(line.contains("9.9.0") && line.contains(release::VERSION), "and both releases: {line}");
    assert!(contents(dir.path()) == before, "the refused directory was changed");
    // inspect refuses it too (recovery refuses), and changes nothing either.
    let (code, _, err) = inspect(dir.path());
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(&format!("format {newer}")), "{err}");
    assert!(contents(dir.path()) == before, "inspect changed the refused directory");
}

/// See tests/data/README.md for what the directories hold.
#[test]
fn the_previous_releases_directories_open_and_are_marked_as_written_by_this_one() {
    for name in ["pre-issue20-sigterm", "pre-issue20-sigkill", "release-0.1.0-sigterm"] {
        let dir = tempfile::tempdir().unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name);
        copy_tree(&src, dir.path());
        let (code, v, err) = inspect(dir.path());
        assert_eq!(code, Some(0), "{name}: {err}");
        assert_eq!(v["format"], json!({"format": null, "written_by": null}), "{name}: unmarked, {v}");
        let text = command().args(["inspect", "--data-dir"]).arg(dir.path()).output().unwrap();
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(text.contains("format unmarked"), "{name}: {text}");

        let mut s = ServerProcess::serve_durable(dir.path(), &[]);
        let key = format!("{:032x}", 1);
        let r = s.client().request("POST", "/keys/batch_exists", &[], json!({"keys": [key]}).to_string().as_bytes());
        assert_eq!((r.status, r.json()["exists"].clone()), (200, json!([true])), "{name}: key 1 is complete: {r:?}");
        if name.starts_with("release-0.1.0") {
            // Format 2: key 5's reservation was journaled, and comes back.
            let r = s.client().request("GET", "/stats", &[], b"").json();
            assert_eq!(r["ranks"][0]["reserved"], json!(1), "{name}: {r}");
        }
        s.signal("TERM");
        s.assert_exit_0();
        let (code, v, err) = inspect(dir.path());
        assert_eq!(code, Some(0), "{name}: {err}");
        assert_eq!(v["format"], this_release(), "{name}: {v}");
    }
}
