"""What vLLM's processes report to the supervisor through files in the run directory.

Each process's plugin writes its own file as it starts (the directory is the supervisor's, 0700,
named to vLLM in INTEL_VLLM_PATCH_STATES_DIR): the supervisor reads them when asked (a scrape,
the "ready" line) and trusts nothing in them beyond their shape.
"""

from __future__ import annotations

import os
import pathlib
import stat

from ..startup_phases import PHASES
from .errors import load_json


class RunReports:
    """The JSON files each vLLM process's plugin writes into the run directory as it starts
    (INTEL_VLLM_PATCH_STATES_DIR): `patch-states-<pid>.json` (its patch states) and
    `startup-<pid>.json` (its start-up phases, vllm_intel.startup_phases), read when asked."""

    MAX_FILES = 64  # a server has a handful of processes; more is not ours to read
    MAX_BYTES = 8192

    def __init__(self, run_dir: pathlib.Path | None = None) -> None:
        self.dir = run_dir  # None: no run directory yet

    def read(self, prefix: str, field: str, kind: type) -> list[dict]:
        """Every `<prefix>-*.json` holding {"process": str, field: {str: kind}}."""
        if self.dir is None:
            return []
        try:
            names = sorted(self.dir.glob(f"{prefix}-*.json"))[: self.MAX_FILES]
        except OSError:
            return []
        out = []
        for path in names:
            try:  # a regular file of ours only (the run directory is 0700, still: no FIFO, link)
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                with os.fdopen(fd, "rb") as f:
                    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                        continue
                    data = load_json(f.read(self.MAX_BYTES))
            except (OSError, ValueError):
                continue
            if (
                isinstance(data, dict)
                and isinstance(data.get("process"), str)
                and isinstance(data.get(field), dict)
                and all(
                    isinstance(v, kind) and not isinstance(v, bool) for v in data[field].values()
                )
            ):
                out.append(data)
        return out

    def patch_states(self) -> list[dict]:
        return self.read("patch-states", "states", str)

    def startup(self) -> dict[str, float]:
        """Seconds per start-up phase: the longest of any process (tensor-parallel workers load
        side by side, so the longest is the wall time); a phase nobody reported is absent."""
        phases: dict[str, float] = {}
        for found in self.read("startup", "phases", (int, float)):
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
        for found in self.read("startup", "graphs", int):
            for source, n in found["graphs"].items():
                total[source] = total.get(source, 0) + n
        return total


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
