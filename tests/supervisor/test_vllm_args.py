"""vllm_args.resolve: the supervisor reads vLLM's settings as `vllm serve` does.

The proof is test_agrees_with_vllms_own_parser: every case of CASES is parsed by vLLM's own
FlexibleArgumentParser + make_arg_parser (as `vllm serve` builds it) in the real 0.32.0 and
0.27.1 venvs, and resolve() must find the same values, or both must refuse the input.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.harness import ROOT
from vllm_intel.supervisor import errors, settings, timing
from vllm_intel.supervisor.errors import ConfigError
from vllm_intel.supervisor.vllm_args import FLAGS, OPTION_TO_DEST, resolve

M = "/models/m"
# (id, argv ({d} = a folder holding FILES), {file name: content})
CASES = [
    ("nothing", [M], {}),
    ("flag", [M, "--port", "9001", "--shutdown-timeout", "12"], {}),
    ("flag=", [M, "--port=9001", "--shutdown-timeout=12", "--host=::1"], {}),
    ("underscores", [M, "--shutdown_timeout", "7", "--disable_log_stats"], {}),
    ("last flag wins", [M, "--port", "9001", "--port=9002"], {}),
    (
        "config only",
        [M, "--config", "{d}/c.yaml"],
        {"c.yaml": "port: 9000\nshutdown-timeout: 60\n"},
    ),
    (
        "config then flag",
        [M, "--config", "{d}/c.yaml", "--port", "9100"],
        {"c.yaml": "port: 9000\nshutdown-timeout: 60\n"},
    ),
    (
        "flag before config",
        [M, "--shutdown-timeout=3", "--config", "{d}/c.yaml"],
        {"c.yaml": "port: 9000\nshutdown-timeout: 60\n"},
    ),
    ("config underscores", [M, "--config", "{d}/c.yml"], {"c.yml": "shutdown_timeout: 9\n"}),
    (
        "model in config",
        ["--config", "{d}/c.yaml", "--port", "9001"],
        {"c.yaml": f"model: {M}\nport: 9000\n"},
    ),
    ("positional beats config model", [M, "--config", "{d}/c.yaml"], {"c.yaml": "model: other\n"}),
    ("--model flag", ["--port", "9001", "--model", M], {}),
    ("--model= flag", ["--model=" + M, "--port", "9001"], {}),
    ("--model beats config", ["--model", M, "--config", "{d}/c.yaml"], {"c.yaml": "model: x\n"}),
    ("two --model", ["--model", M, "--model", "other"], {}),
    (
        "yaml types",
        [M, "--config", "{d}/c.yaml"],
        {
            "c.yaml": "port: '9003'\nshutdown-timeout: 0x1e\nhost: 0.0.0.0\ndisable-log-stats: true\n"
        },
    ),
    ("yaml false", [M, "--config", "{d}/c.yaml"], {"c.yaml": "disable-log-stats: false\n"}),
    (
        "yaml nested and lists",
        [M, "--config", "{d}/c.yaml"],
        {"c.yaml": "api-key: [a, b]\nhf-overrides: {a: 1}\nport: 9004\n"},
    ),
    ("headless", [M, "--config", "{d}/c.yaml"], {"c.yaml": "headless: true\n"}),
    ("api-server-count", [M, "-asc", "2", "--uds", "/tmp/s"], {}),
    ("ssl", [M, "--ssl-certfile", "/c.pem", "--ssl-keyfile=/k.pem", "--ssl-cert-reqs", "2"], {}),
    ("negative port", [M, "--port", "-5"], {}),
    (
        "parallel and hub",
        [M, "-tp", "2", "--pipeline_parallel_size=3", "--revision", "v1", "--download-dir=/d"],
        {},
    ),
    (
        "parallel in config",
        [M, "--config", "{d}/c.yaml", "-pp", "2"],
        {"c.yaml": "tensor-parallel-size: 4\npipeline-parallel-size: 3\nrevision: abc\n"},
    ),
    ("bad tp", [M, "--tensor-parallel-size", "two"], {}),
    # Both refuse:
    ("bad int", [M, "--port", "80a"], {}),
    ("float in yaml", [M, "--config", "{d}/c.yaml"], {"c.yaml": "port: 9000.0\n"}),
    ("missing file", [M, "--config", "{d}/nope.yaml"], {}),
    ("not yaml ext", [M, "--config", "{d}/c.json"], {"c.json": "port: 9000\n"}),
    ("bad yaml", [M, "--config", "{d}/c.yaml"], {"c.yaml": "port: [9000\n"}),
    ("two configs", [M, "--config", "{d}/a.yaml", "--config", "{d}/a.yaml"], {"a.yaml": "{}\n"}),
    ("config no file", [M, "--config"], {}),
    ("flag without value", [M, "--port"], {}),
]
# Inputs vLLM accepts but the supervisor refuses, each with what vLLM does instead.
REFUSED_ONLY_HERE = {
    # vLLM ignores the file silently (it looks for the exact word --config): port stays 8000.
    "config=": ([M, "--config={d}/c.yaml"], {"c.yaml": "port: 9000\n"}, {"port": 8000}),
    # argparse's prefix matching: the supervisor wants the flags it reads written in full.
    "abbreviation": ([M, "--shutdown-time", "7"], {}, {"shutdown_timeout": 7}),
}
# Where resolve() knowingly differs: a model after flags. argparse takes any bare word that no
# flag consumed as the model; telling which flags take a value needs vLLM's whole option table.
# resolve() says no model (the usage is `serve [MODEL] [FLAGS]`), so the supervisor adds the
# built-in one in front and vLLM stops at once on the extra word ("unrecognized arguments").
DIFFERS = {
    "model after flags": (["--port", "9001", M], {}, {"model": M}),
}
FIELDS = [
    "model",
    "host",
    "port",
    "uds",
    "shutdown_timeout",
    "headless",
    "grpc",
    "api_server_count",
    "disable_log_stats",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_cert_reqs",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "revision",
    "download_dir",
]
# vLLM's defaults, where resolve() says None (nobody gave a value).
DEFAULTS = {
    "port": 8000,
    "shutdown_timeout": 0,
    "ssl_cert_reqs": 0,
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
}

REAL_PARSER = textwrap.dedent(
    """
    import json, sys
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.entrypoints.cli.serve import ServeSubcommand
    fields, cases = DATA
    out = {}
    for name, argv in cases.items():
        # As vllm/entrypoints/cli/main.py builds it (a fresh parser: parse_args keeps state).
        parser = FlexibleArgumentParser(description="vLLM CLI")
        sub = parser.add_subparsers(required=False, dest="subparser")
        ServeSubcommand().subparser_init(sub)
        try:
            ns = parser.parse_args(["serve", *argv])
        except BaseException as e:  # argparse exits, vLLM raises ValueError / AssertionError
            out[name] = {"error": type(e).__name__}
            continue
        got = {f: getattr(ns, f) for f in fields}
        # ServeSubcommand.cmd: the positional model wins over --model
        got["model"] = ns.model_tag if ns.model_tag is not None else ns.model
        out[name] = got
    # Every option of `vllm serve`: [dest, takes a value]
    options = {o: [a.dest, a.nargs != 0] for o, a in parser._subparsers._group_actions[0]
               .choices["serve"]._option_string_actions.items()}
    print("RESULT" + json.dumps([out, options]))
    """
)


def materialise(tmp_path, name, argv, files):
    d = tmp_path / name.replace(" ", "_").replace("=", "eq")
    d.mkdir()
    for fname, text in files.items():
        (d / fname).write_text(text)
    return [a.replace("{d}", str(d)) for a in argv]


def ours(argv):
    try:
        r = resolve(argv, bounds=False)  # vLLM's parser bounds nothing; ours does (test_bad_inputs)
    except ConfigError as e:
        return {"error": str(e)}
    got = {f: getattr(r, f) for f in FIELDS}
    for f, default in DEFAULTS.items():
        if got[f] is None:
            got[f] = default
    return got


PARSED_ON = ("0.32.0", "0.27.1")


@pytest.fixture(scope="module")
def real_parsers(tmp_path_factory, vllm_venv):
    """(cases, refused, {version: future of REAL_PARSER's run in that release's venv}): the
    argv of CASES and of the refused ones with their files written; both venvs at once."""
    tmp_path = tmp_path_factory.mktemp("vllm-args")
    cases = {name: materialise(tmp_path, name, argv, files) for name, argv, files in CASES}
    refused = {
        name: materialise(tmp_path, name, argv, files)
        for name, (argv, files, _) in {**REFUSED_ONLY_HERE, **DIFFERS}.items()
    }
    payload = json.dumps([FIELDS, {**cases, **refused}])
    code = f"import json\nDATA = json.loads({payload!r})\n" + REAL_PARSER

    def run(version):
        python = str(vllm_venv(version) / "bin" / "python")
        return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=180)

    with ThreadPoolExecutor(2) as pool:
        yield cases, refused, {v: pool.submit(run, v) for v in PARSED_ON}


@pytest.mark.vllm
@pytest.mark.parametrize("version", PARSED_ON)
def test_agrees_with_vllms_own_parser(real_parsers, version):
    cases, refused, runs = real_parsers
    res = runs[version].result()
    line = next((x for x in res.stdout.splitlines() if x.startswith("RESULT")), None)
    assert line, res.stderr[-3000:]
    real, options = json.loads(line[len("RESULT") :])
    mismatches = {}
    for name, argv in cases.items():
        mine, theirs = ours(argv), real[name]
        if "error" in mine or "error" in theirs:
            if ("error" in mine) != ("error" in theirs):
                mismatches[name] = (mine, theirs)
        elif mine != theirs:
            mismatches[name] = {f: (mine[f], theirs[f]) for f in FIELDS if mine[f] != theirs[f]}
    assert mismatches == {}, mismatches
    for name, argv in refused.items():
        want = {**REFUSED_ONLY_HERE, **DIFFERS}[name][2]
        assert {k: real[name][k] for k in want} == want, (name, real[name])
        if name in DIFFERS:
            assert ours(argv)["model"] is None
            continue
        assert "error" in ours(argv), name
    # Every case above parsed or failed somewhere: the table proves something in both columns.
    assert sum("error" in real[n] for n in cases) >= 5
    assert sum("error" not in real[n] for n in cases) >= 15

    # The flags read here exist with the dest we think, taking a value or not as we think.
    for opt, dest in OPTION_TO_DEST.items():
        assert options.get(opt) == [dest, FLAGS[dest][1]], (opt, options.get(opt))
    # resolve() refuses `--X` that prefixes a flag it reads: safe only if no real vLLM flag is
    # such a prefix (else a legitimate flag would be refused).
    ours_long = [o for o in OPTION_TO_DEST if o.startswith("--")]
    clashes = [
        o for o in options if o not in OPTION_TO_DEST and any(x.startswith(o) for x in ours_long)
    ]
    assert clashes == []


# ------------------------------------------------------------- serve_config uses resolve (fast)


def config(tmp_path, text, name="c.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_config_file_port_and_timeout_are_honoured_not_overridden(tmp_path):
    c = config(tmp_path, "port: 9000\nshutdown-timeout: 60\n")
    cfg = settings.serve_config([str(tmp_path), "--config", c], env={})
    assert (cfg.port, cfg.drain, cfg.url) == (9000, 60, "http://127.0.0.1:9000")
    assert not any(a.startswith("--shutdown-timeout") for a in cfg.argv)  # the file's value rules
    assert "config file" in cfg.notes[0]


def test_command_line_beats_config_file(tmp_path):
    c = config(tmp_path, "port: 9000\nshutdown-timeout: 60\n")
    cfg = settings.serve_config(
        [str(tmp_path), "--port=9100", "--config", c, "--shutdown_timeout", "11"], env={}
    )
    assert (cfg.port, cfg.drain) == (9100, 11)


def test_drain_env_only_when_no_value_anywhere(tmp_path):
    c = config(tmp_path, "port: 9000\n")
    cfg = settings.serve_config(
        [str(tmp_path), "--config", c], env={"INTEL_VLLM_DRAIN_TIMEOUT": "7"}
    )
    assert cfg.drain == 7 and list(cfg.argv[-2:]) == ["--shutdown-timeout", "7"]


def test_xpu_minimum_wins_over_the_config_file(tmp_path):
    c = config(tmp_path, "shutdown-timeout: 1\n")
    cfg = settings.serve_config(
        [str(tmp_path), "--shutdown-timeout=2", "--config", c], env={"INTEL_VLLM_DEVICE": "xpu"}
    )
    assert cfg.drain == timing.XPU_MIN_DRAIN_S and "raised" in cfg.notes[-1]
    # appended last on the command line: it beats the file and every earlier flag
    assert list(cfg.argv[-2:]) == ["--shutdown-timeout", str(timing.XPU_MIN_DRAIN_S)]
    assert "--shutdown-timeout=2" not in cfg.argv
    assert (
        resolve(list(cfg.argv[cfg.argv.index("serve") + 1 :])).shutdown_timeout
        == timing.XPU_MIN_DRAIN_S
    )


def test_model_in_config_gets_no_builtin_model(tmp_path):
    c = config(tmp_path, f"model: {tmp_path}\n")
    cfg = settings.serve_config(["--config", c], env={"INTEL_VLLM_MODEL": "/builtin"})
    assert list(cfg.argv[cfg.argv.index("serve") + 1 :]) == [
        "--config",
        c,
        "--shutdown-timeout",
        str(timing.DEFAULT_DRAIN_S),
    ]
    with pytest.raises(ConfigError, match="does not exist"):
        settings.serve_config(["--config", config(tmp_path, "model: /no/such\n", "m.yaml")])


def test_host_tls_and_stats_shape_what_the_observer_asks(tmp_path):
    cfg = settings.serve_config(
        [str(tmp_path), "--host", "::", "--ssl-certfile", "/c", "--disable-log-stats"], env={}
    )
    assert cfg.url == "https://[::1]:8000" and cfg.count_requests is False
    cfg = settings.serve_config([str(tmp_path), "--host=10.1.2.3", "--port", "9001"], env={})
    assert cfg.url == "http://10.1.2.3:9001" and cfg.count_requests is True


def test_vllm_port_env_is_not_the_api_port(tmp_path):
    cfg = settings.serve_config(
        [str(tmp_path)], env={"VLLM_PORT": "9555", "VLLM_HOST_IP": "1.2.3.4"}
    )
    assert cfg.port == 8000 and cfg.url == "http://127.0.0.1:8000"


@pytest.mark.parametrize(
    "args,files,message",
    [
        (["--config", "{d}/nope.yaml"], {}, "cannot read"),
        (["--config", "{d}/c.yaml"], {"c.yaml": "port: [9000\n"}, "not valid YAML"),
        (["--config", "{d}/c.yaml"], {"c.yaml": "- port\n"}, "YAML mapping"),
        (["--config", "{d}/c.yaml"], {"c.yaml": ""}, "YAML mapping"),
        (["--config", "{d}/c.txt"], {"c.txt": "port: 1\n"}, "yaml"),
        (["--config", "{d}/c.yaml"], {"c.yaml": "port: nine\n"}, "whole number.*config file"),
        (["--config", "{d}/c.yaml"], {"c.yaml": "port: 70000\n"}, "between 1 and 65535"),
        (["--config", "{d}/c.yaml"], {"c.yaml": "shutdown-timeout: -1\n"}, ">= 0"),
        (["--config={d}/c.yaml"], {"c.yaml": "port: 1\n"}, "write --config FILE"),
        (["--shutdown-time", "3"], {}, "write --shutdown-timeout in full"),
        (["--uds", "/tmp/s"], {}, "unix socket"),
        (["--config", "{d}/c.yaml"], {"c.yaml": "headless: true\n"}, "--headless.*no HTTP"),
        (["--grpc"], {}, "no HTTP"),
        (["-asc", "0"], {}, "no HTTP"),
        (["--ssl-cert-reqs=2"], {}, "client certificate"),
    ],
)
def test_bad_vllm_settings_are_one_config_error(tmp_path, args, files, message):
    argv = materialise(tmp_path, "case", args, files)
    with pytest.raises(ConfigError, match=message):
        settings.serve_config([str(tmp_path), *argv], env={})


def test_entrypoint_refuses_a_bad_config_file_with_64_and_one_line(tmp_path):
    bad = config(tmp_path, "port: [\n")
    r = subprocess.run(
        [sys.executable, str(ROOT / "entrypoint.py"), "serve", str(tmp_path), "--config", bad],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == errors.Exit.CONFIG
    assert r.stderr.strip().splitlines() == [
        f"entrypoint.py: --config {bad}: not valid YAML (line 2)"
    ]
