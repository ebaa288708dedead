"""metrics: what the supervisor's /metrics costs. One server of ours (tiny model, eager, probe port
on), batches of 8 streams with and without a scraper asking the probe port's /metrics every
second (15 x the 15 s a PodMonitor uses), alternated; and the supervisor's CPU time per scrape,
from 200 scrapes of the idle server, scaled to a minute at a 15 s interval."""

from __future__ import annotations

import threading
import urllib.request

import psutil

from tests.harness import free_port

from .common import Row, curl_streams, launch, pair_ratios, record, stop

STREAMS, TOKENS = 8, 1500
SCRAPE_EVERY_S = 1.0
SCRAPES = 200


def scrape(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return len(r.read())


class Scraper(threading.Thread):
    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port, self.stop, self.count = port, threading.Event(), 0

    def run(self) -> None:
        while not self.stop.wait(SCRAPE_EVERY_S):
            scrape(self.port)
            self.count += 1


def supervisor_cpu_per_scrape_ms(pid: int, port: int) -> tuple[float, int]:
    sup = psutil.Process(pid)
    t = sup.cpu_times()
    size = 0
    for _ in range(SCRAPES):
        size = scrape(port)
    u = sup.cpu_times()
    return (u.user + u.system - t.user - t.system) * 1000 / SCRAPES, size


def run(repeat: int, quick: bool) -> list[Row]:
    port = free_port()
    s, t_ready = launch(
        "ours", ["--enforce-eager"], name="metrics", env={"INTEL_VLLM_PROBE_PORT": str(port)}
    )
    plain, scraped = [], []
    try:
        per_scrape, size = supervisor_cpu_per_scrape_ms(s.pid, port)
        record("metrics scrape cost", {"cpu_ms_per_scrape": round(per_scrape, 3), "bytes": size})
        for k in range(1 if quick else max(3, repeat)):
            for with_scraper in (False, True)[:: 1 if k % 2 == 0 else -1]:
                scraper = Scraper(port) if with_scraper else None
                if scraper:
                    scraper.start()
                out = curl_streams(s, STREAMS, TOKENS)
                if scraper:
                    scraper.stop.set()
                    scraper.join()
                    out["scrapes"] = scraper.count
                (scraped if with_scraper else plain).append(out["tok_s"])
                record(f"metrics {'scraped' if with_scraper else 'plain'} {k}", out)
    finally:
        stop(s)
    per_minute = per_scrape * 60 / 15
    return [
        Row(
            "metrics",
            f"tokens/s, {STREAMS} streams, /metrics scraped every {SCRAPE_EVERY_S:g} s vs not",
            "tok/s",
            scraped,
            plain,
            pair_ratios(scraped, plain),
            "ratio >= 0.97",
            None,
            fmt="{:.0f}",
        ),
        Row(
            "metrics",
            f"supervisor CPU per scrape ({size} bytes), and per minute at a 15 s interval",
            "ms",
            [round(per_scrape, 3)],
            [round(per_minute, 2)],
            note="ours: per scrape; alternative column: per minute at 15 s",
            fmt="{:.3f}",
        ),
    ]
