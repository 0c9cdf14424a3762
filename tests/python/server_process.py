"""The hf3fs-meta binary as a child process on a free loopback port, for the
Python client suites: started, probed on GET /health, stopped with SIGTERM
(which must end in exit 0 and no panic in the log).

The binary is $HF3FS_META_BIN, else target/release then target/debug.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
STARTUP_DEADLINE_S = 30.0
SHUTDOWN_DEADLINE_S = 30.0


def server_binary() -> Path:
    env = os.environ.get("HF3FS_META_BIN")
    if env:
        p = Path(env)
        if not p.is_file():
            pytest.fail(f"HF3FS_META_BIN={env} is not a file")
        return p
    for profile in ("release", "debug"):
        p = REPO / "target" / profile / "hf3fs-meta"
        if p.is_file():
            return p
    pytest.fail("no server binary: set HF3FS_META_BIN or run `cargo build --release`")


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """Child side of fork: SIGKILL the server if the test process dies."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


class Server:
    """A running server: its process, address and log."""

    def __init__(self, proc: subprocess.Popen, port: int, log_path: Path):
        self.proc = proc
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-n:])

    def stop(self) -> None:
        """SIGTERM; the server must drain and exit 0 without a panic."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=SHUTDOWN_DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"server ignored SIGTERM for {SHUTDOWN_DEADLINE_S} s:\n" + self.log_tail())
        log = self.log()
        assert code == 0, f"server exited with {code} after SIGTERM:\n{self.log_tail()}"
        assert "panicked" not in log, log

    def kill(self) -> None:
        """SIGKILL, as a crash: no drain, nothing flushed by the process."""
        self.proc.kill()
        self.proc.wait()
        assert "panicked" not in self.log(), self.log()


def _start_once(binary: Path, log_path: Path, args: list[str], port: int | None = None) -> Server | None:
    port = port or free_loopback_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF3FS_META_")}
    env.setdefault("RUST_BACKTRACE", "1")
    env.pop("RUST_LOG", None)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [str(binary), "--host", "127.0.0.1", "--port", str(port), "--workers", "2", *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=_die_with_parent,
        )
    server = Server(proc, port, log_path)
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None  # most likely a port race: the caller retries
        try:
            r = requests.get(server.base_url + "/health", timeout=2)
            if r.status_code == 200 and proc.poll() is None:
                return server
        except requests.RequestException:
            pass
        try:
            # Doubles as the pause between polls: returns at once if it exits.
            proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            pass
    proc.kill()
    proc.wait()
    pytest.fail(f"server did not answer GET /health within {STARTUP_DEADLINE_S} s:\n" + server.log_tail())


def start(log_path: Path, args: list[str] | None = None, port: int | None = None) -> Server:
    """Starts the server with `args` on `port`, or on a free port (three tries).

    A given port is one a server of this test just left (a restart): the
    server binds with SO_REUSEADDR, so only another process taking it in
    between can make the start fail, and then it fails the test."""
    binary = server_binary()
    for _ in range(1 if port else 3):
        srv = _start_once(binary, log_path, args or [], port)
        if srv is not None:
            return srv
    pytest.fail("server exited at startup:\n" + log_path.read_text(errors="replace"))
