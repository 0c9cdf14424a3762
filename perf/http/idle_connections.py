#!/usr/bin/env python3
"""Resident memory per open keep-alive connection, and what a client over
the connection cap sees (the many-connections target).

Opens N connections to a target on loopback, sends one batch_exists of 128
keys on each (so every connection has served a request and holds whatever
buffers that left it), keeps them all open, and reports the target's
resident memory (VmRSS of --pid) before and after, per connection. Then,
with --over K, opens K more connections and says, for each, whether its
request was answered within --wait seconds: a server at its
--max-connections cap leaves them in the listen backlog until a slot frees.

    perf/http/idle_connections.py --port P --pid PID [--conns 4096] [--over 0] [--wait 2]

Loopback only; every socket has a timeout, so the script ends by itself.
"""

import argparse
import resource
import socket
import sys
import time


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def request(port: int) -> bytes:
    keys = ",".join(f'"{i:032x}"' for i in range(128))
    body = f'{{"keys":[{keys}]}}'.encode()
    head = (
        f"POST /keys/batch_exists HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


def answered(s: socket.socket) -> bool:
    """Reads one response head; True when a status line arrived."""
    got = b""
    try:
        while b"\r\n\r\n" not in got:
            chunk = s.recv(65536)
            if not chunk:
                return False
            got += chunk
    except (socket.timeout, OSError):
        return False
    return got.startswith(b"HTTP/1.1 ")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid", type=int, required=True, help="the target's pid (for VmRSS)")
    ap.add_argument("--conns", type=int, default=4096)
    ap.add_argument("--over", type=int, default=0, help="connections to open beyond --conns")
    ap.add_argument("--wait", type=float, default=2.0, help="seconds an over-the-cap request may take")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    req = request(a.port)
    before = rss_kb(a.pid)
    socks = []
    failed = 0
    for _ in range(a.conns):
        s = socket.create_connection(("127.0.0.1", a.port), timeout=10)
        s.sendall(req)
        if not answered(s):
            failed += 1
        socks.append(s)
    time.sleep(0.5)  # let the target's allocator settle before reading VmRSS
    after = rss_kb(a.pid)
    per = (after - before) * 1024 / max(a.conns, 1)
    print(f"{a.conns} open connections: RSS {before / 1024:.1f} -> {after / 1024:.1f} MB, "
          f"{per / 1024:.1f} KB per connection, {failed} unanswered")
    if a.over:
        waiting = 0
        extra = []
        for _ in range(a.over):
            s = socket.create_connection(("127.0.0.1", a.port), timeout=a.wait)
            s.sendall(req)
            extra.append(s)
        for s in extra:
            if not answered(s):
                waiting += 1
        print(f"{a.over} more connections: {a.over - waiting} answered within {a.wait} s, {waiting} not")
        # Free a slot: the first waiting client must then be served.
        socks.pop().close()
        if waiting:
            s = extra[-waiting]
            s.settimeout(10)
            print(f"after closing one of the first {a.conns}: a waiting client was "
                  f"{'answered' if answered(s) else 'NOT answered within 10 s'}")
        for s in extra:
            s.close()
    for s in socks:
        s.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
