"""Host links (worker-to-worker sockets of one machine): messages arrive whole and bit for bit, only
a connection that knows the listener's secret is read, a peer whose process ended fails the send,
and owner-computes runs use them between process workers (and equal one process without them)."""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster

import tensorflow_ooc as tfo
from tensorflow_ooc.execution import host_links
from tensorflow_ooc.execution.exchange import Mailbox

pytestmark = pytest.mark.skipif(host_links.host_identity() is None, reason="no abstract Unix sockets here")


def _messages(rng):
    a = rng.standard_normal((37, 5))
    return [
        ("run", ("iteration", 3, "A"), 1, a),
        ("run", ["m", 0], 0, [np.asfortranarray(a), a[::2, 1:4], np.zeros((0, 5)), rng.integers(0, 9, 11)]),
        ("run", "terms", 2, (rng.standard_normal(3).astype(np.float32), 7, None, "text", {"k": 1.5})),
        ("run", "big", 1, rng.standard_normal(300_000)),  # larger than a socket's buffer
    ]


def _same(x, y) -> bool:
    if isinstance(x, np.ndarray):
        return isinstance(y, np.ndarray) and x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)
    if isinstance(x, (list, tuple)):
        return type(x) is type(y) and len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y))
    return x == y


def test_messages_arrive_whole_bit_for_bit_and_writable(rng):
    got, arrived = [], threading.Event()
    sent = _messages(rng)

    def deliver(m):
        got.append(m)
        if len(got) == len(sent):
            arrived.set()

    listener = host_links.Listener(deliver)
    link = host_links.connect(dict(listener.endpoint(), pid=-1))  # as if from another process
    assert link is not None
    try:
        for f in [link.send(m) for m in sent]:
            f.result(timeout=30)
        assert arrived.wait(30)
        assert len(got) == len(sent)
        for m, g in zip(sent, got):
            assert _same(m, g), m[1]
        received = got[0][3]
        received += 1.0  # the receiver's own array: writable
    finally:
        link.close()
        listener.close()


def test_a_connection_without_the_secret_is_not_read(rng):
    got = []
    listener = host_links.Listener(got.append)
    try:
        wrong = dict(listener.endpoint(), pid=-1, secret=bytes(host_links.SECRET_BYTES))
        link = host_links.connect(wrong)
        assert link is not None  # connecting succeeds, but nothing it writes is read
        deadline = time.time() + 2.0
        while time.time() < deadline:  # the listener closes the connection: the next writes fail
            try:
                link.send(("run", "t", 1, np.ones(100_000))).result(timeout=30)
            except host_links.LinkClosed:
                break
            time.sleep(0.02)
        else:
            pytest.fail("a connection with a wrong secret stayed open")
        assert got == []
        # a raw connection that sends garbage: nothing delivered either
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(listener.name)
            s.sendall(os.urandom(4096))
        time.sleep(0.2)
        assert got == []
    finally:
        listener.close()


PEER = """
import pickle, sys, time
from tensorflow_ooc.execution import host_links
listener = host_links.Listener(lambda m: None)
sys.stdout.write(pickle.dumps(listener.endpoint()).hex() + "\\n")
sys.stdout.flush()
time.sleep(600)
"""


def test_a_peer_whose_process_ended_fails_the_send():
    proc = subprocess.Popen([sys.executable, "-c", PEER], stdout=subprocess.PIPE, text=True)
    try:
        endpoint = pickle.loads(bytes.fromhex(proc.stdout.readline().strip()))
        link = host_links.connect(endpoint)
        assert link is not None, "a process of this host is reached over a link"
        link.send(("run", "t", 0, np.ones(8))).result(timeout=30)
        assert not link.closed_by_peer()
        proc.kill()
        proc.wait(30)
        deadline = time.time() + 10
        while not link.closed_by_peer() and time.time() < deadline:  # seen before any send
            time.sleep(0.01)
        assert link.closed_by_peer()
        with pytest.raises(host_links.LinkClosed):
            for _ in range(200):  # the first writes may land in the socket's buffer
                link.send(("run", "t", 0, np.ones(100_000))).result(timeout=30)
        with pytest.raises(host_links.LinkClosed):  # and stays failed
            link.send(("run", "t", 0, np.ones(1))).result(timeout=30)
    finally:
        proc.kill()


def test_other_hosts_and_this_process_keep_dasks_comms():
    listener = host_links.Listener(lambda m: None)
    try:
        here = listener.endpoint()
        assert host_links.connect(here) is None  # this very process: no link to itself
        assert host_links.connect(dict(here, pid=-1, host="elsewhere|boot|net:[1]")) is None
        assert host_links.connect(None) is None
    finally:
        listener.close()


def test_mailbox_gets_link_messages_keyed_like_dasks(rng):
    box = Mailbox()
    listener = host_links.Listener(lambda m: box.put(*m))
    link = host_links.connect(dict(listener.endpoint(), pid=-1))
    try:
        a = rng.standard_normal(9)
        link.send(("r1", ["iteration", 0, "A"], 1, a)).result(timeout=30)
        assert np.array_equal(box.take("r1", ("iteration", 0, "A"), 1, timeout=30), a)
    finally:
        link.close()
        listener.close()


def _links_on_workers():
    from tensorflow_ooc.execution import exchange

    return {peer: link is not None for (_, peer), link in exchange._LINKS.items()}


@pytest.mark.parametrize("links", [True, False])
def test_owner_computes_over_links_or_daskcomms_equals_one_process(rng, tmp_path, monkeypatch, links):
    """Both transports between process workers give one process's result; with links on, every
    worker sent over a link, with them off none did."""
    monkeypatch.setenv("DASK_TFOOC__EXCHANGE__HOST_LINKS", "true" if links else "false")
    shape = (int(rng.integers(2500, 3500)), int(rng.integers(20, 40)), int(rng.integers(2000, 3000)))
    nnz = 8000
    coords = np.stack([rng.integers(0, s, nnz) for s in shape], axis=1)
    store = tfo.convert((coords, rng.random(nnz) + 0.1), tmp_path / "x.zarr", chunk_nnz=1024, duplicates="sum")
    seed = int(rng.integers(1 << 30))
    ref = tfo.cp_als(store, 3, seed=seed, max_iters=4, tol=0, scheduler="inline")
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        got = tfo.cp_als(store, 3, seed=seed, max_iters=4, tol=0, client=client, execution="in-memory")
        used = client.run(_links_on_workers)
    assert got.params["distribution"] == {"kind": "owner-computes", "workers": 2}
    assert abs(got.fit - ref.fit) < 1e-10
    for a, b in zip(got.factors, ref.factors):
        assert np.abs(a - b).max() < 1e-10
    assert len(used) == 2
    assert all(v and all(x is links for x in v.values()) for v in used.values()), used
