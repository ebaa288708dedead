"""Where a vLLM start spends its time, from the figures vLLM itself logs as it starts.

vLLM logs a line as each phase of a start ends (weights downloaded, model loaded, torch.compile
done, engine initialised). `install()`, called by the plugin in each vLLM process, wraps the
logging module's record factory so that a record whose format string is one of those lines also
lands, as seconds, in this process's STARTUP file in the supervisor's run directory
(vllm_intel.in_vllm.run_files), where the supervisor's /metrics and its "ready" line read it; so
does each compiled graph vLLM loaded from its compile cache or compiled (a hit or a miss).

The record factory, not a handler: vLLM (re)configures its loggers with dictConfig, which drops
handlers it did not make, but never touches the factory. A record is made only for a level the
logger lets through, so with VLLM_LOGGING_LEVEL above INFO nothing is recorded (the phases are
then unknown, never zero). The format string is matched exactly: a release that rewords a line
drops that phase, which tests/patches/test_serve.py notices on the real server.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from . import run_files

# vLLM's format string -> (phase, index of the seconds among its arguments), as releases word
# them (0.32 first). `load`: vLLM's "Model loading took" where its model runner logs it (GPU, XPU),
# else the sum of the loader's own two lines (`load_init` + `load_weights`: the CPU runner); it
# includes `download` (vLLM downloads inside the load). `compile`: the worker's torch.compile line,
# once per compiled model (the engine core's "(compilation: ...)" is not read: it would count
# twice), or on CPU the time between the runner's two warm-up lines (its compile). `engine_init`:
# what follows the load in the engine core (KV-cache profiling, warm-up; the compile, by release).
INIT = "init engine (profile, create kv cache, warmup model) took "
LINES = {
    "Time spent downloading weights for %s: %.6f seconds": ("download", 1),
    "Model loading took %s GiB memory and %.6f seconds": ("load", 1),
    "Model loading took %s GiB and %.6f seconds": ("load", 1),
    "Model loading took %.4f GiB memory and %.6f seconds": ("load", 1),
    "Model loading took %.4f GiB and %.6f seconds": ("load", 1),
    "Initializing model took %.6f seconds": ("load_init", 0),
    "Loading weights took %.2f seconds": ("load_weights", 0),
    "%storch.compile took %.2f s in total": ("compile", 1),
    "torch.compile takes %.2f s in total": ("compile", 0),
    INIT + "%.2f s": ("engine_init", 0),
    INIT + "%.2f s (compilation: %.2f s)": ("engine_init", 0),
    INIT + "%.2f s (compilation: %.2f s — language_model: %.2f s, encoder: %.2f s)": (
        "engine_init",
        0,
    ),
    INIT + "%.2f seconds": ("engine_init", 0),
}
# The CPU model runner's compile: from its first line to its second (no seconds in either).
WARM_UP = ("Warming up model for the compilation...", "Warming up done.")
PHASES = ("download", "load", "compile", "engine_init")
# vLLM's line for each compiled graph it loaded from its compile cache (a hit) or compiled (a
# miss), where its compile backend logs one (GPU, XPU); on CPU torch's own counters of its FX
# graph cache, read as the warm-up ends: what makes a start warm, in vLLM's or torch's own words.
GRAPHS = {
    "%sDirectly load the compiled graph(s) for compile range %s from the cache, took %.3f s": (
        "cache"
    ),
    "%sCompiling a graph for compile range %s takes %.2f s": "compiled",
    "Directly load the compiled graph(s) for shape %s from the cache, took %.3f s": "cache",
    "Directly load the compiled graph(s) for dynamic shape from the cache, took %.3f s": "cache",
    "Compiling a graph for shape %s takes %.2f s": "compiled",
    "Compiling a graph for dynamic shape takes %.2f s": "compiled",
}
WATCHED = set(LINES) | set(GRAPHS) | set(WARM_UP)

_installed: dict[int, object] = {}  # pid -> the factory that was there before ours
_warm_up_at: dict[int, float] = {}  # pid -> when its CPU warm-up (compile) began


def record(kind: str, section: str, key: str, amount: float, env=os.environ) -> None:
    """Add `amount` to section[key] in this process's file (best effort: never fails a start).
    Several lines of one key in a process (one per model or graph) add up."""
    where = run_files.own(run_files.STARTUP, env)
    if not where:
        return
    data = run_files.read(where)
    data = data if isinstance(data, dict) else {"process": kind}
    values = data.setdefault(section, {})
    values[key] = values.get(key, 0) + amount
    run_files.write(where, data)


def seconds_of(rec: logging.LogRecord) -> tuple[str, float] | None:
    """(phase, seconds) if the record is one of vLLM's phase lines, else None."""
    found = LINES.get(rec.msg) if isinstance(rec.msg, str) else None
    if found is None:
        return None
    phase, index = found
    args = rec.args if isinstance(rec.args, tuple) else ()
    try:
        return phase, float(args[index])
    except (IndexError, TypeError, ValueError):
        return None


def observe(rec: logging.LogRecord, kind: str) -> None:
    """Record what the record says of the start, if anything."""
    found = seconds_of(rec)
    if found is not None:
        record(kind, "phases", *found)
    elif rec.msg in GRAPHS:
        record(kind, "graphs", GRAPHS[rec.msg], 1)
    elif rec.msg == WARM_UP[0]:
        _warm_up_at[os.getpid()] = rec.created
    elif rec.msg == WARM_UP[1] and os.getpid() in _warm_up_at:
        record(kind, "phases", "compile", rec.created - _warm_up_at.pop(os.getpid()))
        for source, n in fx_graph_cache().items():
            record(kind, "graphs", source, n)


def fx_graph_cache() -> dict[str, int]:
    """Torch inductor's FX graph cache hits ("cache") and misses ("compiled") in this process so
    far, from torch's own counters; {} where torch has not compiled anything."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", {}).get("inductor", {}) if utils else {}
    got = {
        "cache": counters.get("fxgraph_cache_hit", 0),
        # a bypass: a graph the cache cannot hold, compiled at every start
        "compiled": counters.get("fxgraph_cache_miss", 0) + counters.get("fxgraph_cache_bypass", 0),
    }
    return {k: int(v) for k, v in got.items() if v}


def install(kind: Callable[[], str]) -> None:
    """Wrap the record factory in this process (idempotent per pid: a forked child re-installs).
    kind: names the process at record time (a forked child may log before it re-installs)."""
    if os.getpid() in _installed or not os.environ.get(run_files.ENV):
        return
    previous = logging.getLogRecordFactory()
    if getattr(previous, "vllm_intel_phases", False):  # inherited across fork: the parent's
        previous = previous.previous
    _installed[os.getpid()] = previous

    def factory(*args, **kwargs):
        rec = previous(*args, **kwargs)
        try:
            if isinstance(rec.msg, str) and rec.msg in WATCHED:
                observe(rec, kind())
        except Exception:  # observing a start must never break it
            pass
        return rec

    factory.vllm_intel_phases = True
    factory.previous = previous
    logging.setLogRecordFactory(factory)


def uninstall() -> None:
    previous = _installed.pop(os.getpid(), None)
    if previous is not None:
        logging.setLogRecordFactory(previous)
