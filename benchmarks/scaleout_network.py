"""Dask clusters whose workers are separate hosts on a shaped network, for the scale-out benchmark.

Worker processes on one machine talk over loopback, which moves bytes at memory speed with
microseconds of latency: a distribution that ships too much looks free there and costs seconds on a
real cluster. ``shaped_cluster`` gives each worker its own network namespace (its own IP stack, so
every worker-to-worker transfer is real TCP through a kernel link) and caps each worker's link with
``tc``, so the bytes the owner-computes CP-ALS sends are paid for at a datacenter link's rate::

    root namespace:  driver, dask scheduler on tfoocbr0 = 10.77.0.1/24 (a Linux bridge)
    tfooc-w<i>:      one dask worker (with its nanny) on tfoocp<i> = 10.77.0.<i+2>/24,
                     a veth pair whose other end tfoocv<i> is a port of the bridge

Shaping, per worker link:

- the rate limits both ends of the veth pair (a full-duplex NIC: a worker sends at most ``rate``
  and receives at most ``rate``);
- the delay is added on the worker's end only, as it sends, so any worker-to-worker message
  (worker end of the sender, bridge, bridge end of the receiver) is delayed once: ``delay`` is the
  one-way latency between two workers. Delaying both ends, as a per-link netem on each side would,
  doubles it (two links per hop through the bridge).
- with ``netem`` (``netem delay D rate R``) when the kernel has it; otherwise ``tbf`` (a token
  bucket: rate only, no added delay, beside the veth's own few microseconds). The yielded
  ``ClusterAddress`` says which (``qdisc``, ``delay_s``), so a cost model fitted to the run uses
  the link it really had.
- the cap binds only where the cores can fill it: on the 2-core development machine (kernel
  without netem) raw TCP through an unshaped veth pair peaks near 6.7 Gbit/s, so "10gbit" there
  measures the machine, and ``rate="1gbit"`` is the setting that shows the shaping (0.87 Gbit/s
  raw TCP, 10 MB in about 92 ms).

Needs root, ``ip`` and ``tc`` (iproute2), and a kernel with network namespaces, veth, bridges and
tbf or netem. Without them ``shaped_cluster`` raises ``NetworkUnavailable`` before starting
anything, and the caller falls back to ``loopback_cluster`` (``any_cluster`` does both).

One shaped cluster at a time per machine: the names are fixed (prefix ``tfooc``), and a lock file
(``flock``, released by the kernel when its holder dies) serializes runs. A run that finds the lock
free and ``tfooc*`` namespaces, links or recorded processes left behind knows their owner crashed,
and removes them before it starts.

Run it for a quick check of the links (two workers, 10 MB arrays worker to worker)::

    sudo .venv/bin/python benchmarks/scaleout_network.py --workers 2
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PREFIX = "tfooc"
BRIDGE = f"{PREFIX}br0"
SUBNET = "10.77.0"  # a /24: the bridge is .1, worker i is .(i + 2)
BRIDGE_IP = f"{SUBNET}.1"
MAX_WORKERS = 250
STATE_DIR = Path(tempfile.gettempdir()) / f"{PREFIX}-net"
LOCK_FILE = STATE_DIR / "lock"
STATE_FILE = STATE_DIR / "state.json"

_RATE_UNITS = {  # tc(8) units, in bytes per second; a bare number is bits per second
    "": 1 / 8,
    "bit": 1 / 8,
    "kbit": 1e3 / 8,
    "mbit": 1e6 / 8,
    "gbit": 1e9 / 8,
    "tbit": 1e12 / 8,
    "kibit": 1024 / 8,
    "mibit": 1024**2 / 8,
    "gibit": 1024**3 / 8,
    "tibit": 1024**4 / 8,
    "bps": 1.0,
    "kbps": 1e3,
    "mbps": 1e6,
    "gbps": 1e9,
    "tbps": 1e12,
}
_TIME_UNITS = {"": 1e-6, "s": 1.0, "sec": 1.0, "secs": 1.0, "ms": 1e-3, "msec": 1e-3, "msecs": 1e-3}
_TIME_UNITS.update({"us": 1e-6, "usec": 1e-6, "usecs": 1e-6})


class NetworkUnavailable(RuntimeError):
    """No shaped network can be built here (not root, no ip/tc, no namespaces): use loopback instead."""


class NetworkBusy(RuntimeError):
    """Another live process holds the shaped network; falling back to loopback would mix two kinds of run."""


class ClusterAddress(str):
    """A scheduler address that also says what network its workers talk over.

    A plain ``str`` to everything that takes an address (``Client(addr)``); the attributes let a
    benchmark record, and a cost model use, the link the run really had rather than the one asked for.
    """

    network: str  # "shaped" or "loopback"
    qdisc: str | None  # "netem" or "tbf" when shaped
    rate_bytes_per_s: float | None  # each worker's link rate, each way; None on loopback
    delay_s: float | None  # one-way worker-to-worker delay added; 0.0 when the qdisc cannot delay
    hosts: tuple[str, ...]  # the workers' IPs when shaped
    fallback_reason: str | None  # why a shaped network was not used, when any_cluster fell back

    def __new__(
        cls,
        address: str,
        *,
        network: str,
        qdisc: str | None = None,
        rate_bytes_per_s: float | None = None,
        delay_s: float | None = None,
        hosts: tuple[str, ...] = (),
        fallback_reason: str | None = None,
    ) -> ClusterAddress:
        self = super().__new__(cls, address)
        self.network = network
        self.qdisc = qdisc
        self.rate_bytes_per_s = rate_bytes_per_s
        self.delay_s = delay_s
        self.hosts = hosts
        self.fallback_reason = fallback_reason
        return self

    def describe(self) -> dict[str, Any]:
        """The link as JSON-ready fields, for a benchmark's record of the run."""
        return {
            "address": str(self),
            "network": self.network,
            "qdisc": self.qdisc,
            "rate_bytes_per_s": self.rate_bytes_per_s,
            "delay_s": self.delay_s,
            "hosts": list(self.hosts),
            "fallback_reason": self.fallback_reason,
        }


def parse_rate(rate: str) -> float:
    """A tc rate ("10gbit", "1.25gbps", "800mbit") in bytes per second."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", rate.lower())
    if not m or m.group(2) not in _RATE_UNITS:
        raise ValueError(f"not a tc rate: {rate!r} (e.g. 10gbit, 800mbit, 1.25gbps)")
    return float(m.group(1)) * _RATE_UNITS[m.group(2)]


def parse_delay(delay: str) -> float:
    """A tc time ("0.1ms", "100us", "1s"; a bare number is microseconds) in seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*", delay.lower())
    if not m or m.group(2) not in _TIME_UNITS:
        raise ValueError(f"not a tc time: {delay!r} (e.g. 0.1ms, 100us)")
    return float(m.group(1)) * _TIME_UNITS[m.group(2)]


# --- commands -------------------------------------------------------------------------------------


class _CommandFailed(RuntimeError):
    def __init__(self, cmd: list[str], stderr: str) -> None:
        super().__init__(f"{' '.join(cmd)}: {stderr.strip() or 'failed'}")
        self.stderr = stderr


def _run(*cmd: str) -> str:
    """Run an iproute2 command; its stderr becomes the error, since that is where ip and tc explain."""
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    if p.returncode:
        raise _CommandFailed(list(cmd), p.stderr)
    return p.stdout


def _quiet(*cmd: str) -> None:
    """Teardown: a step that fails (already gone) must not stop the steps after it."""
    with contextlib.suppress(_CommandFailed, OSError, subprocess.TimeoutExpired):
        _run(*cmd)


def _preflight() -> None:
    """Fail fast, and catchably, where a shaped network cannot be built at all."""
    if not sys.platform.startswith("linux"):
        raise NetworkUnavailable(f"network namespaces need Linux, not {sys.platform}")
    if os.geteuid() != 0:
        raise NetworkUnavailable("network namespaces and tc need root")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise NetworkUnavailable(f"{' and '.join(missing)} not found (iproute2)")


# --- processes and stale state ---------------------------------------------------------------------


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks: a pid plus this names one process, not a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _record(procs: list[subprocess.Popen], run_dir: Path) -> None:
    """Write what a crashed run would leave behind, so the next run can end it."""
    entries = [{"pid": p.pid, "start": _start_time(p.pid)} for p in procs]
    STATE_FILE.write_text(json.dumps({"owner": os.getpid(), "run_dir": str(run_dir), "procs": entries}))


def _stop(pids: list[int], grace: float = 10.0) -> None:
    """SIGTERM each process group (a nanny shuts its worker down), then SIGKILL what is left."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for pid in pids:
        while time.monotonic() < deadline and _alive_group(pid):
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def _alive_group(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    # a zombie child of ours still counts as alive to killpg: reap it if it is ours
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pgid, os.WNOHANG)[0] == pgid:
            return False
    return True


def _links() -> list[str]:
    out = _run("ip", "-o", "link", "show")
    names = [line.split(":", 2)[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]
    return [n for n in names if n.startswith(PREFIX)]


def _namespaces() -> list[str]:
    out = _run("ip", "netns", "list")
    return [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0].startswith(PREFIX)]


def _clean_stale() -> None:
    """Remove what a crashed run left: its processes, namespaces, links and worker directories."""
    if STATE_FILE.exists():
        try:
            state = json.loads(STATE_FILE.read_text())
        except (OSError, ValueError):
            state = {}
        stale = [e["pid"] for e in state.get("procs", []) if e.get("start") and _start_time(e["pid"]) == e["start"]]
        _stop(stale, grace=3.0)
        if state.get("run_dir"):
            shutil.rmtree(state["run_dir"], ignore_errors=True)
        STATE_FILE.unlink(missing_ok=True)
    for ns in _namespaces():
        with contextlib.suppress(_CommandFailed):
            for pid in _run("ip", "netns", "pids", ns).split():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)
        _quiet("ip", "netns", "del", ns)
    for link in _links():
        _quiet("ip", "link", "del", link)


@contextlib.contextmanager
def _exclusive(timeout: float) -> Iterator[None]:
    """Hold the machine-wide lock on the tfooc names; the kernel drops it if this process dies."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise NetworkBusy(f"another shaped cluster holds {LOCK_FILE} (waited {timeout:.0f} s)") from None
                time.sleep(0.5)
        yield
    finally:
        os.close(fd)  # closing drops the flock


# --- the network ---------------------------------------------------------------------------------


def _qdisc_args(kind: str, rate: str, rate_bytes: float, delay: str | None) -> list[str]:
    if kind == "netem":
        # netem's default queue of 1000 packets drops under a fast sender; drops would measure TCP
        # recovery, not the link
        return ["netem", *(["delay", delay] if delay else []), "rate", rate, "limit", "100000"]
    # tbf: a burst of 100 us at the rate (at least 64 KiB, one GSO segment) keeps a 10 MB transfer
    # within a few percent of the rate; a 50 ms queue never drops a TCP window
    burst = max(int(rate_bytes * 100e-6), 64 * 1024)
    return ["tbf", "rate", rate, "burst", str(burst), "latency", "50ms"]


def _shape(dev: str, ns: str | None, kind: str, rate: str, rate_bytes: float, delay: str | None) -> None:
    netns = ["-n", ns] if ns else []
    _run("tc", *netns, "qdisc", "add", "dev", dev, "root", *_qdisc_args(kind, rate, rate_bytes, delay))


def _build_network(n_workers: int, rate: str, rate_bytes: float, delay: str, delay_s: float) -> tuple[str, list[str]]:
    """Bridge, one namespace and veth pair per worker, shaped; returns the qdisc used and the hosts."""
    _run("ip", "link", "add", BRIDGE, "type", "bridge")
    _run("ip", "addr", "add", f"{BRIDGE_IP}/24", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    kind = "netem"
    hosts = []
    for i in range(n_workers):
        ns, outer, inner, host = f"{PREFIX}-w{i}", f"{PREFIX}v{i}", f"{PREFIX}p{i}", f"{SUBNET}.{i + 2}"
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner, "netns", ns)
        _run("ip", "link", "set", outer, "master", BRIDGE)
        _run("ip", "link", "set", outer, "up")
        _run("ip", "-n", ns, "addr", "add", f"{host}/24", "dev", inner)
        _run("ip", "-n", ns, "link", "set", inner, "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")  # a worker's nanny talks to its worker on lo
        if kind == "netem":
            try:
                _shape(outer, None, "netem", rate, rate_bytes, None)
            except _CommandFailed as exc:
                if "unknown" not in exc.stderr.lower():
                    raise
                kind = "tbf"
                if delay_s > 0:
                    warnings.warn(
                        f"no netem in this kernel: links are shaped to {rate} by tbf, without the {delay} delay",
                        stacklevel=4,
                    )
        if kind == "tbf":
            _shape(outer, None, "tbf", rate, rate_bytes, None)
        _shape(inner, ns, kind, rate, rate_bytes, delay if delay_s > 0 else None)
        hosts.append(host)
    return kind, hosts


def _teardown_network(n_workers: int) -> None:
    for i in range(n_workers):
        ns = f"{PREFIX}-w{i}"
        with contextlib.suppress(_CommandFailed, OSError):
            for pid in _run("ip", "netns", "pids", ns).split():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)
        _quiet("ip", "netns", "del", ns)  # takes the veth pair with it
        _quiet("ip", "link", "del", f"{PREFIX}v{i}")
    _quiet("ip", "link", "del", BRIDGE)


def _worker_env() -> dict[str, str]:
    """The driver's environment, plus its import path: a LocalCluster's spawned workers get the
    driver's sys.path from multiprocessing, and these workers must import the same code."""
    env = dict(os.environ)
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _spawn(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "wb") as fh:
        # a session of its own: the whole group (nanny and worker) is stopped with one killpg
        return subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _start_scheduler(run_dir: Path, env: dict[str, str], timeout: float) -> tuple[subprocess.Popen, str]:
    sched_file, log = run_dir / "scheduler.json", run_dir / "scheduler.log"
    cmd = [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", BRIDGE_IP, "--port", "0"]
    proc = _spawn([*cmd, "--no-dashboard", "--scheduler-file", str(sched_file)], log, env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dask scheduler exited ({proc.returncode}):\n{_tail(log)}")
        with contextlib.suppress(OSError, ValueError, KeyError):
            return proc, json.loads(sched_file.read_text())["address"]
        time.sleep(0.1)
    raise RuntimeError(f"dask scheduler did not start within {timeout:.0f} s:\n{_tail(log)}")


def _wait_for_workers(address: str, procs: list[subprocess.Popen], logs: list[Path], timeout: float) -> None:
    """Wait until every worker registered, failing early (with its log) if one of them exits."""
    from distributed import Client

    deadline = time.monotonic() + timeout
    with Client(address, timeout=timeout) as client:
        while True:
            for p, log in zip(procs, logs):
                if p.poll() is not None:
                    raise RuntimeError(f"dask worker {log.stem} exited ({p.returncode}):\n{_tail(log)}")
            try:
                client.wait_for_workers(len(procs), timeout=1.0)
                return
            except TimeoutError:
                if time.monotonic() > deadline:
                    tails = "\n".join(f"--- {log.stem}\n{_tail(log, 8)}" for log in logs)
                    raise RuntimeError(f"workers did not register within {timeout:.0f} s\n{tails}") from None


@contextlib.contextmanager
def shaped_cluster(
    n_workers: int,
    threads_per_worker: int = 1,
    rate: str = "10gbit",
    delay: str = "0.1ms",
    memory_limit: str | None = None,
    *,
    nanny: bool = True,
    startup_timeout: float = 120.0,
    lock_timeout: float = 60.0,
) -> Iterator[ClusterAddress]:
    """A Dask cluster with each worker in its own network namespace on a shaped link; yields its address.

    ``rate`` and ``delay`` are tc values: each worker's link rate (each way) and the one-way delay
    between two workers (see the module docstring). ``memory_limit`` is Dask's (``None``: "auto",
    the machine's memory times this worker's share of the cores, as a LocalCluster gives).
    With ``nanny`` (the default) a worker that exceeds its limit is restarted, as on a real cluster.

    Raises ``NetworkUnavailable`` before starting anything when the network cannot be built here,
    and ``NetworkBusy`` when another live process holds it for longer than ``lock_timeout``.
    Everything it made (processes, namespaces, links, worker directories) is removed on exit, also
    on error; what a crashed earlier run left behind is removed on entry.
    """
    if not 1 <= n_workers <= MAX_WORKERS:
        raise ValueError(f"n_workers must be in 1..{MAX_WORKERS} (one /24), not {n_workers}")
    if threads_per_worker < 1:
        raise ValueError(f"threads_per_worker must be >= 1, not {threads_per_worker}")
    rate_bytes, delay_s = parse_rate(rate), parse_delay(delay)
    _preflight()
    with _exclusive(lock_timeout):
        try:
            _clean_stale()
        except (_CommandFailed, OSError) as exc:
            raise NetworkUnavailable(f"cannot list or clean network namespaces: {exc}") from exc
        run_dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-cluster-"))
        procs: list[subprocess.Popen] = []
        try:
            try:
                kind, hosts = _build_network(n_workers, rate, rate_bytes, delay, delay_s)
            except (_CommandFailed, OSError) as exc:
                raise NetworkUnavailable(f"cannot build the shaped network: {exc}") from exc
            env = _worker_env()
            _record(procs, run_dir)
            sched, address = _start_scheduler(run_dir, env, startup_timeout)
            procs.append(sched)
            _record(procs, run_dir)
            logs = []
            for i, host in enumerate(hosts):
                ns, log, local = f"{PREFIX}-w{i}", run_dir / f"worker-{i}.log", run_dir / f"worker-{i}"
                local.mkdir()
                # each "host" gets its own cores (taskset), as a machine would: unpinned, every
                # worker saw both cores and ran 2 numba threads, 4 busy threads on 2 cores
                ncpu = os.cpu_count() or 1
                per = max(1, ncpu // len(hosts))
                cores = ",".join(str((i * per + j) % ncpu) for j in range(per))
                cmd = ["ip", "netns", "exec", ns, "taskset", "-c", cores, sys.executable, "-m"]
                cmd += ["distributed.cli.dask_worker", address]
                cmd += ["--host", host, "--name", ns, "--nthreads", str(threads_per_worker), "--nworkers", "1"]
                cmd += ["--memory-limit", memory_limit or "auto", "--local-directory", str(local), "--no-dashboard"]
                # a worker whose scheduler vanished (driver killed) exits on its own
                cmd += ["--nanny" if nanny else "--no-nanny", "--death-timeout", "60"]
                procs.append(_spawn(cmd, log, env))
                logs.append(log)
                _record(procs, run_dir)
            _wait_for_workers(address, procs[1:], logs, startup_timeout)
            yield ClusterAddress(
                address,
                network="shaped",
                qdisc=kind,
                rate_bytes_per_s=rate_bytes,
                delay_s=delay_s if kind == "netem" else 0.0,
                hosts=tuple(hosts),
            )
        finally:
            # workers first (their nannies close them), then the scheduler, then the network
            _stop([p.pid for p in procs[1:]])
            _stop([p.pid for p in procs[:1]])
            for p in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=1)
            _teardown_network(n_workers)
            shutil.rmtree(run_dir, ignore_errors=True)
            STATE_FILE.unlink(missing_ok=True)


@contextlib.contextmanager
def loopback_cluster(
    n_workers: int, threads_per_worker: int = 1, memory_limit: str | None = None
) -> Iterator[ClusterAddress]:
    """The fallback: worker processes on this machine's loopback (no shaping); yields the address."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=n_workers,
        threads_per_worker=threads_per_worker,
        processes=True,
        dashboard_address=None,
        memory_limit=memory_limit or "auto",
    ) as lc:
        yield ClusterAddress(lc.scheduler_address, network="loopback")


@contextlib.contextmanager
def any_cluster(
    n_workers: int,
    threads_per_worker: int = 1,
    rate: str = "10gbit",
    delay: str = "0.1ms",
    memory_limit: str | None = None,
) -> Iterator[ClusterAddress]:
    """A shaped cluster where one can be built, else loopback; ``addr.network`` says which.

    Only ``NetworkUnavailable`` falls back: an error in the caller's body, a worker that fails to
    start, or a busy network (``NetworkBusy``) propagates, so a run never silently changes kind.
    """
    with contextlib.ExitStack() as stack:
        try:
            addr = stack.enter_context(shaped_cluster(n_workers, threads_per_worker, rate, delay, memory_limit))
        except NetworkUnavailable as exc:
            addr = stack.enter_context(loopback_cluster(n_workers, threads_per_worker, memory_limit))
            addr.fallback_reason = str(exc)
        yield addr


# --- measuring a link ------------------------------------------------------------------------------


def _nbytes(x: Any) -> int:
    return int(x.nbytes)


def _ones(n: int) -> Any:
    import numpy as np

    return np.ones(n, dtype=np.float64)


def _time_transfer(client: Any, src: str, dst: str, nbytes: int) -> float:
    """Seconds from submitting a task on ``dst`` that needs an array held by ``src`` to its result."""
    from distributed import wait

    x = client.submit(_ones, max(nbytes // 8, 1), workers=[src], allow_other_workers=False, pure=False)
    wait(x)
    t0 = time.perf_counter()
    client.submit(_nbytes, x, workers=[dst], allow_other_workers=False, pure=False).result()
    dt = time.perf_counter() - t0
    del x
    return dt


def measure_transfer(client: Any, nbytes: int = 10_000_000, repeats: int = 7) -> dict[str, float]:
    """Worker-to-worker transfer time of an ``nbytes`` NumPy array between the first two workers.

    Each try makes a fresh array on one worker and times a task on the other that consumes it
    (the scheduler's round trip plus the fetch), alternating directions; the same with an 8-byte
    array is the round trip without the bytes, so ``transfer_s`` (their difference of medians) is
    the fetch alone and ``gbit_per_s`` the rate it achieved.
    """
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    if len(workers) < 2:
        raise ValueError(f"need two workers, have {len(workers)}")
    a, b = workers[:2]
    _time_transfer(client, a, b, nbytes)  # warm: connections between the two workers, imports
    big, small = [], []
    for i in range(repeats):
        src, dst = (a, b) if i % 2 == 0 else (b, a)
        big.append(_time_transfer(client, src, dst, nbytes))
        small.append(_time_transfer(client, src, dst, 8))
    big_s, small_s = statistics.median(big), statistics.median(small)
    transfer = max(big_s - small_s, 1e-9)
    return {
        "nbytes": float(nbytes),
        "round_trip_s": big_s,
        "round_trip_small_s": small_s,
        "transfer_s": transfer,
        "gbit_per_s": nbytes * 8 / transfer / 1e9,
    }


def _where(address: str) -> str:
    from distributed import get_worker

    return f"{get_worker().address} (asked for {address})"


def check(addr: ClusterAddress, nbytes: int) -> dict[str, Any]:
    """Run a trivial task on each worker (each must run where it was sent) and time the transfer."""
    from distributed import Client

    with Client(addr) as client:
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
        placed = client.gather([client.submit(_where, w, workers=[w], pure=False) for w in workers])
        for w, where in zip(workers, placed):
            if not where.startswith(w):
                raise RuntimeError(f"task sent to {w} ran on {where}")
        return {**addr.describe(), "workers": workers, **measure_transfer(client, nbytes)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rate", default="10gbit")
    ap.add_argument("--delay", default="0.1ms")
    ap.add_argument("--nbytes", type=float, default=10e6)
    args = ap.parse_args(argv)
    rows = []
    try:
        with shaped_cluster(args.workers, 1, args.rate, args.delay) as addr:
            rows.append(check(addr, int(args.nbytes)))
    except NetworkUnavailable as exc:
        print(f"# no shaped network: {exc}")
    with loopback_cluster(args.workers, 1) as addr:
        rows.append(check(addr, int(args.nbytes)))
    print(f"{'network':<9} {'qdisc':<6} {'link':>10} {'rtt 8 B':>9} {'rtt 10 MB':>10} {'transfer':>9} {'Gbit/s':>7}")
    for r in rows:
        link = f"{r['rate_bytes_per_s'] * 8 / 1e9:g} Gbit/s" if r["rate_bytes_per_s"] else "-"
        print(
            f"{r['network']:<9} {r['qdisc'] or '-':<6} {link:>10} {r['round_trip_small_s'] * 1e3:>7.2f}ms"
            f" {r['round_trip_s'] * 1e3:>8.2f}ms {r['transfer_s'] * 1e3:>7.2f}ms {r['gbit_per_s']:>7.2f}"
        )
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
