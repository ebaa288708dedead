"""`entrypoint.py probe ready|live [--port N]`: the exec probe (compose healthcheck, Kubernetes exec
probes), a process of its own. It reads the state file the supervisor's loop publishes, checks it
is one a supervisor wrote, and asks vLLM's /health where the decision (probes.decide) needs it.
"""

from __future__ import annotations

import ipaddress
import os
import pathlib
import socket
import stat
import sys
import urllib.parse

from . import paths, settings
from .errors import ConfigError, load_json, shown
from .observe import healthy
from .probes import KINDS, PROBE_TIMEOUT_S, decide
from .state import State

STATES = frozenset(s.value for s in State)


def read_state(path: pathlib.Path) -> bytes:
    """The state file's bytes; OSError if there is none. Not a FIFO or a device planted there
    (which could block the probe), nor a symlink (the supervisor never writes one), and no more
    than a state file ever holds."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


def parse_state(raw: bytes) -> dict:
    """What `Supervisor.write_state` wrote, checked: the probe signals its pid and asks its url,
    so a file anyone else wrote must not make it signal a process group or ask another host.
    Raises ValueError saying what is wrong."""
    try:
        data = load_json(raw)
    except ValueError as e:  # UnicodeDecodeError included
        raise ValueError("not JSON" if "nested" not in str(e) else f"JSON {e}") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    pid = data.get("pid")
    # bool is an int; 0 and -1 would make kill(2) signal a group or every process
    if type(pid) is not int or not 0 < pid < 2**31:
        raise ValueError(f"pid {pid!r} is not a process id")
    if data.get("state") not in STATES:
        raise ValueError(f"unknown state {data.get('state')!r}")
    url = data.get("url")
    if url:
        why = url_problem(url)
        if why:
            raise ValueError(why)
    return data


def url_problem(url) -> str | None:
    """Why `url` is not one the supervisor would ask vLLM on (http(s) on this host), or None.
    Printable ASCII without blanks only: http.client raises InvalidURL on a control character."""
    if not isinstance(url, str) or not url.isascii() or not url.isprintable() or " " in url:
        return f"url {shown(url)} is not a URL"
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError on a bad port)
    except (TypeError, ValueError, AttributeError):
        return f"url {url!r} is not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"url {url!r} is not an http(s) URL"
    if not is_local_host(parts.hostname):
        return f"url {url!r} is not on this host (loopback or an address of this host only)"
    return None


def is_local_host(host: str) -> bool:
    """Loopback, or an address of this host (vLLM's own --host): one a socket can bind."""
    if host.lower() == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name would need a DNS look-up, whose answer anyone may control
    if addr.is_loopback:
        return True
    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
        return True
    except OSError:
        return False


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def flag_value(flags: list[str], name: str) -> str | None:
    """Value of `--name V` or `--name=V` among the probe's own arguments (last one wins, as
    argparse does)."""
    found = None
    for i, arg in enumerate(flags):
        if arg == name:
            if i + 1 >= len(flags):
                raise ConfigError(f"{name} needs a value")
            found = flags[i + 1]
        elif arg.startswith(name + "="):
            found = arg.split("=", 1)[1]
    return found


def probe(args: list[str], env=os.environ) -> int:
    """`entrypoint.py probe ready|live [--port N]`: exit 0 or 1."""
    if not args or args[0] not in KINDS:
        raise ConfigError("probe takes `ready` or `live`")
    port_s = flag_value(args[1:], "--port")
    if port_s is not None:
        port = settings.parse_port("--port", port_s)
    else:
        port = settings.parse_port(
            "INTEL_VLLM_PORT", env.get("INTEL_VLLM_PORT", str(settings.DEFAULT_PORT))
        )
    path = paths.state_file(port, env)
    if path.parent == paths.private_dir() and not paths.is_private_dir(path.parent):
        print(
            f"not {args[0]}: {path.parent} is not this user's private directory (another "
            "user's, a symlink, or group/other may write it): its state file is not read",
            file=sys.stderr,
        )
        return 1
    try:
        data = parse_state(read_state(path))
    except OSError:
        data = None
    except ValueError as e:  # not what a supervisor writes: say so, and ask nobody
        print(f"not {args[0]}: state file {path}: {e}", file=sys.stderr)
        return 1
    if data is None or not process_exists(data["pid"]):
        print(f"not {args[0]}: no running supervisor for port {port}")
        return 1
    state = data["state"]
    ok_health = healthy(data.get("url") or f"http://127.0.0.1:{port}", PROBE_TIMEOUT_S)
    ok = decide(args[0], state, ok_health)
    print(
        f"{'' if ok else 'not '}{args[0]}: state {state}, "
        f"/health {'ok' if ok_health else 'failing'}"
    )
    return 0 if ok else 1
