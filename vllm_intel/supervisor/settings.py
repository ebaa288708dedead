"""What `entrypoint.py serve` is asked to do, parsed and checked before anything starts: the
device, the drain, the ports, the patch names and vLLM's own flags (read through vllm_args, as
vLLM reads them). Every refusal is a ConfigError: one line, exit 64.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

from .errors import ConfigError, parse_whole, shown
from .log import FORMAT_ENV, FORMATS
from .paths import BUILTIN_MODELS, check_model_path
from .timing import DEFAULT_DRAIN_S, MARGIN_S, MAX_DRAIN_S, XPU_MIN_DRAIN_S
from .vllm_args import VllmArgs, resolve

DEFAULT_PORT = 8000


def device(env=os.environ) -> str:
    dev = env.get("INTEL_VLLM_DEVICE") or env.get("VLLM_TARGET_DEVICE") or "cpu"
    if dev not in ("cpu", "xpu"):
        raise ConfigError(f"INTEL_VLLM_DEVICE must be cpu or xpu, not {shown(dev)}")
    return dev


def parse_seconds(name: str, value: str | None, maximum: int = MAX_DRAIN_S) -> int:
    """Whole seconds, 0..maximum (ASCII digits, surrounding blanks allowed). Raises ConfigError."""
    return parse_whole(
        name, value or "", 0, maximum, what="a whole number of seconds >= 0", unit=" seconds"
    )


def parse_port(name: str, value: str | None) -> int:
    """A TCP port number, 1..65535 (ASCII digits). Raises ConfigError."""
    try:
        return parse_whole(name, value or "", 1, 65535, what="a port number (1-65535)")
    except ConfigError:
        raise ConfigError(f"{name} must be a port number (1-65535), not {shown(value)}") from None


def check_port_number(name: str, port: int) -> int:
    """An int port from vLLM's flags or its config file: 1..65535. Raises ConfigError."""
    if type(port) is not int or not 1 <= port <= 65535:
        raise ConfigError(f"{name} must be between 1 and 65535, not {shown(port)}")
    return port


def drain_seconds(
    flags: list[str] | None = None, env=os.environ, user: int | None = None
) -> tuple[int, list[str]]:
    """DRAIN and the notes explaining how it was chosen. user: the --shutdown-timeout vLLM
    resolved from the command line or its config file (None: given nowhere)."""
    notes = []
    if user is None and flags:
        user = resolve(flags).shutdown_timeout
    if user is not None:
        if user < 0:
            raise ConfigError(f"--shutdown-timeout must be >= 0, not {user}")
        if user > MAX_DRAIN_S:
            raise ConfigError(
                f"--shutdown-timeout must be at most {MAX_DRAIN_S} seconds, not {user}"
            )
        drain = user
    else:
        drain = parse_seconds(
            "INTEL_VLLM_DRAIN_TIMEOUT", env.get("INTEL_VLLM_DRAIN_TIMEOUT", str(DEFAULT_DRAIN_S))
        )
    if device(env) == "xpu" and drain < XPU_MIN_DRAIN_S:
        notes.append(
            f"drain raised from {drain} s to {XPU_MIN_DRAIN_S} s: XPU workers need it "
            "to release Level Zero / oneCCL resources"
        )
        drain = XPU_MIN_DRAIN_S
    return drain, notes


def probe_port(env=os.environ, vllm_port: int | None = None) -> int | None:
    """INTEL_VLLM_PROBE_PORT for `serve`: None when unset, else a port other than vLLM's."""
    value = env.get("INTEL_VLLM_PROBE_PORT")
    if not value:
        return None
    port = parse_port("INTEL_VLLM_PROBE_PORT", value)
    if port == vllm_port:
        raise ConfigError(
            f"INTEL_VLLM_PROBE_PORT {port} is vLLM's own --port: choose another port for the probes"
        )
    return port


def check_patches(env=os.environ) -> None:
    """INTEL_VLLM_PATCHES / INTEL_VLLM_PATCHES_DISABLE name known patches. Raises ConfigError:
    vLLM's plugin would only log the unknown names once the model is loading. The names are
    read from the patches' sources: importing the patches would import torch."""
    from vllm_intel.patches import named_in, patch_names

    known = patch_names()
    for var, names in named_in(env).items():
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ConfigError(
                f"{var}: unknown patch name(s) {shown(','.join(unknown), 80, quote=False)}; "
                f"known: {','.join(sorted(known))}"
            )


@dataclass(frozen=True)
class ServeConfig:
    """`serve`'s inputs, parsed and checked once (serve_config), then only read."""

    argv: tuple[str, ...]
    port: int
    drain: int
    notes: tuple[str, ...]
    model: str | None = None  # positional, --model or the config file's (the CPU plan's weights)
    flags: tuple[str, ...] = ()  # the vLLM flags as passed on
    url: str = ""  # where the supervisor reads vLLM's /health and /metrics
    count_requests: bool = True  # vLLM exports its vllm:* metrics (no --disable-log-stats)
    host: str | None = None  # vLLM's --host (None: every interface)
    metrics_linger: int = 0  # seconds the probe port's /metrics stays up after vLLM's exit
    vargs: VllmArgs | None = None  # the vLLM settings, resolved once from the flags as given

    def __post_init__(self):
        for name in ("argv", "notes", "flags"):  # sequences as given, kept as tuples
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "url", self.url or f"http://127.0.0.1:{self.port}")


def poll_url(host: str | None, port: int, tls: bool) -> str:
    """The address the supervisor asks: vLLM's own host, loopback when it listens everywhere."""
    if host in (None, "", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"{'https' if tls else 'http'}://{host}:{port}"


def strip_flag(flags: list[str], name: str) -> list[str]:
    """flags without `name V` / `name=V` (underscore spellings included)."""
    out, skip = [], False
    for f in flags:
        if skip:
            skip = False
            continue
        key = f.split("=", 1)[0].replace("_", "-")
        if key == name:
            skip = "=" not in f
            continue
        out.append(f)
    return out


def refuse_unreachable(vargs: VllmArgs) -> None:
    """vLLM settings under which the supervisor could never see vLLM over HTTP: ConfigError."""
    if vargs.uds:
        raise ConfigError(
            f"--uds {vargs.uds} (in {vargs.source['uds']}): vLLM would listen on a unix socket "
            "only; the supervisor's readiness checks and probes need its TCP port"
        )
    no_http = (
        "--headless"
        if vargs.headless
        else "--grpc"
        if vargs.grpc
        else f"--api-server-count {vargs.api_server_count}"
        if vargs.api_server_count is not None and vargs.api_server_count < 1
        else None
    )
    if no_http:
        raise ConfigError(
            f"{no_http}: vLLM would start no HTTP API server, so the supervisor could never see "
            "it ready; run `vllm serve` directly for that"
        )
    if vargs.ssl_cert_reqs == 2:  # ssl.CERT_REQUIRED
        raise ConfigError(
            "--ssl-cert-reqs 2: vLLM would demand a client certificate, which the supervisor's "
            "own /health and /metrics requests cannot present"
        )


def builtin_model(env=os.environ) -> str:
    """The model served when none is named anywhere: INTEL_VLLM_MODEL, else the built-in one."""
    model = env.get("INTEL_VLLM_MODEL") or next(
        (str(p) for p in BUILTIN_MODELS if (p / "config.json").exists()), None
    )
    if model is None:
        raise ConfigError(
            "no model given and the built-in model is missing "
            "(set INTEL_VLLM_MODEL, pass a model, or run `make setup`)"
        )
    return model


def with_drain(flags: list[str], vargs: VllmArgs, env) -> tuple[list[str], int, list[str]]:
    """(flags, drain, notes): the flags vLLM gets so that its drain is DRAIN."""
    drain, notes = drain_seconds(env=env, user=vargs.shutdown_timeout)
    if vargs.shutdown_timeout is not None:
        notes.insert(
            0,
            f"drain {vargs.shutdown_timeout} s: --shutdown-timeout from "
            f"{vargs.source['shutdown_timeout']}",
        )
    if vargs.shutdown_timeout is None or drain != vargs.shutdown_timeout:
        # Only when the user gave no value anywhere, or on XPU below the minimum. The command
        # line beats the config file and its last flag wins, so the appended flag is the one
        # vLLM uses; the user's own command-line copies go, not to leave two values around.
        flags = strip_flag(flags, "--shutdown-timeout") + ["--shutdown-timeout", str(drain)]
    return flags, drain, notes


def serve_config(args: list[str], env=os.environ) -> ServeConfig:
    """`vllm serve` argv, port and drain for `entrypoint.py serve ARGS`. Raises ConfigError.

    Every vLLM setting read here comes from vllm_args.resolve: the command line, then the file
    of `--config FILE`, then vLLM's default, as vLLM itself resolves them."""
    if env.get(FORMAT_ENV, "text") not in FORMATS:
        raise ConfigError(
            f"{FORMAT_ENV} must be one of {', '.join(FORMATS)}, not {shown(env.get(FORMAT_ENV))}"
        )
    vargs = resolve(list(args))
    refuse_unreachable(vargs)
    model = None if vargs.model is not None else builtin_model(env)
    name = vargs.model or model
    check_model_path(name)
    port = check_port_number("--port", DEFAULT_PORT if vargs.port is None else vargs.port)
    if vargs.host and not re.fullmatch(r"[A-Za-z0-9._:%-]{1,253}", vargs.host):
        raise ConfigError(
            f"--host {shown(vargs.host)} (in {vargs.source['host']}): not a host name or IP address"
        )
    flags, drain, notes = with_drain(list(args), vargs, env)
    # vLLM's CLI, run by vllm_intel.in_vllm.process_exit: exits without interpreter finalization where
    # the fast-exit patch enables it (see there), otherwise exactly as `-m vllm.entrypoints.cli.main`.
    argv = [
        sys.executable,
        "-m",
        "vllm_intel.in_vllm.process_exit",
        "vllm.entrypoints.cli.main",
        "serve",
    ]
    return ServeConfig(
        argv + ([model] if model else []) + flags,
        port,
        drain,
        notes,
        model=name,
        flags=flags,
        url=poll_url(vargs.host, port, tls=vargs.ssl_certfile is not None),
        count_requests=not vargs.disable_log_stats,
        host=vargs.host,
        metrics_linger=parse_seconds(
            "INTEL_VLLM_METRICS_LINGER_S", env.get("INTEL_VLLM_METRICS_LINGER_S") or "0", MARGIN_S
        ),
        vargs=vargs,
    )


def check_port(host: str | None, port: int) -> None:
    """Preflight: vLLM's port is free. Else vLLM fails to bind only after loading the model, and
    meanwhile whatever holds the port answers the supervisor's /health as if vLLM were ready."""
    import socket

    # vLLM's own bind (create_server_socket, vllm/entrypoints/launchers/launcher.py): its --host
    # or every IPv4 interface, SO_REUSEADDR (a socket in TIME_WAIT does not block it).
    addr = host or ""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((addr, port))
        except (TypeError, ValueError, UnicodeError) as e:  # a host no socket can name
            raise ConfigError(f"cannot listen on {shown(host)}:{port}: {e}") from None
        except OSError as e:
            where = f"{host}:{port}" if host else f"port {port}"
            raise ConfigError(
                f"cannot listen on {where}: {e.strerror or e} (another server holds it? "
                "choose another with --port)"
            ) from None
