#!/usr/bin/env python3
"""The relay's cost per request: one keep-alive client sends the same
`batch_exists` (128 keys, as vLLM's scheduler does) straight to the leader
and through `hf3fs-meta relay`, alternating rounds, and prints the median
per-request latency of each path and their difference.

    perf/ha/relay_cost.py LEADER_ADDR RELAY_ADDR [rounds=7] [requests=2000]

Start a leader (`--ha etcd`) and a relay first (perf/ha/failover.sh shows
how). Loopback only; bounded by rounds x requests.
"""

import http.client
import json
import statistics
import sys
import time


def body() -> bytes:
    keys = [f"{i:032x}" for i in range(128)]
    return json.dumps({"keys": keys}).encode()


def round_trip_us(addr: str, n: int, payload: bytes) -> float:
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    headers = {"Content-Type": "application/json"}
    # One warm-up request opens the connection (and, through the relay, the
    # upstream one).
    conn.request("POST", "/keys/batch_exists", payload, headers)
    conn.getresponse().read()
    start = time.perf_counter()
    for _ in range(n):
        conn.request("POST", "/keys/batch_exists", payload, headers)
        r = conn.getresponse()
        r.read()
        if r.status != 200:
            raise SystemExit(f"{addr}: HTTP {r.status}")
    conn.close()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    leader, relay = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 7
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 2000
    payload = body()
    direct, relayed = [], []
    for _ in range(rounds):
        direct.append(round_trip_us(leader, n, payload))
        relayed.append(round_trip_us(relay, n, payload))
    d, r = statistics.median(direct), statistics.median(relayed)
    print(f"direct  : median {d:.1f} us/request over {rounds} rounds of {n} (range {min(direct):.1f}-{max(direct):.1f})")
    print(f"relayed : median {r:.1f} us/request (range {min(relayed):.1f}-{max(relayed):.1f})")
    print(f"relay cost: {r - d:+.1f} us/request ({r / d:.2f}x)")


if __name__ == "__main__":
    main()
