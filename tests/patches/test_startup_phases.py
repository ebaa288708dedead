"""vllm_intel.in_vllm.startup_phases: vLLM's own start-up lines become seconds per phase in the run dir.

Over the real logging module and vLLM's format strings (the real server: test_serve.py)."""

from __future__ import annotations

import json
import logging
import os

import pytest

from vllm_intel.in_vllm import run_files
from vllm_intel.in_vllm import startup_phases as sp
from vllm_intel.supervisor.reports import RunReports, cache_verdict, phases_text


@pytest.fixture
def installed(tmp_path, monkeypatch):
    monkeypatch.setenv(run_files.ENV, str(tmp_path))
    before = logging.getLogRecordFactory()
    sp.install(lambda: "Worker")
    log = logging.getLogger("vllm.test_startup_phases")
    log.setLevel(logging.INFO)
    log.propagate = False  # made and dropped: no handler needs to see them
    yield log, tmp_path
    sp.uninstall()
    assert logging.getLogRecordFactory() is before


def own_file(tmp_path) -> dict:
    return json.loads((tmp_path / f"startup-{os.getpid()}.json").read_text())


def test_vllm_lines_become_phases_and_repeats_add_up(installed):
    log, tmp_path = installed
    log.info("Model loading took %s GiB memory and %.6f seconds", "0.01", 1.5)
    log.info("%storch.compile took %.2f s in total", "", 20.25)
    log.info("%storch.compile took %.2f s in total", "[encoder] ", 2.0)
    log.info(sp.INIT + "%.2f s (compilation: %.2f s)", 30.0, 22.25)
    log.info("Loading weights took %.2f seconds", 0.5)  # part of the load, kept apart
    range_ = "%sCompiling a graph for compile range %s takes %.2f s"
    log.info(range_, "", "(1, 2048)", 9.5)
    log.info(range_, "", "(2049, 4096)", 3.5)
    log.info("Directly load the compiled graph(s) for shape %s from the cache, took %.3f s", 8, 0.2)
    data = own_file(tmp_path)
    assert data == {
        "process": "Worker",
        "phases": {"load": 1.5, "load_weights": 0.5, "compile": 22.25, "engine_init": 30.0},
        "graphs": {"compiled": 2, "cache": 1},
    }


def test_the_cpu_runner_s_warm_up_is_its_compile_with_torch_s_cache_counts(installed, monkeypatch):
    """CPU (0.32): no compile line, two warm-up lines around the compile; the FX graph cache's
    hits and misses from torch's own counters as the warm-up ends."""
    import sys
    import types

    log, tmp_path = installed
    fake = types.SimpleNamespace(
        counters={"inductor": {"fxgraph_cache_hit": 3, "fxgraph_cache_miss": 1}}
    )
    monkeypatch.setitem(sys.modules, "torch._dynamo.utils", fake)
    log.info("Initializing model took %.6f seconds", 0.25)
    log.info("Loading weights took %.2f seconds", 0.5)
    log.info(sp.WARM_UP[0])
    log.info(sp.WARM_UP[1])
    data = own_file(tmp_path)
    assert data["graphs"] == {"cache": 3, "compiled": 1}
    assert 0 <= data["phases"].pop("compile") < 5
    assert data["phases"] == {"load_init": 0.25, "load_weights": 0.5}
    r = RunReports()
    r.dir = tmp_path
    assert r.startup()["load"] == 0.75  # the loader's two lines where no "Model loading took"
    assert set(r.startup()) == {"load", "compile"}
    log.info(sp.WARM_UP[1])  # a second end without a start records nothing more
    assert own_file(tmp_path)["graphs"] == {"cache": 3, "compiled": 1}


def test_reworded_lines_below_the_level_and_bad_args_record_nothing(installed):
    log, tmp_path = installed
    log.info("Model loading took %.4f GiB of memory and %.6f seconds", 0.01, 1.5)  # reworded
    log.debug(sp.INIT + "%.2f s", 30.0)  # below the logger's level: no record is made
    make = logging.getLogRecordFactory()  # as Logger.makeRecord calls it (no handler formats these)
    make("vllm.x", logging.INFO, __file__, 1, "%storch.compile took %.2f s in total", ("x",), None)
    make("vllm.x", logging.INFO, __file__, 1, "torch.compile takes %.2f s in total", ("n",), None)
    assert not (tmp_path / f"startup-{os.getpid()}.json").exists()


def test_installing_twice_wraps_once_and_no_directory_installs_nothing(tmp_path, monkeypatch):
    before = logging.getLogRecordFactory()
    monkeypatch.delenv(run_files.ENV, raising=False)
    sp.install(lambda: "Worker")
    assert logging.getLogRecordFactory() is before  # no run directory: nothing to write to
    monkeypatch.setenv(run_files.ENV, str(tmp_path))
    sp.install(lambda: "Worker")
    ours = logging.getLogRecordFactory()
    sp.install(lambda: "Worker")
    assert logging.getLogRecordFactory() is ours and ours.previous is before
    sp.uninstall()
    assert logging.getLogRecordFactory() is before


def test_an_unwritable_directory_never_fails_the_log_call(tmp_path, monkeypatch):
    monkeypatch.setenv(run_files.ENV, str(tmp_path / "gone"))
    sp.install(lambda: "Worker")
    try:
        logging.getLogger("vllm.x").warning(sp.INIT + "%.2f s", 3.0)  # must not raise
    finally:
        sp.uninstall()


def test_every_phase_vllm_may_report_has_a_line(tmp_path):
    assert {phase for phase, _ in sp.LINES.values()} == set(sp.PHASES) | {
        "load_init",
        "load_weights",
    }


def test_reports_take_the_longest_process_and_the_ready_line_words_them(tmp_path):
    for pid, phases in ((1, {"load": 2.0, "compile": 9.0}), (2, {"load": 3.0}), (3, {"x": True})):
        (tmp_path / f"startup-{pid}.json").write_text(
            json.dumps({"process": "Worker", "phases": phases})
        )
    (tmp_path / "startup-4.json").write_text("{")
    r = RunReports()
    assert r.startup() == {}  # no run directory yet
    r.dir = tmp_path
    assert r.startup() == {"load": 3.0, "compile": 9.0}  # the bool-valued report is not read
    assert phases_text(r.startup()) == " (vLLM: load 3.0 s, compile 9.0 s)"
    assert phases_text({}) == ""
    assert r.graphs() == {}
    (tmp_path / "startup-5.json").write_text(json.dumps({"process": "W", "graphs": {"cache": 2}}))
    (tmp_path / "startup-6.json").write_text(json.dumps({"process": "W", "graphs": {"cache": 1}}))
    assert r.graphs() == {"cache": 3}  # summed over processes
    assert phases_text({"load": 1.0}, r.graphs()) == (
        " (vLLM: load 1.0 s; compile cache hit: 3 graph(s) loaded)"
    )


@pytest.mark.parametrize(
    "graphs,said",
    [
        ({"cache": 2}, "compile cache hit: 2 graph(s) loaded"),
        ({"compiled": 2}, "compile cache miss: 2 graph(s) compiled"),
        ({"cache": 1, "compiled": 1}, "compile cache partly warm: 1 graph(s) loaded, 1 compiled"),
        ({}, ""),
    ],
)
def test_the_cache_verdict_is_vllms_own_count(graphs, said):
    assert cache_verdict(graphs) == said
    assert phases_text({}, graphs) == (f" (vLLM: {said})" if said else "")
