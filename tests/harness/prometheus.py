"""A real Prometheus (Debian's package, unpacked by scripts/prometheus-tools.sh) for the tests:
scraping given targets every second, queried over its HTTP API."""

from __future__ import annotations

import contextlib
import json
import pathlib
import subprocess
import time
import urllib.parse
import urllib.request

from tests.harness import ROOT, free_port


def tools() -> pathlib.Path:
    """The bin/ directory holding `prometheus` and `promtool`."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "prometheus-tools.sh")],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    return pathlib.Path(out.stdout.strip())


class Prometheus:
    def __init__(self, port: int):
        self.url = f"http://127.0.0.1:{port}"

    def query(self, expr: str) -> list[dict] | None:
        """The instant vector of `expr` (a list of {metric, value}), None if unreachable."""
        url = f"{self.url}/api/v1/query?query={urllib.parse.quote(expr)}"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return json.load(r)["data"]["result"]
        except OSError:
            return None

    def alert_rules(self) -> list[str]:
        """The names of the alerting rules Prometheus has loaded."""
        with urllib.request.urlopen(f"{self.url}/api/v1/rules?type=alert", timeout=5) as r:
            groups = json.load(r)["data"]["groups"]
        return [rule["name"] for g in groups for rule in g["rules"]]

    def value(self, expr: str) -> float | None:
        found = self.query(expr)
        return float(found[0]["value"][1]) if found else None

    def until(self, expr: str, want: float, timeout: float = 15) -> float | None:
        """The value of `expr` once it is `want`, or the last seen after `timeout`."""
        end, got = time.monotonic() + timeout, None
        while time.monotonic() < end:
            got = self.value(expr)
            if got == want:
                break
            time.sleep(0.2)
        return got


@contextlib.contextmanager
def running(tmp: pathlib.Path, jobs: dict[str, list[str]]):
    """Prometheus scraping each job's targets ("host:port") every second."""
    config = "global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n" + "".join(
        f"  - job_name: {job}\n    static_configs: [{{targets: {targets!r}}}]\n"
        for job, targets in jobs.items()
    )
    (tmp / "prometheus.yml").write_text(config)
    port = free_port()
    proc = subprocess.Popen(
        [
            str(tools() / "prometheus"),
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        yield Prometheus(port)
    finally:
        proc.terminate()
        proc.wait(10)
