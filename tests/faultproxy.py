"""A fault-injecting HTTP proxy for tests: sits on loopback in front of moto's S3 server.

Each request is, at random (seeded): answered with a 503 SlowDown or 500 InternalError without
reaching S3; dropped before forwarding (the request never happened); dropped after forwarding
(the request took effect but its response is lost: the hardest case for retries); delayed; or
forwarded untouched. At most ``max_consecutive`` faults happen in a row, so a client that
retries a bounded number of times always gets through: a test that loses rows has a real bug.
:meth:`FaultProxy.force` gives the next requests chosen fates; :meth:`FaultProxy.outage` gives
every request one fate until it is lifted (``reset`` answers with a TCP reset).
The proxy listens on 127.0.0.1 only and shuts itself down after ``lifetime_s`` seconds.
"""

from __future__ import annotations

import http.client
import random
import socket
import struct
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
               "proxy-connection", "content-length"}
_ERRORS = {  # fate "errorNNN" answers with NNN: the errors a store should retry (5xx) and two it must not
    403: b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied</Code>"
         b"<Message>Access Denied</Message></Error>",
    400: b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>InvalidArgument</Code>"
         b"<Message>Invalid Argument</Message></Error>",
    503: b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
         b"<Message>Please reduce your request rate.</Message></Error>",
    500: b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>InternalError</Code>"
         b"<Message>We encountered an internal error. Please try again.</Message></Error>",
}


class FaultProxy:
    """Start with :meth:`start`; ``url`` is the endpoint to give clients; ``stats`` counts what happened."""

    def __init__(self, upstream: str, seed: int = 0, p_error: float = 0.08, p_drop_before: float = 0.04,
                 p_drop_after: float = 0.04, p_slow: float = 0.08, slow_s: tuple[float, float] = (0.2, 0.6),
                 max_consecutive: int = 2, lifetime_s: float = 300.0):
        up = urlsplit(upstream)
        self.upstream = (up.hostname, up.port)
        self.rng = random.Random(seed)
        self.p = [("error", p_error), ("drop_before", p_drop_before), ("drop_after", p_drop_after),
                  ("slow", p_slow)]
        self.slow_s, self.max_consecutive, self.lifetime_s = slow_s, max_consecutive, lifetime_s
        self.stats: Counter = Counter()
        self.enabled = True
        self._lock = threading.Lock()
        self._consecutive = 0
        self._forced: list[str] = []
        self._outage: str | None = None
        self._server: ThreadingHTTPServer | None = None

    def force(self, fates: list[str]) -> None:
        """Give the next requests these fates (``error``, ``drop_before``, ...), whatever the odds say."""
        with self._lock:
            self._forced.extend(fates)

    def outage(self, fate: str | None) -> None:
        """Give every request this fate (``error503``, ``reset``, ...) from now on; ``None`` lifts the outage."""
        with self._lock:
            self._outage = fate

    # ---- decisions
    def decide(self) -> str:
        """The fate of the next request (thread-safe)."""
        with self._lock:
            self.stats["requests"] += 1
            if self._outage:
                self.stats[self._outage] += 1
                return self._outage
            if self._forced:
                fate = self._forced.pop(0)
                self.stats[fate] += 1
                return fate
            if not self.enabled or self._consecutive >= self.max_consecutive:
                self._consecutive = 0
                return "forward"
            r, acc = self.rng.random(), 0.0
            for kind, p in self.p:
                acc += p
                if r < acc:
                    if kind != "slow":  # a slow answer is still an answer
                        self._consecutive += 1
                    self.stats[kind] += 1
                    return kind
            self._consecutive = 0
            return "forward"

    # ---- lifecycle
    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FaultProxy:
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True).start()
        # stops by itself: a forgotten proxy never outlives its test session by long
        timer = threading.Timer(self.lifetime_s, self.stop)
        timer.daemon = True
        timer.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real S3 clients use it
    owner: FaultProxy

    def log_message(self, *args) -> None:  # quiet: the counters say what happened
        pass

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw = bytearray()
            while True:  # keep the chunk framing: the upstream parses it (aws-chunked bodies)
                line = self.rfile.readline()
                raw += line
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while True:
                        trailer = self.rfile.readline()
                        raw += trailer
                        if trailer in (b"\r\n", b"\n", b""):
                            return bytes(raw)
                raw += self.rfile.read(size + 2)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _handle(self) -> None:
        body = self._read_body()
        fate = self.owner.decide()
        if fate == "drop_before":
            self.close_connection = True
            return
        if fate == "reset":  # linger 0: close() sends RST, the client reads "connection reset by peer"
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            return
        if fate.startswith("error"):
            status = int(fate[5:]) if fate[5:] else self.owner.rng.choice([503, 500])
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(_ERRORS[status])))
            self.end_headers()
            if self.command != "HEAD":  # a body after a HEAD answer would garble the connection's next answer
                self.wfile.write(_ERRORS[status])
            return
        if fate == "slow":
            time.sleep(self.owner.rng.uniform(*self.owner.slow_s))
        conn = http.client.HTTPConnection(*self.owner.upstream, timeout=60)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for k, v in self.headers.items():
                if k.lower() not in ("connection", "keep-alive", "proxy-connection"):
                    conn.putheader(k, v)
            conn.endheaders(body or None)
            resp = conn.getresponse()
            data = resp.read()
            headers = resp.getheaders()
            status = resp.status
        finally:
            conn.close()
        if fate == "drop_after":  # it happened upstream; the client never hears of it
            self.close_connection = True
            return
        self.send_response(status)
        length = None
        for k, v in headers:
            if k.lower() == "content-length":
                length = v
            if k.lower() not in _HOP_BY_HOP:
                self.send_header(k, v)
        # HEAD answers carry the object's length but no body
        self.send_header("Content-Length", length if self.command == "HEAD" and length else str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle
