"""A TCP relay on loopback that a test or a benchmark can cut, as a network or a failover would.

Processes connect to the relay's port instead of the database's. ``cut()``
closes every connection at once (each side sees its peer go away mid-stream)
and closes the listening socket, so a new connection is refused on the spot;
``restore()`` listens again on the same port. Only 127.0.0.1, both ways.
"""

from __future__ import annotations

import socket
import threading
from contextlib import suppress

CHUNK = 65536


class Relay:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1", port: int = 0) -> None:
        self.target = (target_host, target_port)
        self._lock = threading.Lock()
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._listener: socket.socket | None = None
        self.port = port
        self.cuts = 0
        self.accepted = 0
        self.restore()

    # --- control -------------------------------------------------------------------

    def restore(self) -> None:
        """Listen (again) on the relay's port."""
        with self._lock:
            if self._listener is not None:
                return
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(128)
            self.port = listener.getsockname()[1]
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> int:
        """Close every relayed connection and refuse new ones; returns how many were cut."""
        with self._lock:
            listener, self._listener = self._listener, None
            pairs, self._pairs = self._pairs, set()
            self.cuts += 1
        if listener is not None:
            _close(listener)
        for pair in pairs:
            for sock in pair:
                _close(sock)
        return len(pairs)

    def close(self) -> None:
        self.cut()

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    # --- relaying ----------------------------------------------------------------------

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut: the listener is closed
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            pair = (client, upstream)
            with self._lock:
                if self._listener is not listener:  # cut while connecting
                    _close(client)
                    _close(upstream)
                    return
                self._pairs.add(pair)
                self.accepted += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst, pair), daemon=True).start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, pair: tuple[socket.socket, socket.socket]
    ) -> None:
        try:
            while data := src.recv(CHUNK):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._pairs.discard(pair)
            _close(src)
            _close(dst)


def _close(sock: socket.socket) -> None:
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with suppress(OSError):
        sock.close()
