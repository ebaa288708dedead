"""bench/runtime.py without Docker: each arm's `docker run` options, command and environment, the
section's options, and common.curl_batch's prompts (against a stand-in server)."""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench import limits, runtime
from bench.__main__ import SECTIONS, parser, section_options
from bench.common import curl_batch

UPSTREAM = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4:/opt/venv/lib/libiomp5.so"
EDGE = "3210m"
WHAT = limits.Served(
    "/models/m",
    ("-v", "/host/models/q:/models/m:ro", "--memory", EDGE, "--memory-swap", EDGE),
    ("/models/m", "--max-model-len", "4096"),
    {},
    "q, ",
)


def options(args: list[str]) -> dict[str, list[str]]:
    """`docker run` options -> option name -> every value given to it."""
    out: dict[str, list[str]] = {}
    for name, value in zip(args[::2], args[1::2]):
        assert name.startswith("-"), args
        out.setdefault(name, []).append(value)
    return out


def env(args: list[str]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in options(args).get("-e", []))


def arm(kind: str, setting: str) -> runtime.Arm:
    """An Arm as its __init__ would leave it, without the `docker run`."""
    a = runtime.Arm.__new__(runtime.Arm)
    a.kind, a.what, a.setting, a.cache_dir = kind, WHAT, setting, f"/c/{kind}"
    return a


@pytest.mark.parametrize("setting", ["noquota", "quota"])
@pytest.mark.parametrize("kind", runtime.KINDS)
def test_every_arm_gets_the_same_model_memory_shm_cpus_and_a_cache_of_its_own(kind, setting):
    args = arm(kind, setting).run_args()
    got = options(args)
    assert got["--shm-size"] == ["1g"]
    assert got["--memory"] == [EDGE] and got["--memory-swap"] == [EDGE]
    assert got["-v"] == ["/host/models/q:/models/m:ro", f"/c/{kind}:/home/vllm/.cache"]
    assert got.get("--cpus") == (["1"] if setting == "quota" else None)
    # vLLM's default mode (torch.compile), the same serve command for the entrypoint and vllm
    assert arm(kind, setting).command() == ["serve", "/models/m", "--max-model-len", "4096"]


def test_bare_is_vllm_itself_without_plugin_or_preload():
    args = arm("bare", "noquota").run_args()
    assert options(args)["--entrypoint"] == ["/opt/venv/bin/vllm"]
    assert env(args) == {
        "VLLM_PLUGINS": "none",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "TORCHINDUCTOR_CACHE_DIR": "/home/vllm/.cache/torchinductor",
    }
    assert not any("LD_PRELOAD" in a for a in args)


def test_upstream_is_bare_with_exactly_upstreams_preload():
    bare, upstream = arm("bare", "quota").run_args(), arm("upstream", "quota").run_args()
    assert options(upstream)["--entrypoint"] == ["/opt/venv/bin/vllm"]
    assert env(upstream) == {**env(bare), "LD_PRELOAD": UPSTREAM}
    assert runtime.UPSTREAM_PRELOAD == UPSTREAM


def test_ours_runs_the_images_entrypoint_and_sets_nothing():
    args = arm("ours", "noquota").run_args()
    assert "--entrypoint" not in args and "-e" not in args


def test_an_unknown_arm_is_refused():
    with pytest.raises(ValueError, match="unknown runtime arm"):
        runtime.docker_args("cpuset", "noquota", WHAT, "/c")


def test_limits_arms_keep_their_args_and_command():
    a = limits.Arm.__new__(limits.Arm)
    a.kind, a.what = "cpuset", WHAT
    assert a.run_args() == limits.COMMON + list(WHAT.docker_args) + limits.ARMS["cpuset"]
    assert a.command() == ["serve", *WHAT.serve_args, "--enforce-eager"]
    assert limits.Arm.section == "limits" and runtime.Arm.section == "runtime"


def test_options_reach_the_section():
    assert "runtime" in SECTIONS
    args = parser().parse_args(
        ["--only", "runtime", "--runtime-quota", "on", "--runtime-shapes", "llama-3.2-1b"]
        + ["--runtime-arms", "bare", "--runtime-starts", "3"]
    )
    want = {"shapes": "llama-3.2-1b", "quota": "on", "arms": "bare", "starts": 3}
    assert section_options("runtime", args) == want
    defaults = parser().parse_args([])
    assert section_options("runtime", defaults) == {
        "shapes": None,
        "quota": None,
        "arms": None,
        "starts": 1,
    }
    with pytest.raises(SystemExit):
        parser().parse_args(["--runtime-quota", "sometimes"])


def test_defaults_quick_and_explicit_choices():
    assert runtime.settings(None, False) == ("noquota", "quota")
    assert runtime.settings(None, True) == ("noquota",)
    assert runtime.settings("on", True) == ("quota",)
    assert runtime.settings("off", False) == ("noquota",)
    with pytest.raises(ValueError):
        runtime.settings("sometimes", False)
    assert runtime.shape_list(None, False) == ("qwen2.5-0.5b", "llama-3.2-1b")
    assert runtime.shape_list(None, True) == ("qwen2.5-0.5b",)
    assert runtime.shape_list(" llama-3.2-1b, ", True) == ("llama-3.2-1b",)
    # at least 6 pairs: the fewest that give a 95 % interval (bench/stats.py)
    assert [runtime.rounds(r, False) for r in (1, 3, 4, 10)] == [6, 6, 8, 20]
    assert runtime.rounds(5, True) == 2


def test_loads_scale_with_the_shapes_and_settings_speed():
    fast = runtime.load_tokens("qwen2.5-0.5b", "noquota")
    slow = runtime.load_tokens("llama-3.2-1b", "quota")
    assert [n for n, _ in fast.values()] == [1, 4, 16] == [n for n, _ in slow.values()]
    for load in fast:
        assert runtime.MIN_TOKENS <= slow[load][1] < fast[load][1]


def test_long_prompts_share_no_prefix():
    prompts = runtime.long_prompts(4, "r000") + runtime.long_prompts(4, "r001")
    assert len(set(prompts)) == 8
    assert len({p.splitlines()[0] for p in prompts}) == 8  # they differ in their first line
    assert all(len(p) > 3000 for p in prompts)


def test_the_plan_brief_keeps_threads_runtime_and_preload():
    line = (
        "plan: cgroup v1: CPUs 0-1 (2), no CPU quota -> threads: vLLM auto over the 2 allowed "
        "CPUs; runtime: tcmalloc + Intel OpenMP; KV cache: 1 GiB; env: "
        f"VLLM_CPU_KVCACHE_SPACE=1 LD_PRELOAD={UPSTREAM}"
    )
    assert runtime.plan_brief(line) == (
        "threads: vLLM auto over the 2 allowed CPUs; runtime: tcmalloc + Intel OpenMP; "
        f"LD_PRELOAD={UPSTREAM}"
    )


def test_without_an_engine_the_section_says_why(monkeypatch):
    monkeypatch.setattr(runtime, "engine", lambda: (None, "no Docker engine answers"))
    (row,) = runtime.run(1, True)
    assert row.section == "runtime" and row.note == "not measured: no Docker engine answers"


class Completions(BaseHTTPRequestHandler):
    """A stand-in /v1/completions: streams one usage chunk (prompt tokens: the prompt's words)."""

    prompts: list[str] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.prompts.append(body["prompt"])
        usage = {
            "prompt_tokens": len(body["prompt"].split()),
            "completion_tokens": body["max_tokens"],
        }
        text = f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(text.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    Completions.prompts = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Completions)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_curl_batch_sends_one_prompt_per_stream_and_counts_their_tokens(server, tmp_path):
    got = curl_batch(server, "m", tmp_path, 3, 1, lambda: 0.0, prompt=["a", "b c", "d e f"])
    assert got["ok"] and got["prompt_tokens"] == 6 and got["prompt_tok_s"] > 0
    assert sorted(Completions.prompts) == ["a", "b c", "d e f"]
    with pytest.raises(ValueError):
        curl_batch(server, "m", tmp_path, 2, 1, lambda: 0.0, prompt=["one"])


def test_curl_batch_keeps_its_prompt_for_the_positional_callers(server, tmp_path):
    got = curl_batch(server, "m", tmp_path, 2, 4, lambda: 0.0, {"x": lambda: 0.0})
    assert got["ok"] and got["cpu_ms_x"] == 0
    assert Completions.prompts == ["def main(", "def main("]


def test_arms_are_chosen_with_ours_and_upstream_always():
    assert runtime.arm_list(None) == runtime.KINDS
    assert runtime.arm_list("bare") == ("bare", "upstream", "ours")
    assert runtime.arm_list("ours") == ("upstream", "ours")
    with pytest.raises(ValueError, match="unknown runtime arm"):
        runtime.arm_list("bare,pinned")


def test_rows_of_a_run_with_fewer_arms_compare_only_the_arms_that_ran():
    kinds = ("upstream", "ours")
    loads = runtime.load_tokens("qwen2.5-0.5b", "noquota")
    m = {"ok": True, "tok_s": 10.0, "cpu_ms": 5.0, "throttled": 0.0, "prompt_tokens": 2000}
    m["prompt_tok_s"] = 200.0
    got = {(k, load): [dict(m)] * 6 for k in kinds for load in [*loads, runtime.PREFILL]}
    arm = {"ready_s": 1.0, "peak_mib": 100, "memory_mib": {}, "mapped": "x", "plan": "plan: -"}
    arm["compile_cache"] = None
    run = {"got": got, "kinds": kinds, "loads": loads, "rounds": 6, "first_start": True}
    run.update({k: dict(arm) for k in kinds})
    what = runtime.limits.Served("/models/m", ("--memory", "5g"), (), {})
    rows = runtime._rows("qwen2.5-0.5b", "noquota", run, what)
    names = [r.figure for r in rows]
    assert any("ours vs upstream" in n for n in names), names
    assert not any("bare" in n or "ours-spin" in n for n in names), names


def test_every_arm_gets_the_same_headroom_above_the_plans_edge():
    what = runtime.limits.Served(
        "/m", ("-v", "a:b", "--memory", "5429m", "--memory-swap", "5429m"), (), {}
    )
    args = runtime.with_headroom(what).docker_args
    assert args == ("-v", "a:b", "--memory", "5941m", "--memory-swap", "5941m")


class FakeArm:
    """runtime.Arm's interface without Docker: each container start is a new object, its speed
    its start's (so a slow start shows in its rounds only)."""

    made: list = []

    def __init__(self, kind, setting, what, cache_dir):
        self.kind, self.cache_dir, self.name, self.tmp = (
            kind,
            cache_dir,
            f"fake-{kind}",
            "/nonexistent",
        )
        self.start_no = sum(a.kind == kind for a in FakeArm.made)
        FakeArm.made.append(self)

    def start(self):
        self.started = True

    def load(self, n, tokens, prompts=None):
        speed = 10.0 * (self.start_no + 1)
        m = {"ok": True, "tok_s": speed, "prompt_tok_s": speed, "cpu_ms": 1.0, "throttled": 0.0}
        return m | {"prompt_tokens": 2000}

    def figures(self):
        return {"ready_s": 1.0, "start": self.start_no, "cache": self.cache_dir}

    def running(self):
        return True

    def remove(self, keep_log=None):
        self.removed = True


def test_starts_split_the_rounds_between_fresh_containers_and_caches(monkeypatch, tmp_path):
    FakeArm.made = []
    monkeypatch.setattr(runtime, "Arm", FakeArm)
    monkeypatch.setattr(runtime.limits, "alone", lambda *a: contextlib.nullcontext())
    monkeypatch.setattr(runtime, "record", lambda *a: None)
    monkeypatch.setattr(runtime, "log", lambda *a: None)
    caches = {kind: tmp_path / kind for kind in runtime.KINDS}
    for path in caches.values():
        path.mkdir()
    kinds = ("upstream", "ours")
    got = runtime.measure("qwen2.5-0.5b", "noquota", WHAT, caches, 5, kinds, starts=3)
    assert got["rounds"] == 6  # 5 rounded up to 2 per start
    assert [(a.kind, a.start_no) for a in FakeArm.made] == [
        ("upstream", 0), ("ours", 0), ("ours", 1), ("upstream", 1), ("upstream", 2), ("ours", 2),
    ]  # fmt: skip
    assert all(a.removed for a in FakeArm.made)
    # a fresh compile cache per start, under the kind's
    assert {a.cache_dir for a in FakeArm.made if a.kind == "ours"} == {
        str(caches["ours"] / f"start-{s}") for s in range(3)
    }
    # each start's rounds in order, the kinds paired round by round
    speeds = [m["tok_s"] for m in got["got"][("ours", "1 stream")]]
    assert speeds == [10.0, 10.0, 20.0, 20.0, 30.0, 30.0]
    assert len(got["got"][("upstream", runtime.PREFILL)]) == 6
    assert got["ours"]["start"] == 2 and [s["ours"]["start"] for s in got["starts"]] == [0, 1, 2]
    # the rows say each start's ratio: starts 0, 1, 2 of ours against upstream's
    arm = {"ready_s": 1.0, "peak_mib": 1, "memory_mib": {}, "mapped": "x", "plan": "plan: -"}
    got.update({k: dict(arm, compile_cache=None) for k in kinds}, first_start=True)
    what = runtime.limits.Served("/models/m", ("--memory", "5g"), (), {})
    notes = [r.note for r in runtime._rows("qwen2.5-0.5b", "noquota", got, what)]
    assert "ratio per start 1.000 / 1.000 / 1.000" in notes[0], notes[0]
    assert runtime.per_start([1, 2, 6, 6], [2, 2, 3, 2], 2) == "0.750 / 2.500"
    with pytest.raises(ValueError, match="--runtime-starts"):
        runtime.run(1, False, starts=0)
