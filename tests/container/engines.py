"""The engines' own metadata clients against a server in a container, for
tests/container/run.sh: vLLM 0.33.0's and SGLang 0.5.23's
``Hf3fsGlobalMetadataClient``, read out of their pinned wheels
(tests/python/engine_wheels.py), driven by the flows of the engine suites
(test_engine_client_vllm.py's connector on two ranks, test_engine_client_sglang.py's
HiCache pool in the ``kv`` space of rank 0).

    engines.py URL STATE

Each run first checks every key the earlier runs saved (recorded in the
JSON file STATE, with the simulated 3FS pages they wrote): each is found
by the engine's lookup and at the page it was saved at, which holds it.
Then it saves a new batch through the same clients and reads it back, and
records it. So a run after a restart, or through the relay after a
failover, asserts that what was acknowledged before is still there and
that the clients keep working. Exit status 0, or an assertion's traceback.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import engine_wheels  # noqa: E402
from engine_wheels import PoolName  # noqa: E402
from test_engine_client_sglang import Pool, keys_of  # noqa: E402
from test_engine_client_vllm import Connector, block_hashes  # noqa: E402

NUM_PAGES = 256
BATCH = 16


def main(url: str, state_path: Path) -> None:
    state = json.loads(state_path.read_text()) if state_path.exists() else {"runs": 0, "vllm": [], "sglang": []}
    tmp = Path(tempfile.mkdtemp(prefix="engines-"))
    vllm = engine_wheels.load_vllm_client(tmp).Hf3fsGlobalMetadataClient
    sglang = engine_wheels.load_sglang_client(tmp).Hf3fsGlobalMetadataClient
    assert vllm.__module__ == "engine_vllm_hf3fs_metadata_server", vllm.__module__

    conn = Connector(vllm, url, num_pages=NUM_PAGES)
    pool = Pool(sglang(url), 0, PoolName.KV, NUM_PAGES)
    # The simulated 3FS files survive the server, as the real ones do.
    for rank, pages in enumerate(state.get("vllm_files", [{}, {}])):
        conn.files[rank] = {int(p): bytes.fromhex(b) for p, b in pages.items()}
    pool.file = {int(p): bytes.fromhex(b) for p, b in state.get("sglang_file", {}).items()}

    old_vllm = [k for batch in state["vllm"] for k in batch]
    old_sglang = [k for batch in state["sglang"] for k in batch]
    if old_vllm:
        assert conn.hits(old_vllm) == len(old_vllm), "a vLLM block saved before is not found"
        conn.load_all(old_vllm)
    if old_sglang:
        assert pool.hits(old_sglang) == len(old_sglang), "an SGLang key saved before is not found"
        assert None not in pool.get(old_sglang), "an SGLang key saved before has no page"

    run = state["runs"]
    keys = block_hashes(BATCH, f"container-run-{run}")
    conn.save_all(keys)
    assert conn.hits(keys) == len(keys)
    conn.load_all(keys)
    skeys = keys_of(BATCH, f"container-run-{run}")
    pool.set(skeys)
    assert pool.hits(skeys) == len(skeys)
    assert None not in pool.get(skeys)

    state["runs"] = run + 1
    state["vllm"].append(keys)
    state["sglang"].append(skeys)
    state["vllm_files"] = [{str(p): b.hex() for p, b in f.items()} for f in conn.files]
    state["sglang_file"] = {str(p): b.hex() for p, b in pool.file.items()}
    state_path.write_text(json.dumps(state))
    print(
        f"{url}: {len(old_vllm)} vLLM blocks and {len(old_sglang)} SGLang keys saved before found; "
        f"{len(keys)} + {len(skeys)} saved and read back now"
    )


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
