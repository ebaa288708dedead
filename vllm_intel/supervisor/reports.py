"""What vLLM's processes report to the supervisor through files in the run directory
(vllm_intel.in_vllm.run_files): the supervisor reads them when asked (a scrape, the "ready" and exit
lines) and trusts nothing in them beyond their shape.
"""

from __future__ import annotations

import pathlib

from ..in_vllm import drain_forecast, run_files
from ..in_vllm.startup_phases import PHASES
from .extension import Extension


class RunReports(Extension):
    """The files each vLLM process writes into the run directory: its patch states and start-up
    phases as it starts (vllm_intel.in_vllm.startup_phases), the API server's drain forecast and counts
    (vllm_intel.in_vllm.drain_forecast) as it drains. An extension for the words they add to the "ready"
    and exit lines."""

    def __init__(self, run_dir: pathlib.Path | None = None) -> None:
        self.dir = run_dir  # None: no run directory yet
        self.found_forecast: drain_forecast.Forecast | None = None

    def read(self, prefix: str, field: str, kind: type) -> list[dict]:
        """Every `<prefix>*.json` holding {"process": str, field: {str: kind}}."""
        if self.dir is None:
            return []
        return [
            data
            for data in run_files.read_all(self.dir, prefix)
            if isinstance(data, dict)
            and isinstance(data.get("process"), str)
            and isinstance(data.get(field), dict)
            and all(isinstance(v, kind) and not isinstance(v, bool) for v in data[field].values())
        ]

    def patch_states(self) -> list[dict]:
        return self.read(run_files.PATCH_STATES, "states", str)

    def startup(self) -> dict[str, float]:
        """Seconds per start-up phase: the longest of any process (tensor-parallel workers load
        side by side, so the longest is the wall time); a phase nobody reported is absent."""
        phases: dict[str, float] = {}
        for found in self.read(run_files.STARTUP, "phases", (int, float)):
            own = {k: float(v) for k, v in found["phases"].items()}
            parts = [own.pop(k) for k in ("load_init", "load_weights") if k in own]
            if parts and "load" not in own:  # the loader's own lines, where the runner logs none
                own["load"] = sum(parts)
            for phase, seconds in own.items():
                if phase in PHASES:
                    phases[phase] = max(phases.get(phase, 0.0), seconds)
        return phases

    def graphs(self) -> dict[str, int]:
        """Compiled graphs vLLM loaded from its compile cache ("cache") or compiled ("compiled"),
        summed over its processes; {} where vLLM logged neither (nothing compiled, eager)."""
        total: dict[str, int] = {}
        for found in self.read(run_files.STARTUP, "graphs", int):
            for source, n in found["graphs"].items():
                total[source] = total.get(source, 0) + n
        return total

    def forecast(self) -> drain_forecast.Forecast | None:
        """The drain forecast vLLM's API server wrote, once it exists (written once)."""
        if self.found_forecast is None and self.dir is not None:
            self.found_forecast = drain_forecast.read(self.dir)
        return self.found_forecast

    def result(self) -> run_files.Result | None:
        """How the drain's requests ended as vLLM's API server counted them, read afresh each
        time (it rewrites them at each end); None before it wrote any."""
        return drain_forecast.read_result(self.dir) if self.dir is not None else None

    def ready_words(self, sup) -> str:
        return phases_text(self.startup(), self.graphs())

    def exit_words(self, sup) -> str:
        """After a stop: how the drain ended (vLLM's counts, else the observer's samples) and
        what was forecast at its start."""
        if sup.stop_requested_at is None:
            return ""
        found = self.forecast()
        forecast = "" if found is None else f"; forecast at SIGTERM: {found.brief()}"
        return sup.observer.summary(sup.exited_at, self.result()) + forecast


def phases_text(phases: dict[str, float], graphs: dict[str, int] | None = None) -> str:
    """ " (vLLM: load 3.1 s, compile 40.2 s, engine init 55.0 s; compile cache miss: 2 graphs
    compiled)" for the ready line, or "" if vLLM said nothing of its start."""
    known = [f"{k.replace('_', ' ')} {phases[k]:.1f} s" for k in PHASES if k in phases]
    said = "; ".join(part for part in (", ".join(known), cache_verdict(graphs or {})) if part)
    return f" (vLLM: {said})" if said else ""


def cache_verdict(graphs: dict[str, int]) -> str:
    """Hit, miss or partly, from vLLM's own lines for each compiled graph."""
    loaded, compiled = graphs.get("cache", 0), graphs.get("compiled", 0)
    if loaded and compiled:
        return f"compile cache partly warm: {loaded} graph(s) loaded, {compiled} compiled"
    if loaded:
        return f"compile cache hit: {loaded} graph(s) loaded"
    if compiled:
        return f"compile cache miss: {compiled} graph(s) compiled"
    return ""
