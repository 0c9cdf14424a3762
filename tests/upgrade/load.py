#!/usr/bin/env python3
"""The engines' request sequences through the relay, for the rolling
upgrade (tests/upgrade/rolling.sh), checking every answer.

Four loops, one connection each, as the engines' clients call the server
(docs/api.md, "How the connector calls it" and "How SGLang's client calls
it"): vLLM's save (batch_allocate 16 fresh keys on rank 0, then
confirm_write them) and load (batch_exists, then get_locations of keys
already acknowledged); SGLang's set (reserve_and_allocate_page_indices of
16 fresh keys in space (0, "kv"), then confirm_write) and get (exists, then
get_page_indices). The sequences are written here from the documented
contract; the engines' own client classes (tests/python/engine_wheels.py)
need their 300 MB wheels, which this script does not fetch.

Rules, as the engines' clients behave: a 503 is retried (after 20 ms, up
to 200 times: counted, "retried 503s"); a connection refused or reset (a
node restarting behind the relay) is retried the same way and counted
apart; any other status, or a 503 not cured by its retries, is a client
error. A confirm answered 204 is acknowledged: its (key, page) is logged
with the time of the answer (WRITES, one line `time dialect`), and must be
read back at that page by every later load (else a wrong page).

    tests/upgrade/load.py RELAY_ADDR WRITES SUMMARY

Initializes rank 0 and the space first (PAGES pages each, default 65536); runs until SIGTERM, then writes a
JSON summary to SUMMARY: acknowledged confirms, loads checked, wrong
pages, retried 503s, retried connection errors, client errors (with the
first few), and the acknowledged confirms as [dialect, key, page] for the
final check against the new leader.
"""

import http.client
import json
import os
import random
import signal
import sys
import threading
import time

RETRIES = 200
# Pages of rank 0 and of SGLang's space (rolling.sh's PAGES).
PAGES = int(os.environ.get("PAGES", "65536"))
RETRY_S = 0.02

stop = threading.Event()
lock = threading.Lock()
acked = {"vllm": {}, "sglang": {}}
stats = {"confirms": 0, "loads": 0, "wrong_pages": [], "retried_503": 0, "retried_conn": 0, "errors": []}


class Conn:
    def __init__(self, addr: str):
        self.host, port = addr.rsplit(":", 1)
        self.port = int(port)
        self.c = None

    def post(self, path: str, body: dict):
        """(status, parsed body) after the retries; None when stopping."""
        for _ in range(RETRIES):
            if stop.is_set():
                return None
            try:
                if self.c is None:
                    self.c = http.client.HTTPConnection(self.host, self.port, timeout=30)
                self.c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
                r = self.c.getresponse()
                data = r.read()
                if r.getheader("connection", "").lower() == "close":
                    self.c.close()
                    self.c = None
            except (OSError, http.client.HTTPException):
                if self.c is not None:
                    self.c.close()
                self.c = None
                with lock:
                    stats["retried_conn"] += 1
                time.sleep(RETRY_S)
                continue
            if r.status == 503:
                with lock:
                    stats["retried_503"] += 1
                time.sleep(RETRY_S)
                continue
            return r.status, (json.loads(data) if data else None)
        return 503, None


def error(what: str):
    with lock:
        stats["errors"].append(what)


def fresh(bits: int, n: int):
    """`n` random keys of `bits` bits in hex: vLLM's 32 digits, SGLang's 64."""
    return [f"{random.getrandbits(bits):0{bits // 4}x}" for _ in range(n)]


def vllm_save(addr: str):
    c = Conn(addr)
    while not stop.is_set():
        keys = fresh(128, 16)
        r = c.post("/keys/batch_allocate", {"rank": 0, "keys": [[k, ""] for k in keys]})
        if r is None:
            return
        if r[0] != 200:
            error(f"vllm batch_allocate: {r}")
            continue
        pages = [p for _, p in r[1]["results"]]
        if any(p < 0 for p in pages):
            continue  # full: vLLM skips the save
        body = {"rank": 0, "confirmations": [[k, p] for k, p in zip(keys, pages)], "pages_to_release": []}
        r = c.post("/keys/confirm_write", body)
        if r is None:
            return
        if r[0] != 204:
            error(f"vllm confirm_write: {r}")
            continue
        now = time.time()
        with lock:
            stats["confirms"] += 1
            acked["vllm"].update(zip(keys, pages))
            writes.write(f"{now:.6f} vllm\n")
            writes.flush()


def sglang_save(addr: str):
    c = Conn(addr)
    while not stop.is_set():
        keys = fresh(256, 16)
        r = c.post("/0/reserve_and_allocate_page_indices", {"keys": [[k, ""] for k in keys]})
        if r is None:
            return
        if r[0] != 200:
            error(f"sglang reserve: {r}")
            continue
        got = [(k, p) for k, (written, p) in zip(keys, r[1]["indices"]) if not written and p >= 0]
        r = c.post("/0/confirm_write", {"written_keys_to_confirm": [[k, p] for k, p in got]})
        if r is None:
            return
        if r[0] != 204:
            error(f"sglang confirm_write: {r}")
            continue
        now = time.time()
        with lock:
            stats["confirms"] += 1
            acked["sglang"].update(got)
            writes.write(f"{now:.6f} sglang\n")
            writes.flush()


def sample(dialect: str):
    with lock:
        items = list(acked[dialect].items())
    return random.sample(items, min(64, len(items)))


def check(dialect: str, want, got):
    bad = [f"{dialect} {k}: acknowledged at {p}, read {g}" for (k, p), g in zip(want, got) if g != p]
    with lock:
        stats["loads"] += 1
        stats["wrong_pages"].extend(bad)


def vllm_load(addr: str):
    c = Conn(addr)
    while not stop.is_set():
        want = sample("vllm")
        if not want:
            time.sleep(0.01)
            continue
        keys = [k for k, _ in want]
        r = c.post("/keys/batch_exists", {"keys": keys})
        if r is None:
            return
        if r[0] != 200:
            error(f"vllm batch_exists: {r}")
            continue
        r = c.post("/keys/get_locations", {"rank": 0, "keys": keys})
        if r is None:
            return
        if r[0] != 200:
            error(f"vllm get_locations: {r}")
            continue
        check("vllm", want, r[1]["locations"])


def sglang_load(addr: str):
    c = Conn(addr)
    while not stop.is_set():
        want = sample("sglang")
        if not want:
            time.sleep(0.01)
            continue
        keys = [k for k, _ in want]
        r = c.post("/0/exists", {"keys": keys})
        if r is None:
            return
        if r[0] != 200:
            error(f"sglang exists: {r}")
            continue
        r = c.post("/0/get_page_indices", {"keys": keys})
        if r is None:
            return
        if r[0] != 200:
            error(f"sglang get_page_indices: {r}")
            continue
        check("sglang", want, r[1]["indices"])


def main():
    global writes
    addr, writes_path, summary = sys.argv[1:4]
    writes = open(writes_path, "w")
    c = Conn(addr)
    for path, body, ok in [
        ("/rank/0/initialize", {"num_pages": PAGES, "role": "worker"}, 200),
        ("/0/initialize", {"num_pages": PAGES}, 204),
    ]:
        r = c.post(path, body)
        if r is None or r[0] != ok:
            print(f"load.py: {path}: {r}", file=sys.stderr)
            sys.exit(1)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threads = [threading.Thread(target=f, args=(addr,)) for f in (vllm_save, vllm_load, sglang_save, sglang_load)]
    for t in threads:
        t.start()
    while not stop.is_set():
        stop.wait(0.2)
    for t in threads:
        t.join()
    out = dict(stats)
    out["acked_keys"] = {d: len(a) for d, a in acked.items()}
    out["acked"] = [[d, k, p] for d, a in acked.items() for k, p in a.items()]
    out["errors"] = stats["errors"][:20]
    out["error_count"] = len(stats["errors"])
    out["wrong_page_count"] = len(stats["wrong_pages"])
    out["wrong_pages"] = stats["wrong_pages"][:20]
    with open(summary, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
