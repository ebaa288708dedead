"""Every input entrypoint.py reads, when bad, ends in ONE line on stderr and exit 64 before
anything starts: never a traceback, a hang, or a value silently used (each case one seen failing).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from tests.harness import ROOT
from vllm_intel.supervisor import errors, paths, settings, timing, vllm_args, workload
from vllm_intel.supervisor.errors import ConfigError

from .conftest import fake_env, free_port

BILLION_LAUGHS = "".join(
    ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n']
    + [f"l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10)]
)


def entrypoint(tmp: pathlib.Path, *args: str, env: dict[str, str] | None = None, timeout=20):
    full = fake_env(tmp, shm=tmp, HOME=str(tmp)) | (env or {})
    return subprocess.run(
        [sys.executable, str(ROOT / "entrypoint.py"), *args],
        env=full,
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def refused(r, message: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 64, (r.returncode, r.stdout, r.stderr)
    assert len(lines) == 1 and lines[0].startswith("entrypoint.py: "), r.stderr
    assert message in lines[0], lines[0]
    assert len(lines[0]) < 400, lines[0]
    assert "fake vllm argv" not in r.stdout + r.stderr  # nothing started


def files(tmp: pathlib.Path, name: str, content: bytes | str | None) -> str:
    path = tmp / name
    if content is None:
        os.mkfifo(path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return str(path)


HUGE = "9" * 5000


@pytest.mark.parametrize(
    "args,env,message",
    [
        (["grace-period"], {"INTEL_VLLM_DRAIN_TIMEOUT": HUGE}, "at most 86400 seconds"),
        (["grace-period", "--shutdown-timeout", HUGE], {}, "at most 12 digits"),
        (["grace-period", f"--shutdown-timeout={HUGE}"], {}, "at most 12 digits"),
        (["grace-period"], {"INTEL_VLLM_DRAIN_TIMEOUT": "1" + "0" * 20}, "at most 86400"),
        (["grace-period", "--shutdown-timeout", "1" + "0" * 20], {}, "at most 12 digits"),
        (["grace-period", "--shutdown-timeout", "86401"], {}, "at most 86400"),
        (["grace-period"], {"INTEL_VLLM_DRAIN_TIMEOUT": "86401"}, "at most 86400"),
        (["grace-period", "--shutdown-timeout", "1e20"], {}, "whole number"),
        (["grace-period"], {"INTEL_VLLM_DRAIN_TIMEOUT": "1e20"}, "whole number"),
        (["grace-period", "--shutdown-timeout", "-5"], {}, ">= 0"),
        (["grace-period"], {"INTEL_VLLM_DRAIN_TIMEOUT": "-1"}, "whole number"),
        (["grace-period", "--shutdown-timeout", "nan"], {}, "whole number"),
        (["grace-period"], {"INTEL_VLLM_DRAIN_TIMEOUT": "inf"}, "whole number"),
        (["serve", "./model", "--shutdown-timeout", "100000"], {}, "at most 86400"),
        (["grace-period", "model", "-tp", "1000000000"], {}, "-tp must be at most 1024"),
        (["plan", "./model", "-tp", "1000000000"], {}, "-tp must be at most 1024"),
        (["plan", "./model", "-tp", "1000", "-pp", "1000"], {}, "1000000 workers"),
        (["serve", "./model", "--port", "70000"], {}, "between 1 and 65535"),
        (["serve", "./model", "--port", "0"], {}, "between 1 and 65535"),
        (["serve", "~nosuchuser/model"], {}, "no home directory for user 'nosuchuser'"),
        (["plan", "~nosuchuser/model"], {}, "no home directory for user 'nosuchuser'"),
        (["prefetch", "~nosuchuser/model"], {}, "no home directory for user 'nosuchuser'"),
        (["serve"], {"INTEL_VLLM_MODEL": "~nosuchuser/m"}, "no home directory"),
        (["serve", "/" + "a" * 5000], {}, "File name too long"),
        (["prefetch", "a" * 5000], {}, "File name too long"),
        (["serve", ""], {}, "the model name is empty (in the command line)"),
        (["serve", "--model", " "], {}, "the model name is empty"),
        (["prefetch", ""], {}, "the model name is empty"),
        (["serve", "./model", "--host", "\x80"], {}, "not a host name or IP address"),
        (["serve", "./model", "--host", "a b"], {}, "not a host name or IP address"),
        (["/" + "a" * 5000], {}, "unknown subcommand '/aaa"),
        (["patches", "/" + "a" * 5000], {}, "patches: unknown argument '/aaa"),
        (["serve", "./model", "--hf-token", "X"], {}, "HF_TOKEN environment variable"),
        (["serve", "./model", "--hf-token=X"], {}, "HF_TOKEN environment variable"),
        (["prefetch", "org/name", "--hf_token", "X"], {}, "HF_TOKEN environment variable"),
        (["plan", "./model", "--hf-tok=X"], {}, "HF_TOKEN environment variable"),
        (["serve", "./model"], {"INTEL_VLLM_PROBE_PORT": "99999"}, "INTEL_VLLM_PROBE_PORT must"),
        (["serve", "./model"], {"INTEL_VLLM_PROBE_PORT": "0"}, "INTEL_VLLM_PROBE_PORT must"),
        (["serve", "./model"], {"INTEL_VLLM_PROBE_PORT": "x"}, "INTEL_VLLM_PROBE_PORT must"),
        (["serve", "./model", "--port", "18123"], {"INTEL_VLLM_PROBE_PORT": "18123"}, "own --port"),
        # The healthcheck's command: a bad probe port is a config error, not "not ready".
        (["probe", "ready"], {"INTEL_VLLM_PROBE_PORT": "99999"}, "INTEL_VLLM_PROBE_PORT must"),
        (["probe", "live"], {"INTEL_VLLM_PROBE_PORT": "0"}, "INTEL_VLLM_PROBE_PORT must"),
        (["probe", "ready"], {"INTEL_VLLM_PROBE_PORT": "x1"}, "INTEL_VLLM_PROBE_PORT must"),
        (["probe", "ready"], {"INTEL_VLLM_PROBE_PORT": "²"}, "INTEL_VLLM_PROBE_PORT must"),
        (["serve", "./model"], {"INTEL_VLLM_PATCHES": "bogus"}, "unknown patch name(s) bogus"),
        (["serve", "./model"], {"INTEL_VLLM_PATCHES_DISABLE": "fast-exit,x"}, "patch name(s) x"),
        # the deleted pin (docs/decisions/0002-delete-the-pin.md), refused like any unknown mode
        (["serve", "./model"], {"INTEL_VLLM_CPU_PLAN": "pin"}, "must be one of 0, 1, not 'pin'"),
        (["serve", "./model"], {"TMPDIR": "/nonexistent-tmp"}, "TMPDIR /nonexistent-tmp does not"),
        (["serve", "./model"], {"TMPDIR": "/etc/hostname"}, "is not a directory"),
        (["serve", "./model"], {"TMPDIR": "/proc/self/fdinfo"}, "is not writable"),
    ],
)
def test_a_bad_input_is_one_line_and_64(tmp_path, args, env, message):
    (tmp_path / "model").mkdir()
    refused(entrypoint(tmp_path, *args, env=env), message)


@pytest.mark.parametrize(
    "name,content,message",
    [
        ("bin.yaml", bytes(range(256)) * 20, "not UTF-8 text"),
        ("big.yaml", b"# padding\n" * (2 << 20), "more than the 1048576"),
        ("fifo.yaml", None, "is not a regular file"),
        ("bomb.yaml", BILLION_LAUGHS, "YAML aliases are refused"),
        ("ports.yaml", "port: [1, 2]\n", "port must be one value, not [1, 2]"),
        ("bool.yaml", "port: true\n", "port must be one value"),
        ("float.yaml", "port: 8000.5\n", "port must be a whole number"),
        ("null.yaml", "shutdown-timeout:\n", "must be one value"),
        ("tp.yaml", "tensor_parallel_size: 100000000\n", "must be at most 1024"),
        ("deep.yaml", "a: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
        ("head.yaml", "headless: 1\n", "headless must be true or false"),
    ],
)
def test_a_bad_config_file_is_one_line_and_64_fast(tmp_path, name, content, message):
    path = files(tmp_path, name, content)
    for sub in ("grace-period", "serve", "plan", "prefetch"):
        r = entrypoint(tmp_path, sub, str(tmp_path), "--config", path, timeout=10)
        refused(r, message)


def test_a_directory_as_config_is_refused(tmp_path):
    (tmp_path / "d.yaml").mkdir()
    refused(entrypoint(tmp_path, "grace-period", "--config", "d.yaml"), "is a directory")


def test_a_good_config_file_still_works(tmp_path):
    path = files(tmp_path, "ok.yaml", "shutdown-timeout: 7\nport: '9000'\nheadless: false\n")
    r = entrypoint(tmp_path, "grace-period", "--config", path)
    assert (r.returncode, r.stdout.strip()) == (0, str(timing.grace_period(7))), r.stderr


def test_plan_on_a_model_with_an_unreadable_entry_is_one_line(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "loop.safetensors").symlink_to("loop.safetensors")  # ELOOP, as root too
    refused(entrypoint(tmp_path, "plan", str(model)), "cannot read")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to nobody")
def test_plan_on_a_model_with_an_unreadable_directory_as_a_user(tmp_path):
    model = tmp_path / "m"
    (model / "locked").mkdir(parents=True)
    (model / "locked").chmod(0)
    tmp_path.chmod(0o755)
    r = subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable]
        + [str(ROOT / "entrypoint.py"), "plan", str(model)],
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "TMPDIR": "/tmp"},
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    if "setpriv" in r.stderr and r.returncode != 64:
        pytest.skip(r.stderr.strip())
    refused(r, "Permission denied")


def test_patch_names_without_importing_torch_are_the_registrys():
    from vllm_intel.patches import registry

    names = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from vllm_intel.supervisor import settings; "
            "settings.check_patches({'INTEL_VLLM_PATCHES': 'fast-exit'}); "
            "from vllm_intel.patches import patch_names; "
            "print(','.join(patch_names())); print('torch' in sys.modules)",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert names[1] == "False"
    assert names[0].split(",") == [p.name for p in registry.all_patches()]


def test_check_patches():
    settings.check_patches({"INTEL_VLLM_PATCHES": "fast-exit, drain-deadline"})
    settings.check_patches({"INTEL_VLLM_PATCHES": " ", "INTEL_VLLM_PATCHES_DISABLE": ""})
    with pytest.raises(ConfigError, match="INTEL_VLLM_PATCHES: unknown patch name"):
        settings.check_patches({"INTEL_VLLM_PATCHES": "fast-exit,nope"})


def test_parsers():
    assert settings.parse_seconds("d", " 007 ") == 7
    assert settings.parse_seconds("d", "0" * 50 + "5") == 5  # leading zeros are no digits
    for bad in ("", None, "1.5", "-1", "١٢", "86401", HUGE):
        with pytest.raises(ConfigError):
            settings.parse_seconds("d", bad)
    assert settings.parse_port("p", "65535") == 65535
    for bad in ("0", "65536", "", "8e3", "١٢٣", "x"):
        with pytest.raises(ConfigError):
            settings.parse_port("p", bad)
    for bad in (0, 65536, True, [1, 2], "80"):
        with pytest.raises(ConfigError):
            settings.check_port_number("--port", bad)
    assert settings.probe_port({}) is None
    assert settings.probe_port({"INTEL_VLLM_PROBE_PORT": "8001"}, vllm_port=8000) == 8001
    with pytest.raises(ConfigError, match="own --port"):
        settings.probe_port({"INTEL_VLLM_PROBE_PORT": "8000"}, vllm_port=8000)


def test_shown_keeps_a_line_short():
    assert errors.shown("abc") == "'abc'"
    assert errors.shown("abc", quote=False) == "abc"
    cut = errors.shown(HUGE)
    assert len(cut) < 60 and "5000 chars" in cut
    assert errors.shown("a\nb", quote=False) == "'a\\nb'"  # never a second line


def test_check_tmpdir(tmp_path):
    paths.check_tmpdir({"TMPDIR": str(tmp_path)})
    paths.check_tmpdir({})
    with pytest.raises(ConfigError, match="does not exist"):
        paths.check_tmpdir({"TMPDIR": str(tmp_path / "nope")})


def test_resolve_bounds_and_the_unbounded_parse():
    assert vllm_args.resolve(["m", "--port", "-5"], bounds=False).port == -5
    with pytest.raises(ConfigError, match="between 1 and 65535"):
        vllm_args.resolve(["m", "--port", "-5"])
    with pytest.raises(ConfigError, match="at most 12 digits"):
        vllm_args.resolve(["m", "--port", HUGE], bounds=False)
    assert workload.parallel(["m", "-tp", "1024"]) == (1024, 1)


def test_load_config_file_refuses_aliases_but_reads_plain_yaml(tmp_path):
    ok = files(tmp_path, "ok.yaml", "port: 9000\nserved-model-name: [a, b]\nx: {k: 1}\n")
    assert vllm_args.load_config_file(ok) == [
        "--port",
        "9000",
        "--served-model-name",
        "a",
        "b",
        "--x",
        '{"k": 1}',
    ]
    anchors = files(tmp_path, "a.yaml", "a: &x 1\nb: *x\n")
    with pytest.raises(ConfigError, match="alias"):
        vllm_args.load_config_file(anchors)


def test_serve_with_good_inputs_still_starts(run):
    """The checks refuse only what is bad: a probe port other than vLLM's, known patches."""
    r = run(env={"INTEL_VLLM_PROBE_PORT": str(free_port()), "INTEL_VLLM_PATCHES": "fast-exit"})
    code, out, _ = r.stop_when_serving()
    assert code == 0, out


def test_probe_fast_path_with_a_non_ascii_digit(tmp_path):
    """launch.py's fast probe path: '²'.isdigit() holds and int('²') raises."""
    r = entrypoint(tmp_path, "probe", "ready", env={"INTEL_VLLM_PROBE_PORT": "²"})
    assert r.returncode == 64 and "Traceback" not in r.stderr, r.stderr
