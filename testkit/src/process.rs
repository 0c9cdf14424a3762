//! The real binary as a child process, for the tests that need the process
//! itself (`tests/process/binary.rs`, `tests/process/durable_crash.rs`,
//! `tests/process/durable_disk.rs`): its flags, its stderr log line by line, its
//! exit status, signals and SIGKILL.
//!
//! Every wait is bounded by [`FAILSAFE`] and ends on a
//! condition (a log line, stderr closing), never on a sleep.

use crate::{Client, FAILSAFE};
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::OnceLock;
use std::time::Instant;

/// The server binary cargo built for the running test. `cargo test` names it
/// in `CARGO_BIN_EXE_hf3fs-meta` (cargo 1.94 on sets it when the test runs,
/// not only when it builds); a test binary started by hand finds it where
/// cargo puts it, beside the `deps/` directory that holds the test itself.
pub fn bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("CARGO_BIN_EXE_hf3fs-meta") {
            return PathBuf::from(p);
        }
        let exe = std::env::current_exe().expect("the test binary's path");
        let p = exe.parent().and_then(Path::parent).map(|d| d.join("hf3fs-meta"));
        match p {
            Some(p) if p.is_file() => p,
            _ => panic!(
                "no hf3fs-meta binary beside {} and no CARGO_BIN_EXE_hf3fs-meta: run the test with `cargo test`",
                exe.display()
            ),
        }
    })
}

/// A command for the binary with a clean environment: no `RUST_LOG`, no
/// `HF3FS_META_*` from the caller.
pub fn command() -> Command {
    let mut cmd = Command::new(bin());
    clean_env(&mut cmd);
    cmd
}

/// Removes `RUST_LOG` and every `HF3FS_META_*` of the caller from `cmd`'s
/// environment.
pub fn clean_env(cmd: &mut Command) {
    cmd.env_remove("RUST_LOG");
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("HF3FS_META_") {
            cmd.env_remove(k);
        }
    }
}

/// A running server process whose stderr lines arrive on a channel; killed
/// on drop if it still runs.
pub struct ServerProcess {
    /// The process.
    pub child: Child,
    /// Where it listens (port 0 until the test learns the real one, for a
    /// process spawned with `--port 0`).
    pub addr: SocketAddr,
    lines: Receiver<String>,
    /// Every stderr line read so far.
    pub log: Vec<String>,
}

/// How a [`ServerProcess::start`] ended.
pub enum Started {
    /// It logged that it listens.
    Serving(ServerProcess),
    /// The process exited before listening (a refused start), with its log.
    Exited(ExitStatus, Vec<String>),
}

/// A start-up failure the binary logs before it exits (src/main.rs).
fn refused(line: &str) -> bool {
    ["cannot start the runtime", "cannot open", "cannot listen"].iter().any(|w| line.contains(w))
}

impl ServerProcess {
    /// Spawns the binary with `--host 127.0.0.1 --port <port>` and `args`;
    /// a thread forwards its stderr line by line.
    pub fn spawn(port: u16, args: &[&str]) -> ServerProcess {
        ServerProcess::spawn_with(&command, port, args)
    }

    /// [`ServerProcess::spawn`] with the command made by `cmd` (e.g. the
    /// binary under a `ulimit`).
    pub fn spawn_with(cmd: &dyn Fn() -> Command, port: u16, args: &[&str]) -> ServerProcess {
        let mut child = cmd()
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the server");
        let rx = forward_lines(child.stderr.take().expect("stderr"));
        ServerProcess { child, addr: SocketAddr::from(([127, 0, 0, 1], port)), lines: rx, log: Vec::new() }
    }

    /// Starts the binary on a free port of 127.0.0.1 with `args` and waits
    /// for its "listening" line; retries on a port clash. A process that
    /// refuses to start is waited for to its exit.
    pub fn start(args: &[&str]) -> Started {
        ServerProcess::start_with(&command, args)
    }

    /// [`ServerProcess::start`] with the command made by `cmd`.
    pub fn start_with(cmd: &dyn Fn() -> Command, args: &[&str]) -> Started {
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
            let mut p = ServerProcess::spawn_with(cmd, port, args);
            match p.wait_line(|l| l.contains("listening") || refused(l)) {
                Some(l) if l.contains("listening") => return Started::Serving(p),
                Some(l) if l.to_lowercase().contains("address already in use") => p.kill(),
                _ => {
                    let st = p.wait_exit();
                    return Started::Exited(st, std::mem::take(&mut p.log));
                }
            }
        }
        panic!("no free port after 5 tries");
    }

    /// [`ServerProcess::start`] that must serve.
    pub fn serve(args: &[&str]) -> ServerProcess {
        ServerProcess::serve_with(&command, args)
    }

    /// [`ServerProcess::start_with`] that must serve.
    pub fn serve_with(cmd: &dyn Fn() -> Command, args: &[&str]) -> ServerProcess {
        match ServerProcess::start_with(cmd, args) {
            Started::Serving(p) => p,
            Started::Exited(st, log) => panic!("the server did not start ({st:?}):\n{}", log.join("\n")),
        }
    }

    /// [`ServerProcess::start`] on the data directory `data`, with
    /// `--fsync always --workers 2` and `extra`.
    pub fn start_durable(data: &Path, extra: &[&str]) -> Started {
        let data = data.to_str().expect("a UTF-8 data directory");
        let mut args = vec!["--fsync", "always", "--workers", "2", "--data-dir", data];
        args.extend_from_slice(extra);
        ServerProcess::start(&args)
    }

    /// [`ServerProcess::start_durable`] that must serve.
    pub fn serve_durable(data: &Path, extra: &[&str]) -> ServerProcess {
        match ServerProcess::start_durable(data, extra) {
            Started::Serving(p) => p,
            Started::Exited(st, log) => panic!("the server did not start ({st:?}):\n{}", log.join("\n")),
        }
    }

    /// A new keep-alive connection to the server.
    pub fn client(&self) -> Client {
        Client::connect(self.addr)
    }

    /// Reads stderr lines until one satisfies `f` (returned), stderr ends, or
    /// the failsafe runs out. Every line read is kept in `log`.
    pub fn wait_line(&mut self, f: impl Fn(&str) -> bool) -> Option<String> {
        self.next_matching(f).ok()
    }

    /// Whether a stderr line read so far, or one still to come within the
    /// failsafe, satisfies `f`.
    pub fn saw_line(&mut self, f: impl Fn(&str) -> bool) -> bool {
        self.log.iter().any(|l| f(l)) || self.wait_line(f).is_some()
    }

    /// Like `wait_line`; the error says whether stderr closed (`true`) or the
    /// failsafe ran out (`false`).
    pub fn next_matching(&mut self, f: impl Fn(&str) -> bool) -> Result<String, bool> {
        let deadline = Instant::now() + FAILSAFE;
        loop {
            match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(l) => {
                    self.log.push(l.clone());
                    if f(&l) {
                        return Ok(l);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return Err(true),
                Err(RecvTimeoutError::Timeout) => return Err(false),
            }
        }
    }

    /// The stderr lines already sent, without waiting for more.
    pub fn read_log(&mut self) {
        while let Ok(l) = self.lines.try_recv() {
            self.log.push(l);
        }
    }

    /// Every remaining stderr line, until the process closes stderr; false
    /// when the failsafe ran out first.
    pub fn drain(&mut self) -> bool {
        self.next_matching(|_| false) == Err(true)
    }

    /// Waits for the process to exit: it closes stderr when it does, so
    /// reading stderr to its end is the wait (bounded by the failsafe).
    pub fn wait_exit(&mut self) -> ExitStatus {
        if !self.drain() {
            self.kill();
            panic!("the server did not exit\n{}", self.log.join("\n"));
        }
        self.child.wait().expect("wait")
    }

    /// Waits for the exit and checks it is a clean 0 (not death by signal).
    pub fn assert_exit_0(&mut self) {
        let st = self.wait_exit();
        assert_eq!(st.code(), Some(0), "exit status {st:?}; log:\n{}", self.log.join("\n"));
    }

    /// Sends `sig` (a name for kill(1): TERM, INT, ...).
    pub fn signal(&self, sig: &str) {
        signal(self.child.id(), sig);
    }

    /// SIGKILL, and the process reaped.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A thread that sends each line of `stderr` on the returned channel until
/// it closes.
pub fn forward_lines(stderr: ChildStderr) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Sends `sig` (a name for kill(1): TERM, INT, HUP, ...) to process `pid`.
/// After `STOP`, returns only once every thread of the process has stopped.
pub fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill").args([&format!("-{sig}"), &pid.to_string()]).status().expect("run kill");
    assert!(st.success(), "kill -{sig} {pid} failed");
    if sig == "STOP" {
        wait_stopped(pid);
    }
}

/// Waits until every thread of `pid` is stopped (state `T` in
/// `/proc/<pid>/task/*/stat`). `kill` returns once the signal is queued:
/// the kernel wakes one thread of the process for it, and only when that
/// thread runs does the stop reach the others. Until then another thread
/// can still read and answer a request; on a busy machine a test that sent
/// one right after `kill -STOP` saw it answered by the "paused" leader.
fn wait_stopped(pid: u32) {
    let stopped = |task: &Path| {
        // A thread that exited meanwhile runs no more: count it as stopped.
        std::fs::read_to_string(task.join("stat")).map_or(true, |stat| {
            // The state follows the command name's closing parenthesis.
            stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()) == Some('T')
        })
    };
    crate::wait_for(&format!("every thread of process {pid} stopped after SIGSTOP"), || {
        // A process gone altogether has nothing left to stop.
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Some(()) };
        tasks.flatten().all(|t| stopped(&t.path())).then_some(())
    })
}

/// How many of its last stderr lines a process prints when a failing test
/// drops it.
const LOG_TAIL: usize = 80;

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
        // A failing test says what its servers said: the last lines of each
        // (the whole log stays in `log` for the tests that assert on it).
        if std::thread::panicking() {
            self.read_log();
            let from = self.log.len().saturating_sub(LOG_TAIL);
            eprintln!("--- the last {} log lines of the server on {} ---", self.log.len() - from, self.addr);
            for l in &self.log[from..] {
                eprintln!("{l}");
            }
        }
    }
}

/// Starts the binary with `args` and asserts it refuses to start: exit
/// status 2 and a log line that contains every one of `says`; `what`
/// names the configuration in the panic if it starts instead.
pub fn refused_at_start_up(args: &[&str], says: &[&str], what: &str) {
    match ServerProcess::start(args) {
        Started::Exited(st, log) => {
            assert_eq!(st.code(), Some(2), "{log:?}");
            assert!(log.iter().any(|l| says.iter().all(|s| l.contains(s))), "{log:?}");
        }
        Started::Serving(_) => panic!("{what} started"),
    }
}
