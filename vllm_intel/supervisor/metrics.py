"""The supervisor's own metrics (prometheus_client), served at GET /metrics on the probe port:
what operators need to see of a start and a stop, readable while vLLM drains or after it is gone
(vLLM's own /metrics on its port has the requests, tokens and KV cache).

An extension of the loop (extension.py): its hooks set the values from the loop's thread only; a
scrape (the probe port's thread) reads them through
prometheus_client's locks. Names follow Prometheus conventions: `vllm_intel_` prefix, base units
(`_seconds`, `_bytes`), `_total` for counters. CPU throttling is read from the container's
cgroup at each scrape (cpu.stat), nothing polled in between.
"""

from __future__ import annotations

import pathlib
import time

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Info,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..in_vllm.drain_forecast import Result
from . import limits
from .extension import Extension
from .reports import RunReports
from .state import State

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
disable_created_metrics()  # this process is the supervisor's alone: no `_created` twin per counter
OUTCOMES = ("finished", "cut", "forced", "not_started")  # how a stop ended (drain_outcome())


def drain_outcome(*, escalated: bool, aborted: int | None, was_serving: bool) -> str:
    """finished: every request in flight ended on its own; cut: the drain deadline aborted some;
    forced: the supervisor killed the process group; not_started: stopped before vLLM served."""
    if escalated:
        return "forced"
    if not was_serving:
        return "not_started"
    return "cut" if aborted else "finished"


class CpuStat:
    """Counters of the container's cgroup cpu.stat (v2: usec; v1: ns), at scrape time."""

    FIELDS = {
        "nr_periods": ("cpu_periods", "CFS periods with runnable work (cgroup cpu.stat)", 1),
        "nr_throttled": ("cpu_throttled_periods", "CFS periods the quota throttled", 1),
        "throttled_usec": ("cpu_throttled_seconds", "Time the quota throttled (v2)", 1e-6),
        "throttled_time": ("cpu_throttled_seconds", "Time the quota throttled (v1)", 1e-9),
    }

    def __init__(self, cgroup_root: pathlib.Path, self_cgroup: str | None = None):
        self.path = cpu_stat_path(cgroup_root, self_cgroup)

    def describe(self):
        return []

    def collect(self):
        text = limits.read_text(self.path) if self.path else None
        for line in (text or "").splitlines():
            key, _, value = line.partition(" ")
            if key in self.FIELDS and value.strip().isdigit():
                name, doc, scale = self.FIELDS[key]
                yield CounterMetricFamily(f"vllm_intel_{name}", doc, value=int(value) * scale)


class FromRunReports:
    """A collector of what vLLM's processes reported in the run directory, read at scrape time."""

    def __init__(self, reports: RunReports) -> None:
        self.reports = reports

    def describe(self):
        return []


class PatchStates(FromRunReports):
    """`vllm_intel_patch_state{process, patch, state}`: how many of vLLM's processes of that kind
    report that state; `vllm_intel_vllm_processes_started_total{process}`: how many of that kind
    started (a process that dies and is replaced while the server runs counts again)."""

    def collect(self):
        family = GaugeMetricFamily(
            "vllm_intel_patch_state",
            "vLLM processes of a kind reporting a patch in a state",
            labels=["process", "patch", "state"],
        )
        started = CounterMetricFamily(
            "vllm_intel_vllm_processes_started",
            "vLLM processes of a kind started in this container (each reports its patch states)",
            labels=["process"],
        )
        counts: dict[tuple[str, str, str], int] = {}
        kinds: dict[str, int] = {}
        for found in self.reports.patch_states():
            kinds[found["process"]] = kinds.get(found["process"], 0) + 1
            for patch, state in found["states"].items():
                key = (found["process"], patch, state)
                counts[key] = counts.get(key, 0) + 1
        for labels, n in sorted(counts.items()):
            family.add_metric(list(labels), n)
        for kind, n in sorted(kinds.items()):
            started.add_metric([kind], n)
        yield family
        yield started


class StartupPhases(FromRunReports):
    """`vllm_intel_startup_phase_seconds{phase}` and `vllm_intel_startup_graphs{source}`: what vLLM
    logged of its start (RunReports.startup, RunReports.graphs)."""

    def collect(self):
        family = GaugeMetricFamily(
            "vllm_intel_startup_phase_seconds",
            "Seconds of a start-up phase as vLLM logged it (download is part of load; "
            "compile, by release, of load or engine_init)",
            labels=["phase"],
        )
        for phase, seconds in sorted(self.reports.startup().items()):
            family.add_metric([phase], seconds)
        yield family
        graphs = GaugeMetricFamily(
            "vllm_intel_startup_graphs",
            "Compiled graphs vLLM loaded from its compile cache (source=cache) or compiled at this "
            "start (source=compiled)",
            labels=["source"],
        )
        for source, n in sorted(self.reports.graphs().items()):
            graphs.add_metric([source], n)
        yield graphs


def cpu_stat_path(cgroup_root: pathlib.Path, self_cgroup: str | None = None) -> pathlib.Path | None:
    """This process's cpu.stat: the first on the way up that exists (the container's cgroup)."""
    if self_cgroup is None:
        self_cgroup = limits.read_text(pathlib.Path("/proc/self/cgroup")) or ""
    own = limits.own_paths(self_cgroup)
    if (cgroup_root / "cgroup.controllers").exists():
        dirs = limits.walk(cgroup_root, own.get("", ""))
    else:
        base = next(
            (cgroup_root / c for c in ("cpu,cpuacct", "cpu") if (cgroup_root / c).is_dir()), None
        )
        dirs = limits.walk(base, own.get("cpu", "")) if base else []
    return next((d / "cpu.stat" for d in dirs if (d / "cpu.stat").is_file()), None)


# attribute -> (name, help) of each gauge: one value, set by the loop as it learns it
GAUGES = {
    "ready_s": ("vllm_intel_ready_seconds", "Seconds from spawning vLLM to its /health answering"),
    "window_s": ("vllm_intel_drain_window_seconds", "The drain window (vLLM's --shutdown-timeout)"),
    "in_flight": (
        "vllm_intel_drain_in_flight_requests",
        "Requests in flight when the drain began (counted by vLLM's API server; else its /metrics)",
    ),
    "finished": ("vllm_intel_drain_finished_requests", "Requests finished since the drain began"),
    "aborted": (
        "vllm_intel_drain_aborted_requests",
        "Requests aborted or failed since the drain began",
    ),
    "forecast_s": (
        "vllm_intel_drain_forecast_seconds",
        "Time the slowest request in flight needs at the drain's own speed (the forecast)",
    ),
    "forecast_cut": (
        "vllm_intel_drain_forecast_cut_requests",
        "Requests the forecast says the drain window will cut",
    ),
    "drain_s": ("vllm_intel_drain_seconds", "Seconds from the stop request to vLLM's exit"),
    "omp_threads": (
        "vllm_intel_plan_omp_threads",
        "OpenMP threads per worker the plan set (0: vLLM's)",
    ),
    "kv_bytes": ("vllm_intel_plan_kv_cache_bytes", "KV cache the plan set (0: vLLM's or yours)"),
    "quota": ("vllm_intel_cpu_quota_cpus", "The container's CPU quota (0: none)"),
}


class Metrics(Extension):
    def __init__(
        self,
        cgroup_root: pathlib.Path = limits.CGROUP_ROOT,
        reports: RunReports | None = None,
        linger_s: float = 0,  # after a drain of requests, /metrics stays up for a last scrape
    ):
        self.linger_s = linger_s
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.info = Info("vllm_intel", "This supervisor and what it runs", registry=r)
        self.state = Enum(
            "vllm_intel_state",
            "The supervisor's state",
            states=[s.value for s in State],
            registry=r,
        )

        def gauge(attr: str) -> Gauge:
            return Gauge(*GAUGES[attr], registry=r)

        self.ready_s, self.window_s = gauge("ready_s"), gauge("window_s")
        self.in_flight, self.finished = gauge("in_flight"), gauge("finished")
        self.aborted, self.forecast_s = gauge("aborted"), gauge("forecast_s")
        self.forecast_cut, self.drain_s = gauge("forecast_cut"), gauge("drain_s")
        self.omp_threads, self.kv_bytes = gauge("omp_threads"), gauge("kv_bytes")
        self.quota = gauge("quota")
        self.drains = Counter(
            "vllm_intel_drains", "Stops, by how they ended", ["outcome"], registry=r
        )
        for outcome in OUTCOMES:
            self.drains.labels(outcome)
        self.swept = Counter(
            "vllm_intel_leftovers_swept", "Dead runs' entries removed at start", registry=r
        )
        r.register(CpuStat(cgroup_root))
        self.reports = reports or RunReports()
        r.register(PatchStates(self.reports))
        r.register(StartupPhases(self.reports))
        ProcessCollector(registry=r)  # process_start_time_seconds: restarts, seen from outside

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def plan(self, p) -> None:
        self.omp_threads.set(p.omp_threads or 0)
        self.kv_bytes.set((p.kv_gib or 0) * limits.GiB)
        self.quota.set(p.limits.quota or 0)

    # -- the loop's hooks (extension.py) ----------------------------------------------------
    def on_state(self, sup) -> None:
        self.state.state(sup.state.value)
        if sup.state == State.SERVING:
            self.ready_s.set(time.monotonic() - sup.started)
        elif sup.state == State.DRAINING:
            self.window_s.set(sup.drain)

    def on_tick(self, sup) -> None:
        if sup.stop_requested_at is not None:
            self.drain_progress(drain_counts(sup, self.reports), self.reports.forecast())

    def on_exit(self, sup) -> None:
        """The stop's outcome; then, if requests were drained, the linger for a last scrape."""
        if sup.stop_requested_at is None:
            return
        counted = drain_counts(sup, self.reports)
        self.drain_progress(counted, self.reports.forecast())
        aborted = None if counted is None else counted.aborted + counted.failed
        self.drain_s.set((sup.exited_at or time.monotonic()) - sup.stop_requested_at)
        outcome = drain_outcome(
            escalated=sup.escalated, aborted=aborted, was_serving=sup.was_serving
        )
        self.drains.labels(outcome).inc()
        if self.linger_s and drained_requests(sup, self.reports):
            sup.linger(sup.time_left(self.linger_s))

    def drain_progress(self, counted: Result | None, forecast) -> None:
        """From the drain's counts (drain_counts) and the forecast vLLM's API server wrote
        (drain_forecast.Forecast), as soon as they exist."""
        if counted is not None:
            self.in_flight.set(counted.in_flight)
            self.finished.set(counted.finished)
            self.aborted.set(counted.aborted + counted.failed)
        if forecast is not None:
            self.forecast_s.set(forecast.need_s if forecast.need_s is not None else float("nan"))
            self.forecast_cut.set(forecast.cut)


def reference() -> list[tuple[str, str, str]]:
    """(name as scraped, type, help) of every metric, for the docs: the registry's own families
    (on no cgroup and no run directory, so that no machine decides the list: the run directory's
    collectors yield their families without samples) and cpu.stat's counters."""
    rows = []
    for family in Metrics(pathlib.Path("/nonexistent")).registry.collect():
        suffix = {"counter": "_total", "info": "_info"}.get(family.type, "")
        rows.append((family.name + suffix, family.type, family.documentation))
    for name, doc, _ in CpuStat.FIELDS.values():
        if not any(r[0] == f"vllm_intel_{name}_total" for r in rows):
            rows.append((f"vllm_intel_{name}_total", "counter", doc.removesuffix(" (v2)")))
    return rows


def drain_counts(sup, reports: RunReports) -> Result | None:
    """How the drain's requests ended: as vLLM's API server counted them, else as the observer's
    /metrics samples tell; None: neither yet."""
    counted = reports.result()
    return counted if counted is not None else sup.observer.counts()


def drained_requests(sup, reports: RunReports) -> bool:
    """Requests were in flight when the stop came (an idle stop has nothing to report)."""
    counted, forecast = drain_counts(sup, reports), reports.forecast()
    return bool(counted and counted.in_flight) or bool(forecast and forecast.in_flight)
