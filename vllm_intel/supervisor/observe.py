"""Observation of vLLM over HTTP (/health, /metrics), in a thread of its own.

The loop only reads what this thread last saw: a slow or hung vLLM HTTP server can never delay
a signal or the deadline.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.error
import urllib.request

from .timing import HEALTH_TIMEOUT_S, METRICS_TIMEOUT_S, TICK_S


def direct_opener(url: str) -> urllib.request.OpenerDirector:
    """An opener that asks `url` itself. Invariant: every HTTP request the supervisor and `probe`
    make goes to this host's vLLM or supervisor, so none goes through a proxy, whatever
    http_proxy / no_proxy say (urlopen would honour them: a proxy could answer for vLLM)."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if url.startswith("https:"):
        import ssl

        # Our own server, reached by loopback or its bind address: its certificate names the
        # public host, not that address, so only the encryption is used, not the verification.
        handlers.append(urllib.request.HTTPSHandler(context=ssl._create_unverified_context()))
    return urllib.request.build_opener(*handlers)


def http_get(url: str, path: str, timeout: float) -> tuple[int, str]:
    """(status, body) of GET url/path; (0, error) if it cannot connect. url: the server's base
    address (settings.poll_url)."""
    try:
        with direct_opener(url).open(url + path, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except (OSError, ValueError) as e:
        return 0, str(e)


def healthy(url: str, timeout: float = HEALTH_TIMEOUT_S) -> bool:
    return http_get(url, "/health", timeout)[0] == 200


COUNTED = re.compile(r"vllm:(num_requests_running|num_requests_waiting|request_success)")


def parse_counts(text: str) -> dict[str, float]:
    """Requests running, waiting, finished and aborted, from vLLM's Prometheus exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    counts = {"running": 0.0, "waiting": 0.0, "finished": 0.0, "aborted": 0.0}
    # Only the lines of the families read here: whatever else vLLM exposes (a value or metric type
    # the parser rejects) must not make these counts unreadable.
    ours = "\n".join(line for line in text.splitlines() if COUNTED.search(line)) + "\n"
    for family in text_string_to_metric_families(ours):
        for sample in family.samples:
            if sample.name == "vllm:num_requests_running":
                counts["running"] += sample.value
            elif sample.name == "vllm:num_requests_waiting":
                counts["waiting"] += sample.value
            elif sample.name == "vllm:request_success_total":
                key = "aborted" if sample.labels.get("finished_reason") == "abort" else "finished"
                counts[key] += sample.value
    return counts


def request_counts(url: str) -> dict[str, float] | None:
    """In-flight and finished counts from vLLM's /metrics (None if unreachable or unparsable)."""
    status, body = http_get(url, "/metrics", METRICS_TIMEOUT_S)
    if status != 200:
        return None
    try:
        return parse_counts(body)
    except ValueError:
        return None


class Observer(threading.Thread):
    """Polls /health until vLLM is ready; from the drain on, polls /metrics for the exit log."""

    def __init__(self, url: str, count_requests: bool = True):
        super().__init__(name="observer", daemon=True)
        self.url = url
        # With --disable-log-stats vLLM exports no vllm:* metrics: counts would read 0, a lie.
        self.count_requests = count_requests
        self.ready = threading.Event()
        self.wake = threading.Event()  # the drain began (or the supervisor is done)
        self.stopped = threading.Event()
        self.counting = False
        # A stop while STARTING, yet vLLM answers HTTP: it became ready between two /health polls,
        # may hold accepted requests, and drains them itself (before its engine is up, its HTTP
        # server accepts nothing: a request waits in the listen queue and times out).
        self.stopped_while_starting = False
        self.answering = threading.Event()
        self.at_drain: dict[str, float] | None = None  # first sample after the drain began
        self.last: dict[str, float] | None = None
        self.last_at: float | None = None  # time.monotonic() of `last`

    def run(self) -> None:
        while not (self.ready.is_set() or self.wake.is_set()):
            if healthy(self.url):
                self.ready.set()
            else:
                self.wake.wait(TICK_S)
        self.wake.wait()
        if self.stopped_while_starting and not self.stopped.is_set():
            if http_get(self.url, "/metrics", METRICS_TIMEOUT_S)[0]:
                self.answering.set()
                self.counting = self.count_requests
        while self.counting and not self.stopped.is_set():
            counts = request_counts(self.url)
            if counts is not None:
                if self.at_drain is None:
                    self.at_drain = counts
                self.last, self.last_at = counts, time.monotonic()
            self.stopped.wait(TICK_S)

    def begin_drain(self, serving: bool) -> None:
        """Stop the health polling; count requests until the end if vLLM was serving."""
        self.counting = serving and self.count_requests
        self.stopped_while_starting = not serving
        self.wake.set()

    def stop(self) -> None:
        self.stopped.set()
        self.wake.set()

    def summary(self, exited_at: float | None = None) -> str:
        """ "; N in flight at SIGTERM, ..." for the exit line, or "" if never counted.

        exited_at: time.monotonic() when vLLM exited. The last sample can precede the end of the
        drain (one every TICK_S), so the line says how long before the exit it was taken."""
        first, last = self.at_drain, self.last
        if first is None:
            return ""
        inflight = int(first["running"] + first["waiting"])
        finished = int(last["finished"] - first["finished"])
        aborted = int(last["aborted"] - first["aborted"])
        running = int(last["running"] + last["waiting"])
        seen = "as last seen in /metrics"
        if exited_at is not None and self.last_at is not None:
            seen += f", {max(exited_at - self.last_at, 0):.1f} s before vLLM exited"
        return (
            f"; {inflight} in flight at SIGTERM, {finished} finished, {aborted} aborted"
            + (f", {running} still running" if running else "")
            + f" ({seen})"
        )
