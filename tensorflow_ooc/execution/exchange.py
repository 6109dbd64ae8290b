"""Worker-to-worker messages for owner-computes runs: a mailbox on every worker and a ``Team`` that
sends and receives NumPy arrays between the workers of one run, MPI style.

Why not Dask tasks for the exchanges: a sparse reduce-scatter as tasks needs a slicing task per
worker pair on the sender and a consumer task on the receiver, each a scheduler round trip (four
per mode in all); on 2 cores those hops cost more than the 3.3 M-nonzero MTTKRP they serve. Here
each worker runs one task per iteration and the rows travel over Dask's own comms (the worker's
connection pool, its serialization of NumPy buffers as frames, without pickled copies), straight
from worker to worker: the scheduler and the driver see one task and one small summary per worker
and iteration.

Workers of one host skip Dask's comms for the rows: :mod:`.host_links` sends them over a socket
of their own, read by a thread of the receiver straight into its mailbox.

The mailbox is a handler (``tfooc_exchange``) that a :class:`ExchangePlugin` adds to each worker.
A receive waits in short slices, so a run whose peer was lost is aborted (:func:`abort_run`, sent
by the driver) instead of waiting for ever, and a task whose driver is gone (the scheduler released
it: :func:`task_released`) ends its wait itself.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
from distributed import WorkerPlugin, get_worker
from distributed.protocol import to_serialize
from distributed.utils import sync

from . import host_links

HANDLER = "tfooc_exchange"
LINK_HANDLER = "tfooc_link"
# a receive gives up when nothing came for this long (a peer stuck or gone without the driver
# noticing); the driver aborts runs whose workers left long before this
RECEIVE_TIMEOUT_S = 600.0
# a worker waiting for a peer checks this often that the peer's process still answers: a driver
# killed with its worker cannot abort the run, and the survivors' tasks would hold their threads
LIVENESS_EVERY_S = 2.0


class ExchangeAborted(RuntimeError):
    """The run was aborted while this worker waited for a peer (a worker of the run was lost)."""


class Mailbox:
    """Messages that arrived for this worker, keyed by (run, tag, source rank)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.box: dict[tuple[str, Any, int], Any] = {}
        self.aborted: set[str] = set()
        # runs released here: a message still under way when its run ended is dropped, not kept
        self.forgotten: set[str] = set()

    def put(self, run: str, tag: Any, src: int, payload: Any) -> None:
        with self.cond:
            if run in self.forgotten:
                return
            self.box[(run, _tag(tag), int(src))] = payload
            self.cond.notify_all()

    def take(
        self,
        run: str,
        tag: Any,
        src: int,
        timeout: float = RECEIVE_TIMEOUT_S,
        alive: Callable[[], bool] | None = None,
        released: Callable[[], bool] | None = None,
    ) -> Any:
        """The message ``tag`` from rank ``src``, waiting for it; ``alive()``, asked every
        ``LIVENESS_EVERY_S`` of waiting, says whether the sender is still there; ``released()``,
        asked every slice of waiting, whether the waiting task is still wanted."""
        key = (run, _tag(tag), int(src))
        start = time.monotonic()
        deadline, asked = start + timeout, start
        with self.cond:
            while key not in self.box:
                if run in self.aborted:
                    raise ExchangeAborted(f"run {run} was aborted (a worker of the run was lost)")
                if released is not None and released():
                    raise ExchangeAborted(f"run {run}: its driver released this task (the driver stopped)")
                now = time.monotonic()
                if now >= deadline:
                    raise TimeoutError(f"run {run}: no message {tag!r} from worker rank {src} after {timeout:.0f} s")
                if alive is not None and now - asked >= LIVENESS_EVERY_S:
                    self.cond.release()  # no lock held while asking over the network
                    try:
                        gone = not alive()
                    finally:
                        self.cond.acquire()
                    asked = time.monotonic()
                    if gone and key not in self.box:
                        raise ExchangeAborted(f"run {run}: worker rank {src} is gone (its process ended)")
                    continue
                self.cond.wait(min(deadline - now, 0.2))
            return self.box.pop(key)

    def abort(self, run: str) -> None:
        with self.cond:
            self.aborted.add(run)
            for key in [k for k in self.box if k[0] == run]:
                del self.box[key]
            self.cond.notify_all()

    def forget(self, run: str) -> None:
        with self.cond:
            for key in [k for k in self.box if k[0] == run]:
                del self.box[key]
            self.aborted.discard(run)
            self.forgotten.add(run)


def _tag(tag: Any) -> Any:
    # tags travel as msgpack lists; keys are tuples
    return tuple(tag) if isinstance(tag, (list, tuple)) else tag


# one mailbox per worker (several in-process workers share a process)
_MAILBOXES: dict[str, Mailbox] = {}
_LOCK = threading.Lock()


def mailbox(address: str) -> Mailbox:
    with _LOCK:
        box = _MAILBOXES.get(address)
        if box is None:
            box = _MAILBOXES[address] = Mailbox()
        return box


class ExchangePlugin(WorkerPlugin):
    """Adds the ``tfooc_exchange`` handler (deliver a message to this worker's mailbox)."""

    name = "tfooc-exchange"
    idempotent = True

    def setup(self, worker) -> None:
        import distributed.comm.utils as comm_utils

        # Dask serializes messages over 10 MiB in a thread of its own (offload), which costs two
        # thread hops per message; NumPy rows serialize as frames without a copy, so the hops were
        # the cost (docs/EXECUTION.md, "Measurements")
        comm_utils.OFFLOAD_THRESHOLD = 0
        box = mailbox(worker.address)

        def receive(run: str, tag: Any, src: int, payload: Any = None) -> str:
            box.put(run, tag, src, payload)
            return "OK"

        worker.handlers[HANDLER] = receive
        listener = _listener(worker.address, box)
        worker.handlers[LINK_HANDLER] = lambda: listener.endpoint() if listener is not None else None

    def teardown(self, worker) -> None:
        with _LOCK:
            listener = _LISTENERS.pop(worker.address, None)
            links = [_LINKS.pop(k) for k in [k for k in _LINKS if k[0] == worker.address]]
        if listener is not None:
            listener.close()
        for link in links:
            if link is not None:
                link.close()


# per worker address: its listening host link (None where links are off or impossible)
_LISTENERS: dict[str, host_links.Listener | None] = {}
# per (worker address, peer address): the link to the peer, None where it keeps Dask's comms
_LINKS: dict[tuple[str, str], host_links.Link | None] = {}


def _listener(address: str, box: Mailbox) -> host_links.Listener | None:
    with _LOCK:
        if address not in _LISTENERS:
            listener = None
            if host_links.links_enabled() and host_links.host_identity() is not None:
                try:
                    listener = host_links.Listener(lambda m: box.put(*m))
                except OSError:
                    listener = None  # no socket here (a sandbox without AF_UNIX): Dask's comms
            _LISTENERS[address] = listener
        return _LISTENERS[address]


def _link(worker, peer: str) -> host_links.Link | None:
    """This worker's link to ``peer``, made at the first send (asking the peer over Dask for its
    endpoint); None where the peer is not on this host, or links are off: Dask's comms then."""
    key = (worker.address, peer)
    with _LOCK:
        # a peer restarted at the same address (its nanny) since the last run: connect again
        if key in _LINKS and (_LINKS[key] is None or not _LINKS[key].closed_by_peer()):
            return _LINKS[key]
    try:
        endpoint = sync(worker.loop, _ask_endpoint, worker, peer)
    except Exception:  # a peer without the plugin's handler, or not answering: Dask's comms
        endpoint = None
    link = host_links.connect(endpoint)
    with _LOCK:
        old = _LINKS.get(key)
        _LINKS[key] = link
    if old is not None:
        old.close()
    return link


async def _ask_endpoint(worker, peer: str) -> dict | None:
    return await worker.rpc(peer).__getattr__(LINK_HANDLER)()


def task_released() -> bool:
    """Whether the scheduler released the Dask task running in this thread (False outside a task).

    A task keeps its thread until it returns, whatever the scheduler decides. When the run's
    driver is killed, its client's tasks are released: one a worker already runs goes on, and one
    queued behind it is dropped. A worker that had started its next iteration then waits for a
    peer that will never run it, and the peer's process still answers, so only the receive
    timeout ended the wait: a rerun on the same cluster found that worker's only thread taken for
    600 s (CI, November 2026)."""
    try:
        worker = get_worker()
        key = worker.get_current_task()
    except (ValueError, KeyError):
        return False
    ts = worker.state.tasks.get(key)
    return ts is None or ts.state in ("cancelled", "released", "forgotten")


def abort_run(run: str, dask_worker=None) -> None:
    """Run on a worker (``client.run``): wake its tasks of ``run`` with :class:`ExchangeAborted`."""
    mailbox(dask_worker.address).abort(run)


def forget_run(run: str, dask_worker=None) -> None:
    """Run on a worker: drop ``run``'s undelivered messages."""
    mailbox(dask_worker.address).forget(run)


@dataclass
class Team:
    """The workers of one run, as seen from the one at ``rank``: sends and receives by rank and tag.

    Arrays are sent as Dask serialized frames (zero-copy on the sending side); ``bytes_sent``
    counts the payload bytes this worker sent to other workers."""

    run: str
    rank: int
    addresses: Sequence[str]
    bytes_sent: int = 0
    wait_seconds: float = 0.0
    send_seconds: float = 0.0
    rounds: int = 0  # calls of send_many that sent to another rank: the message rounds
    _worker: Any = field(default=None, repr=False)
    _pending: list = field(default_factory=list, repr=False)

    @property
    def size(self) -> int:
        return len(self.addresses)

    def _box(self) -> Mailbox:
        return mailbox(self.addresses[self.rank])

    def _dask_worker(self):
        if self._worker is None:
            self._worker = get_worker()
        return self._worker

    def send_many(self, tag: Any, payloads: dict[int, Any]) -> None:
        """Send ``payloads[dst]`` to each rank ``dst`` (to itself: straight into its own mailbox)."""
        t0 = time.perf_counter()
        remote = {}
        for dst, x in payloads.items():
            if dst == self.rank:
                self._box().put(self.run, tag, self.rank, x)
            else:
                remote[dst] = x
                self.bytes_sent += _nbytes(x)
        if remote:
            self.rounds += 1
            worker = self._dask_worker()
            for dst in list(remote):
                link = _link(worker, self.addresses[dst])
                if link is not None:
                    self._pending.append((dst, link.send((self.run, tag, self.rank, remote.pop(dst)))))
        if remote:
            # handed to the event loop without waiting for the peers' replies: the sender goes on
            # to its next work (waiting cost 11 % of an uber-shaped iteration's samples on 2
            # workers); the payloads are fresh arrays no one writes, and a failed send is raised
            # at the next receive or at :meth:`flush`
            self._pending.append(
                (
                    None,
                    asyncio.run_coroutine_threadsafe(
                        _send_all(worker, self.run, list(tag), self.rank, remote, self.addresses),
                        worker.loop.asyncio_loop,
                    ),
                )
            )
        self.send_seconds += time.perf_counter() - t0

    def flush(self) -> None:
        """Wait until every send was delivered; raise the first that failed."""
        pending, self._pending = self._pending, []
        for dst, f in pending:
            self._result(dst, f, RECEIVE_TIMEOUT_S)

    def settle(self) -> None:
        """Raise the first send that failed so far, without waiting for those still under way
        (they are checked at the next receive, :meth:`settle` or :meth:`flush`)."""
        self._raise_failed_sends()

    def _raise_failed_sends(self) -> None:
        done = [p for p in self._pending if p[1].done()]
        self._pending = [p for p in self._pending if not p[1].done()]
        for dst, f in done:
            self._result(dst, f, None)

    def _result(self, dst: int | None, f, timeout: float | None) -> None:
        try:
            f.result(timeout=timeout)
        except host_links.LinkClosed as exc:  # the peer's process ended: the run has lost it
            raise ExchangeAborted(f"run {self.run}: worker rank {dst} is gone ({exc})") from exc

    def receive(self, tag: Any, src: int) -> Any:
        t0 = time.perf_counter()
        self._raise_failed_sends()
        try:
            return self._box().take(self.run, tag, src, alive=lambda: self._answers(src), released=task_released)
        finally:
            self.wait_seconds += time.perf_counter() - t0

    def _answers(self, rank: int) -> bool:
        """Whether the worker at ``rank`` still accepts connections (False when its process is
        gone; a busy or slow peer counts as there)."""
        worker = self._dask_worker()
        try:
            sync(worker.loop, _connects, self.addresses[rank])
        except OSError:
            return False
        except Exception:  # anything else (a timeout of the check itself): not known to be gone
            return True
        return True


async def _connects(address: str) -> None:
    """Open and close a connection to ``address``; OSError when nothing listens there."""
    from distributed.comm import connect

    comm = await connect(address, timeout=5)
    await comm.close()


async def _send_all(worker, run: str, tag: list, src: int, payloads: dict[int, Any], addresses: Sequence[str]) -> None:
    await asyncio.gather(
        *(
            worker.rpc(addresses[dst]).__getattr__(HANDLER)(run=run, tag=tag, src=src, payload=_wire(x))
            for dst, x in payloads.items()
        )
    )


def _wire(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return to_serialize(x)
    if isinstance(x, (list, tuple)):
        return [_wire(v) for v in x]
    return x


def _nbytes(x: Any) -> int:
    if isinstance(x, np.ndarray):
        return int(x.nbytes)
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(v) for v in x)
    return 0
