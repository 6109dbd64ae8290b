"""``RunStore.list(limit)``, which the runs table pages through: the newest ``limit`` records are the
first ``limit`` of the whole listing, whatever the ids look like and however many runs share a
creation time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np

from tensorflow_ooc.monitoring.state import RunsState
from tensorflow_ooc.workflow.records import RunRecord, RunStore


def _iso(t: datetime) -> str:
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _write(runs: RunStore, run_id: str, created: datetime) -> None:
    runs.write(
        RunRecord(
            run_id=run_id,
            workflow="w",
            spec_path="w.yaml",
            spec_sha256="0",
            storage=runs.root,
            cluster="inline",
            mode="foreground",
            user="u",
            host="h",
            created_at=_iso(created),
            state="done",
        )
    )


def test_pages_are_slices_of_one_order(tmp_path):
    rng = np.random.default_rng()
    seed = int(rng.integers(1 << 31))
    rng = np.random.default_rng(seed)
    runs = RunStore(str(tmp_path / "storage"))
    now = datetime.now(UTC).replace(microsecond=0)
    n = int(rng.integers(100, 160))  # more than a small limit's margin of ids read
    # ids of new_run_id's form (their second in the id), ids given by the caller (any form), and
    # groups of runs created in the same millisecond
    times = [now - timedelta(minutes=int(m)) for m in rng.integers(0, 30, n)]
    for k, t in enumerate(times):
        if rng.random() < 0.5:
            run_id = f"flow-{k % 3}-{t.strftime('%Y%m%d-%H%M%S')}-{k:04x}"
        else:
            run_id = f"given-{int(rng.integers(1 << 40)):x}"
        _write(runs, run_id, t)
    whole = [r.run_id for r in runs.list()]
    assert len(whole) == n
    want = sorted(((r.created_at, r.run_id) for r in runs.list()), reverse=True)
    assert whole == [i for _, i in want], f"seed={seed}"
    for limit in (1, 5, 10, 20, 25, n - 1):
        assert [r.run_id for r in runs.list(limit)] == whole[:limit], f"seed={seed} limit={limit}"
    # the runs table's pages: every page a slice of the one order
    state = RunsState([runs.root])
    for limit in (10, 25):
        for page in range(1, -(-n // limit) + 1):
            got = [r["run_id"] for r in state.runs(limit, (page - 1) * limit)]
            assert got == whole[(page - 1) * limit : page * limit], f"seed={seed} page={page} limit={limit}"
