"""Byte links between the worker processes of one host: the exchange's rows without Dask's comms.

Owner-computes workers on one machine sent each mode's rows through Dask's comms: a message and
its reply through both workers' event loops, msgpack framing and loopback TCP. On 2 process
workers of 2 cores that took 10-12 ms of each worker's event-loop CPU per vast-shaped iteration,
on the cores the kernels use, and 1.1-2.7 ms a delivery (docs/EXECUTION.md, "Host links").

A link is a Unix-domain stream socket in Linux's abstract namespace (no file is made): each
worker listens on one; a sender connects to a peer's listener once and keeps the connection. The
sender's writer thread writes each message (a pickle, protocol 5, whose NumPy buffers go out of
band, written as they are), so the task thread goes on at once; the receiver's reader thread
reads the buffers straight into fresh arrays and puts the message into the worker's mailbox. No
event loop, no copy but the socket's.

A connection is served only after it presents the listener's secret, which the connecting worker
got over Dask's own comm (TLS where the cluster uses it): a process that merely finds the socket
cannot inject messages. Workers of other hosts, or of another network namespace, or where links
are off (``tfooc.exchange.host-links: false`` in Dask's config, or
``DASK_TFOOC__EXCHANGE__HOST_LINKS=false``), keep Dask's comms.
"""

from __future__ import annotations

import hmac
import os
import pickle
import queue
import secrets
import socket
import struct
import threading
from concurrent.futures import Future
from typing import Any, Callable

import dask
import numpy as np

CONFIG_KEY = "tfooc.exchange.host-links"
SECRET_BYTES = 16
# a message: the pickle's length, its buffer count; then each buffer's length
_HEAD = struct.Struct("<QI")
_SIZE = struct.Struct("<Q")


class LinkClosed(ConnectionError):
    """The peer's end of a link closed: its process ended (or its listener was closed)."""


def links_enabled() -> bool:
    """Whether this process serves and uses host links (Dask config ``tfooc.exchange.host-links``)."""
    value = dask.config.get(CONFIG_KEY, default=True)
    if isinstance(value, str):
        return value.strip().lower() not in ("0", "false", "no", "off")
    return bool(value)


def host_identity() -> str | None:
    """What two processes share when one can reach the other's abstract socket: the machine (its
    boot) and the network namespace; None where there is no abstract namespace (not Linux)."""
    if not hasattr(socket, "AF_UNIX") or not os.path.exists("/proc/self/ns/net"):
        return None
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{socket.gethostname()}|{boot}|{os.readlink('/proc/self/ns/net')}"
    except OSError:
        return None


def _recv_exactly(sock: socket.socket, view: memoryview) -> bool:
    """Fill ``view`` from ``sock``; False at end of stream before it is full."""
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            return False
        got += k
    return True


def encode(message: Any) -> list:
    """``message`` as the pieces written for it: head, pickle, out-of-band buffers."""
    buffers: list = []
    body = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    sizes = b"".join(_SIZE.pack(r.nbytes) for r in raws)
    return [_HEAD.pack(len(body), len(raws)) + sizes, body, *raws]


def decode_from(sock: socket.socket) -> tuple[bool, Any]:
    """Read one message from ``sock``: (False, None) at the end of the stream."""
    head = bytearray(_HEAD.size)
    if not _recv_exactly(sock, memoryview(head)):
        return False, None
    body_size, count = _HEAD.unpack(head)
    sizes = bytearray(_SIZE.size * count)
    if count and not _recv_exactly(sock, memoryview(sizes)):
        return False, None
    body = bytearray(body_size)
    if not _recv_exactly(sock, memoryview(body)):
        return False, None
    buffers = []
    for (size,) in _SIZE.iter_unpack(sizes):
        buf = np.empty(size, dtype=np.uint8)  # writable, not zeroed: the arrays received are the receiver's
        if size and not _recv_exactly(sock, memoryview(buf)):
            return False, None
        buffers.append(buf)
    return True, pickle.loads(body, buffers=buffers)


class Listener:
    """A worker's listening link: every connection that presents the secret has a reader thread
    that hands each message to ``deliver``."""

    def __init__(self, deliver: Callable[[Any], None]) -> None:
        self.deliver = deliver
        self.secret = secrets.token_bytes(SECRET_BYTES)
        self.name = f"\0tfooc-link-{os.getpid()}-{secrets.token_hex(8)}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.name)
        self.sock.listen(64)
        self.closed = False
        threading.Thread(target=self._accept, name="tfooc-link-accept", daemon=True).start()

    def endpoint(self) -> dict:
        """What a peer needs to connect: the host identity, the socket's name, the secret."""
        return {"host": host_identity(), "pid": os.getpid(), "name": self.name, "secret": self.secret}

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="tfooc-link-read", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            token = bytearray(SECRET_BYTES)
            try:
                if not _recv_exactly(conn, memoryview(token)) or not hmac.compare_digest(bytes(token), self.secret):
                    return  # not a peer that asked this worker over Dask: nothing it sent is read
                while True:
                    ok, message = decode_from(conn)
                    if not ok:
                        return
                    self.deliver(message)
            except OSError:
                return

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class Link:
    """A connection to one peer's listener; :meth:`send` queues a message for the writer thread and
    returns a future that is done when the message was written (an error once the peer is gone)."""

    def __init__(self, endpoint: dict) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(endpoint["name"])
        self.sock.sendall(endpoint["secret"])
        self.broken: BaseException | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._write, name="tfooc-link-write", daemon=True).start()

    def send(self, message: Any) -> Future:
        done: Future = Future()
        if self.broken is not None:
            done.set_exception(LinkClosed(f"host link closed: {self.broken}"))
            return done
        self._queue.put((done, message))
        return done

    def _write(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            done, message = item
            if self.broken is not None:
                done.set_exception(LinkClosed(f"host link closed: {self.broken}"))
                continue
            try:
                for piece in encode(message):
                    self.sock.sendall(piece)
            except OSError as exc:
                self.broken = exc
                done.set_exception(LinkClosed(f"host link to a peer worker broke: {exc}"))
            else:
                done.set_result(None)

    def closed_by_peer(self) -> bool:
        """Whether the peer's end is closed (its process ended): the peer never writes on a link,
        so a readable end of stream is the only thing a look without waiting can find."""
        if self.broken is not None:
            return True
        try:
            return self.sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def close(self) -> None:
        self._queue.put(None)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def connect(endpoint: dict | None) -> Link | None:
    """A link to the peer that answered ``endpoint``, where it is a process of this host (another
    one); None where not, or where connecting failed (the caller keeps Dask's comms)."""
    if not endpoint or not links_enabled():
        return None
    here = host_identity()
    if here is None or endpoint.get("host") != here or endpoint.get("pid") == os.getpid():
        return None
    try:
        return Link(endpoint)
    except OSError:
        return None
