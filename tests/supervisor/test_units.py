"""The supervisor's pure functions, in-process: settings, exit codes, /metrics, the sweep, probes."""

from __future__ import annotations

import os
import pathlib
import signal

import pytest

from vllm_intel.in_vllm import drain_forecast
from vllm_intel.supervisor import errors, janitor, loop, observe, paths, probes, settings, timing
from vllm_intel.supervisor.errors import ConfigError, Exit

# ---------------------------------------------------------------------------------- settings


def test_serve_config_adds_the_drain_as_shutdown_timeout(tmp_path):
    cfg = settings.serve_config(
        [str(tmp_path), "--port", "9001"], env={"INTEL_VLLM_DRAIN_TIMEOUT": "7"}
    )
    assert cfg.port == 9001 and cfg.drain == 7
    assert list(cfg.argv[-4:]) == ["--port", "9001", "--shutdown-timeout", "7"]
    assert list(cfg.argv[1:5]) == [
        "-m",
        "vllm_intel.in_vllm.process_exit",
        "vllm.entrypoints.cli.main",
        "serve",
    ]


def test_users_shutdown_timeout_is_the_drain(tmp_path):
    cfg = settings.serve_config([str(tmp_path), "--shutdown-timeout=12"], env={})
    assert cfg.drain == 12 and cfg.argv.count("--shutdown-timeout=12") == 1
    assert "--shutdown-timeout" not in cfg.argv


def test_xpu_raises_a_short_drain_and_rewrites_the_flag(tmp_path):
    cfg = settings.serve_config(
        [str(tmp_path), "--shutdown-timeout", "0"], env={"INTEL_VLLM_DEVICE": "xpu"}
    )
    assert cfg.drain == timing.XPU_MIN_DRAIN_S and cfg.notes
    assert list(cfg.argv[-2:]) == ["--shutdown-timeout", str(timing.XPU_MIN_DRAIN_S)]
    assert cfg.argv.count("--shutdown-timeout") == 1


@pytest.mark.parametrize(
    "env,args,message",
    [
        ({"INTEL_VLLM_DRAIN_TIMEOUT": "1.5"}, ["/"], "whole number"),
        ({"INTEL_VLLM_DEVICE": "gpu"}, ["/"], "cpu or xpu"),
        ({}, ["/no/such/model"], "does not exist"),
        ({}, ["/", "--port"], "--port needs a value"),
    ],
)
def test_bad_settings_raise_config_error(env, args, message):
    with pytest.raises(ConfigError, match=message):
        settings.serve_config(args, env=env)


def test_grace_is_drain_plus_teardown_plus_margin():
    assert timing.grace_period(30) == 45 == 30 + timing.TEARDOWN_S + timing.MARGIN_S
    assert timing.deadline(30) == 40


def test_state_file_default_and_override():
    assert paths.state_file(8123, env={}).name == "vllm-intel-8123.state.json"
    assert paths.state_file(1, env={"INTEL_VLLM_STATE_FILE": "/x/s.json"}) == pathlib.Path(
        "/x/s.json"
    )


# ---------------------------------------------------------------------------------- exit codes


@pytest.mark.parametrize(
    "rc,stop,escalated,expected",
    [
        (0, True, False, 0),  # clean drain
        (3, True, False, 3),  # vLLM's own code after a stop request
        (-11, True, False, 139),  # died of SIGSEGV
        (0, False, False, Exit.UNEXPECTED),  # exited by itself: must be restarted
        (5, False, False, Exit.UNEXPECTED),  # an engine that died: the table says 70 too
        (-9, False, False, 137),  # killed by a signal nobody sent through us
        (-9, True, True, Exit.FORCED),  # we killed the group
        (0, True, True, 0),  # exited cleanly during the escalation
    ],
)
def test_exit_code_mapping(rc, stop, escalated, expected):
    assert errors.exit_code(rc, stop_requested=stop, escalated=escalated) == expected


# ---------------------------------------------------------------------------------- signals


def test_every_catchable_signal_but_ours_is_forwarded():
    assert {
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGWINCH,
        signal.SIGALRM,
        signal.SIGPWR,
        signal.SIGCONT,
        signal.SIGRTMIN,
        signal.SIGRTMAX,
    } <= loop.FORWARDED
    assert not (
        {
            signal.SIGTERM,
            signal.SIGINT,
            signal.SIGCHLD,
            signal.SIGKILL,
            signal.SIGSTOP,
            signal.SIGTSTP,
            signal.SIGSEGV,
        }
        & loop.FORWARDED
    )
    assert loop.WATCHED == loop.FORWARDED | loop.STOPPING | {signal.SIGCHLD}


# ---------------------------------------------------------------------------------- /metrics

METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# TYPE vllm:request_success counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 10.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 4.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 2.0
vllm:request_success_created{engine="0",finished_reason="stop",model_name="m"} 1.7e9
"""


def test_metrics_counts_sum_engines_and_split_aborts():
    assert observe.parse_counts(METRICS) == {
        "running": 5.0,
        "waiting": 1.0,
        "finished": 14.0,
        "aborted": 2.0,
    }


def test_metrics_counts_survive_a_family_the_parser_rejects():
    odd = METRICS + '# TYPE vllm:some_new_metric gauge\nvllm:some_new_metric{x="1"} not-a-number\n'
    assert observe.parse_counts(odd) == observe.parse_counts(METRICS)


def test_observer_summary_is_relative_to_the_drain():
    obs = observe.Observer("http://127.0.0.1:0")
    assert obs.summary() == ""  # never counted (vLLM was not serving)
    obs.at_drain = observe.parse_counts(METRICS)
    obs.last = dict(obs.at_drain, running=0.0, waiting=1.0, finished=19.0, aborted=3.0)
    assert obs.summary() == (
        "; 6 in flight at SIGTERM, 5 finished, 1 aborted, 1 still running "
        "(as last seen in /metrics; no count from vLLM's API server)"
    )
    obs.last_at = 100.0  # a sample can precede the drain's end: the line says by how much
    assert obs.summary(exited_at=100.43).endswith(
        "1 still running (as last seen in /metrics, 0.4 s before vLLM exited; "
        "no count from vLLM's API server)"
    )
    # vLLM's API server counted every end itself: its counts, not the samples
    counted = drain_forecast.Result(in_flight=6, finished=6, aborted=0, failed=0, open=0)
    assert obs.summary(exited_at=100.43, counted=counted) == (
        "; 6 in flight at SIGTERM, 6 finished, 0 aborted (as counted by vLLM's API server)"
    )


# ---------------------------------------------------------------------------------- janitor


def inode(path):
    st = os.stat(path)
    return (st.st_dev, st.st_ino)


def test_files_in_use_sees_this_process_mapping_a_file(tmp_path):
    import mmap

    path = tmp_path / "psm_mapped"
    path.write_bytes(b"x" * 4096)
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 4096):
        assert inode(path) in janitor.files_in_use()
    assert inode(path) not in janitor.files_in_use()


# ---------------------------------------------------------------------------------- probes


@pytest.mark.parametrize(
    "kind,state,healthy,ok",
    [
        ("ready", "STARTING", True, False),
        ("ready", "SERVING", True, True),
        ("ready", "SERVING", False, False),
        ("ready", "DRAINING", True, False),  # out of rotation the moment the drain starts
        ("live", "STARTING", False, True),  # loading is alive
        ("live", "DRAINING", True, True),  # draining is alive
        ("live", "DRAINING", False, False),
        ("live", "KILLING", True, False),
    ],
)
def test_probe_decisions(kind, state, healthy, ok):
    assert probes.decide(kind, state, healthy) is ok


def test_xpu_serve_without_a_render_node_is_refused_in_one_line(tmp_path):
    from vllm_intel.supervisor.cli import missing_device

    dri = tmp_path / "dri"
    dri.mkdir()
    why = missing_device({"VLLM_TARGET_DEVICE": "xpu"}, dri)
    assert why and "no XPU device" in why and "--device /dev/dri" in why and "\n" not in why
    (dri / "renderD128").touch()
    assert missing_device({"VLLM_TARGET_DEVICE": "xpu"}, dri) is None
    assert missing_device({"VLLM_TARGET_DEVICE": "cpu"}, tmp_path / "none") is None
    assert missing_device({}, tmp_path / "none") is None


def test_compile_cache_line_says_empty_or_warm(tmp_path):
    from vllm_intel.supervisor import cli

    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind"), "VLLM_CACHE_ROOT": str(tmp_path / "v")}
    assert cli.compile_cache_line(env).endswith(": empty, this start compiles")
    (tmp_path / "v" / "torch_compile_cache" / "abc").mkdir(parents=True)
    (tmp_path / "v" / "torch_compile_cache" / "abc" / "graph.py").write_text("")
    line = cli.compile_cache_line(env)
    assert f"{tmp_path}/v/torch_compile_cache 1 file(s)" in line and ": warm" in line
