"""The engines' own metadata-client modules, taken from their published
wheels at test time.

vLLM and SGLang each ship their HF3FS metadata server and its HTTP client,
``Hf3fsGlobalMetadataClient``, in one module of their wheel. The tests in
``test_engine_client_*.py`` drive the real binary through those classes, so
that a change in how an engine's client calls the server (a route, a body
field, the retry policy) shows up here. Their code never enters this
repository:

1. ``pip download --no-deps`` fetches the pinned wheel (exact file, checked
   against its SHA-256 with ``--require-hashes``) into a cache outside the
   repository that survives between runs:
   ``${XDG_CACHE_HOME:-~/.cache}/hf3fs-meta/wheels``. A wheel already there
   (and matching its hash) is not downloaded again.
2. ``zipfile`` reads the one module out of the wheel into a pytest temporary
   directory; nothing else of the wheel is unpacked or installed.
3. ``importlib`` loads it from there under a private module name. SGLang's
   module imports two names from the rest of the engine; the loader puts
   two small stand-ins in ``sys.modules`` for the import only (see
   ``_sglang_stubs``) and removes them afterwards.

A wheel that cannot be fetched fails the test under CI (``CI=true``); outside
CI it skips with a message when the package index cannot be reached at all
(offline: pip's error is a network one, or the index does not answer), and
fails otherwise (a wrong pin, a full disk). tests/process/python_client.rs fails on
any skip, so `cargo test` needs the network or a filled cache either way.
"""

from __future__ import annotations

import abc
import ast
import enum
import importlib.machinery
import fcntl
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import types
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Optional

import pytest

# pip must finish within this (the vllm wheel is ~336 MB).
DOWNLOAD_DEADLINE_S = 900
# How long the offline check waits for the package index.
INDEX_PROBE_TIMEOUT_S = 10


@dataclass(frozen=True)
class PinnedWheel:
    """One published wheel and the module the tests take from it."""

    project: str
    version: str
    # The exact file: its tags decide pip's --abi and --platform, so that the
    # same file is fetched whatever the interpreter or machine running pip.
    filename: str
    sha256: str
    module: str

    @property
    def abi(self) -> str:
        return self.filename.removesuffix(".whl").split("-")[-2]

    @property
    def platform(self) -> str:
        return self.filename.removesuffix(".whl").split("-")[-1]


# The versions perf/baselines/vllm.sh and perf/baselines/sglang.sh compare
# against (perf/RESULTS.md).
VLLM = PinnedWheel(
    project="vllm",
    version="0.33.0",
    filename="vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    sha256="4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa",
    module="vllm/distributed/kv_transfer/kv_connector/v1/hf3fs/hf3fs_metadata_server.py",
)
SGLANG = PinnedWheel(
    project="sglang",
    version="0.5.23",
    filename="sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl",
    sha256="00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937",
    module="sglang/srt/mem_cache/storage/hf3fs/mini_3fs_metadata_server.py",
)

# pip's messages when the index cannot be reached at all.
_NETWORK_ERRORS = re.compile(
    r"Temporary failure in name resolution|Name or service not known|"
    r"Failed to establish a new connection|Network is unreachable|"
    r"Connection refused|ProxyError|No route to host|timed out",
    re.IGNORECASE,
)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hf3fs-meta" / "wheels"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _index_unreachable(wheel: PinnedWheel) -> bool:
    """Whether the package index pip uses cannot be reached at all."""
    index = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
    try:
        urllib.request.urlopen(f"{index.rstrip('/')}/{wheel.project}/", timeout=INDEX_PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return False  # it answered
    except (urllib.error.URLError, OSError):
        return True
    return False


def _download_failed(wheel: PinnedWheel, output: str) -> None:
    what = f"cannot download {wheel.filename} (pip download --no-deps {wheel.project}=={wheel.version})"
    if not in_ci() and (_NETWORK_ERRORS.search(output) or _index_unreachable(wheel)):
        pytest.skip(f"{what}: no network, it seems (outside CI this skips; under CI=true it fails):\n{output[-2000:]}")
    pytest.fail(f"{what}:\n{output[-4000:]}")


def _download(wheel: PinnedWheel, into: Path) -> None:
    """Fetches the pinned file into `into` (a fresh directory)."""
    req = into / "requirements.txt"
    req.write_text(f"{wheel.project}=={wheel.version} --hash=sha256:{wheel.sha256}\n")
    cmd = [
        sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
        "--no-deps", "--only-binary=:all:", "--require-hashes",
        "--implementation", "cp", "--python-version", "3.11",
        "--abi", wheel.abi, "--platform", wheel.platform,
        "--dest", str(into), "-r", str(req),
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_DEADLINE_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        _download_failed(wheel, f"pip did not finish within {DOWNLOAD_DEADLINE_S} s (timed out)\n{e.stdout or ''}{e.stderr or ''}")
    if proc.returncode != 0:
        _download_failed(wheel, proc.stdout + proc.stderr)
    if not (into / wheel.filename).is_file():
        pytest.fail(f"pip download succeeded but left no {wheel.filename} in {into}: {sorted(p.name for p in into.iterdir())}")


def fetch(wheel: PinnedWheel) -> Path:
    """The pinned wheel in the cache, downloaded first if it is not there.

    An exclusive lock on the cache serializes concurrent test runs, so that
    two of them never download the same file at once.
    """
    cache = cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        pytest.fail(f"cannot create the wheel cache {cache}: {e} (set XDG_CACHE_HOME to a writable directory)")
    path = cache / wheel.filename
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file() and _sha256(path) == wheel.sha256:
            return path
        path.unlink(missing_ok=True)
        staging = cache / f".download-{os.getpid()}"
        staging.mkdir(exist_ok=True)
        try:
            _download(wheel, staging)
            got = staging / wheel.filename
            digest = _sha256(got)
            assert digest == wheel.sha256, f"{wheel.filename}: sha256 {digest}, pinned {wheel.sha256}"
            os.replace(got, path)  # same file system: a reader sees all of it or nothing
        finally:
            for p in staging.iterdir():
                p.unlink()
            staging.rmdir()
    return path


def extract(wheel: PinnedWheel, into: Path, member: str | None = None) -> Path:
    """Reads one file of the wheel (its client module by default) into
    `into`; returns the file."""
    member = member or wheel.module
    src = fetch(wheel)
    with zipfile.ZipFile(src) as z:
        try:
            text = z.read(member)
        except KeyError:
            pytest.fail(f"{wheel.filename} has no {member}; the code moved?")
    dest = into / f"{wheel.project}_{Path(member).name}"
    dest.write_bytes(text)
    return dest


def _load(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_vllm_client(tmp: Path) -> types.ModuleType:
    """vLLM's hf3fs_metadata_server module. It imports nothing of vLLM: only
    orjson, requests, urllib3 and fastapi (tests/python/requirements.txt)."""
    return _load(extract(VLLM, tmp), "engine_vllm_hf3fs_metadata_server")


class PoolName(str, enum.Enum):
    """Stand-in for ``sglang.srt.mem_cache.hicache_storage.PoolName``: the
    client only passes a member to ``str()`` to name the namespace, so the
    members the tests use are enough. ``str()`` is the value, as the
    engine's enum gives (a plain ``str`` enum would give ``PoolName.KV``)."""

    KV = "kv"
    MAMBA = "mamba"
    SWA = "swa"

    def __str__(self) -> str:
        return self.value


class Hf3fsMetadataInterface(abc.ABC):
    """Stand-in for the engine's abstract base of metadata clients; the
    client class defines every method it has."""


def _sglang_stubs() -> dict[str, types.ModuleType]:
    """The two engine modules SGLang's client module imports from, as
    stand-ins holding the one name each that it takes, and their parents."""
    mods: dict[str, types.ModuleType] = {}
    for name in ("sglang", "sglang.srt", "sglang.srt.mem_cache", "sglang.srt.mem_cache.storage",
                 "sglang.srt.mem_cache.storage.hf3fs"):  # fmt: skip
        m = types.ModuleType(name)
        m.__path__ = []  # a package, so that submodules resolve
        mods[name] = m
    storage = types.ModuleType("sglang.srt.mem_cache.hicache_storage")
    storage.PoolName = PoolName
    iface = types.ModuleType("sglang.srt.mem_cache.storage.hf3fs.storage_hf3fs")
    iface.Hf3fsMetadataInterface = Hf3fsMetadataInterface
    mods[storage.__name__] = storage
    mods[iface.__name__] = iface
    return mods


def load_sglang_client(tmp: Path) -> types.ModuleType:
    """SGLang's mini_3fs_metadata_server module, imported with the two
    stand-ins in ``sys.modules`` for the duration of the import only."""
    path = extract(SGLANG, tmp)
    stubs = _sglang_stubs()
    saved = {name: sys.modules.get(name) for name in stubs}
    sys.modules.update(stubs)
    try:
        module = _load(path, "engine_sglang_mini_3fs_metadata_server")
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    assert module.PoolName is PoolName
    return module


# --------------------------------------------------------------------------
# The engines' key functions (tests/python/test_longest_prefix.py).
#
# The modules that hold them import the whole engine (torch, the model
# config), so only the functions are taken: `_functions` parses the file
# out of the wheel with `ast` and compiles the named definitions, as
# written there, in a namespace that holds the few names they use.
# SGLang's hash is C++ (pybind11 over OpenSSL's SHA-256) that the engine
# compiles on first use; `load_sglang_hashes` compiles the wheel's own
# source the same way, with g++, pybind11's headers (requirements.txt),
# OpenSSL's (libssl-dev) and Python's (.ci/run installs the three).
# --------------------------------------------------------------------------

VLLM_CONNECTOR = "vllm/distributed/kv_transfer/kv_connector/v1/hf3fs/hf3fs_connector.py"
SGLANG_HASH_CPP = "sglang/srt/mem_cache/cpp_utils/hash_binding.cpp"
SGLANG_NATIVE_HASH = "sglang/srt/mem_cache/cpp_utils/native_hash.py"
SGLANG_CACHE_UTILS = "sglang/srt/mem_cache/utils.py"
SGLANG_STORAGE = "sglang/srt/mem_cache/storage/hf3fs/storage_hf3fs.py"
# g++ must finish within this (the binding compiles in 10-30 s).
COMPILE_DEADLINE_S = 300


def _functions(path: Path, names: list[str], namespace: dict[str, Any], cls: str | None = None) -> dict[str, Callable]:
    """The definitions `names` of `path` (top-level, or methods of class
    `cls`), compiled from the file's own source in `namespace`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    body = tree.body
    if cls is not None:
        found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
        if not found:
            pytest.fail(f"{path.name} has no class {cls}; the code moved?")
        body = found[0].body
    defs = [n for n in body if isinstance(n, ast.FunctionDef) and n.name in names]
    missing = set(names) - {d.name for d in defs}
    if missing:
        pytest.fail(f"{path.name}{'.' + cls if cls else ''} has no {sorted(missing)}; the code moved?")
    code = compile(ast.Module(body=defs, type_ignores=[]), str(path), "exec")
    exec(code, namespace)  # the wheel's own definitions
    return {name: namespace[name] for name in names}


def load_vllm_key_chain(tmp: Path) -> Callable[[list[int], int], list[str]]:
    """vLLM's key chain of a prompt: ``HF3FSKVConnector._generate_block_hashes``
    (which calls ``_compute_prefix_hash``) and ``_align_to_block_size``, on a
    stand-in connector that has only the ``_block_size`` they read. Returns
    ``chain(token_ids, block_size)`` and, as ``chain.align``, the
    connector's alignment of a token count to whole blocks."""
    path = extract(VLLM, tmp, VLLM_CONNECTOR)
    names = ["_generate_block_hashes", "_compute_prefix_hash", "_align_to_block_size"]
    methods = _functions(path, names, {"hashlib": hashlib, "Optional": Optional}, cls="HF3FSKVConnector")
    connector = type("Connector", (), methods)

    def of(block_size: int):
        c = connector()
        c._block_size = block_size
        return c

    def chain(token_ids: list[int], block_size: int) -> list[str]:
        return of(block_size)._generate_block_hashes(token_ids, 0)

    chain.align = lambda num_tokens, block_size: of(block_size)._align_to_block_size(num_tokens)
    return chain


def _compile_sglang_hash(cpp: Path, into: Path) -> types.ModuleType:
    """The wheel's hash_binding.cpp built as the extension the engine builds
    (``hicache_hash_cpp``), and imported."""
    import sysconfig

    try:
        import pybind11
    except ImportError:
        pytest.fail("pybind11 is not installed (tests/python/requirements.txt)")
    name = "hicache_hash_cpp"
    out = into / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    cmd = [
        os.environ.get("CXX", "g++"), "-O2", "-std=c++17", "-shared", "-fPIC", "-w",
        f"-DTORCH_EXTENSION_NAME={name}",
        f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}",
        str(cpp), "-o", str(out), "-lcrypto",
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_DEADLINE_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.fail(f"cannot compile SGLang's {SGLANG_HASH_CPP} ({' '.join(cmd)}): {e}")
    if proc.returncode != 0:
        pytest.fail(
            f"cannot compile SGLang's {SGLANG_HASH_CPP}: it needs g++, libssl-dev and Python's headers\n"
            f"{' '.join(cmd)}\n{proc.stderr[-4000:]}"
        )
    loader = importlib.machinery.ExtensionFileLoader(name, str(out))
    spec = importlib.util.spec_from_file_location(name, out, loader=loader)
    assert spec is not None, out
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def load_sglang_hashes(tmp: Path) -> types.SimpleNamespace:
    """SGLang's storage key chain: ``get_storage_hash_str``,
    ``get_hash_str`` and ``storage_namespace_seed`` of
    ``sglang/srt/mem_cache/utils.py`` over ``native_hash.py``'s
    ``get_native_hash`` and the compiled binding; and the HF3FS backend's
    ``batch_exists`` (``HiCacheHF3FS``, with ``_get_mha_zero_copy_keys``)
    as ``batch_exists(client, rank, keys, mha_zero_copy)``."""
    ext = _compile_sglang_hash(extract(SGLANG, tmp, SGLANG_HASH_CPP), tmp)
    native = _load(extract(SGLANG, tmp, SGLANG_NATIVE_HASH), "engine_sglang_native_hash")
    # The engine's loader builds the extension with torch's cpp_extension;
    # the same source, built above, stands in for its result.
    native._load_native_hash_module = lambda: ext
    ns: dict[str, Any] = {
        "hashlib": hashlib, "Any": Any, "List": List, "Optional": Optional,
        "get_native_hash": native.get_native_hash,
    }  # fmt: skip
    fns = _functions(
        extract(SGLANG, tmp, SGLANG_CACHE_UTILS), ["get_hash_str", "storage_namespace_seed", "get_storage_hash_str"], ns
    )
    backend = _functions(
        extract(SGLANG, tmp, SGLANG_STORAGE),
        ["batch_exists", "_get_mha_zero_copy_keys"],
        {"List": List, "Optional": Optional, "HiCacheStorageExtraInfo": object},
        cls="HiCacheHF3FS",
    )
    storage = type("Backend", (), backend)

    def batch_exists(client, rank: int, keys: list[str], mha_zero_copy: bool = False) -> int:
        b = storage()
        b.metadata_client, b.rank, b.mha_zero_copy = client, rank, mha_zero_copy
        return b.batch_exists(keys)

    return types.SimpleNamespace(**fns, batch_exists=batch_exists)
