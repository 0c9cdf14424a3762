"""A forwarding HTTP gateway between an engine's client and the server, that
answers 503 when the test says so.

The engines' clients retry 500/502/503/504 three times with a 0.3 s backoff
and no timeout. To check that their own retry loop rides out a server that
is unavailable for a while, the unavailability must be under the test's
control: the binary has no switch that makes its API routes answer 503 (its
only 503s come from a failing disk or a shutdown in progress), and racing a
restart against the client's 1.8 s of backoff would make the test depend on
timing. The gateway counts instead: ``fail_next(n)`` answers the next ``n``
requests 503 without forwarding them, and ``hold_next()`` parks the request
after those until ``release()`` names the (possibly restarted) server, as a
load balancer in front of a restarting backend would. Every other request is
forwarded as is to the server, and its answer is relayed as is.

Loopback only; one thread per connection (ThreadingHTTPServer), HTTP/1.1
keep-alive towards the client, a fresh connection per request towards the
server.
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Bounds on waits that only a broken test or server would reach.
FORWARD_TIMEOUT_S = 30.0
HOLD_DEADLINE_S = 60.0

UNAVAILABLE = b'{"detail":"gateway: the metadata server is unavailable"}'


class Gateway:
    """The gateway's listening socket, its plan and its log of attempts."""

    def __init__(self, backend_port: int):
        self._lock = threading.Lock()
        self._backend_port = backend_port
        self._fail = 0
        self._hold = False
        self._held = threading.Event()
        self._released = threading.Event()
        # (method, path, outcome) per request received: "503", "forwarded <status>".
        self.attempts: list[tuple[str, str, str]] = []
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="gateway", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._released.set()  # never leave a handler parked
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=FORWARD_TIMEOUT_S)

    def fail_next(self, n: int) -> None:
        """Answers the next `n` requests 503 without forwarding them."""
        with self._lock:
            self._fail = n

    def hold_next(self) -> None:
        """Parks the first request after the failures until `release`."""
        with self._lock:
            self._hold = True
            self._held.clear()
            self._released.clear()

    def wait_held(self) -> None:
        """Returns once a request is parked (fails after HOLD_DEADLINE_S)."""
        assert self._held.wait(HOLD_DEADLINE_S), f"no request reached the gateway's hold: {self.attempts}"

    def release(self, backend_port: int) -> None:
        """Forwards the parked request, and all later ones, to `backend_port`."""
        with self._lock:
            self._backend_port = backend_port
            self._hold = False
        self._released.set()

    def outcomes(self, path: str) -> list[str]:
        """The outcome of every request received for `path`, in order."""
        with self._lock:
            return [o for _, p, o in self.attempts if p == path]

    def _plan(self, method: str, path: str) -> str:
        with self._lock:
            if self._fail > 0:
                self._fail -= 1
                self.attempts.append((method, path, "503"))
                return "fail"
            if self._hold:
                self._held.set()
                return "hold"
            return "forward"

    def _forward(self, method: str, path: str, body: bytes, content_type: str | None) -> tuple[int, bytes, str | None]:
        with self._lock:
            port = self._backend_port
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=FORWARD_TIMEOUT_S)
        try:
            headers = {"Content-Type": content_type} if content_type else {}
            conn.request(method, path, body=body if method == "POST" else None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            result = (resp.status, data, resp.getheader("Content-Type"))
        finally:
            conn.close()
        with self._lock:
            self.attempts.append((method, path, f"forwarded {result[0]}"))
        return result


def _handler(gw: Gateway) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # noqa: A002 (the base class's name)
            pass

        def _reply(self, status: int, body: bytes, content_type: str | None) -> None:
            self.send_response(status)
            if content_type:
                self.send_header("Content-Type", content_type)
            if status != 204:  # a 204 has no body and no length
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if status != 204:
                self.wfile.write(body)

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            plan = gw._plan(self.command, self.path)
            if plan == "fail":
                self._reply(503, UNAVAILABLE, "application/json")
                return
            if plan == "hold" and not gw._released.wait(HOLD_DEADLINE_S):
                self._reply(504, b'{"detail":"gateway: held past its deadline"}', "application/json")
                return
            status, data, ctype = gw._forward(self.command, self.path, body, self.headers.get("Content-Type"))
            self._reply(status, data, ctype)

        do_GET = _serve
        do_POST = _serve

    return Handler
