//! The real binary: its command line, its startup log, signals.

use serde_json::{json, Value};
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;
use testkit::process::{bin, clean_env, command, ServerProcess};
use testkit::{Client, FAILSAFE};

/// Every flag of the command line.
const FLAGS: [&str; 63] = [
    "--host",
    "--port",
    "--world-size",
    "--log-level",
    "--log-format",
    "--workers",
    "--reservation-ttl",
    "--max-body-bytes",
    "--max-keys-per-request",
    "--max-key-len",
    "--max-ranks",
    "--max-pages-per-rank",
    "--max-connections",
    "--header-timeout",
    "--body-timeout",
    "--shutdown-timeout",
    "--admin-token",
    "--auth-all",
    "--data-dir",
    "--fsync",
    "--eviction",
    "--evict-high-watermark",
    "--evict-low-watermark",
    "--read-lease",
    "--max-spaces",
    "--expected-keys",
    "--ha",
    "--etcd-endpoints",
    "--ha-cluster",
    "--ha-lease-ttl",
    "--etcd-user",
    "--etcd-password-file",
    "--node-id",
    "--advertise-url",
    "--ha-token-file",
    "--ha-sync",
    "--ha-sync-timeout-ms",
    "--ha-replication-listen",
    "--ha-replication-advertise",
    "--ha-heartbeat-ms",
    "--etcd-ca",
    "--etcd-cert",
    "--etcd-key",
    "--tls-cert",
    "--tls-key",
    "--tls-client-ca",
    "--tls-ca",
    "--plain-listen",
    "--tenants",
    "--kv-events-endpoint",
    "--kv-events-bind",
    "--kv-events-replay-endpoint",
    "--kv-events-topic",
    "--kv-events-buffer-steps",
    "--kv-events-hwm",
    "--kv-events-format",
    "--kv-events-medium",
    "--kv-events-hash",
    "--kv-events-block-size",
    "--kv-events-data-parallel-rank",
    "--kv-events-heartbeat-ms",
    "--help",
    "--version",
];

#[test]
fn help_lists_every_flag() {
    let out = command().arg("--help").output().expect("run --help");
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8(out.stdout).expect("UTF-8");
    for flag in FLAGS {
        assert!(
            help.lines().any(|l| l.split([' ', ',', '=']).any(|w| w == flag)),
            "--help does not list {flag}:\n{help}"
        );
    }
    // And the parser agrees: every long flag it knows is in the help, but
    // the hidden test-only ones (--durable-faults).
    use clap::CommandFactory;
    for arg in hf3fs_meta::config::Config::command().get_arguments() {
        if arg.is_hide_set() {
            let long = arg.get_long().expect("hidden flags are long");
            assert!(!help.contains(&format!("--{long}")), "hidden --{long} shows in --help");
            continue;
        }
        if let Some(long) = arg.get_long() {
            assert!(help.contains(&format!("--{long}")), "--{long} missing from --help");
            assert!(FLAGS.contains(&format!("--{long}").as_str()), "new flag --{long}: add it to FLAGS");
        }
    }
    let out = command().arg("--version").output().expect("run --version");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(env!("CARGO_PKG_VERSION")), "{text}");
    assert!(text.contains(&format!("commit {}", hf3fs_meta::release::COMMIT)), "{text}");
    assert!(text.contains("replication protocol 2-4") && text.contains("data-directory format 2"), "{text}");
}

/// Every subcommand, with the document its `--help` names.
const SUBCOMMANDS: [(&str, &str); 5] = [
    ("relay", "docs/ha.md"),
    ("bench", "docs/bench.md"),
    ("inspect", "docs/operations.md"),
    ("verify", "docs/operations.md"),
    ("ctl", "docs/ha.md"),
];

#[test]
fn help_lists_every_subcommand_and_each_names_its_document() {
    let out = command().arg("--help").output().expect("run --help");
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8(out.stdout).expect("UTF-8");
    let commands = help.split("Commands:\n").nth(1).expect("a Commands section").split("\n\n").next().unwrap();
    use clap::CommandFactory;
    let parser = hf3fs_meta::config::Config::command();
    let known: Vec<&str> = parser.get_subcommands().map(|c| c.get_name()).filter(|n| *n != "help").collect();
    assert_eq!(known, SUBCOMMANDS.map(|(n, _)| n), "a new subcommand: add it to SUBCOMMANDS");
    for (name, doc) in SUBCOMMANDS {
        // Listed on a line of its own with its description.
        let line = commands.lines().find(|l| l.trim_start().starts_with(&format!("{name} "))).unwrap_or_else(|| {
            panic!("--help does not list {name}:\n{help}");
        });
        let about = parser.find_subcommand(name).and_then(|c| c.get_about()).expect("a description").to_string();
        assert!(about.contains(doc), "{name}'s description names no {doc}: {about}");
        assert!(line.contains(about.split_whitespace().next().unwrap()), "{name}'s line has no description: {line}");
        // Its own help: usage under the binary's name, and the document.
        let out = command().args([name, "--help"]).output().expect("run SUBCOMMAND --help");
        assert!(out.status.success(), "{name} --help: {out:?}");
        let text = String::from_utf8(out.stdout).expect("UTF-8");
        assert!(text.contains(&format!("Usage: hf3fs-meta {name}")), "{name} --help:\n{text}");
        assert!(text.contains(doc), "{name} --help names no {doc}:\n{text}");
        assert!(!text.contains("metadata server for vLLM"), "{name} --help describes the server:\n{text}");
    }
    // The relay, parsed apart from the server's flags, has the same help.
    let out = command().args(["relay", "--help"]).output().expect("run relay --help");
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    assert!(text.starts_with("Forward a local port to the HA cluster's serving leader"), "{text}");
    assert!(text.contains("--etcd-endpoints") && text.contains("--log-level"), "{text}");
    assert!(!text.contains("--data-dir"), "relay --help lists the server's flags:\n{text}");
}

#[test]
fn bad_flags_exit_nonzero_with_usage() {
    for args in [
        &["--world-size", "0"][..],
        &["--port", "70000"],
        &["--host", "not-an-ip"],
        &["--auth-all"],
        &["--log-format", "xml"],
        &["--no-such-flag"],
        &["--max-ranks", "0"],
        &["--expected-keys", "-5"],
    ] {
        let out = command().args(args).stdin(Stdio::null()).output().expect("run");
        assert!(!out.status.success(), "{args:?} was accepted");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).starts_with("error:"), "{args:?}: {out:?}");
    }
}

/// `--expected-keys` sizes the key index at start (`/stats` counts its
/// slots); a size the hard cap refuses is a configuration error (exit 2)
/// before anything listens.
#[test]
fn expected_keys_sizes_the_index() {
    let slots = |args: &[&str]| {
        let mut p = ServerProcess::serve(args);
        let st = p.client().request("GET", "/stats", &[], b"").json();
        p.signal("TERM");
        p.assert_exit_0();
        st["index_slots"].as_u64().expect("index_slots")
    };
    // The default floor, 2^12 keys: 2^13 slots.
    assert_eq!(slots(&[]), 1 << 13);
    // 10^5 keys: room for 5/4 of them, to a power of two (2^17 slots).
    assert_eq!(slots(&["--expected-keys", "100000"]), 1 << 17);
    // Below the floor, the floor.
    assert_eq!(slots(&["--expected-keys", "10"]), 1 << 13);
    let out = command()
        .args(["--host", "127.0.0.1", "--port", "0", "--expected-keys", "4294967296"])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid configuration") && err.contains("--expected-keys"), "{err}");
}

#[test]
fn startup_log_names_the_effective_config() {
    let mut p = ServerProcess::serve(&[
        "--world-size",
        "3",
        "--reservation-ttl",
        "77",
        "--max-body-bytes",
        "12345",
        "--max-connections",
        "9",
        "--workers",
        "1",
        "--admin-token",
        "hush",
    ]);
    // The log's first line says which release this is.
    let first = p.log.first().expect("a first line");
    let me = format!("hf3fs-meta {} (commit {};", hf3fs_meta::release::VERSION, hf3fs_meta::release::COMMIT);
    assert!(first.contains(&me) && first.contains("starting"), "{first}");
    let line = p.log.iter().find(|l| l.contains("listening")).cloned().expect("startup line");
    for want in [
        format!("addr={}", p.addr),
        "workers=1".to_string(),
        "world_size=Some(3)".to_string(),
        "reservation_ttl_s=77".to_string(),
        "max_body_bytes=12345".to_string(),
        "max_keys_per_request=65536".to_string(),
        "max_key_len=1024".to_string(),
        "max_ranks=1024".to_string(),
        "max_connections=9".to_string(),
        "header_timeout_s=30".to_string(),
        "body_timeout_s=30".to_string(),
        "admin_token=true".to_string(),
        "auth_all=false".to_string(),
        env!("CARGO_PKG_VERSION").to_string(),
    ] {
        assert!(line.contains(&want), "startup line lacks {want:?}: {line}");
    }
    assert!(!line.contains("hush"), "the token itself must not be logged: {line}");
    assert!(line.contains("INFO"), "{line}");
    // It serves, with that configuration.
    let mut c = p.client();
    let st = c.request("GET", "/stats", &[], b"").json();
    assert_eq!(st["world_size"], json!(3));
    assert_eq!(st["reservation_ttl_seconds"], json!(77));
    drop(c);
    p.signal("TERM");
    p.assert_exit_0();
}

#[test]
fn port_zero_logs_the_real_address() {
    let mut p = ServerProcess::spawn(0, &[]);
    let line = p.wait_line(|l| l.contains("listening")).expect("startup line");
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("addr="))
        .and_then(|a| a.parse::<SocketAddr>().ok())
        .unwrap_or_else(|| panic!("no addr= in {line}"));
    assert_ne!(addr.port(), 0, "{line}");
    p.addr = addr;
    let mut c = p.client();
    assert_eq!(c.request("GET", "/health", &[], b"").status, 200);
    drop(c);
    p.signal("INT");
    p.assert_exit_0();
}

#[test]
fn json_log_format() {
    let mut p = ServerProcess::serve(&["--log-format", "json", "--world-size", "2"]);
    let mut c = p.client();
    // Something that logs at error level, with a line of its own.
    let r = c.request("POST", "/keys/confirm_write", &[], br#"{"rank": 5, "confirmations": [["k", 1]]}"#);
    assert_eq!(r.status, 500);
    drop(c);
    p.signal("TERM");
    p.assert_exit_0();
    p.drain();
    assert!(p.log.len() >= 3, "{:?}", p.log);
    let mut parsed = Vec::new();
    for line in &p.log {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        assert!(v["level"].is_string() && v["fields"].is_object() && v["timestamp"].is_string(), "{line}");
        parsed.push(v);
    }
    let start = parsed
        .iter()
        .find(|v| v["fields"]["message"].as_str().is_some_and(|m| m.contains("listening")))
        .expect("startup line");
    assert_eq!(start["level"], json!("INFO"));
    assert_eq!(start["fields"]["addr"], json!(p.addr.to_string()));
    assert_eq!(start["fields"]["world_size"], json!("Some(2)"));
    assert_eq!(start["fields"]["max_connections"], json!(4096));
    let err =
        parsed.iter().find(|v| v["level"] == json!("ERROR")).unwrap_or_else(|| panic!("no error line: {:?}", p.log));
    let msg = err["fields"]["message"].as_str().expect("message");
    assert!(msg.starts_with("Confirm write for keys failed: "), "{msg}");
    assert!(msg.contains("Rank 5 not initialized"), "{msg}");
}

#[test]
fn text_log_has_the_confirm_failure_line() {
    let mut p = ServerProcess::serve(&[]);
    let mut c = p.client();
    assert_eq!(c.request("POST", "/rank/0/initialize", &[], br#"{"num_pages": 4}"#).status, 200);
    let r = c.request("POST", "/keys/confirm_write", &[], br#"{"rank": 0, "confirmations": [["k", 2]]}"#);
    assert_eq!(r.status, 500);
    let detail = r.detail();
    let line = p
        .wait_line(|l| l.contains("Confirm write for keys failed: "))
        .unwrap_or_else(|| panic!("no error line: {:?}", p.log));
    assert!(line.contains("ERROR"), "{line}");
    let message = detail.strip_prefix("Confirmation failed: ").expect("prefix");
    assert!(line.ends_with(&format!("Confirm write for keys failed: {message}")), "{line}\nvs {detail}");
    // Re-initializing with another size: the same 200, and a warning.
    let r = c.request("POST", "/rank/0/initialize", &[], br#"{"num_pages": 8}"#);
    assert_eq!(r.json(), json!({"message": "Rank 0 initialized with 8 pages"}));
    let warn = p
        .wait_line(|l| l.contains("WARN") && l.contains("already initialized"))
        .unwrap_or_else(|| panic!("no size-mismatch warning: {:?}", p.log));
    assert!(warn.contains("existing=4") && warn.contains("requested=8"), "{warn}");
    drop(c);
    p.signal("TERM");
    p.assert_exit_0();
}

/// Signal with idle keep-alive connections open: exit 0, promptly; the
/// connections are closed and new ones refused.
fn graceful_exit_on(sig: &str) {
    let mut p = ServerProcess::serve(&["--shutdown-timeout", "5"]);
    let mut idle: Vec<Client> = (0..2).map(|_| p.client()).collect();
    for c in &mut idle {
        let r = c.request("GET", "/health", &[], b"");
        assert_eq!(r.status, 200);
        assert!(!r.closes());
    }
    p.signal(sig);
    let st = p.wait_exit();
    assert_eq!(st.code(), Some(0), "{st:?}\n{}", p.log.join("\n"));
    for c in &mut idle {
        assert!(c.closed_by_server(), "an idle connection was left open");
    }
    match TcpStream::connect_timeout(&p.addr, Duration::from_secs(5)) {
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}"),
        Ok(_) => panic!("a connection was accepted after exit"),
    }
    p.drain();
    let log = p.log.join("\n");
    let name = if sig == "TERM" { "SIGTERM received" } else { "SIGINT received" };
    assert!(log.contains(name), "{log}");
    assert!(log.contains("stopped"), "{log}");
    assert!(!log.contains("shutdown timeout"), "idle connections must not hold up the exit: {log}");
}

#[test]
fn sigterm_with_idle_connections_exits_0() {
    graceful_exit_on("TERM");
}

#[test]
fn sigint_with_idle_connections_exits_0() {
    graceful_exit_on("INT");
}

#[test]
fn sigterm_lets_a_request_in_flight_finish() {
    let mut p = ServerProcess::serve(&["--shutdown-timeout", "10"]);
    let mut c = p.client();
    assert_eq!(c.request("POST", "/rank/0/initialize", &[], br#"{"num_pages": 4}"#).status, 200);
    // Headers sent; "100 Continue" proves the handler is reading the body.
    let body = br#"{"rank": 0, "keys": [["k", ""]]}"#;
    c.send(
        format!(
            "POST /keys/batch_allocate HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    let interim = c.read_any().expect("100 Continue");
    assert_eq!(interim.status, 100, "{interim:?}");
    p.signal("TERM");
    p.wait_line(|l| l.contains("shutting down")).unwrap_or_else(|| panic!("no shutdown line: {:?}", p.log));
    // The server no longer accepts...
    match TcpStream::connect_timeout(&p.addr, Duration::from_secs(5)) {
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}"),
        Ok(mut s) => {
            // ...or, if the kernel still completed the handshake, serves nothing.
            use std::io::{Read, Write};
            let _ = s.write_all(b"GET /health HTTP/1.1\r\n\r\n");
            s.set_read_timeout(Some(FAILSAFE)).expect("timeout");
            let mut buf = [0u8; 64];
            assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)), "served after shutdown began");
        }
    }
    // ...but the request in flight completes.
    c.send(body);
    let r = c.read_response().expect("the in-flight request is answered");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["results"][0][0], json!("k"));
    assert!(c.closed_by_server(), "the connection closes after its last answer");
    p.assert_exit_0();
}

#[test]
fn shutdown_timeout_bounds_a_stalled_request() {
    let mut p = ServerProcess::serve(&["--shutdown-timeout", "1"]);
    let mut c = p.client();
    // A request in flight (its handler is reading the body) that never completes.
    c.send(b"POST /keys/batch_exists HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 100\r\n\r\n");
    assert_eq!(c.read_any().expect("100 Continue").status, 100);
    c.send(b"{\"keys\": [");
    p.signal("TERM");
    // The process gives up on it after --shutdown-timeout and exits 0.
    p.assert_exit_0();
    let log = p.log.join("\n");
    assert!(log.contains("shutdown timeout"), "{log}");
    assert!(c.closed_by_server());
}

/// The caught-signal mask of a process (Linux: `SigCgt` in /proc/PID/status).
#[cfg(target_os = "linux")]
fn caught_signals(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc status");
    let hex = status.lines().find_map(|l| l.strip_prefix("SigCgt:")).expect("SigCgt line").trim();
    u64::from_str_radix(hex, 16).expect("hex mask")
}

/// Once the server has answered a request, SIGTERM and SIGINT must already
/// be handled: otherwise a signal in that window kills the process with the
/// default action instead of draining and exiting 0.
#[cfg(target_os = "linux")]
#[test]
fn signal_handlers_are_installed_before_the_first_answer() {
    for _ in 0..5 {
        let mut p = ServerProcess::serve(&[]);
        let mut c = p.client();
        assert_eq!(c.request("GET", "/health", &[], b"").status, 200);
        let mask = caught_signals(p.child.id());
        let (sigint, sigterm) = (1u64 << (2 - 1), 1u64 << (15 - 1));
        assert_eq!(mask & sigint, sigint, "SIGINT not handled yet (SigCgt {mask:x})");
        assert_eq!(mask & sigterm, sigterm, "SIGTERM not handled yet (SigCgt {mask:x})");
        drop(c);
        p.signal("TERM");
        p.assert_exit_0();
    }
}

/// The binary started by `sh` after `ulimit <flag> <n>` (the arguments
/// that follow go to the binary), with the same clean environment.
#[cfg(target_os = "linux")]
fn command_under_ulimit(flag: &'static str, n: u64) -> impl Fn() -> Command {
    move || {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &format!("ulimit {flag} {n} && exec \"$0\" \"$@\""), bin().to_str().expect("a UTF-8 path")]);
        clean_env(&mut cmd);
        cmd
    }
}

/// `Max open files` of a process: (soft, hard), `None` for unlimited.
#[cfg(target_os = "linux")]
fn open_file_limits(pid: u32) -> (Option<u64>, Option<u64>) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("read /proc limits");
    let line = limits.lines().find(|l| l.starts_with("Max open files")).expect("Max open files line");
    let mut v = line["Max open files".len()..].split_whitespace().map(|x| x.parse::<u64>().ok());
    (v.next().flatten(), v.next().flatten())
}

/// A soft open-file limit below --max-connections (plus 64 for the rest) is
/// raised to fit, as far as the hard limit allows.
#[cfg(target_os = "linux")]
#[test]
fn soft_open_file_limit_is_raised_to_fit_the_connection_cap() {
    let (_, hard) = open_file_limits(std::process::id());
    let mut p = ServerProcess::serve_with(&command_under_ulimit("-Sn", 100), &["--max-connections", "300"]);
    let want = hard.map_or(364, |h| h.min(364));
    let line = p.wait_line(|l| l.contains("open-file limit")).expect("a log line about the open-file limit");
    let (soft, _) = open_file_limits(p.child.id());
    assert_eq!(soft, Some(want), "{line}");
    if want == 364 {
        assert!(line.contains("raised the soft open-file limit") && line.contains("to=364"), "{line}");
    }
    let mut c = p.client();
    assert_eq!(c.request("GET", "/health", &[], b"").status, 200);
    drop(c);
    p.signal("TERM");
    p.assert_exit_0();
}

/// When even the hard limit leaves no room for --max-connections, the
/// server says so at startup and serves at most what fits (here 100 - 64).
#[cfg(target_os = "linux")]
#[test]
fn hard_open_file_limit_below_the_cap_lowers_it_with_a_warning() {
    let mut p = ServerProcess::serve_with(&command_under_ulimit("-n", 100), &["--max-connections", "4096"]);
    let line = p.wait_line(|l| l.contains("open-file limit")).expect("a warning about the open-file limit");
    assert!(line.contains("WARN") && line.contains("serving at most 36"), "{line}");
    // It serves within that: 36 clients at once, each answered.
    let mut clients: Vec<Client> = (0..36).map(|_| p.client()).collect();
    for c in &mut clients {
        assert_eq!(c.request("GET", "/health", &[], b"").status, 200);
    }
    drop(clients);
    p.signal("TERM");
    p.assert_exit_0();
}

/// The listen backlog is as long as --max-connections (the kernel trims it
/// to net.core.somaxconn), so that every client may connect at once. `ss`
/// shows a listening socket's backlog as its Send-Q.
#[cfg(target_os = "linux")]
#[test]
fn listen_backlog_follows_the_connection_cap() {
    if Command::new("ss").arg("-V").output().is_err() {
        eprintln!("skipped: no `ss` (iproute2) to read the listen backlog with");
        return;
    }
    let somaxconn: u64 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .expect("read somaxconn")
        .trim()
        .parse()
        .expect("somaxconn is a number");
    let mut p = ServerProcess::serve(&["--max-connections", "1500"]);
    let out = Command::new("ss").args(["-Hltn", &format!("sport = :{}", p.addr.port())]).output().expect("run ss");
    let text = String::from_utf8_lossy(&out.stdout);
    let send_q: u64 = text
        .split_whitespace()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no listening socket in ss's answer: {text:?}"));
    assert_eq!(send_q, somaxconn.min(1500), "{text}");
    p.signal("TERM");
    p.assert_exit_0();
}

/// The flags of an HA node that are checked before etcd is called (the
/// endpoint is never reached).
const HA_NODE: [&str; 8] = [
    "--ha",
    "etcd",
    "--etcd-endpoints",
    "http://127.0.0.1:1",
    "--node-id",
    "a",
    "--advertise-url",
    "http://127.0.0.1:0",
];

/// Moved from tests/ha/election.rs: no etcd is needed to refuse.
#[test]
fn an_ha_node_without_a_cluster_secret_is_refused_at_start_up() {
    testkit::process::refused_at_start_up(&HA_NODE, &["--ha-token-file"], "a node without a cluster secret");
}

/// Moved from tests/ha/liveness.rs: no etcd is needed to refuse.
#[test]
fn an_ha_heartbeat_not_below_the_sync_timeout_is_refused_at_start_up() {
    let mut args = HA_NODE.to_vec();
    args.extend(["--ha-sync-timeout-ms", "500", "--ha-heartbeat-ms", "500"]);
    testkit::process::refused_at_start_up(
        &args,
        &["--ha-heartbeat-ms 500 must be below"],
        "a node whose standby would close every idle session",
    );
}
