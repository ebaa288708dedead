"""The supervisor's own metrics (vllm_intel.supervisor.metrics) on the probe port's /metrics:
parsed as Prometheus parses them, through a start, a drain and the linger after vLLM's exit
against the fake `vllm serve`, and cpu.stat read from fake cgroup trees."""

from __future__ import annotations

import signal
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vllm_intel.supervisor import metrics as m

from .conftest import free_port, serving


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples, name, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_every_documented_metric_is_exposed_and_every_exposed_one_documented(tmp_path):
    import json

    documented = {name for name, _kind, _doc in m.reference()}
    metrics = m.Metrics()  # this machine's cgroup: cpu.stat as it has it
    metrics.reports.dir = tmp_path  # a run directory where one vLLM process reported
    (tmp_path / "patch-states-1.json").write_text(
        json.dumps({"process": "Worker", "states": {"drain-deadline": "applied"}})
    )
    (tmp_path / "startup-1.json").write_text(
        json.dumps({"process": "Worker", "phases": {"load": 1.0}, "graphs": {"cache": 1}})
    )
    text = metrics.render().decode()
    exposed = {
        s.name
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if not s.name.endswith("_created")
    }
    assert exposed <= documented, exposed - documented
    # read at scrape time from this machine's cgroup: maybe none here
    elsewhere = {n for n in documented if n.startswith("vllm_intel_cpu_") and n.endswith("_total")}
    assert documented - exposed <= elsewhere, documented - exposed


def test_every_gauge_is_an_attribute_of_its_name(tmp_path):
    """GAUGES names the gauges; each is an attribute the loop sets, and in the registry."""
    metrics = m.Metrics(tmp_path)
    names = {f.name for f in metrics.registry.collect()}
    for attr, (name, _) in m.GAUGES.items():
        assert getattr(metrics, attr)._name == name, attr
        assert name in names, name


@pytest.mark.parametrize(
    "escalated, aborted, was_serving, outcome",
    [
        (False, 0, True, "finished"),
        (False, None, True, "finished"),  # --disable-log-stats: nothing counted, nothing cut seen
        (False, 2, True, "cut"),
        (True, 0, True, "forced"),
        (False, 0, False, "not_started"),
    ],
)
def test_drain_outcome(escalated, aborted, was_serving, outcome):
    assert m.drain_outcome(escalated=escalated, aborted=aborted, was_serving=was_serving) == outcome


def test_cpu_stat_counters_from_cgroup_v2_and_v1(tmp_path):
    v2 = tmp_path / "v2"
    (v2 / "pod" / "c").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("cpu\n")
    (v2 / "pod" / "c" / "cpu.stat").write_text(
        "usage_usec 99\nnr_periods 10\nnr_throttled 4\nthrottled_usec 2500000\n"
    )
    samples = {s.name: s.value for f in m.CpuStat(v2, "0::/pod/c\n").collect() for s in f.samples}
    assert samples == {
        "vllm_intel_cpu_periods_total": 10,
        "vllm_intel_cpu_throttled_periods_total": 4,
        "vllm_intel_cpu_throttled_seconds_total": 2.5,
    }
    v1 = tmp_path / "v1" / "cpu,cpuacct"
    v1.mkdir(parents=True)
    (v1 / "cpu.stat").write_text("nr_periods 7\nnr_throttled 1\nthrottled_time 3000000000\n")
    samples = {
        s.name: s.value
        for f in m.CpuStat(tmp_path / "v1", "4:cpu,cpuacct:/\n").collect()
        for s in f.samples
    }
    assert samples["vllm_intel_cpu_throttled_seconds_total"] == 3.0
    assert list(m.CpuStat(tmp_path / "none", "").collect()) == []  # no cgroup: no counters


def test_a_drain_is_visible_while_it_runs_and_its_outcome_after_vllms_exit(run):
    """The fake vLLM counts 3 requests running and exits 1.5 s after SIGTERM; the probe port's
    /metrics says DRAINING with 3 in flight while it drains, then, during the linger, how the
    drain ended and how long it took; the entrypoint exits at the end of the linger."""
    r, port = serving(
        run,
        {
            "FAKE_RUNNING": "3",
            "FAKE_DRAIN": "1.5",
            "INTEL_VLLM_METRICS_LINGER_S": "3",
        },
    )
    before = scrape(port)
    assert value(before, "vllm_intel_state", vllm_intel_state="SERVING") == 1
    assert value(before, "vllm_intel_ready_seconds") > 0
    assert value(before, "vllm_intel_drains_total", outcome="finished") == 0
    r.signal(signal.SIGTERM)
    time.sleep(1.0)
    draining = scrape(port)
    assert value(draining, "vllm_intel_state", vllm_intel_state="DRAINING") == 1
    assert value(draining, "vllm_intel_drain_in_flight_requests") == 3
    assert value(draining, "vllm_intel_drain_window_seconds") == 1
    time.sleep(1.5)  # vLLM exited; the linger keeps the port up
    after = scrape(port)
    assert value(after, "vllm_intel_drains_total", outcome="finished") == 1
    assert 1.0 < value(after, "vllm_intel_drain_seconds") < 3.0
    t0 = time.monotonic()
    code, out, _ = r.finish()
    assert code == 0, out
    assert time.monotonic() - t0 < 3.5, out


def test_the_drain_counts_are_vllms_own_where_it_wrote_them(run, tmp_path):
    """vLLM's API server writes how each request of the drain ended into the run directory (here
    the test writes it, as drain-deadline does at each end); the exit line and the probe port's
    drain series give those counts, not the /metrics samples: the fake vLLM's /metrics counts 3
    running to its end and no finish, as a last sample taken before the last ends would."""
    from vllm_intel.in_vllm import drain_forecast, run_files

    r, port = serving(
        run,
        {
            "FAKE_RUNNING": "3",
            "FAKE_DRAIN": "3",
            "INTEL_VLLM_METRICS_LINGER_S": "3",
        },
    )
    (run_dir,) = tmp_path.glob("vllm-intel-run-*")
    env = {run_files.ENV: str(run_dir)}
    r.signal(signal.SIGTERM)
    r.wait_for(lambda: r.state() == "DRAINING")
    drain_forecast.write(drain_forecast.Result(3, 2, 1, 0, 0), env)

    def outcomes():
        return {o: value(scrape(port), "vllm_intel_drains_total", outcome=o) for o in m.OUTCOMES}

    r.wait_for(lambda: sum(outcomes().values()) == 1)  # vLLM exited: the linger's last scrape
    assert outcomes()["cut"] == 1  # the abort
    after = scrape(port)
    assert value(after, "vllm_intel_drain_in_flight_requests") == 3
    assert value(after, "vllm_intel_drain_finished_requests") == 2
    assert value(after, "vllm_intel_drain_aborted_requests") == 1
    code, out, _ = r.finish()
    assert code == 0, out
    assert (
        "; 3 in flight at SIGTERM, 2 finished, 1 aborted (as counted by vLLM's API server)" in out
    ), out


def test_a_second_signal_ends_the_linger_at_once(run):
    r, port = serving(
        run,
        {
            "INTEL_VLLM_METRICS_LINGER_S": "5",
            "FAKE_RUNNING": "2",  # requests in flight: the drain is worth a last scrape
            # A drain the observer can sample (it polls every tick): one that ends at once is
            # over before the first sample, counts nothing in flight, and has no linger.
            "FAKE_DRAIN": "1",
        },
    )
    r.signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # wait until vLLM has exited and the outcome is counted
        if value(scrape(port), "vllm_intel_drains_total", outcome="finished") == 1:
            break
        time.sleep(0.1)
    t0 = time.monotonic()
    r.signal(signal.SIGTERM)
    code, out, _ = r.finish()
    assert code == 0 and time.monotonic() - t0 < 1.5, out


def test_a_real_prometheus_scrapes_the_drain(run, tmp_path):
    """Debian's Prometheus, scraping the probe port every second through a drain of the fake
    vLLM (3 requests running, 3 s to drain, 2 s of linger): its queries see the supervisor
    DRAINING with 3 in flight during the drain, and the stop counted as finished after it."""
    from tests.harness import prometheus

    probe_port = free_port()
    with prometheus.running(tmp_path, {"vllm-intel": [f"127.0.0.1:{probe_port}"]}) as prom:
        r = run(
            {
                "INTEL_VLLM_PROBE_PORT": str(probe_port),
                "FAKE_RUNNING": "3",
                "FAKE_DRAIN": "3",
                "INTEL_VLLM_DRAIN_TIMEOUT": "10",
                "INTEL_VLLM_METRICS_LINGER_S": "2",
            }
        )
        r.wait_for(lambda: r.state() == "SERVING")
        assert prom.until('vllm_intel_state{vllm_intel_state="SERVING"}', 1) == 1
        r.signal(signal.SIGTERM)
        assert prom.until('vllm_intel_state{vllm_intel_state="DRAINING"}', 1, 3) == 1
        assert prom.until("vllm_intel_drain_in_flight_requests", 3, 3) == 3
        assert prom.until('vllm_intel_drains_total{outcome="finished"}', 1, 6) == 1
        code, out, _ = r.finish()
        assert code == 0, out


def test_patch_states_and_starts_are_counted_per_process_kind_from_the_run_dir(tmp_path):
    import json
    import os

    from vllm_intel.supervisor.reports import RunReports

    reports = RunReports()
    states = m.PatchStates(reports)
    assert [f.samples for f in states.collect()] == [[], []]  # no run directory yet
    reports.dir = tmp_path
    for pid, kind, state in (
        (1, "API server", "applied"),
        (2, "Worker", "applied"),
        (3, "Worker", "failed"),
    ):
        (tmp_path / f"patch-states-{pid}.json").write_text(
            json.dumps({"process": kind, "states": {"drain-deadline": state}})
        )
    (tmp_path / "patch-states-4.json").write_text("not json")
    (tmp_path / "patch-states-5.json").write_text(json.dumps({"process": 1, "states": []}))
    os.symlink(tmp_path / "patch-states-1.json", tmp_path / "patch-states-6.json")  # not followed
    patch, started = states.collect()
    samples = {(s.labels["process"], s.labels["state"]): s.value for s in patch.samples}
    assert samples == {
        ("API server", "applied"): 1,
        ("Worker", "applied"): 1,
        ("Worker", "failed"): 1,
    }
    # A worker that died and was replaced while the server ran: two starts of that kind.
    assert {s.labels["process"]: s.value for s in started.samples} == {"API server": 1, "Worker": 2}
    assert {s.name for s in started.samples} == {"vllm_intel_vllm_processes_started_total"}


def test_startup_phases_are_served_from_the_run_dir(tmp_path):
    import json

    metrics = m.Metrics(tmp_path / "no-cgroup")
    metrics.reports.dir = tmp_path
    (tmp_path / "startup-7.json").write_text(
        json.dumps({"process": "Worker", "phases": {"load": 2.5, "compile": 30.0}})
    )
    text = metrics.render().decode()
    assert 'vllm_intel_startup_phase_seconds{phase="load"} 2.5' in text
    assert 'vllm_intel_startup_phase_seconds{phase="compile"} 30.0' in text


def test_an_idle_stop_does_not_linger(run):
    """Nothing was in flight: nothing to report, the entrypoint exits at once."""
    r, port = serving(run, {"INTEL_VLLM_METRICS_LINGER_S": "5"})
    t0 = time.monotonic()
    r.signal(signal.SIGTERM)
    code, out, _ = r.finish()
    assert code == 0 and time.monotonic() - t0 < 3, out
