"""The hub helpers on real files: cache resolution as huggingface_hub does it, which files a
prefetch takes, the progress logged while a download is in flight, and `entrypoint.py prefetch`
exit codes (no-op for local paths and offline; one line and 69 when the hub is unreachable)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import types

import pytest

from tests.harness import ROOT
from tests.harness.fakehub import FakeHub
from tests.harness.models import REVISION, hub_layout
from vllm_intel.supervisor import errors, hub, settings
from vllm_intel.supervisor.state import State


def test_cache_dir_follows_huggingface_hub(tmp_path):
    # huggingface_hub resolves its constants at import: ask a fresh interpreter each time.
    for env in (
        {"HF_HOME": str(tmp_path / "home")},
        {"HF_HOME": str(tmp_path / "home"), "HF_HUB_CACHE": str(tmp_path / "hub")},
        {"XDG_CACHE_HOME": str(tmp_path / "xdg")},
    ):
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "XDG_"))}
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                "from huggingface_hub import constants as c; print(c.HF_HUB_CACHE)",
            ],
            env={**clean, **env},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert str(hub.cache_dir({**clean, **env})) == out, env


@pytest.mark.parametrize(
    "value,online", [("1", False), ("true", False), ("ON", False), ("0", True), ("", True)]
)
def test_offline_switch_reads_like_huggingface_hub(value, online):
    assert hub.online({"HF_HUB_OFFLINE": value}) is online


def test_repo_id_or_local_path(tmp_path):
    assert hub.repo_id("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    assert hub.repo_id("gpt2") == "gpt2"
    assert hub.repo_id("/models/x") is None and hub.repo_id("./x") is None
    assert hub.repo_id(str(tmp_path)) is None and hub.repo_id(None) is None
    assert hub.repo_id("a/b/c") is None  # no hub repo has two slashes


def test_choose_files_takes_one_weight_format_and_the_config():
    names = [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        "original/consolidated.00.pth",
        "original/params.json",
        "README.md",
        ".gitattributes",
        "onnx/model.onnx",
    ]
    assert hub.choose_files(names) == [
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert "pytorch_model.bin" in hub.choose_files(["config.json", "pytorch_model.bin"])


def test_progress_counts_complete_and_partial_blobs(tmp_path, tiny_model):
    cache, repo = tmp_path / "hub", "org/name"
    hub_layout(tiny_model, cache, repo)
    done, partial, n = hub.progress(cache, repo)
    assert done == sum(p.stat().st_size for p in tiny_model.rglob("*") if p.is_file())
    assert (partial, n) == (0, 0)
    blobs = cache / "models--org--name" / "blobs"
    (blobs / "abc.incomplete").write_bytes(b"x" * 1000)
    (blobs / "abc.lock").write_bytes(b"")
    assert hub.progress(cache, repo) == (done, 1000, 1)
    line = hub.progress_line(cache, repo, total=(done + 1000) * 2)
    assert "org/name" in line and "(50 %)" in line and "1 file in progress" in line
    assert hub.progress(cache, "org/absent") == (0, 0, 0)


def test_progress_is_logged_while_starting_and_growing_once_per_period(
    tmp_path, monkeypatch, capfd
):
    """serve's download progress: a look from the loop's tick every PROGRESS_S while vLLM is
    STARTING, a line only when the bytes changed; prefetch's thread does the same looks."""
    monkeypatch.setattr(hub, "PROGRESS_S", 0.05)
    cache, repo = tmp_path / "hub", "org/name"
    blobs = hub.repo_dir(cache, repo) / "blobs"
    blobs.mkdir(parents=True)
    partial = blobs / "f.incomplete"
    partial.write_bytes(b"")
    sup = types.SimpleNamespace(state=State.STARTING)
    ext = hub.DownloadProgress(cache, repo)
    ext.on_spawn(sup)

    def ticks(seconds):  # the loop's turns, faster than PROGRESS_S
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            ext.on_tick(sup)
            time.sleep(0.005)

    def logged():
        return [line for line in capfd.readouterr().err.splitlines() if "downloading" in line]

    for size in (10_000, 20_000):  # a download that grows
        partial.write_bytes(b"x" * size)
        ticks(0.2)
    lines = logged()
    assert len(lines) == 2 and "20.0 kB" in lines[-1], lines  # one line per change, not per tick
    sup.state = State.SERVING  # the supervisor left STARTING: no more looks
    partial.write_bytes(b"x" * 30_000)
    ticks(0.2)
    assert logged() == []

    t = hub.ProgressLogger(cache, repo)
    t.start()
    partial.write_bytes(b"x" * 40_000)
    time.sleep(0.2)
    t.stop()
    t.join(timeout=2)
    assert not t.is_alive() and any("40.0 kB" in line for line in logged())


def entrypoint(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "INTEL_VLLM_"))}
    return subprocess.run(
        [sys.executable, str(ROOT / "entrypoint.py"), *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_prefetch_is_a_noop_for_local_models_and_offline(tmp_path, tiny_model):
    home = {"HF_HOME": str(tmp_path)}
    r = entrypoint("prefetch", env={**home, "INTEL_VLLM_MODEL": str(tiny_model)})
    assert r.returncode == 0 and "is local, nothing to download" in r.stderr, r.stderr
    r = entrypoint("prefetch", "org/name", env={**home, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0 and "HF_HUB_OFFLINE is set" in r.stderr, r.stderr
    assert not (tmp_path / "hub").exists()  # nothing written


def test_prefetch_bad_input_and_unreachable_hub(tmp_path):
    r = entrypoint("prefetch", "/no/such/model", env={})
    assert r.returncode == errors.Exit.CONFIG and r.stderr.count("\n") == 1, r.stderr
    r = entrypoint("prefetch", "org/name", "--revision", env={})
    assert r.returncode == errors.Exit.CONFIG and "--revision needs a value" in r.stderr
    # A hub that refuses connections (a port nothing listens on): one line, exit 69, fast.
    env = {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}
    t0 = time.monotonic()
    r = entrypoint("prefetch", "org/name", env=env)
    assert r.returncode == errors.Exit.PREFETCH, r.stderr
    assert r.stderr.count("\n") == 1 and "cannot download org/name" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and time.monotonic() - t0 < 30


def test_serve_logs_download_progress_only_for_a_repo_id_online(tmp_path):
    """serve's wiring: the model and flags as serve_config resolves them (a --config file's model
    included) decide whether a progress logger runs, and where it looks."""
    on = {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "0"}
    config = tmp_path / "serve.yaml"
    config.write_text("model: org/from-file\n")

    def watch(args, env):
        progress = hub.download_progress(settings.serve_config(args, env), env)
        return progress and (progress.cache, progress.repo)

    assert watch(["org/name", "--port", "8123"], on) == (tmp_path / "hub", "org/name")
    assert watch(["--model", "org/name"], on) == (tmp_path / "hub", "org/name")
    assert watch(["--config", str(config)], on) == (tmp_path / "hub", "org/from-file")
    assert watch(["org/name", "--download-dir", str(tmp_path / "d")], on) == (
        tmp_path / "d",
        "org/name",
    )
    assert watch([str(tmp_path)], on) is None  # a local directory
    assert watch(["org/name"], {**on, "HF_HUB_OFFLINE": "1"}) is None


def test_prefetch_downloads_what_vllm_reads_from_a_hub(tmp_path, tiny_model):
    """The real download path against a local hub (tests/harness/fakehub.py): one weight format
    and the config files land in the cache layout vLLM reads, the progress is logged while it
    runs, and a second prefetch downloads nothing."""
    extra = {"pytorch_model.bin": b"b" * 1000, "original/params.json": b"{}", "README.md": b"#"}
    code = (
        "import sys; from vllm_intel.supervisor import hub; hub.PROGRESS_S = 0.3; "
        "sys.exit(hub.prefetch(sys.argv[1:]))"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "INTEL_VLLM_"))}
    with FakeHub(tiny_model, "org/name", extra, chunk_delay_s=0.15) as fake:
        env = {**clean, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": fake.url}
        run = [sys.executable, "-c", code, "org/name"]
        first = subprocess.run(run, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
        downloads = [p for m, p in fake.requests if m == "GET" and "/resolve/" in p]
        again = subprocess.run(run, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
        after = [p for m, p in fake.requests if m == "GET" and "/resolve/" in p]
    assert first.returncode == 0, first.stderr
    wanted = sorted(str(p.relative_to(tiny_model)) for p in tiny_model.rglob("*") if p.is_file())
    assert sorted(p.rsplit("/", 1)[1] for p in downloads) == wanted  # no .bin, original/, README
    snap = hub.repo_dir(tmp_path / "hub", "org/name") / "snapshots" / REVISION
    for name in wanted:
        assert (snap / name).read_bytes() == (tiny_model / name).read_bytes(), name
    assert "Fetching" not in first.stderr  # huggingface_hub's bars are off; our lines instead
    assert re.search(r"prefetch: org/name: 6 files, [\d.]+ kB, [\d.]+ kB to download", first.stderr)
    assert re.search(r"downloading org/name: .* of .* \(\d+ %\)", first.stderr), first.stderr
    assert again.returncode == 0 and "0 B to download" in again.stderr, again.stderr
    assert after == downloads  # the cache answered: nothing fetched twice


def test_prefetch_takes_the_servers_arguments(tmp_path, tiny_model):
    """An init container given the server's own arguments downloads what serve will read: the
    model and --revision from its --config file, into --download-dir; serve-only flags pass."""
    conf = tmp_path / "serve.yaml"
    conf.write_text(f"model: org/name\nrevision: {REVISION}\nport: 9000\n")
    into = tmp_path / "models"
    args = ["--config", str(conf), "--download-dir", str(into), "--enforce-eager", "-tp", "1"]
    with FakeHub(tiny_model, "org/name", {}) as fake:
        env = {"HF_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": fake.url}
        r = entrypoint("prefetch", *args, env=env)
        asked = [p for m, p in fake.requests if m == "GET"]
    assert r.returncode == 0, r.stderr
    assert f"prefetch: org/name@{REVISION}: 6 files" in r.stderr and str(into) in r.stderr
    assert any(f"/resolve/{REVISION}/" in p for p in asked), asked
    snap = hub.repo_dir(into, "org/name") / "snapshots" / REVISION
    assert (snap / "config.json").read_bytes() == (tiny_model / "config.json").read_bytes()
    assert not (tmp_path / "home" / "hub").exists()  # not the default cache


def test_serve_resolves_its_vllm_flags_once(tmp_path, monkeypatch):
    """The settings, the CPU plan's workload and the download logger all read the one resolution
    serve_config made (a --config file is read once, by vLLM's rules)."""
    from vllm_intel.supervisor import cli, vllm_args, workload

    calls = []

    def counted(args):
        calls.append(list(args))
        return vllm_args.resolve(args)

    for module in (settings, workload, hub):
        monkeypatch.setattr(module, "resolve", counted)
    config = tmp_path / "serve.yaml"
    config.write_text("model: org/from-file\ntensor-parallel-size: 2\n")
    env = {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "0"}
    cfg = settings.serve_config(["--config", str(config), "--port", "8123"], env)
    monkeypatch.setattr(os, "environ", env)  # make_plan reads the process's environment
    assert cli.make_plan(cfg).work.tp == 2
    assert hub.download_progress(cfg, env).repo == "org/from-file"
    assert calls == [["--config", str(config), "--port", "8123"]]
