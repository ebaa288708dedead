"""Fuzz entrypoint.py's own inputs against the fake vLLM: every subcommand, the flags the
supervisor reads (random values), the environment it reads, and --config files of random shapes.

Each case ends either in a started server (which then drains on SIGTERM) or in a documented exit
code with at most one line on stderr (`entrypoint.py: ...`): never a traceback, never more than
10 s, and nothing of the user's changed (a canary directory next to the run dir, hashed before and
after). FUZZ_EXAMPLES sets the number of examples (60; nightly 300).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from vllm_intel.supervisor.reference import EXIT_CODES

from .conftest import FAKE, ROOT, free_port

# EXIT_CODES' fixed codes, and `probe`'s / `patches`'s 1 (USAGE: "exit 0/1"; patches --strict).
DOCUMENTED = {int(code) for code, _ in EXIT_CODES if code.isdigit()} | {0}
NOT_STARTED = DOCUMENTED - {70, 124, 126}  # what a run that never started vLLM may end in
ONE_LINERS = {1: ("probe", "patches")}
SUBCOMMANDS = ["serve", "prefetch", "patches", "probe", "grace-period", "plan", "help"]
LIMIT_S = 10
# 60 in every run; Buildkite's scheduled builds run 300 (.buildkite/steps/cpu.sh)
DEFAULT_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))
RAN = {"examples": 0, "started": 0, "seconds": 0.0}

text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12
)
number = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(
        ["0", "1", "5", "30", "-1", "1.5", "1e20", "nan", "inf", "-inf", " 7 ", "", "abc"]
        + ["65535", "65536", "86400", "86401", "9" * 5000, "٣", "0x10", "1_000", "+3"]
    ),
    text,
)
# Placeholders, filled in per run: {model} a model dir, {canary} the canary, {cfg} the config.
model = st.sampled_from(
    ["{model}", "./model", "{canary}", "~nosuchuser/m", "~/m", "/nonexistent", "org/name"]
    + ["/" + "a" * 5000, "{model}/../model", "{cfg}", ""]
)
flag_pair = st.one_of(
    st.tuples(st.sampled_from(["--port", "--shutdown-timeout", "-tp", "-pp", "-asc"]), number),
    st.tuples(
        st.sampled_from(["--port=", "--shutdown-timeout=", "--tensor-parallel-size="]), number
    ),
    st.tuples(
        st.sampled_from(["--config"]), st.sampled_from(["{cfg}", "{canary}/c.yaml", "x.txt"])
    ),
    st.tuples(st.sampled_from(["--hf-token", "--hf-token=", "--hf_token"]), text),
    st.tuples(st.sampled_from(["--model", "--host", "--download-dir", "--revision"]), text),
    st.tuples(
        st.sampled_from(["--headless", "--enforce-eager", "--grpc", "ready", "live"]), st.just(None)
    ),
)
ENV_NAMES = [
    "INTEL_VLLM_DRAIN_TIMEOUT", "INTEL_VLLM_DEVICE", "INTEL_VLLM_MODEL", "INTEL_VLLM_PORT",
    "INTEL_VLLM_PROBE_PORT", "INTEL_VLLM_CPU_PLAN", "INTEL_VLLM_PATCHES",
    "INTEL_VLLM_PATCHES_DISABLE", "INTEL_VLLM_PATCHES_STRICT", "INTEL_VLLM_SHM_DIR",
    "INTEL_VLLM_STATE_FILE", "TMPDIR", "HF_HUB_OFFLINE", "HF_HOME", "HF_HUB_CACHE",
    "XDG_CACHE_HOME", "VLLM_TARGET_DEVICE", "OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND",
    "VLLM_CPU_KVCACHE_SPACE", "VLLM_MQ_MAX_CHUNK_BYTES_MB", "VLLM_SHM_BROADCAST_BUSY_SLEEP_S",
]  # fmt: skip
env_value = st.one_of(
    number,
    st.sampled_from(
        ["cpu", "xpu", "pin", "1", "0", "fast-exit", "bogus", "{tmp}", "{canary}", "/nonexistent"]
        + ["{tmp}/state.json", "{canary}", "~nosuchuser", "/dev/null", "{model}"]
    ),
)
environment = st.dictionaries(st.sampled_from(ENV_NAMES), env_value, max_size=4)
config = st.one_of(
    st.none(),
    st.binary(max_size=200),
    st.dictionaries(
        st.sampled_from(["port", "shutdown-timeout", "tensor_parallel_size", "headless", "model"]),
        st.recursive(
            st.one_of(st.none(), st.booleans(), st.integers(-(2**66), 2**66), st.floats(), text),
            lambda kids: st.lists(kids, max_size=3) | st.dictionaries(text, kids, max_size=3),
            max_leaves=6,
        ),
        max_size=3,
    ).map(lambda d: json.dumps(d, default=str)),  # JSON is YAML
    text.map(lambda t: f"port: {t}\n"),
)
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")
)


def tree_hash(root: pathlib.Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        st_ = path.lstat()
        h.update(f"{path.relative_to(root)} {st_.st_mode:o} {st_.st_size}\n".encode())
        if path.is_file() and not path.is_symlink():
            h.update(path.read_bytes())
    return h.hexdigest()


def fill(value: str, where: dict[str, str]) -> str:
    for k, v in where.items():
        value = value.replace("{" + k + "}", v)
    return value


def one_run(sub, model_arg, flags, env_in, cfg):
    root = pathlib.Path(tempfile.mkdtemp(prefix="fz-", dir="/tmp"))
    try:
        return _one_run(root, sub, model_arg, flags, env_in, cfg)
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)


def _one_run(root, sub, model_arg, flags, env_in, cfg):
    run, canary = root / "run", root / "canary"
    (run / "model").mkdir(parents=True)
    (run / "shm").mkdir()
    canary.mkdir()
    (canary / "c.yaml").write_text("port: 8123\n")
    (canary / "weights.safetensors").write_bytes(b"\0" * 64)
    (canary / "sub").mkdir()
    (canary / "sub" / "psm_keep").write_text("mine")
    cfg_path = run / "c.yaml"
    if cfg is None:
        os.mkfifo(cfg_path)
    else:
        cfg_path.write_bytes(cfg if isinstance(cfg, bytes) else cfg.encode("utf-8", "replace"))
    where = {
        "tmp": str(run),
        "canary": str(canary),
        "model": str(run / "model"),
        "cfg": str(cfg_path),
    }
    before = tree_hash(canary)

    port = free_port()
    args = [sub] if sub else []
    if model_arg is not None:
        args.append(fill(model_arg, where))
    if sub == "serve":
        args += ["--port", str(port)]  # a free port, unless a fuzzed --port comes later
    for name, value in flags:
        if value is None:
            args.append(name)
        elif name.endswith("="):
            args.append(name + fill(value, where))
        else:
            args += [name, fill(value, where)]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("INTEL_VLLM_", "HF_", "VLLM_", "OMP_", "FAKE_"))
    }
    env.update(
        PYTHONPATH=str(FAKE),
        HOME=str(run),
        TMPDIR=str(run),
        INTEL_VLLM_STATE_FILE=str(run / "state.json"),
        INTEL_VLLM_SHM_DIR=str(run / "shm"),
        INTEL_VLLM_DRAIN_TIMEOUT="1",
        HF_HUB_OFFLINE="1",
        HF_ENDPOINT="http://127.0.0.1:9",  # HF_HUB_OFFLINE=0: refused at once, never the internet
        HF_HUB_ETAG_TIMEOUT="1",
        HF_HUB_DOWNLOAD_TIMEOUT="1",
    )
    # The user's own cache dirs are written as documented: never the canary there.
    cache = ("HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME")
    env.update(
        {
            k: fill(v, {**where, "canary": str(run)} if k in cache else where)
            for k, v in env_in.items()
        }
    )
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "entrypoint.py"), *args],
        env=env,
        cwd=run,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    started = False
    state_file = run / env["INTEL_VLLM_STATE_FILE"]  # a relative one is in the cwd, run/
    while time.monotonic() - t0 < LIMIT_S and proc.poll() is None:
        try:
            if json.loads(state_file.read_text())["state"] == "SERVING":
                started = True
                break
        except (OSError, ValueError, KeyError, TypeError):
            pass
        time.sleep(0.05)
    state = None
    try:
        state = json.loads(state_file.read_text())["state"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if not started and proc.poll() is None and state == "STARTING":
        # vLLM runs and is loading, as a real one can for minutes (the fake answers /health on
        # its first --port only, vLLM uses the last): no input hangs the supervisor; stop it.
        started = True
    if started:
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()  # the drain (INTEL_VLLM_DRAIN_TIMEOUT: the fake exits at once)
    try:
        out, err = proc.communicate(timeout=max(0.1, LIMIT_S - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{args} {env_in}: still running after {LIMIT_S} s\n{err[-2000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # a leftover fake vLLM, if any
        except OSError:
            pass
    code = proc.returncode
    case = (args, env_in, code, err[-3000:])
    assert "Traceback" not in err + out, case
    assert tree_hash(canary) == before, case
    lines = err.strip().split("\n")  # what a log shows as lines (not str.splitlines: \x85)
    lines = [line for line in lines if line]
    if started or "fake vllm argv" in out:
        # vLLM ran: its own exit code, or the supervisor's for how it ended
        assert code in DOCUMENTED or 1 <= code <= 128 + 64, case
    else:
        assert code in NOT_STARTED or sub in ONE_LINERS.get(code, ()), case
        assert len(lines) <= 1, case
        if code == 64:
            # `patches` is `python -m vllm_intel.patches`, whose lines say so
            prefixes = ("entrypoint.py: ", "vllm-intel patches: " if sub == "patches" else "")
            assert lines and lines[0].startswith(tuple(p for p in prefixes if p)), case
            assert len(lines[0]) < 1000, case
    return started


inputs = dict(
    sub=st.one_of(st.sampled_from(SUBCOMMANDS), st.sampled_from(["", "SERVE", "--bogus"]), text),
    model_arg=st.one_of(st.none(), model),
    flags=st.lists(flag_pair, max_size=3),
    env_in=environment,
    cfg=config,
)
# The cases seen failing, each a seed of its own.
SEEDS = [
    ("grace-period", None, [], {"INTEL_VLLM_DRAIN_TIMEOUT": "9" * 5000}, ""),
    ("grace-period", None, [("--shutdown-timeout", "9" * 5000)], {}, ""),
    ("grace-period", None, [("--shutdown-timeout", "1" + "0" * 20)], {}, ""),
    (
        "grace-period",
        None,
        [("--shutdown-timeout", "nan")],
        {"INTEL_VLLM_DRAIN_TIMEOUT": "inf"},
        "",
    ),
    ("grace-period", None, [("--config", "{cfg}")], {}, bytes(range(256))),
    ("grace-period", None, [("--config", "{cfg}")], {}, None),  # a FIFO
    ("grace-period", None, [("--config", "{cfg}")], {}, b"#" * (16 << 20)),
    ("grace-period", None, [("--config", "{cfg}")], {}, BOMB),
    ("serve", "{model}", [("--config", "{cfg}")], {}, "port: [1, 2]\n"),
    ("plan", "{model}", [("-tp", "1000000000")], {}, ""),
    ("serve", "~nosuchuser/model", [], {}, ""),
    ("serve", "{model}", [], {"INTEL_VLLM_PROBE_PORT": "99999"}, ""),
    ("serve", "{model}", [], {"INTEL_VLLM_PROBE_PORT": "0"}, ""),
    ("serve", "{model}", [], {"INTEL_VLLM_PATCHES": "bogus"}, ""),
    ("serve", "{model}", [], {"TMPDIR": "/nonexistent"}, ""),
    ("serve", "{model}", [("--hf-token", "X")], {}, ""),
    ("prefetch", "{model}", [("--hf-token=", "X")], {}, ""),
    ("plan", "{canary}", [], {}, ""),
    ("serve", "", [], {}, ""),  # an empty model name: a traceback, found by this fuzz
    ("serve", None, [("--host", "\x80")], {}, ""),  # a traceback from bind(), found by it too
    ("serve", None, [("--port", "1")], {}, ""),  # the fake's /health is on its first --port
    ("serve", "{model}", [], {}, ""),  # a good start, drained
    ("probe", None, [("ready", None)], {"INTEL_VLLM_PROBE_PORT": "99999"}, ""),
    ("probe", None, [("ready", None)], {"INTEL_VLLM_PROBE_PORT": "²"}, ""),  # launch.py's int()
    # "model given twice" echoed both values as they were: 5000 characters, a newline (found by
    # a 300-example run)
    ("serve", "/" + "a" * 5000, [("--model", "")], {}, None),
    ("serve", "{model}", [("--model", "\n0")], {}, None),
    # numbers the plan reads: Unicode digits (int() takes them) and 5000 digits (int() raises)
    ("plan", "{model}", [], {"VLLM_CPU_KVCACHE_SPACE": "١٢"}, ""),
    ("plan", "{model}", [], {"VLLM_CPU_KVCACHE_SPACE": "9" * 5000}, ""),
    ("plan", "{model}", [], {"VLLM_MQ_MAX_CHUNK_BYTES_MB": "9" * 5000}, ""),
    ("serve", "{model}", [("--port", "٨٠٠٠")], {}, ""),
    ("grace-period", None, [], {"INTEL_VLLM_DRAIN_TIMEOUT": "١"}, ""),
    # secrets on the command line: refused alike, never echoed
    ("serve", "{model}", [("--api-key", "X")], {}, ""),
    ("plan", "{model}", [("--api-key=", "X")], {}, ""),
    # a user's existing file named as the state file: refused, never overwritten
    ("serve", "{model}", [], {"INTEL_VLLM_STATE_FILE": "{canary}/c.yaml"}, ""),
    # tensor parallel on one NUMA node: the plan binds each rank (or refuses: too few CPUs)
    ("plan", "{model}", [("-tp", "2")], {}, ""),
]


def fuzz(**kw):
    t0 = time.monotonic()
    started = one_run(**kw)
    RAN["examples"] += 1
    RAN["started"] += started
    RAN["seconds"] += time.monotonic() - t0


def seeded(test):
    for sub, model_arg, flags, env_in, cfg in reversed(SEEDS):
        test = example(sub=sub, model_arg=model_arg, flags=flags, env_in=env_in, cfg=cfg)(test)
    return test


@settings(
    max_examples=DEFAULT_EXAMPLES,
    deadline=None,
    # The same examples on every run (CI's verdict must not depend on luck); FUZZ_RANDOM=1 draws
    # new ones.
    derandomize=not os.environ.get("FUZZ_RANDOM"),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@seeded
@given(**inputs)
def test_inputs_end_in_a_server_or_a_documented_error(sub, model_arg, flags, env_in, cfg):
    fuzz(sub=sub, model_arg=model_arg, flags=flags, env_in=env_in, cfg=cfg)


def teardown_module(module):
    print(
        f"\nfuzz: {RAN['examples']} examples ({RAN['started']} started a server) in "
        f"{RAN['seconds']:.1f} s",
        file=sys.__stderr__,
    )
