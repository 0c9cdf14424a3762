//! Runs the Python test suites in `tests/python` (a vLLM-style and an
//! SGLang-style `requests`/urllib3 client against the real binary, and the
//! engines' own client classes taken from their wheels at test time) as
//! part of `cargo test`, one test each.
//!
//! The interpreter is `$HF3FS_META_PYTHON` (default `python3`); it needs the
//! packages of `tests/python/requirements.txt`. `.ci/run` makes a venv with
//! them and points `HF3FS_META_PYTHON` at it. Without them the suites are
//! skipped with a note on the terminal saying how to run them; with
//! `HF3FS_META_REQUIRE_ALL` set (`.ci/run` sets it) a missing interpreter
//! or package is a failure, so a green CI run means the client tests ran.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use testkit::skip;

/// pytest must finish within this (the suite takes well under a minute).
const DEADLINE: Duration = Duration::from_secs(600);

const HOW_TO_FIX: &str = "run `.ci/run`, or create a venv with \
     `python3 -m venv .venv && .venv/bin/pip install -r tests/python/requirements.txt` \
     and set HF3FS_META_PYTHON=.venv/bin/python, then `cargo test --test process python_client`";

fn python() -> String {
    std::env::var("HF3FS_META_PYTHON").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "python3".to_string())
}

/// Waits for `child` with a bounded deadline, collecting stdout and stderr.
fn wait_bounded(mut child: Child, what: &str) -> (std::process::ExitStatus, String) {
    let mut out = child.stdout.take().expect("stdout piped");
    let mut err = child.stderr.take().expect("stderr piped");
    let out_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() > DEADLINE => {
                let _ = child.kill();
                let _ = child.wait();
                let out = out_reader.join().unwrap_or_default();
                panic!("{what} did not finish within {DEADLINE:?}; output so far:\n{}", String::from_utf8_lossy(&out));
            }
            // Polling a child process: the pause only paces the poll.
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("waiting for {what}: {e}"),
        }
    };
    let mut text = String::from_utf8_lossy(&out_reader.join().unwrap_or_default()).into_owned();
    let err = err_reader.join().unwrap_or_default();
    if !err.is_empty() {
        text.push_str("\n--- stderr ---\n");
        text.push_str(&String::from_utf8_lossy(&err));
    }
    (status, text)
}

/// The number in pytest's closing "N passed" line.
fn passed_count(output: &str) -> u64 {
    let Some(line) = output.lines().rev().find(|l| l.contains(" passed")) else {
        return 0;
    };
    line.split([',', ' '])
        .collect::<Vec<_>>()
        .windows(2)
        .find(|w| w[1] == "passed")
        .and_then(|w| w[0].parse().ok())
        .unwrap_or(0)
}

/// Runs pytest on `args` (paths and options under the repository root) and
/// checks that it passed, ran something and skipped nothing. Without the
/// interpreter or its packages, skips (see the module note).
fn run_pytest(args: &[&str]) {
    run_pytest_with(args, &[], Network::Shared);
}

/// Where pytest and everything it starts listen.
#[derive(Clone, Copy, PartialEq)]
enum Network {
    /// This process's network namespace (the suites bind loopback only).
    Shared,
    /// A network namespace of its own, with only its loopback up, that
    /// ends with pytest (`unshare --net --map-root-user`): for a suite
    /// that starts a program which binds every address.
    Own,
}

/// [`run_pytest`] with `env` set for pytest, in `network`.
fn run_pytest_with(args: &[&str], env: &[(&str, &str)], network: Network) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = env!("CARGO_BIN_EXE_hf3fs-meta");
    let py = python();

    // The interpreter and the packages, first, so that a missing one says
    // what to do instead of burying it in a traceback.
    let probe = Command::new(&py)
        .args([
            "-c",
            "import requests, urllib3, pytest, prometheus_client, orjson, fastapi, pybind11, zmq, msgspec; print(requests.__version__)",
        ])
        .current_dir(root)
        .stdin(Stdio::null())
        .output();
    match probe {
        Err(e) => {
            return skip(&format!("tests/python (cannot run the Python interpreter `{py}`: {e})"), HOW_TO_FIX);
        }
        Ok(o) if !o.status.success() => {
            let why = String::from_utf8_lossy(&o.stderr);
            let last = why.lines().last().unwrap_or("").to_string();
            return skip(&format!("tests/python (packages missing from `{py}`: {last})"), HOW_TO_FIX);
        }
        Ok(_) => {}
    }

    let mut command = match network {
        Network::Shared => Command::new(&py),
        Network::Own => {
            let mut c = Command::new("unshare");
            c.args(["--net", "--map-root-user", "--", "sh", "-c", r#"ip link set lo up && exec "$@""#, "sh", &py]);
            c
        }
    };
    let child = command
        .args(["-m", "pytest", "-q"])
        .args(args)
        .current_dir(root)
        .env("HF3FS_META_BIN", bin)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONUNBUFFERED", "1")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start `{py} -m pytest`: {e}.\nTo fix: {HOW_TO_FIX}"));
    let (status, output) = wait_bounded(child, "pytest");

    // pytest exits 5 when it collected no test: that is a failure too.
    assert!(status.success(), "pytest failed ({status}; exit 5 means no test was collected):\n{output}");
    let passed = passed_count(&output);
    assert!(passed > 0, "pytest reported no passing test:\n{output}");
    assert!(!output.contains(" skipped"), "pytest skipped tests; every test of tests/python must run:\n{output}");
    println!("{output}");
}

/// The SGLang suite, on its own.
const SGLANG_SUITE: &str = "tests/python/test_sglang_client.py";

/// The engines' own clients (vLLM's and SGLang's `Hf3fsGlobalMetadataClient`,
/// both through the relay across a failover with real etcd, both with two
/// tenants each at once, and three tenants' deployments on a replicated
/// cluster across failovers and a restart; `/keys/longest_prefix` against
/// the engines' own key chains, SGLang's native hash compiled from its
/// wheel's source with g++; the KV events decoded with the engines' own
/// event classes), read out of their pinned wheels, which it downloads once
/// into `${XDG_CACHE_HOME:-~/.cache}/hf3fs-meta/wheels`; see engine_wheels.py).
const ENGINE_SUITES: [&str; 7] = [
    "tests/python/test_engine_client_vllm.py",
    "tests/python/test_engine_client_sglang.py",
    "tests/python/test_engine_client_ha.py",
    "tests/python/test_longest_prefix.py",
    "tests/python/test_engine_client_tenants.py",
    "tests/python/test_engine_client_tenants_ha.py",
    "tests/python/test_kv_events.py",
];

/// NVIDIA Dynamo's standalone KV indexer fed by the server's KV events,
/// with Dynamo's own interpreter (`$HF3FS_META_DYNAMO_PYTHON`, default
/// `.venv-dynamo/bin/python`: `ai-dynamo-runtime` of
/// tests/python/requirements-dynamo.txt, in a venv of its own).
const DYNAMO_SUITE: &str = "tests/python/test_kv_events_dynamo.py";

const DYNAMO_HOW_TO_FIX: &str = "run `.ci/run`, or `python3 -m venv .venv-dynamo && \
     .venv-dynamo/bin/pip install -r tests/python/requirements-dynamo.txt` \
     (or set HF3FS_META_DYNAMO_PYTHON to an interpreter with ai-dynamo-runtime)";

#[test]
fn vllm_python_client_suite() {
    let mut args = vec!["tests/python", "--ignore", SGLANG_SUITE, "--ignore", DYNAMO_SUITE];
    for s in ENGINE_SUITES {
        args.extend(["--ignore", s]);
    }
    run_pytest(&args);
}

#[test]
fn engine_client_suites() {
    run_pytest(&ENGINE_SUITES);
}

#[test]
fn dynamo_indexer_suite() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dynamo = std::env::var("HF3FS_META_DYNAMO_PYTHON")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| root.join(".venv-dynamo/bin/python").display().to_string());
    let probe = Command::new(&dynamo).args(["-m", "dynamo.indexer", "--help"]).stdin(Stdio::null()).output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            let why = String::from_utf8_lossy(&o.stderr);
            let last = why.lines().last().unwrap_or("").to_string();
            return skip(&format!("{DYNAMO_SUITE} (`{dynamo} -m dynamo.indexer` fails: {last})"), DYNAMO_HOW_TO_FIX);
        }
        Err(e) => return skip(&format!("{DYNAMO_SUITE} (cannot run `{dynamo}`: {e})"), DYNAMO_HOW_TO_FIX),
    }
    // The indexer's HTTP listener binds every address (the wheel has no
    // flag for its host), so the suite runs in a network namespace of its
    // own; the vLLM wheel it takes its client from is fetched before, out
    // here, where the package index is reachable.
    let fetch = Command::new(python())
        .args(["-c", "import engine_wheels; engine_wheels.fetch(engine_wheels.VLLM)"])
        .current_dir(root.join("tests/python"))
        .stdin(Stdio::null())
        .output();
    match fetch {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!("cannot fetch the pinned vLLM wheel:\n{}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            return skip(&format!("tests/python (cannot run the Python interpreter `{}`: {e})", python()), HOW_TO_FIX)
        }
    }
    let unshare = Command::new("unshare").args(["--net", "--map-root-user", "true"]).stdin(Stdio::null()).output();
    if !matches!(&unshare, Ok(o) if o.status.success()) {
        return skip(
            &format!(
                "{DYNAMO_SUITE} (no network namespace of its own: `unshare --net --map-root-user` fails: {unshare:?})"
            ),
            "run as root or allow unprivileged user namespaces (kernel.unprivileged_userns_clone=1)",
        );
    }
    run_pytest_with(&[DYNAMO_SUITE], &[("HF3FS_META_DYNAMO_PYTHON", &dynamo)], Network::Own);
}

#[test]
fn sglang_python_client_suite() {
    run_pytest(&[SGLANG_SUITE]);
}

#[test]
fn passed_count_reads_pytest_summaries() {
    assert_eq!(passed_count("..\n14 passed in 19.07s\n"), 14);
    assert_eq!(passed_count("1 failed, 3 passed, 2 warnings in 1.0s"), 3);
    assert_eq!(passed_count("no tests ran in 0.01s"), 0);
}
