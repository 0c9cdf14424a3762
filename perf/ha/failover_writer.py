#!/usr/bin/env python3
"""A light write load through the relay for `perf/ha/failover.sh
--replicated`: vLLM's save (allocate 16 fresh keys on rank 0, then confirm
them) about 20 times a second, one connection a request, no retry policy
of its own beyond trying again 10 ms after a failure. Every confirm
answered 204 appends a line to LOG: the wall-clock time of its answer and
the epoch of the leader that answered (its `x-hf3fs-meta-epoch` header), so
the script can time a failover as "the first write acknowledged by the new
leader" (a confirm of the old leader's may still arrive an instant after
the SIGKILL was sent).

    perf/ha/failover_writer.py RELAY_ADDR LOG

Initializes rank 0 (65536 pages) first. Runs until killed.
"""

import http.client
import json
import sys
import time

PAUSE_S = 0.05  # between saves: a light load
RETRY_S = 0.01  # after a failed request


def post(addr: str, path: str, body: dict) -> tuple[int, bytes, str]:
    """The status, the body and the answering leader's epoch ("" if none)."""
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read(), r.getheader("x-hf3fs-meta-epoch", "")
    finally:
        conn.close()


def until_ok(addr: str, path: str, body: dict) -> None:
    while True:
        try:
            if post(addr, path, body)[0] < 500:
                return
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(RETRY_S)


def main() -> None:
    addr, log = sys.argv[1], sys.argv[2]
    until_ok(addr, "/rank/0/initialize", {"num_pages": 1 << 16, "role": "worker"})
    n = 0
    with open(log, "a", buffering=1) as out:
        while True:
            keys = [f"{i:032x}" for i in range(n, n + 16)]
            n += 16
            try:
                st, data, _ = post(addr, "/keys/batch_allocate", {"rank": 0, "keys": [[k, ""] for k in keys]})
                if st != 200:
                    time.sleep(RETRY_S)
                    continue
                pages = [p for _, p in json.loads(data)["results"]]
                if min(pages) < 0:
                    continue
                c = {"rank": 0, "confirmations": [[k, p] for k, p in zip(keys, pages)], "pages_to_release": []}
                st, _, epoch = post(addr, "/keys/confirm_write", c)
                if st == 204:
                    out.write(f"{time.time():.6f} {epoch}\n")
                    time.sleep(PAUSE_S)
                else:
                    time.sleep(RETRY_S)
            except (OSError, http.client.HTTPException, ValueError, KeyError):
                time.sleep(RETRY_S)


if __name__ == "__main__":
    main()
