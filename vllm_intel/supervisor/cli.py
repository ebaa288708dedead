"""`entrypoint.py` subcommands: serve (set up, spawn, loop, clean up), patches, probe,
grace-period, plan, help."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import signal
import sys
import tempfile

from ..in_vllm import run_files
from . import errors, limits, paths, runtime, settings, timing, workload
from .errors import ConfigError, Exit, StoppedBeforeStart
from .log import json_mode, log, record, write_lines
from .plan import Plan
from .plan import plan as make
from .signals import check_stop


def child_env(run_dir: pathlib.Path, planned: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # The CPU plan's values; the plan never holds a variable the user set (those are "yours").
    env.update(planned or {})
    # vLLM's sockets, inductor's scratch files and vllm_dist_* files land here and go with it.
    env["TMPDIR"] = str(run_dir)
    env["VLLM_RPC_BASE_PATH"] = str(run_dir)
    # Where vLLM's processes leave their reports: patch states, start-up phases, the drain's
    # forecast and counts (run_files.py; reports.py reads them).
    env[run_files.ENV] = str(run_dir)
    # Keep compiled kernels across runs (a warm start skips torch.compile's work: docs/bench.md,
    # "Start times per model size"); it is a cache, not litter.
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(paths.inductor_cache(os.environ)))
    if json_mode(env) and not env.get("VLLM_LOGGING_CONFIG_PATH"):  # yours wins
        from vllm_intel.in_vllm.jsonlog import logging_config

        config = run_dir / "vllm-logging.json"
        config.write_text(json.dumps(logging_config(env.get("VLLM_LOGGING_LEVEL") or "INFO")))
        env["VLLM_LOGGING_CONFIG_PATH"] = str(config)
    return env


def compile_caches(env: dict[str, str]) -> list[pathlib.Path]:
    """Where vLLM's processes keep what they compile: torch inductor's kernels and vLLM's
    torch.compile cache (VLLM_CACHE_ROOT, by default $XDG_CACHE_HOME/vllm or ~/.cache/vllm)."""
    vllm_root = env.get("VLLM_CACHE_ROOT") or paths.cache_home(env) / "vllm"
    return [
        pathlib.Path(env["TORCHINDUCTOR_CACHE_DIR"]),
        pathlib.Path(vllm_root) / "torch_compile_cache",
    ]


MAX_COUNTED = 10000  # a look, not an inventory: the line must not delay the start


def compile_cache_line(env: dict[str, str]) -> str:
    """One line before the start: are the compile caches warm? vLLM reuses an entry only when
    its key (release, model, settings; torch's for the kernels) matches, and says so itself."""
    counts = {path: count_files(path, MAX_COUNTED) for path in compile_caches(env)}
    shown = ", ".join(
        f"{path} {f'{n}+' if n >= MAX_COUNTED else n} file(s)" for path, n in counts.items()
    )
    if not any(counts.values()):
        return f"compile caches: {shown}: empty, this start compiles"
    return f"compile caches: {shown}: warm, a start of the same release, model and settings reuses them"


def count_files(path: pathlib.Path, limit: int) -> int:
    """Files under `path`, counted until `limit` is reached."""
    n = 0
    for _root, _dirs, files in os.walk(path):
        check_stop("the compile-cache count")  # a cold network file system can be slow
        n += len(files)
        if n >= limit:
            break
    return n


def missing_device(env=os.environ, dri: pathlib.Path = pathlib.Path("/dev/dri")) -> str | None:
    """Why `serve` cannot start on this image's device, or None. Only the XPU image asks: without a
    render node vLLM finds no platform and dies in a traceback far from the cause."""
    if env.get("VLLM_TARGET_DEVICE") != "xpu" or any(dri.glob("renderD*")):
        return None
    return (
        f"no XPU device: this is the XPU image and {dri}/renderD* does not exist "
        "(run it with --device /dev/dri, or use the CPU image)"
    )


def serve(args: list[str]) -> int:
    """Every start-up phase ends with check_stop: a SIGTERM / SIGINT before vLLM is spawned ends
    the start-up there (exit 128 + N, nothing to drain); from the spawn on the loop takes it."""
    try:
        return start(args)
    except StoppedBeforeStart as e:
        name = signal.Signals(e.sig).name
        log(
            f"{name} before vLLM was started (during {e.phase}): nothing to drain, exit {128 + e.sig}",
            event="exit",
            code=128 + e.sig,
        )
        return 128 + e.sig


def start(args: list[str]) -> int:
    cfg = settings.serve_config(args)
    # Every input checked before anything starts: TMPDIR first (the state file's default is in it).
    paths.check_tmpdir()
    state_path = paths.check_state_file(paths.state_file(cfg.port))
    probe_port = settings.probe_port(vllm_port=cfg.port)
    settings.check_patches()
    if importlib.util.find_spec("vllm") is None:
        log(f"vLLM is not installed for {sys.executable}")
        return Exit.NOT_FOUND
    missing = missing_device()
    if missing:
        log(missing)
        return Exit.NO_DEVICE
    check_stop("the settings' checks")
    plan = make_plan(cfg)  # may raise ConfigError: memory limit too small
    for note in cfg.notes:  # only now: a refused input is one line, not notes and then the error
        log(note)
    check_stop("the plan")
    # The run's imports (psutil: the janitor's, leftovers') only now: a missing vLLM is reported
    # by any python3.
    from . import janitor, leftovers, loop  # noqa: F401  (so the stop check below covers them)

    check_stop("the imports")
    return supervise(cfg, plan, state_path, probe_port)


def supervise(
    cfg: settings.ServeConfig,
    plan: Plan,
    state_path: pathlib.Path,
    probe_port: int | None,
) -> int:
    """The run itself, in its run directory, from the preflight checks to vLLM's exit."""
    from . import hub, janitor
    from .leftovers import Descendants, OomKills
    from .loop import Supervisor
    from .relay import Relay
    from .reports import RunReports

    tmp, shm = pathlib.Path(tempfile.gettempdir()), paths.shm_dir()
    # The /dev/shm preflight after the sweep (a dead run's segments no longer count), before
    # the run's claim there (run_dir: a shm_dir it cannot write is one line too).
    with janitor.run_dir(tmp, shm, lambda: workload.check_shm(shm, plan.shm_needed)) as run:
        check_stop("the leftover sweep")
        settings.check_port(cfg.host, cfg.port)
        log(plan.line(), event="plan")
        env = child_env(run.path, plan.env)
        log(compile_cache_line(env), event="compile-cache")
        reports = RunReports(run.path)  # what vLLM's processes report as they start
        # Beside the loop (extension.py), in this order: the probe port's /metrics; what vLLM
        # maps in shm becomes this run's claim; with JSON logs, the relay of vLLM's output; with
        # a repo id and the hub on, its download's progress; what vLLM's processes report (the
        # ready and exit lines' words, the drain's before an OOM kill's); the cgroup's OOM kills
        # (counted as it is made: before the spawn); vLLM's processes that outlive its group.
        metrics = None
        if probe_port is not None:
            from .metrics import Metrics

            metrics = Metrics(reports=reports, linger_s=cfg.metrics_linger)
        relay = Relay() if json_mode() else None
        parts = (metrics, run, relay, hub.download_progress(cfg), reports)
        parts += (OomKills(), Descendants())
        sup = Supervisor(cfg, state_path, [e for e in parts if e is not None])
        try:
            Supervisor.block_signals()
            if probe_port is not None:
                serve_probes(sup, metrics, cfg, plan, probe_port, run.swept)
            check_stop("the preflight checks")  # the last: a stop from here on is the loop's
            failed = sup.spawn(env, relay.child_fds() if relay else None)
            if failed is not None:
                return failed
            code = sup.run()
            sup.exit_extensions()
            return code
        finally:
            sup.remove_state()


def serve_probes(sup, m, cfg: settings.ServeConfig, plan: Plan, port: int, swept: int) -> None:
    """The probe port: /ready, /live and the supervisor's /metrics, from one thread."""
    from vllm_intel.patches import vllm_version  # reads vLLM's _version.py, no import

    from . import probes

    m.info.info({"device": plan.device, "vllm": vllm_version() or "none"})
    m.plan(plan)
    m.swept.inc(swept)
    m.state.state(sup.state.value)
    try:
        probes.serve_http(port, cfg.url, lambda: sup.state, m.render)
    except OSError as e:
        raise ConfigError(f"cannot serve probes on INTEL_VLLM_PROBE_PORT {port}: {e}") from None


def make_plan(cfg: settings.ServeConfig) -> Plan:
    """The plan for this run: its inputs read once (limits, workload), then the pure decision."""
    work = workload.workload(list(cfg.flags), cfg.model, os.environ, cfg.vargs)
    device = settings.device()
    libs = runtime.find() if device == "cpu" else runtime.Libraries()
    return make(limits.read_limits(), work, dict(os.environ), device, libs)


def show_plan(args: list[str]) -> int:
    """`entrypoint.py plan [MODEL] [FLAGS]`: the plan `serve` with these arguments would use."""
    p = make_plan(settings.serve_config(args))
    print(p.line())
    workload.check_shm(paths.shm_dir(), p.shm_needed)
    return 0


def patches(args: list[str]) -> int:
    try:
        from vllm_intel import patches as plugin
    except ImportError as e:
        log(f"the patch plugin cannot be imported for {sys.executable}: {e}")
        return Exit.NOT_FOUND
    bad = next((a for a in args if a != "--strict"), None)
    if bad is not None and args not in (["-h"], ["--help"]):  # one short line, whatever it is
        raise ConfigError(f"patches: unknown argument {errors.shown(bad)}; {plugin.USAGE}")
    return plugin.main(args)


def prefetch(args: list[str]) -> int:
    from .hub import prefetch as run_prefetch

    return run_prefetch(args)


def grace_period(args: list[str]) -> int:
    """`entrypoint.py grace-period [MODEL] [FLAGS]`: the grace for `serve` with these arguments
    (their --shutdown-timeout, on the command line or in its --config file, else the env)."""
    print(timing.grace_period(settings.drain_seconds(args)[0]))
    return 0


def show_help(args: list[str]) -> int:
    from .docs import help_text

    print(help_text())
    return 0


def probe(args: list[str]) -> int:
    from .probe_client import probe as run_probe

    # launch.main asks a valid probe port itself; here a set but invalid one is a config error
    # (exit 64, one line), never "not ready" from a probe that asked nobody.
    settings.probe_port()
    return run_probe(args)


COMMANDS = {
    "serve": serve,
    "patches": patches,
    "probe": probe,
    "prefetch": prefetch,
    "grace-period": grace_period,
    "plan": show_plan,
    "-h": show_help,
    "--help": show_help,
    "help": show_help,
}


def main(argv: list[str]) -> int:
    cmd, rest = (argv[0], argv[1:]) if argv else ("serve", [])
    try:
        if cmd not in COMMANDS:
            raise ConfigError(
                f"unknown subcommand {errors.shown(cmd)} (expected serve, prefetch, patches, probe, grace-period, "
                "plan)"
            )
        return COMMANDS[cmd](rest)
    except ConfigError as e:
        if json_mode() and cmd == "serve":
            line = record(str(e), level="error", event="config-error", code=int(Exit.CONFIG))
        else:
            line = f"entrypoint.py: {e}"
        write_lines(2, (line + "\n").encode("utf-8", "replace"))
        return Exit.CONFIG
