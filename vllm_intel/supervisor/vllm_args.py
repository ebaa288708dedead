"""The `vllm serve` settings the supervisor relies on, resolved as vLLM resolves them, without
importing vLLM (the supervisor is PID 1 and must start fast).

Sources and precedence, as in vLLM 0.27.1 and 0.32.0 (vllm/utils/argparse_utils.py,
FlexibleArgumentParser.parse_args / _pull_args_from_config / load_config_file):

1. The command line. `--flag V` and `--flag=V`; underscores in a flag name are dashes; the last
   occurrence wins (argparse). The first `--model M` is moved to the front as the positional model.
2. The file of `--config FILE` (only that spelling: vLLM tests `"--config" in args`, so it ignores
   `--config=FILE` without a word; we refuse that). A YAML mapping; each `key: value` becomes
   `--key str(value)` (true -> `--key`, false -> nothing, list -> `--key a b`) and is inserted
   right after the model, before every command-line flag, so the command line wins. A positional
   model beats the file's `model:`.
3. vLLM's defaults.

The environment: `vllm serve` takes none of these from it. `VLLM_API_KEY` is the API key when
`--api-key` is absent, but it guards only /v1, /v2, /inference, /cohere (AuthenticationMiddleware),
never the /health and /metrics the supervisor reads, so it does not concern us. `VLLM_PORT` is NOT
the API port: it is the first of the internal ports of torch.distributed / engine communication
(vllm/envs.py) and must never be read as the server's port. `VLLM_HOST_IP` likewise is the
internal communication address, not `--host`.

What the supervisor relies on, and why:
  model                 the built-in model is added only when none is named anywhere
  host, port            where /health and /metrics are polled; the state file's name
  shutdown-timeout      the drain: the deadline is computed from it; never overridden
  ssl-certfile/-keyfile the server speaks HTTPS: poll with https (local, unverified)
  ssl-cert-reqs         2 (a client certificate required): the supervisor has none -> refused
  uds                   no TCP port to poll -> refused
  headless, grpc, api-server-count < 1
                        no HTTP API server, so readiness can never be observed -> refused
  disable-log-stats     vLLM then exports no vllm:* metrics: no request counts from /metrics
  api-server-count > 1  fine: the servers share the port, /metrics is aggregated over processes
  root-path             fine: it only strips a proxy prefix, /health still answers at /health
  tensor-/pipeline-parallel-size
                        workers: the CPU plan's threads and the /dev/shm vLLM's queues need
  revision, download-dir
                        what `prefetch` downloads and where, the download progress logged
  max-model-len, kv-cache-dtype, hf-overrides, hf-config-path, kv-cache-memory-bytes
                        the KV cache one request of the whole context needs (context.py);
                        the last three: not known before vLLM starts, so not checked
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field

from .errors import ConfigError, parse_whole, shown
from .timing import MAX_DRAIN_S

# Bounds on inputs: a value past them is refused (exit 64) before anything starts.
MAX_CONFIG_BYTES = 1 << 20  # a --config file is a few vLLM flags, never megabytes
MAX_PARALLEL = 1024  # each of the tensor, pipeline and data parallel sizes, and their product

# The flags read here, by vLLM dest: option strings and whether the flag takes a value.
FLAGS = {
    "model": (("--model",), True),
    "host": (("--host",), True),
    "port": (("--port",), True),
    "uds": (("--uds",), True),
    "shutdown_timeout": (("--shutdown-timeout",), True),
    "headless": (("--headless",), False),
    "grpc": (("--grpc",), False),
    "api_server_count": (("--api-server-count", "-asc"), True),
    "disable_log_stats": (("--disable-log-stats",), False),
    "ssl_certfile": (("--ssl-certfile",), True),
    "ssl_keyfile": (("--ssl-keyfile",), True),
    "ssl_cert_reqs": (("--ssl-cert-reqs",), True),
    "tensor_parallel_size": (("--tensor-parallel-size", "-tp"), True),
    "pipeline_parallel_size": (("--pipeline-parallel-size", "-pp"), True),
    "data_parallel_size": (("--data-parallel-size", "-dp"), True),
    "revision": (("--revision",), True),
    "download_dir": (("--download-dir",), True),
    "max_model_len": (("--max-model-len",), True),
    "kv_cache_dtype": (("--kv-cache-dtype",), True),
    "dtype": (("--dtype",), True),
    "hf_overrides": (("--hf-overrides",), True),
    "hf_config_path": (("--hf-config-path",), True),
    "kv_cache_memory_bytes": (("--kv-cache-memory-bytes",), True),
}
INTS = (
    "port",
    "shutdown_timeout",
    "api_server_count",
    "ssl_cert_reqs",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
)
# dest -> (lowest, highest) accepted; None: unbounded on that side (vLLM's own checks, or ours
# with a message of their own: --api-server-count < 1 has no HTTP server).
BOUNDS = {
    "port": (1, 65535),
    "shutdown_timeout": (None, MAX_DRAIN_S),  # < 0: settings.drain_seconds says so
    "api_server_count": (None, MAX_PARALLEL),
    "ssl_cert_reqs": (0, 2),
    "tensor_parallel_size": (None, MAX_PARALLEL),  # < 1: resources.parallel says so
    "pipeline_parallel_size": (None, MAX_PARALLEL),
    "data_parallel_size": (None, MAX_PARALLEL),
}
# Read only for being given (context.py: the KV cache cannot be known before vLLM starts).
PRESENCE_ONLY = ("hf_overrides", "hf_config_path", "kv_cache_memory_bytes")
# Every flag of `vllm serve` that carries a secret (vLLM 0.27.1 / 0.32.0: the hub token, the API
# keys), and the environment variable vLLM reads instead. Never on the command line: every
# process of the host can read /proc/PID/cmdline; refused in one line that names the variable
# and never echoes the value. (A `--config` file may hold them: it is not in /proc.)
SECRET_FLAGS = {"--hf-token": "HF_TOKEN", "--api-key": "VLLM_API_KEY"}
# The shortest abbreviation argparse would take for each: `--hf-` is also --hf-overrides,
# `--api-` also --api-server-count.
SECRET_PREFIXES = {"--hf-token": "--hf-t", "--api-key": "--api-k"}
OPTION_TO_DEST = {opt: dest for dest, (opts, _) in FLAGS.items() for opt in opts}
MODEL_FLAG = re.compile(r"^--model(=.+|$)")


@dataclass
class VllmArgs:
    """The effective values; None where nobody gave one (vLLM's default applies)."""

    model: str | None = None
    host: str | None = None
    port: int | None = None
    uds: str | None = None
    shutdown_timeout: int | None = None
    headless: bool = False
    grpc: bool = False
    api_server_count: int | None = None
    disable_log_stats: bool = False
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_cert_reqs: int | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    data_parallel_size: int | None = None
    revision: str | None = None
    download_dir: str | None = None
    max_model_len: str | None = None  # as given: vLLM reads 4k, 4K, auto (context.py)
    kv_cache_dtype: str | None = None
    dtype: str | None = None
    hf_overrides: str | None = None
    hf_config_path: str | None = None
    kv_cache_memory_bytes: str | None = None
    config: str | None = None
    # dest -> "the command line" or "the config file FILE": said in logs and errors
    source: dict[str, str] = field(default_factory=dict)


def _cfg(path: str) -> str:
    return f"--config {shown(path, 200, quote=False)}"


def read_config_bytes(path: str) -> bytes:
    """The file's bytes: a regular file (not a FIFO, a device or a directory, which could block
    or never end) of at most MAX_CONFIG_BYTES, opened without blocking. Raises ConfigError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"{_cfg(path)}: cannot read it: {e.strerror or e}") from None
    except ValueError as e:  # an embedded NUL
        raise ConfigError(f"{_cfg(path)}: cannot read it: {e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise ConfigError(f"{_cfg(path)}: is {kind}")
        if st.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"{_cfg(path)}: {st.st_size} bytes, more than the "
                f"{MAX_CONFIG_BYTES} a config file may have"
            )
        chunks, size = [], 0
        while size <= MAX_CONFIG_BYTES:  # a file that grows while read stops at the limit too
            chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise ConfigError(f"{_cfg(path)}: cannot read it: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{_cfg(path)}: more than the {MAX_CONFIG_BYTES} bytes a config file may have"
        )
    return b"".join(chunks)


def _yaml_loader():
    """yaml.SafeLoader without aliases: `*name` can expand a small file into billions of
    nodes (billion laughs), and a vLLM config file never needs one. Every refusal is a
    ConstructorError at its line, a value the loader cannot build too: SafeConstructor raises
    plain Python errors for some (an impossible date, a bad tagged float or int, an integer
    past Python's digit limit)."""
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"alias *{event.anchor} (YAML aliases are refused)",
                    event.start_mark,
                )
            return super().compose_node(parent, index)

        def construct_object(self, node, deep=False):
            try:
                return super().construct_object(node, deep)
            except (ValueError, TypeError, AttributeError, LookupError, ArithmeticError):
                value = shown(node.value) if isinstance(node.value, str) else "the value"
                tag = node.tag.rsplit(":", 1)[-1]
                raise yaml.constructor.ConstructorError(
                    None, None, f"{value} is not a valid {tag}", node.start_mark
                ) from None

    return NoAliasLoader


def load_config_file(path: str) -> list[str]:
    """vLLM's load_config_file: the YAML file as flags. Raises ConfigError where vLLM fails, and
    for what would make the supervisor block, blow up or misread a value (see read_config_bytes,
    _yaml_loader; a list or a mapping as the value of a flag it reads)."""
    if path.split(".")[-1] not in ("yaml", "yml"):
        raise ConfigError(f"{_cfg(path)}: vLLM reads only .yaml/.yml config files")
    raw = read_config_bytes(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{_cfg(path)}: not UTF-8 text (byte {e.start})") from None
    import yaml  # only when there is a config file: the common start stays import-free

    try:
        config = yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" (line {where.line + 1})" if where else ""
        problem = getattr(e, "problem", None)
        building = isinstance(e, yaml.constructor.ConstructorError) and problem
        why = f": {shown(problem, 100, quote=False)}" if building else ""
        raise ConfigError(f"{_cfg(path)}: not valid YAML{at}{why}") from None
    except RecursionError:
        raise ConfigError(f"{_cfg(path)}: nested too deeply") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{_cfg(path)}: must be a YAML mapping of vLLM flags")
    flags: list[str] = []
    for key, value in config.items():
        key = str(key)
        dest = OPTION_TO_DEST.get(_normalise("--" + key).split("=", 1)[0])
        if dest is not None:
            _check_file_value(path, key, dest, value)
        if isinstance(value, bool):
            # vLLM 0.32 turns false into --no-KEY where such a flag exists; none of ours has one,
            # and for ours false is the default: nothing to add.
            if value:
                flags.append("--" + key)
        elif isinstance(value, list):
            if value:
                flags += ["--" + key, *map(str, value)]
        elif isinstance(value, dict):
            import json

            try:
                flags += ["--" + key, json.dumps(value, default=str)]
            except (RecursionError, ValueError):
                raise ConfigError(f"{_cfg(path)}: {key}: nested too deeply") from None
            except TypeError:  # a key JSON has no form for (a date): vLLM's json.dumps fails too
                raise ConfigError(f"{_cfg(path)}: {key}: a key JSON cannot hold") from None
        else:
            flags += ["--" + key, str(value)]
    return flags


def _check_file_value(path: str, key: str, dest: str, value) -> None:
    """A flag the supervisor reads has one scalar value in the file: `port: [1, 2]` would be
    `--port 1 2` (vLLM's argparse error, or port 1 with a stray `2`). Flags read only for being
    there take any value vLLM takes (--hf-overrides: a mapping)."""
    if dest in PRESENCE_ONLY:
        return
    takes_value = FLAGS[dest][1]
    if not takes_value:
        if not isinstance(value, bool):
            raise ConfigError(f"{_cfg(path)}: {key} must be true or false, not {shown(value)}")
    elif isinstance(value, (list, dict, bool)) or value is None:
        raise ConfigError(f"{_cfg(path)}: {key} must be one value, not {shown(value)}")
    elif dest in INTS and not (type(value) is int or isinstance(value, str)):
        raise ConfigError(f"{_cfg(path)}: {key} must be a whole number, not {shown(value)}")


def _parse_int(name: str, dest: str, value: str, origin: str, bounds: bool = True) -> int:
    """int(value) as argparse's type=int, refusing what no setting could mean (> MAX_DIGITS
    digits: Python itself refuses over 4300) and values outside BOUNDS. Raises ConfigError."""
    lo, hi = BOUNDS.get(dest, (None, None)) if bounds else (None, None)
    try:
        return parse_whole(name, value, lo, hi, signed=True)
    except ConfigError as e:
        raise ConfigError(f"{e} (in {origin})") from None


def _refuse_secret(raw: str) -> None:
    """A secret flag (SECRET_FLAGS: `--hf-token X`, `--api-key=X`, or an abbreviation of one) on
    the command line."""
    name = _normalise(raw).split("=", 1)[0]
    for flag, env in SECRET_FLAGS.items():
        if name.startswith(SECRET_PREFIXES[flag]) and flag.startswith(name):  # as argparse takes
            raise ConfigError(
                f"{flag} on the command line: every process can read it in /proc/PID/cmdline; "
                f"set the {env} environment variable instead"
            )


def _normalise(arg: str) -> str:
    """`--a_b=V` -> `--a-b=V`: vLLM swaps underscores for dashes in the name (up to a dot)."""
    if not arg.startswith("--"):
        return arg
    name, eq, value = arg.partition("=")
    head, dot, tail = name[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail + eq + value


def _abbreviates(arg: str) -> str | None:
    """The flag of ours that `--abbrev` would select through argparse's prefix matching."""
    name = arg.split("=", 1)[0]
    if not name.startswith("--") or name in OPTION_TO_DEST or len(name) < 3:
        return None
    hits = [opt for opt in OPTION_TO_DEST if opt.startswith("--") and opt.startswith(name)]
    return hits[0] if hits else None


def _model_first(argv: list[str]) -> list[str]:
    """argv with the first --model moved to the front as the positional model (vLLM does this
    first)."""
    args = list(argv)
    first_model = next((i for i, a in enumerate(args) if MODEL_FLAG.match(a)), None)
    if first_model is None:
        return args
    if args[first_model] == "--model":
        if first_model + 1 >= len(args):
            raise ConfigError("--model needs a value")
        tag, rest = args[first_model + 1], first_model + 2
    else:
        tag, rest = args[first_model].removeprefix("--model="), first_model + 1
    if argv and not argv[0].startswith("-") and first_model > 0:
        raise ConfigError(
            f"model given twice: {shown(argv[0], 200, quote=False)} and "
            f"--model {shown(tag, 200, quote=False)}"
        )
    return [tag, *args[:first_model], *args[rest:]]


def _splice_config(args: list[str], model_in_cli: bool) -> tuple[list[str], str | None, range]:
    """(args, config path, the indices that came from the file): the config file's flags go
    right after the model, before the command line's."""
    for a in args:
        if a.startswith("--config="):
            raise ConfigError(
                f"{a}: vLLM ignores the file when it is written this way; write --config FILE"
            )
    if "--config" not in args:
        return args, None, range(0)
    if args.count("--config") > 1:
        raise ConfigError("--config given more than once (vLLM reads one config file)")
    at = args.index("--config")
    if at == len(args) - 1:
        raise ConfigError("--config needs a file")
    config_path = args[at + 1]
    from_file = load_config_file(config_path)
    rest = args[:at] + args[at + 2 :]
    head = 1 if model_in_cli else 0
    return rest[:head] + from_file + rest[head:], config_path, range(head, head + len(from_file))


def _scan(args: list[str], found: VllmArgs, model_in_cli: bool, from_file: range, bounds: bool):
    """Set in `found` each flag of FLAGS that args give (the last one wins), and its source."""
    i = 1 if model_in_cli else 0
    while i < len(args):
        raw = args[i]
        arg = _normalise(raw)
        origin = f"the config file {found.config}" if i in from_file else "the command line"
        i += 1
        if (full := _abbreviates(arg)) is not None:
            raise ConfigError(
                f"{raw}: write {full} in full (the supervisor reads that flag and does not "
                "guess argparse abbreviations)"
            )
        name, eq, value = arg.partition("=")
        dest = OPTION_TO_DEST.get(name)
        if dest is None:
            continue
        takes_value = FLAGS[dest][1]
        if takes_value and not eq:
            if i >= len(args) or (args[i].startswith("-") and not _is_number(args[i])):
                raise ConfigError(f"{name} needs a value (in {origin})")
            value = args[i]
            i += 1
        elif not takes_value:
            if eq:
                raise ConfigError(f"{name} takes no value (in {origin})")
            value = True
        if dest == "model" and model_in_cli:
            continue  # the positional model wins: `vllm serve` sets args.model = model_tag
        if dest in INTS:
            value = _parse_int(name, dest, value, origin, bounds)
        setattr(found, dest, value)
        found.source[dest] = origin


def resolve(argv: list[str], bounds: bool = True) -> VllmArgs:
    """What `vllm serve ARGV` would use for the settings in FLAGS. Raises ConfigError, also for
    values outside BOUNDS (and more than MAX_PARALLEL workers) unless bounds=False: vLLM's
    own parser takes those, and fails later or never (a port of -5, a drain of 10**20 s)."""
    for a in argv:
        _refuse_secret(a)
    args = _model_first(argv)
    model_in_cli = bool(args) and not args[0].startswith("-")
    args, config_path, from_file = _splice_config(args, model_in_cli)
    found = VllmArgs(config=config_path, source={})
    if model_in_cli:
        found.model = args[0]
        found.source["model"] = "the command line"
    _scan(args, found, model_in_cli, from_file, bounds)
    if bounds and found.model is not None and not found.model.strip():
        raise ConfigError(f"the model name is empty (in {found.source['model']})")
    workers = (
        (found.tensor_parallel_size or 1)
        * (found.pipeline_parallel_size or 1)
        * (found.data_parallel_size or 1)
    )
    if bounds and abs(workers) > MAX_PARALLEL:
        raise ConfigError(
            "--tensor-parallel-size x --pipeline-parallel-size x --data-parallel-size = "
            f"{workers} workers, more than {MAX_PARALLEL}"
        )
    return found


def _is_number(arg: str) -> bool:
    """argparse takes `-5` as a value, not an option, when no option looks like a number."""
    return re.fullmatch(r"-\d+$|-\d*\.\d+", arg) is not None
