"""`entrypoint.py` subcommands: serve (set up, spawn, loop, clean up), patches, probe,
grace-period, plan, help."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
import tempfile

from .. import drain_forecast
from . import resources, settings
from .settings import ConfigError, Exit, log


def child_env(run_dir: pathlib.Path, planned: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # The CPU plan's values; the plan never holds a variable the user set (those are "yours").
    env.update(planned or {})
    # vLLM's sockets, inductor's scratch files and vllm_dist_* files land here and go with it.
    env["TMPDIR"] = str(run_dir)
    env["VLLM_RPC_BASE_PATH"] = str(run_dir)
    # Where drain-deadline leaves its drain forecast for the exit line (nobody else's file).
    env[drain_forecast.FORECAST_ENV] = str(run_dir / "drain-forecast.json")
    # Keep compiled kernels across runs (a warm start is ~15 s faster); it is a cache, not litter.
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(settings.inductor_cache(os.environ)))
    return env


def compile_caches(env: dict[str, str]) -> list[pathlib.Path]:
    """Where vLLM's processes keep what they compile: torch inductor's kernels and vLLM's
    torch.compile cache (VLLM_CACHE_ROOT, by default $XDG_CACHE_HOME/vllm or ~/.cache/vllm)."""
    vllm_root = env.get("VLLM_CACHE_ROOT") or settings.cache_home(env) / "vllm"
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
    cfg = settings.serve_config(args)
    # Every input checked before anything starts: TMPDIR first (the state file's default is in it).
    settings.check_tmpdir()
    state_path = settings.check_state_file(settings.state_file(cfg.port))
    probe_port = settings.probe_port(vllm_port=cfg.port)
    settings.check_patches()
    if importlib.util.find_spec("vllm") is None:
        log(f"vLLM is not installed for {sys.executable}")
        return Exit.NOT_FOUND
    missing = missing_device()
    if missing:
        log(missing)
        return Exit.NO_DEVICE
    plan = make_plan(cfg)  # may raise ConfigError: memory limit too small
    for note in cfg.notes:  # only now: a refused input is one line, not notes and then the error
        log(note)
    # psutil and the loop's imports only now: a missing vLLM is reported by any python3.
    from .loop import Supervisor

    sup = Supervisor(cfg, state_path)
    try:
        return supervise(sup, cfg, plan, probe_port)
    finally:
        sup.remove_state()


def supervise(sup, cfg: settings.ServeConfig, plan: resources.Plan, probe_port: int | None) -> int:
    """The run itself, in its run directory, from the preflight checks to vLLM's exit."""
    from . import hub, janitor, pinning, probes
    from .loop import Supervisor

    tmp = pathlib.Path(tempfile.gettempdir())
    with janitor.run_dir(tmp, settings.shm_dir()) as run:
        # After the sweep (a dead run's segments no longer count), before anything starts.
        resources.check_shm(settings.shm_dir(), plan.shm_needed)
        settings.check_port(cfg.host, cfg.port)
        log(plan.line())
        env = child_env(run.path, plan.env)
        log(compile_cache_line(env))
        Supervisor.block_signals()
        if probe_port is not None:
            try:
                probes.serve_http(probe_port, cfg.url, lambda: sup.state)
            except OSError as e:
                raise ConfigError(f"cannot serve probes on INTEL_VLLM_PROBE_PORT {probe_port}: {e}")
        failed = sup.spawn(env, plan.pin)
        if failed is not None:
            return failed
        run.watch(sup.child.pid)  # what vLLM maps in shm becomes this run's claim
        # A repo id with the hub on: vLLM downloads it while STARTING; say how far it got.
        progress = hub.watch_download(
            cfg.model, cfg.flags or [], lambda: sup.state == settings.State.STARTING
        )
        # The pin moves off CPUs that others load later (two replicas that chose alike).
        follower = (
            pinning.Follower(
                sup.child.pid, plan.pin, sorted(plan.limits.cpus), plan.limits.core_of
            ).start()
            if plan.pin
            else None
        )
        try:
            return sup.run()
        finally:
            if progress:
                progress.stop()
            if follower:
                follower.stop()


def make_plan(cfg: settings.ServeConfig) -> resources.Plan:
    return resources.plan(
        cfg.flags or [], cfg.model, resources.read_limits(), settings.device(), os.environ
    )


def show_plan(args: list[str]) -> int:
    """`entrypoint.py plan [MODEL] [FLAGS]`: the plan `serve` with these arguments would use."""
    p = make_plan(settings.serve_config(args))
    print(p.line())
    resources.check_shm(settings.shm_dir(), p.shm_needed)
    return 0


def patches(args: list[str]) -> int:
    try:
        from vllm_intel import patches as plugin
    except ImportError as e:
        log(f"the patch plugin cannot be imported for {sys.executable}: {e}")
        return Exit.NOT_FOUND
    bad = next((a for a in args if a != "--strict"), None)
    if bad is not None and args not in (["-h"], ["--help"]):  # one short line, whatever it is
        raise ConfigError(f"patches: unknown argument {settings.shown(bad)}; {plugin.USAGE}")
    return plugin.main(args)


def prefetch(args: list[str]) -> int:
    from .hub import prefetch as run_prefetch

    return run_prefetch(args)


def grace_period(args: list[str]) -> int:
    """`entrypoint.py grace-period [MODEL] [FLAGS]`: the grace for `serve` with these arguments
    (their --shutdown-timeout, on the command line or in its --config file, else the env)."""
    print(settings.grace_period(settings.drain_seconds(args)[0]))
    return 0


def show_help(args: list[str]) -> int:
    from .docs import help_text

    print(help_text())
    return 0


def probe(args: list[str]) -> int:
    from .probes import probe as run_probe

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
                f"unknown subcommand {settings.shown(cmd)} (expected serve, prefetch, patches, probe, grace-period, "
                "plan)"
            )
        return COMMANDS[cmd](rest)
    except ConfigError as e:
        print(f"entrypoint.py: {e}", file=sys.stderr)
        return Exit.CONFIG
