"""Fuzz entrypoint.py's own inputs (environment values, subcommands, flag forms) against the fake
vLLM: every case ends either in a started server (which then drains on SIGTERM) or in a one-line
error with a documented exit code - never a traceback, a hang or another code."""

from __future__ import annotations

import pathlib
import signal
import tempfile
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import Run, free_port

DOCUMENTED_ERRORS = {64, 127}
text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8
)
drain = st.one_of(
    st.sampled_from(["0", "5", "30", "-1", "1.5", "abc", "", " 7 ", "1e3", "99999"]), text
)
device = st.sampled_from([None, "cpu", "xpu", "gpu", ""])
subcommand = st.one_of(
    st.sampled_from(["serve", "patches-typo", "probe", "--bogus", "SERVE"]),
    text.filter(lambda s: s not in ("serve", "patches", "grace-period", "-h", "--help", "help")),
)
flag = st.sampled_from(
    [
        "--port",
        "--port=",
        "--shutdown-timeout",
        "--shutdown-timeout=3",
        "--shutdown-timeout=x",
        "--model",
        "--model=/nonexistent",
        "--max-model-len",
        "1024",
        "--enforce-eager",
        "./relative-missing",
        "-x",
    ]
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sub=subcommand, flags=st.lists(flag, max_size=4), drain=drain, dev=device)
def test_inputs_end_in_a_server_or_a_documented_error(tmp_path, sub, flags, drain, dev):
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="fz-", dir=tmp_path))
    env = {"INTEL_VLLM_DRAIN_TIMEOUT": drain}
    if dev is not None:
        env["INTEL_VLLM_DEVICE"] = dev
    if sub == "serve":  # a real model dir and a free port unless the fuzzed flags override them
        args = ["serve", str(tmp), "--port", str(free_port()), *flags]
    else:
        args = [sub, *flags]
    r = Run(tmp, env, args)
    end = time.monotonic() + 8
    while time.monotonic() < end and r.proc.poll() is None and r.state() != "SERVING":
        time.sleep(0.05)
    if r.proc.poll() is None and r.state() == "SERVING":
        r.signal(signal.SIGTERM)  # started: it must drain and exit cleanly
        code, out, _ = r.finish(timeout=20)
        assert code == 0, out
        return
    if r.proc.poll() is None:  # neither started nor failed (e.g. fake vLLM's port flag is bad)
        r.signal(signal.SIGTERM)
    code, out, _ = r.finish(timeout=60)
    if "fake vllm argv" in out:  # vLLM started and failed by itself (e.g. a flag it rejects):
        assert code == 70 or 1 <= code < 128, out  # its own error code, or 70 - never 0
        return
    assert "Traceback" not in out, out
    lines = [l for l in out.strip().splitlines() if l]
    assert code in DOCUMENTED_ERRORS, (args, env, out)
    assert len(lines) == 1 and lines[0].startswith("entrypoint.py: "), (args, env, out)
