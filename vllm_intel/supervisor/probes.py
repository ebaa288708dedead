"""Readiness and liveness: one decision, asked two ways.

`entrypoint.py probe ready|live` (exec probes, compose healthcheck) reads the state file the loop
publishes; with INTEL_VLLM_PROBE_PORT set, the supervisor also answers `GET /ready` and
`GET /live` itself (HTTP probes: no Python interpreter started per probe).
"""

from __future__ import annotations

import http.server
import json
import os
import threading
from collections.abc import Callable

from . import settings
from .observe import healthy
from .settings import PROBE_TIMEOUT_S, ConfigError, State

KINDS = ("ready", "live")


def decide(kind: str, state: str, vllm_healthy: bool) -> bool:
    """ready: serving and /health answers (fails the moment a drain starts); live: still loading,
    or the server answers (holds while draining)."""
    if kind == "ready":
        return state == State.SERVING.value and vllm_healthy
    return state == State.STARTING.value or (
        state in (State.SERVING.value, State.DRAINING.value) and vllm_healthy
    )


def probe(args: list[str], env=os.environ) -> int:
    """`entrypoint.py probe ready|live [--port N]`: exit 0 or 1."""
    if not args or args[0] not in KINDS:
        raise ConfigError("probe takes `ready` or `live`")
    port_s = settings.flag_value(args[1:], "--port")
    port = (
        settings.parse_seconds("--port", port_s)
        if port_s
        else int(env.get("INTEL_VLLM_PORT", settings.DEFAULT_PORT))
    )
    try:
        data = json.loads(settings.state_file(port, env).read_text())
        os.kill(int(data["pid"]), 0)
    except (OSError, ValueError, KeyError):
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


def serve_http(
    probe_port: int, vllm_url: str, state: Callable[[], State]
) -> http.server.HTTPServer:
    """Answer GET /ready and /live on probe_port from a daemon thread; returns the server."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            kind = self.path.strip("/").split("?")[0]
            if kind not in KINDS:
                self.send_error(404)
                return
            current = state().value
            # Ask vLLM only when the answer depends on it (never once readiness is lost).
            ok = decide(kind, current, False) or (
                decide(kind, current, True) and healthy(vllm_url, PROBE_TIMEOUT_S)
            )
            body = f"{'' if ok else 'not '}{kind}: state {current}\n".encode()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass  # a probe every few seconds would drown vLLM's own log

    server = http.server.ThreadingHTTPServer(("0.0.0.0", probe_port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="probes", daemon=True).start()
    return server
