"""What entrypoint.py runs: `probe` answered by the supervisor's probe port when there is one (a
healthcheck every few seconds should cost a socket, not the supervisor's imports), everything
else by cli.main."""

from __future__ import annotations

import os


def probe_over_http(kind: str, port: int) -> int:
    """GET /ready or /live from the supervisor's probe server: exit 0 on 200, else 1."""
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(f"GET /{kind} HTTP/1.0\r\nHost: localhost\r\n\r\n".encode())
            reply = s.makefile("rb").read().decode("utf-8", "replace")
        head, _, body = reply.partition("\r\n\r\n")
        ok = head.split()[1] == "200"
        print(body.strip())
    except (OSError, IndexError):
        print(f"not {kind}: no supervisor answers on probe port {port}")
        return 1
    return 0 if ok else 1


def _interrupted(sig, frame) -> None:
    """SIGINT (Ctrl-C) in a subcommand other than `serve`: one line and exit 130, wherever the
    subcommand was (a KeyboardInterrupt would print a traceback from whatever it was doing)."""
    os.write(2, b"entrypoint.py: interrupted (SIGINT)\n")
    os._exit(130)


def main(argv: list[str]) -> int:
    if not argv or argv[0] == "serve":
        from .signals import hold

        hold()  # first: a stop from now on is kept pending, never dropped (signals.py)
    else:
        import signal

        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not when ignored
            signal.signal(signal.SIGINT, _interrupted)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # entrypoint.py held it
    probe_port = os.environ.get("INTEL_VLLM_PROBE_PORT", "")
    if (
        len(argv) == 2
        and argv[0] == "probe"
        and argv[1] in ("ready", "live")
        and probe_port.isascii()  # '²'.isdigit() too, and int('²') raises
        and probe_port.isdigit()
        and 0 < int(probe_port[:6]) < 65536  # else cli.main refuses it in one line (exit 64)
    ):
        return probe_over_http(argv[1], int(probe_port))
    from .cli import main as cli_main

    return cli_main(argv)
