"""Real servers on 127.0.0.1 (port 0) for the outbound tests: scripted HTTP, a black hole, SMTP.

``HttpServer`` answers each path from a script of ``Reply`` objects (the last
one repeats) and logs every request with its arrival and end times, so tests
can prove things from the server's side: how many requests, which headers,
how many were in flight at once, how far apart they started. A reply can
answer any status with any headers, wait before answering, drip its body a
byte at a time, reset the connection mid-body, or stream far more than any
client should read.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"ok"
    delay: float = 0.0  # before the status line
    drip: float | None = None  # seconds between body bytes (declares a long Content-Length)
    # Seconds between header lines that never end (the head is never complete): no
    # read ever waits long, so only a whole-exchange deadline stops the client.
    drip_headers: float | None = None
    reset_after: int | None = None  # send this many body bytes, then a TCP RST
    stream_bytes: int | None = None  # chunked body of this many bytes, no Content-Length
    chunk: bytes = b"M" * 65536  # what a streamed body is made of


@dataclass
class Record:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    started: float  # time.time() when the request was read
    finished: float = 0.0
    bytes_sent: int = 0
    sni: str | None = None

    def header(self, name: str) -> str | None:
        for key, value in self.headers.items():
            if key.lower() == name.lower():
                return value
        return None


Script = Reply | Callable[[Record], Reply]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        sni = getattr(self.connection, "_durable_sni", None)
        record = Record(self.command, self.path, dict(self.headers.items()), body, time.time())
        record.sni = sni
        self.server.owner.log_request(record)
        reply = self.server.owner.next_reply(record)
        try:
            self._answer(reply, record)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            self.close_connection = True
        finally:
            record.finished = record.finished or time.time()

    do_GET = do_POST = do_PUT = do_DELETE = _serve

    def _answer(self, reply: Reply, record: Record) -> None:
        if reply.delay:
            time.sleep(reply.delay)
        if reply.drip_headers is not None:
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            for n in range(int(30 / reply.drip_headers)):  # at most 30 s of it
                self.wfile.write(b"X-Drip-%d: .\r\n" % n)
                self.wfile.flush()
                record.bytes_sent += 1
                time.sleep(reply.drip_headers)
            self.close_connection = True
            return
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if reply.stream_bytes is not None:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = reply.chunk
            while record.bytes_sent < reply.stream_bytes:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                record.bytes_sent += len(chunk)
            self.wfile.write(b"0\r\n\r\n")
            return
        if reply.drip is not None:
            self.send_header("Content-Length", str(100_000))
            self.end_headers()
            for _ in range(100_000):
                self.wfile.write(b".")
                self.wfile.flush()
                record.bytes_sent += 1
                time.sleep(reply.drip)
            return
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        if reply.reset_after is not None:
            self.wfile.write(reply.body[: reply.reset_after])
            self.wfile.flush()
            record.bytes_sent = reply.reset_after
            # SO_LINGER 0: close() sends RST instead of FIN — a reset mid-response.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            return
        # "Finished" before the last write: the client cannot have read the answer (and
        # freed its gate slot) before this moment, so logged intervals never overstate
        # the client's concurrency.
        record.finished = time.time()
        self.wfile.write(reply.body)
        record.bytes_sent = len(reply.body)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: HttpServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # resets and broken pipes are what these tests provoke


class HttpServer:
    def __init__(self, tls: ssl.SSLContext | None = None):
        self.log: list[Record] = []
        self._scripts: dict[str, list[Script]] = {}
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        if tls is not None:
            self._server.socket = _SniRecordingContext(tls).wrap(self._server.socket)
        self.port = self._server.server_address[1]
        self.scheme = "https" if tls else "http"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

    def url(self, path: str = "/", host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{host}:{self.port}{path}"

    def reply(self, path: str, *script: Script) -> None:
        with self._lock:
            self._scripts[path] = list(script)

    def next_reply(self, record: Record) -> Reply:
        with self._lock:
            script = self._scripts.get(record.path.split("?")[0]) or [Reply()]
            item = script.pop(0) if len(script) > 1 else script[0]
        return item(record) if callable(item) else item

    def log_request(self, record: Record) -> None:
        with self._lock:
            self.log.append(record)

    def requests(self, path: str | None = None) -> list[Record]:
        with self._lock:
            return [r for r in self.log if path is None or r.path.split("?")[0] == path]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _SniRecordingContext:
    """Wraps accepted sockets in TLS and remembers the SNI name each client sent."""

    def __init__(self, context: ssl.SSLContext):
        self.context = context
        context.sni_callback = self._sni

    @staticmethod
    def _sni(tls: Any, name: str | None, _ctx: ssl.SSLContext) -> None:
        tls._durable_sni = name

    def wrap(self, sock: socket.socket) -> socket.socket:
        context = self.context

        class Listening(socket.socket):
            def accept(self):  # type: ignore[override]
                conn, addr = super().accept()
                conn.settimeout(5)
                return context.wrap_socket(conn, server_side=True), addr

        return Listening(sock.family, sock.type, fileno=sock.detach())


def make_tls(hostname: str, tmp_dir: Any) -> tuple[ssl.SSLContext, str]:
    """A throw-away CA and a certificate for ``hostname``: (server context, CA bundle path)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "durable test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(hostname)]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path = tmp_dir / "server.pem"
    cert_path.write_bytes(
        leaf.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    ca_path = tmp_dir / "ca.pem"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path)
    return context, str(ca_path)


class BlackHole:
    """A listening socket whose accept queue is full: new connections hang in SYN-SENT."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(0)
        self.port = self._sock.getsockname()[1]
        self._fillers = []
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", self.port))
            self._fillers.append(filler)
        time.sleep(0.1)

    def close(self) -> None:
        for filler in self._fillers:
            filler.close()
        self._sock.close()


def max_concurrency(records: list[Record]) -> int:
    """The most requests the server was handling at one instant."""
    edges = sorted(
        [(r.started, 1) for r in records] + [(r.finished, -1) for r in records],
        key=lambda edge: (edge[0], edge[1]),  # ends before starts at the same instant
    )
    current = peak = 0
    for _, step in edges:
        current += step
        peak = max(peak, current)
    return peak


def start_gaps(records: list[Record]) -> list[float]:
    starts = sorted(r.started for r in records)
    return [b - a for a, b in itertools.pairwise(starts)]
