"""Prometheus metrics of tfooc runs, on the Dask scheduler's ``/metrics`` endpoint.

Dask's ``/metrics`` handler writes ``prometheus_client.generate_latest()`` of the process-wide
registry, so a collector registered there is scraped with Dask's own metrics. One collector is
registered per process (the registry refuses duplicate names) and reads every live monitoring
plugin of the process (test suites start many schedulers in one process).

================================  =========  ==========================  ============================================
metric                            type       labels                      value
================================  =========  ==========================  ============================================
``tfooc_runs``                    gauge      ``state``                   runs per state (records under the known
                                                                         storage roots and runs seen in events)
``tfooc_iterations_total``        counter    ``run_id``, ``step``        CP-ALS iterations this run did (every
                                                                         attempt; a resumed run counts its own)
``tfooc_iteration``               gauge      ``run_id``, ``step``        the iteration reached (its index)
``tfooc_fit``                     gauge      ``run_id``, ``step``        fit after the latest iteration
``tfooc_fit_change``              gauge      ``run_id``, ``step``        its change from the iteration before
``tfooc_loglik``                  gauge      ``run_id``, ``step``        a CP-APR (Poisson) run's log-likelihood
                                                                         after the latest outer iteration (its
                                                                         ``tfooc_fit`` is the least-squares fit)
``tfooc_kkt_violation``           gauge      ``run_id``, ``step``        a CP-APR run's KKT violation after the
                                                                         latest outer iteration
``tfooc_iteration_seconds``       gauge      ``run_id``, ``step``        seconds of the latest iteration
``tfooc_mttkrp_seconds``          gauge      ``run_id``, ``step``,       the latest iteration's MTTKRP seconds per
                                             ``mode``                    mode (slowest partition task)
``tfooc_nnz_per_second``          gauge      ``run_id``, ``step``        nonzero-modes per second, latest iteration
``tfooc_bytes_read_total``        counter    ``run_id``, ``step``        compressed bytes read from the store
``tfooc_bytes_sent_total``        counter    ``run_id``, ``step``        bytes workers sent each other (owner-
                                                                         computes runs on several workers)
``tfooc_bytes_lower_bound_total`` counter    ``run_id``, ``step``        the lower bound of those bytes under the
                                                                         run's distribution of rows
``tfooc_exchange_seconds``        gauge      ``run_id``, ``step``,       the latest iteration's seconds sending to
                                             ``mode``                    and waiting for other workers, per mode
``tfooc_checkpoints_total``       counter    ``run_id``, ``step``        checkpoints written
================================  =========  ==========================  ============================================

Counters are monotonic per run: they add up every iteration event the run sent, so a driver
retried after a lost worker continues its run's count (the iterations it repeats after the
checkpoint count again: they were done again), and a run resumed from an earlier run's checkpoint
counts the iterations it did, starting from its own first.

Per-run series exist for the runs whose events reached the scheduler (at most
``state.MAX_LIVE_RUNS``), so their number stays bounded.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from typing import Any

_PLUGINS: weakref.WeakSet[Any] = weakref.WeakSet()
_REGISTERED = False
_LOCK = threading.Lock()


class TfoocCollector:
    """A ``prometheus_client`` custom collector over the live monitoring plugins."""

    def describe(self) -> list:
        # no up-front description: the registry then calls collect() lazily, at scrape time only
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        plugins = [p for p in list(_PLUGINS) if getattr(p, "state", None) is not None]
        runs = GaugeMetricFamily("tfooc_runs", "tfooc workflow runs per state", labels=["state"])
        counts: dict[str, int] = {}
        views: dict[str, dict] = {}
        for p in plugins:
            for state, n in p.state.counts().items():
                counts[state] = max(counts.get(state, 0), n)
            for v in p.state.live_views():
                views[v["run_id"]] = v
        for state, n in sorted(counts.items()):
            runs.add_metric([state], n)
        yield runs

        lab = ["run_id", "step"]
        iters = CounterMetricFamily("tfooc_iterations", "CP-ALS iterations done by this run", labels=lab)
        at = GaugeMetricFamily("tfooc_iteration", "the CP-ALS iteration reached (its index)", labels=lab)
        fit = GaugeMetricFamily("tfooc_fit", "CP-ALS fit after the latest iteration", labels=lab)
        dfit = GaugeMetricFamily("tfooc_fit_change", "change of the fit in the latest iteration", labels=lab)
        loglik = GaugeMetricFamily(
            "tfooc_loglik", "CP-APR (Poisson) log-likelihood after the latest outer iteration", labels=lab
        )
        kkt = GaugeMetricFamily(
            "tfooc_kkt_violation", "CP-APR KKT violation after the latest outer iteration", labels=lab
        )
        secs = GaugeMetricFamily("tfooc_iteration_seconds", "seconds of the latest CP-ALS iteration", labels=lab)
        mttkrp = GaugeMetricFamily(
            "tfooc_mttkrp_seconds", "MTTKRP seconds per mode in the latest iteration", labels=lab + ["mode"]
        )
        rate = GaugeMetricFamily("tfooc_nnz_per_second", "nonzero-modes per second in the latest iteration", labels=lab)
        read = CounterMetricFamily("tfooc_bytes_read_total", "compressed bytes read from the store", labels=lab)
        sent = CounterMetricFamily("tfooc_bytes_sent", "bytes workers sent each other", labels=lab)
        bound = CounterMetricFamily(
            "tfooc_bytes_lower_bound", "lower bound of the bytes workers send each other", labels=lab
        )
        exch = GaugeMetricFamily(
            "tfooc_exchange_seconds", "seconds sending to and waiting for other workers per mode", labels=lab + ["mode"]
        )
        cps = CounterMetricFamily("tfooc_checkpoints", "CP-ALS checkpoints written", labels=lab)
        for run_id, v in views.items():
            for step, its in v["iterations"].items():
                if not its:
                    continue
                last, key = its[-1], [run_id, step]
                # counted over every iteration event the run sent, so never less than before: a
                # retried driver repeats iterations after its checkpoint (each one is work done),
                # and a run resumed from another's checkpoint counts its own, not the index
                done = v.get("counters", {}).get(step) or {}
                iters.add_metric(key, float(done.get("iterations", len(its))))
                if last.get("iteration") is not None:
                    at.add_metric(key, float(last["iteration"]))
                if last.get("fit") is not None:
                    fit.add_metric(key, float(last["fit"]))
                if last.get("fit_change") is not None:
                    dfit.add_metric(key, float(last["fit_change"]))
                if last.get("loglik") is not None:  # a CP-APR run's outer iteration
                    loglik.add_metric(key, float(last["loglik"]))
                if last.get("kkt_violation") is not None:
                    kkt.add_metric(key, float(last["kkt_violation"]))
                if last.get("seconds") is not None:
                    secs.add_metric(key, float(last["seconds"]))
                for mode, s in enumerate(last.get("mttkrp_seconds") or []):
                    mttkrp.add_metric(key + [str(mode)], float(s))
                if last.get("nnz_per_s") is not None:
                    rate.add_metric(key, float(last["nnz_per_s"]))
                read.add_metric(key, float(done.get("bytes_read", 0)))
                if any("bytes_sent" in it for it in its):
                    sent.add_metric(key, float(done.get("bytes_sent", 0)))
                    bound.add_metric(key, float(done.get("bytes_lower_bound", 0)))
                for mode, s in enumerate(last.get("exchange_seconds") or []):
                    exch.add_metric(key + [str(mode)], float(s))
                cps.add_metric(key, float(v["checkpoint_count"].get(step, 0)))
        yield from (iters, at, fit, dfit, loglik, kkt, secs, mttkrp, rate, read, sent, bound, exch, cps)


def register(plugin: Any) -> bool:
    """Expose ``plugin``'s runs on this process's ``/metrics``; False without prometheus_client."""
    global _REGISTERED
    try:
        import prometheus_client
    except ImportError:
        return False
    with _LOCK:
        _PLUGINS.add(plugin)
        if not _REGISTERED:
            prometheus_client.REGISTRY.register(TfoocCollector())
            _REGISTERED = True
    return True


def unregister(plugin: Any) -> None:
    with _LOCK:
        _PLUGINS.discard(plugin)
