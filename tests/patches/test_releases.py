"""Every patch's decision on the real source of every release the project follows (the sdists of
docker/xpu-releases.toml), as `tools/upstream_release.py` makes it: the patch plugin of this
checkout in the default venv, the release's Python code first on the path, on the canonical CPU
host of docs/patch-verdicts.json. The recorded fingerprints (patches/tested_code.py) are those of
the releases' code, and the verdicts are the ones docs/patch-verdicts.json (and the README's
table rendered from it) shows."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from _patchtest import run_json

from tests.conftest import upstream_release
from tests.harness import ROOT, scripts_run

TOOL = upstream_release()
RECORDED = json.loads((ROOT / "docs" / "patch-verdicts.json").read_text())
RELEASES = RECORDED["releases"]


@pytest.fixture(scope="module")
def on_sources(default_python):
    """Every run of this module on the releases' sources, two at a time (each is one python
    importing vLLM): ({release: future of its verdict}, future of MUTATED's JSON on 0.34.0)."""
    with ThreadPoolExecutor(2) as pool:
        verdicts = {v: pool.submit(TOOL.verdict, v, str(default_python)) for v in RELEASES}
        env = {"PYTHONPATH": str(TOOL.source("0.34.0"))}
        yield verdicts, pool.submit(run_json, default_python, MUTATED, env=env)


@pytest.fixture(scope="module")
def verdicts(on_sources):
    return {v: done.result()["patches"] for v, done in on_sources[0].items()}


def test_the_followed_releases_are_the_recipe_tables():
    assert RELEASES == TOOL.known_releases()


@pytest.mark.vllm
def test_tested_code_is_the_fingerprints_of_the_releases_sources():
    from vllm_intel.patches.tested_code import TESTED

    got = TOOL.record({"cpu-amx-tiles": ["0.34.0"]})  # and `record --add cpu-amx-tiles 0.34.0`
    added = got["cpu-amx-tiles"].pop("0.34.0")
    assert got == TESTED, "run `make upstream-release-record`"
    assert added == TESTED["cpu-amx-tiles"]["0.32.0"]  # its target is 0.32.0's code there


@pytest.mark.vllm
@pytest.mark.parametrize("version", RELEASES)
def test_verdicts_are_the_recorded_ones(verdicts, version):
    assert verdicts[version] == RECORDED["verdicts"][version], "run `make upstream-release-record`"


@pytest.mark.vllm
@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_every_fix_upstream_lacks_applies_on_the_newest_releases(verdicts, version):
    got = verdicts[version]
    # the code they change is 0.32.0's, where the drain and the rest were tested
    for name in ("drain-deadline", "cpu-accelerator-api", "cpu-amx-tiles"):
        assert got[name][0] == "applied", got[name]
        assert got[name][1].endswith(f"(vLLM {version}: its code is 0.32.0's, tested)"), got[name]
    # their tests run on these releases' sources
    for name in ("cpu-aot-compile", "shm-busy-sleep"):
        assert got[name][0] == "applied" and "tested" not in got[name][1], got[name]
    # upstream has these fixes; xpu-shutdown finds 0.34.0's moved model runner
    assert got["cpu-accelerator-noops"] == [
        "upstream",
        "vLLM binds distinct no-ops (vllm PR #49960)",
    ]
    assert got["xpu-shutdown"] == ["upstream", "vLLM carries PR #46433"]
    # the runner's detection changed (a watchdog), the lifecycle patches apply and say so
    for name in ("fast-exit", "engine-parent-watch"):
        assert got[name][0] == "applied", got[name]
        assert (
            "changed since 0.32.0: vllm.v1.engine.core:EngineCoreProc.run_engine_core"
            in (got[name][1])
        )


@pytest.mark.vllm
def test_no_reason_is_wrong_on_any_release(verdicts):
    for version, got in verdicts.items():
        for name, (state, reason) in got.items():
            assert state != "failed", (version, name, reason)
            assert "not installed" not in reason, (version, name, reason)
            if state == "untested":
                assert f"vLLM {version} is outside the tested range" in reason, reason
                assert "changed since" in reason, reason  # names what changed


MUTATED = """
import json, multiprocessing, os
multiprocessing.current_process().name = "EngineCore"
from vllm_intel.patches import drain_deadline
from vllm_intel.patches.tested_code import TESTED
for fps in TESTED["drain-deadline"].values():  # as if it had been tested on other code
    fps["vllm.v1.engine.core:EngineCoreProc._handle_shutdown"] = "0" * 16
state = drain_deadline.PATCH.apply()
print(json.dumps([state, drain_deadline.PATCH.reason]))
"""


@pytest.mark.vllm
def test_a_target_unlike_the_tested_code_leaves_the_patch_out(on_sources):
    """The fingerprint is what carries drain-deadline to 0.34.0: recorded for other code, the
    patch is untested there and names the target."""
    state, reason = on_sources[1].result()
    assert state == "untested", reason
    assert reason.startswith("vLLM 0.34.0 is outside the tested range >=0.27.1,<=0.32.0; ")
    assert "changed since 0.32.0: vllm.v1.engine.core:EngineCoreProc._handle_shutdown (" in reason


@pytest.mark.vllm
def test_show_names_the_changed_targets_with_their_diff(default_python):
    """What `make upstream-release V=0.34.0` says of the patches: every target whose code
    changed since the patch's newest tested release, with the diff."""
    changes = {(p, t): (newest, d) for p, t, newest, d in TOOL.changed_targets("0.34.0")}
    run_engine_core = changes[("fast-exit", "vllm.v1.engine.core:EngineCoreProc.run_engine_core")]
    assert run_engine_core[0] == "0.32.0"
    assert "+                    get_watch_dog().handle_failure(signal_name)" in run_engine_core[1]
    moved = changes[("xpu-shutdown", "vllm.v1.worker.gpu_model_runner:GPUModelRunner.shutdown")]
    assert moved[1].startswith("--- 0.32.0/") and "-def shutdown(self) -> None:" in moved[1]
    assert not any(p == "drain-deadline" for p, _ in changes)  # its code is 0.32.0's
    assert not any(p in ("cpu-aot-compile", "shm-busy-sleep") for p, _ in changes)  # tested


class Index(http.server.BaseHTTPRequestHandler):
    """A package index's JSON page for vllm (PEP 691), listing ``versions``; or, with ``answer``
    set, that (status, raw body) instead."""

    versions: list[str] = []
    answer: tuple[int, bytes] | None = None

    def do_GET(self):  # noqa: N802 (http.server's name)
        body = json.dumps({"name": "vllm", "versions": self.versions, "files": []}).encode()
        status = 200 if self.path == "/simple/vllm/" else 404
        status, body = self.answer or (status, body)
        self.send_response(status)
        self.send_header("content-type", "application/vnd.pypi.simple.v1+json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_the_scheduled_step_fails_naming_a_newer_release():
    """.buildkite/steps/upstream-watch.sh against a package index on loopback: quiet while the
    table's newest is upstream's newest, exit 3 naming the command once a newer one is out."""
    newest = TOOL.known_releases()[-1]
    major, minor, _ = newest.split(".")
    newer = f"{major}.{int(minor) + 1}.0"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = dict(os.environ, PIP_INDEX_URL=f"http://127.0.0.1:{server.server_port}/simple")
    step = [str(ROOT / ".buildkite" / "steps" / "upstream-watch.sh")]
    try:
        Index.versions = ["0.1.0", newest, f"{newer}rc1"]  # a pre-release does not count
        quiet = subprocess.run(step, env=env, capture_output=True, text=True, timeout=60)
        assert quiet.returncode == 0, quiet.stderr
        assert f"vLLM {newest} is upstream's newest release" in quiet.stdout
        Index.versions = [newest, newer]
        late = subprocess.run(step, env=env, capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
    assert late.returncode == TOOL.NEWER == 3, late.stderr
    assert f"vLLM {newer} is out (the recipe table's newest is {newest})" in late.stderr
    assert f"make upstream-release V={newer}" in late.stderr
    scripts_run.ran(".buildkite/steps/upstream-watch.sh")


def watch_step(answer: tuple[int, bytes] | None, url: str | None = None):
    """The scheduled step against an index on loopback giving `answer` (or at `url`)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = dict(os.environ, PIP_INDEX_URL=url or f"http://127.0.0.1:{server.server_port}/simple")
    Index.answer = answer
    try:
        step = [str(ROOT / ".buildkite" / "steps" / "upstream-watch.sh")]
        return subprocess.run(step, env=env, capture_output=True, text=True, timeout=120)
    finally:
        Index.answer = None
        server.shutdown()
        server.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once closed


NEWER = b'{"versions": ["99.0.0"]}'  # a newer release, without the table's newest
UNASKED = {
    "unreachable": None,
    "HTTP 500": (500, b"{}"),
    "HTTP 404": (404, b""),
    "not JSON": (200, b"<html>rate limited</html>"),
    "a JSON list": (200, b"[]"),
    "no versions (PEP 691 without PEP 700)": (200, b'{"name": "vllm", "files": []}'),
    "versions as a string": (200, b'{"versions": "99.0.0"}'),
    "versions not strings": (200, b'{"versions": [99, 100]}'),
    "nested past the parser": (200, b"[" * 100_000),
    "not listing the table's newest": (200, NEWER),
}


@pytest.mark.parametrize("case", UNASKED)
def test_an_index_that_cannot_be_asked_fails_the_step_as_no_release(case):
    """Exit 75 (Buildkite retries it), one line naming the index: never the release's exit 3
    (before: a traceback and exit 1, the release's code then)."""
    url = f"http://127.0.0.1:{closed_port()}/simple" if case == "unreachable" else None
    r = watch_step(UNASKED[case], url)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == TOOL.UNASKED == 75, (r.returncode, r.stderr)
    assert len(lines) == 1 and "could not ask the package index" in lines[0], r.stderr
    assert lines[0].endswith("no release is implied") and "is out" not in r.stderr
    assert "Traceback" not in r.stderr and not r.stdout
    scripts_run.ran(".buildkite/steps/upstream-watch.sh")


def test_the_release_command_reproduces_the_newest_row(tmp_path):
    """`upstream_release.py row 0.34.0` against a table without 0.34.0 (its sdist then checked
    against the index's sha256): the row it prints, put back, gives the shipped table."""
    import tomllib

    table = (ROOT / "docker" / "xpu-releases.toml").read_text()
    shipped = tomllib.loads(table)
    newest = TOOL.known_releases()[-1]
    start = table.index(f'[release."{newest}"]')
    end = table.find("\n[release.", start + 1)
    without = table[:start] + (table[end + 1 :] if end != -1 else "")
    without = without.replace(f'default = "{newest}"', f'default = "{TOOL.known_releases()[-2]}"')
    copy = tmp_path / "xpu-releases.toml"
    copy.write_text(without)
    assert newest not in tomllib.loads(without)["release"]
    env = dict(os.environ, XPU_RECIPE_TABLE=str(copy))
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "upstream_release.py"), "row", newest],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    assert "taken from the index's JSON" not in out.stderr or newest in out.stderr
    assert tomllib.loads(out.stdout)["release"][newest] == shipped["release"][newest]


def fake_venv(tmp_path):
    """A VENV whose python records each argv (fields split by \\x1f) and does nothing else."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\nprintf '%s\\037' \"$@\" >> {venv}/calls\necho >> {venv}/calls\n")
    python.chmod(0o755)
    return venv


def make_upstream_release(venv, v: str):
    return subprocess.run(
        ["make", "--no-print-directory", "upstream-release", f"V={v}", f"VENV={venv}"],
        cwd=ROOT,
        env=dict(os.environ, MAKEFLAGS=""),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "v",
    ["0.35.0; touch {x}", "0.35.0 && touch {x}", "$(shell touch {x})", "0.35.0'; touch {x}; '",
     '0.35.0"; touch {x}; "', "`touch {x}`", "0.35.0\ntouch {x}", "", "-h", "../0.35.0"],
)  # fmt: skip
def test_make_upstream_release_refuses_v_that_is_no_release_number(tmp_path, v):
    """Checked before `setup` and before any shell or make expansion sees it: nothing runs."""
    venv, x = fake_venv(tmp_path), tmp_path / "pwned"
    r = make_upstream_release(venv, v.format(x=x))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr  # make's own status when a recipe fails
    assert len(lines) == 2 and lines[1].endswith("Error 64"), r.stderr
    assert lines[0].startswith("make upstream-release: V=") and "not a vLLM release" in lines[0]
    assert not x.exists() and not (venv / "calls").exists() and not r.stdout


@pytest.mark.parametrize("v", ["0.35.0", "0.35.1rc1", "0.35.0.post1", "1.0"])
def test_make_upstream_release_passes_a_release_number_as_one_argument(tmp_path, v):
    venv = fake_venv(tmp_path)
    r = make_upstream_release(venv, v)
    assert r.returncode == 0, r.stderr
    calls = (venv / "calls").read_text().splitlines()
    assert calls[-1] == "\x1f".join(["tools/upstream_release.py", "show", v, ""]), calls
