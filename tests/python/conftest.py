"""Fixtures of the engine-client suites (test_engine_client_*.py): the
engines' own client modules, a durable server that can crash and restart,
and the 503 gateway. Fixtures run only for the tests that ask for them, so
the other suites of this folder neither download nor start anything here.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import requests

import engine_wheels
import server_process
from gateway import Gateway

STATS_TIMEOUT_S = 30.0


@pytest.fixture(scope="session")
def vllm_client_module(tmp_path_factory) -> types.ModuleType:
    """vLLM 0.33.0's hf3fs_metadata_server module, read out of its wheel."""
    return engine_wheels.load_vllm_client(tmp_path_factory.mktemp("vllm-module"))


@pytest.fixture(scope="session")
def sglang_client_module(tmp_path_factory) -> types.ModuleType:
    """SGLang 0.5.23's mini_3fs_metadata_server module, read out of its wheel."""
    return engine_wheels.load_sglang_client(tmp_path_factory.mktemp("sglang-module"))


class DurableServer:
    """The binary with --data-dir, which a test can SIGKILL and start again
    on the same data, on the same port (clients that talk to it directly
    keep their address) or on a new one (behind the gateway)."""

    def __init__(self, tmp_path: Path, args: list[str]):
        self.data_dir = tmp_path / "data"
        self.log_path = tmp_path / "hf3fs-meta.log"
        self.args = ["--data-dir", str(self.data_dir), *args]
        self.server: server_process.Server | None = server_process.start(self.log_path, self.args)
        self.restarts = 0

    @property
    def port(self) -> int:
        assert self.server is not None, "the server is down"
        return self.server.port

    @property
    def base_url(self) -> str:
        assert self.server is not None, "the server is down"
        return self.server.base_url

    def kill(self) -> None:
        """SIGKILL: a crash with requests possibly in flight."""
        assert self.server is not None
        self.server.kill()
        self.server = None

    def start(self, port: int | None = None) -> None:
        """Starts the binary again on the same data dir (recovery runs
        before it binds, so once it answers /health it serves the state)."""
        assert self.server is None, "already running"
        self.server = server_process.start(self.log_path, self.args, port)
        self.restarts += 1

    def stats(self) -> dict:
        r = requests.get(self.base_url + "/stats", timeout=STATS_TIMEOUT_S)
        r.raise_for_status()
        return r.json()

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()


@pytest.fixture
def durable_server(tmp_path):
    # Small page spaces are filled in places: the background evictor (above
    # a high watermark) would race the checks, so it is held off.
    srv = DurableServer(tmp_path, ["--evict-high-watermark", "1", "--evict-low-watermark", "1"])
    yield srv
    srv.close()


@pytest.fixture
def gateway(durable_server):
    gw = Gateway(durable_server.port)
    yield gw
    gw.close()
