#!/usr/bin/env python3
"""The client of perf/http/instructions.sh: exactly N requests of one route over
one keep-alive connection, with the same bytes every run.

    instructions.py --port PORT --route ROUTE --requests N [--stored S]

Before the N measured requests it prepares the route's state on the same
connection, identically whatever N is (so that the difference of two runs,
N = 100 and N = 600, holds the measured requests only):

- every route but the bare exchange initializes its rank or page space with
  2^20 pages and stores 128 keys (32-hex MD5 digests for vLLM, 64-hex SHA-256
  digests for SGLang): allocate, then confirm;
- the confirm routes also reserve MAX_REQUESTS batches of 128 new keys, so
  that request i confirms batch i whatever N is;
- the release route (vLLM's confirm_write with only `pages_to_release`, as
  a worker frees the pages of a batch it no longer keeps) also confirms
  those batches, so that request i frees batch i's 128 bound pages.

- the longest-prefix routes store the 128 keys of a prompt's chain (the
  engine's chain of PROMPT_TOKENS token ids in blocks of BLOCK_SIZE):
  `vllm_prefix` asks `/keys/longest_prefix` with the token ids (the server
  hashes the chain), `vllm_prefix_keys` with the 128 keys, `sglang_prefix`
  with SGLang's token ids; the lookup routes store that same chain when
  --stored is given, so that both sides ask about the same keys;
- with --stored S above 128, S - 128 more keys are stored first, in
  batches of FILL_BATCH (the index then holds S keys; the rank has S + 2^20
  pages).

Request i of the new-key routes carries batch i's 128 keys, never seen
before. Every answer is checked (status, and for lookups every key found),
so the counts always measure the work the table names. Standard library
only; loopback only; it stops after its requests (and a 60 s socket
timeout guards every read).
"""

import argparse
import hashlib
import json
import socket
import sys

KEYS = 128
PAGES = 1 << 20
MAX_REQUESTS = 600
BLOCK_SIZE = 16
PROMPT_TOKENS = [(7919 * i) % 151_000 for i in range(KEYS * BLOCK_SIZE)]
FILL_BATCH = 8192
PREFIX_ROUTES = ("vllm_prefix", "vllm_prefix_keys", "sglang_prefix")


def md5(text):
    return hashlib.md5(text.encode()).hexdigest()


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def vllm_chain(tokens):
    """vLLM's hf3fs key chain of the full blocks (docs/api.md, "The key chains")."""
    out, prev = [], ""
    for start in range(0, len(tokens) - BLOCK_SIZE + 1, BLOCK_SIZE):
        prev = md5(f"{prev}_{tokens[start:start + BLOCK_SIZE]}")
        out.append(prev)
    return out


def sglang_chain(tokens):
    """SGLang's storage key chain of the full pages (ids below 2^32)."""
    out, prev = [], b""
    for start in range(0, len(tokens) - BLOCK_SIZE + 1, BLOCK_SIZE):
        block = b"".join(t.to_bytes(4, "little") for t in tokens[start:start + BLOCK_SIZE])
        prev = hashlib.sha256(prev + block).digest()
        out.append(prev.hex())
    return out


def dumps(value):
    """Compact JSON, as perf's load generator and SGLang's orjson send it."""
    return json.dumps(value, separators=(",", ":"))


class Conn:
    """One HTTP/1.1 keep-alive connection, requests one at a time."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def post(self, path, body):
        data = body.encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        self.sock.sendall(head.encode() + data)
        return self.response()

    def fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise SystemExit("instructions.py: the server closed the connection")
        self.buf += chunk

    def response(self):
        while b"\r\n\r\n" not in self.buf:
            self.fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        while len(self.buf) < length:
            self.fill()
        body, self.buf = self.buf[:length], self.buf[length:]
        return status, body


def expect(what, status, body, want_status=200):
    if status != want_status:
        raise SystemExit(f"instructions.py: {what} answered {status}: {body[:300]!r}")
    return json.loads(body) if body else None


class Vllm:
    """vLLM's dialect on rank 0."""

    def __init__(self, conn):
        self.c = conn

    def setup(self, stored, fill=()):
        pages = PAGES + len(fill)
        expect("initialize", *self.c.post("/rank/0/initialize", dumps({"num_pages": pages, "role": "worker"})))
        for i in range(0, len(fill), FILL_BATCH):
            self.confirm(self.allocate(fill[i : i + FILL_BATCH]))
        self.confirm(self.allocate(stored))

    def allocate(self, keys):
        got = expect("batch_allocate", *self.c.post("/keys/batch_allocate", dumps({"rank": 0, "keys": [[k, ""] for k in keys]})))
        pairs = [(k, p) for k, p in got["results"]]
        if len(pairs) != len(keys) or any(p < 0 for _, p in pairs):
            raise SystemExit(f"instructions.py: batch_allocate gave no page to some key: {got}")
        return pairs

    def confirm(self, pairs):
        body = dumps({"rank": 0, "confirmations": pairs, "pages_to_release": []})
        expect("confirm_write", *self.c.post("/keys/confirm_write", body), 204)

    def release(self, pages):
        body = dumps({"rank": 0, "confirmations": [], "pages_to_release": pages})
        expect("confirm_write (release)", *self.c.post("/keys/confirm_write", body), 204)


class Sglang:
    """SGLang's dialect on rank 0, namespace "kv" (the default, not named)."""

    def __init__(self, conn):
        self.c = conn

    def setup(self, stored, fill=()):
        expect("initialize", *self.c.post("/0/initialize", dumps({"num_pages": PAGES + len(fill)})), 204)
        for i in range(0, len(fill), FILL_BATCH):
            self.confirm(self.allocate(fill[i : i + FILL_BATCH]))
        self.confirm(self.allocate(stored))

    def allocate(self, keys):
        path = "/0/reserve_and_allocate_page_indices"
        got = expect("reserve", *self.c.post(path, dumps({"keys": [[k, ""] for k in keys]})))
        pairs = [(k, p) for k, (written, p) in zip(keys, got["indices"])]
        if len(pairs) != len(keys) or any(p < 0 for _, p in pairs):
            raise SystemExit(f"instructions.py: reserve gave no page to some key: {got}")
        return pairs

    def confirm(self, pairs):
        body = dumps({"written_keys_to_confirm": pairs, "pages_to_release": []})
        expect("confirm_write", *self.c.post("/0/confirm_write", body), 204)


def vllm_new(i):
    return [md5(f"new-{i}-{j}") for j in range(KEYS)]


def sglang_new(i):
    return [sha(f"new-{i}-{j}") for j in range(KEYS)]


def run(route, conn, n, stored=KEYS):
    """Prepares `route`'s state, then sends its n measured requests."""
    if route in PREFIX_ROUTES or stored > KEYS:
        vllm_stored, sglang_stored = vllm_chain(PROMPT_TOKENS), sglang_chain(PROMPT_TOKENS)
    else:
        vllm_stored = [md5(f"stored-{j}") for j in range(KEYS)]
        sglang_stored = [sha(f"stored-{j}") for j in range(KEYS)]
    if route == "bare":
        body = dumps({"keys": vllm_stored})
        for _ in range(n):
            expect("bare", *conn.post("/keys/batch_exists", body))
        return
    dialect, keys, new = (Vllm(conn), vllm_stored, vllm_new) if route.startswith("vllm") else (Sglang(conn), sglang_stored, sglang_new)
    fill = [(md5 if route.startswith("vllm") else sha)(f"fill-{j}") for j in range(max(0, stored - KEYS))]
    dialect.setup(keys, fill)
    if route in PREFIX_ROUTES:
        if route == "vllm_prefix_keys":
            body = dumps({"keys": keys})
        else:
            query = {"token_ids": PROMPT_TOKENS, "block_size": BLOCK_SIZE}
            body = dumps(query if route == "vllm_prefix" else {"dialect": "sglang", **query})
        want = {"length": KEYS, "blocks": KEYS, "ranks": [KEYS]}
        for _ in range(n):
            got = expect(route, *conn.post("/keys/longest_prefix", body))
            if got != want:
                raise SystemExit(f"instructions.py: {route} answered {got}, not {want}")
    elif route in ("vllm_exists", "sglang_exists"):
        path = "/keys/batch_exists" if route == "vllm_exists" else "/0/exists"
        body = dumps({"keys": keys})
        for _ in range(n):
            got = expect(route, *conn.post(path, body))
            if got["exists"] != [True] * KEYS:
                raise SystemExit(f"instructions.py: {route} did not find every stored key: {got}")
    elif route in ("vllm_locations", "sglang_locations"):
        path, body, field = (
            ("/keys/get_locations", dumps({"rank": 0, "keys": keys}), "locations")
            if route == "vllm_locations"
            else ("/0/get_page_indices", dumps({"keys": keys}), "indices")
        )
        for _ in range(n):
            got = expect(route, *conn.post(path, body))
            if None in got[field] or len(got[field]) != KEYS:
                raise SystemExit(f"instructions.py: {route} did not locate every stored key: {got}")
    elif route in ("vllm_allocate", "sglang_allocate"):
        for i in range(n):
            dialect.allocate(new(i))
    elif route in ("vllm_confirm", "sglang_confirm"):
        batches = [dialect.allocate(new(i)) for i in range(MAX_REQUESTS)]
        for i in range(n):
            dialect.confirm(batches[i])
    elif route == "vllm_release":
        batches = [dialect.allocate(new(i)) for i in range(MAX_REQUESTS)]
        for batch in batches:
            dialect.confirm(batch)
        for i in range(n):
            dialect.release([p for _, p in batches[i]])
    else:
        raise SystemExit(f"instructions.py: unknown route {route}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--route", required=True)
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--stored", type=int, default=KEYS, help="keys in the index (at least 128)")
    a = ap.parse_args()
    if not 0 <= a.requests <= MAX_REQUESTS:
        sys.exit(f"instructions.py: --requests must be 0..{MAX_REQUESTS}")
    run(a.route, Conn(a.port), a.requests, max(KEYS, a.stored))


if __name__ == "__main__":
    main()
