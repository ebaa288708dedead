"""The docs' copies of the supervisor's facts, rendered from vllm_intel.supervisor.settings.

README.md and docs/CONVENTIONS.md hold each block between `<!-- generated:NAME -->` and
`<!-- end:NAME -->`; `python -m vllm_intel.supervisor.docs` rewrites them and
tests/supervisor/test_docs.py fails when they differ.
"""

from __future__ import annotations

import pathlib
import re
import sys

from . import paths, reference, timing


def exit_codes() -> str:
    rows = [f"| {code} | {meaning} |" for code, meaning in reference.EXIT_CODES]
    return "\n".join(["| code | meaning |", "|---|---|", *rows])


def settings_table() -> str:
    rows = [f"| `{s.name}` | {s.default} | {s.meaning} |" for s in reference.SETTINGS]
    return "\n".join(["| variable | default | meaning |", "|---|---|---|", *rows])


def common_settings_table() -> str:
    """README's short table: the settings of reference.COMMON, each linked to where
    docs/settings.md explains it."""
    ours = {s.name: s for s in reference.SETTINGS}
    vllms = {s.name: s for s in reference.VLLM_SETTINGS}
    rows = []
    for name in reference.COMMON:
        if name in ours:
            s, where = ours[name], re.sub(r"[^\w\- ]", "", name.lower()).replace(" ", "-")
        else:
            s, where = vllms[name], "vllm-settings-the-supervisor-reads"
        rows.append(f"| [`{name}`](docs/settings.md#{where}) | {s.default} | {s.meaning} |")
    return "\n".join(["| setting | default | meaning |", "|---|---|---|", *rows])


def vllm_settings_table() -> str:
    rows = [f"| `{s.name}` | {s.default} | {s.meaning} |" for s in reference.VLLM_SETTINGS]
    head = (
        "Read from vLLM's own sources, with vLLM's precedence: command line > "
        "`--config FILE.yaml` > vLLM's default.\n\n"
    )
    return head + "\n".join(["| vLLM setting | default | the supervisor |", "|---|---|---|", *rows])


def shutdown() -> str:
    return f"```\n{timing.SHUTDOWN_FORMULA}\n```"


def orchestrator() -> str:
    return f"```\n{timing.ORCHESTRATOR_FORMULA}\n```"


def usage() -> str:
    return f"```\n{reference.USAGE}\n```"


def _verdicts() -> dict:
    """docs/patch-verdicts.json: the followed releases and each patch's verdict on each."""
    import json

    return json.loads((pathlib.Path(__file__).parents[2] / "docs/patch-verdicts.json").read_text())


def patch_table() -> str:
    """Each patch's summary and verdict on every followed release (docs/patch-verdicts.json,
    written by tools/upstream_release.py from the releases' sources; a patch it does not hold yet
    shows "not recorded")."""
    from vllm_intel.patches import declarations

    data = _verdicts()
    releases = data["releases"]
    rows = [
        f"| `{p.name}` | {p.summary} | "
        + " | ".join(data["verdicts"][v].get(p.name, ["not recorded"])[0] for v in releases)
        + " |"
        for p in declarations()
    ]
    head = "| patch | fixes | " + " | ".join(releases) + " |"
    return "\n".join([head, "|---|---|" + "---|" * len(releases), *rows])


def patch_declarations_table() -> str:
    """What each patch declares (patches/_base.py), with the followed releases in its range."""
    from packaging.specifiers import SpecifierSet

    from vllm_intel.patches import declarations

    releases = _verdicts()["releases"]
    rows = []
    for p in declarations():
        runs_on = [v for v in releases if SpecifierSet(p.tested).contains(v)]
        upstream = p.upstream or "none"
        rows.append(
            f"| `{p.name}` | `patches/{p.module}.py` | {p.order} | `{p.tested}`"
            + (" (lifecycle)" if p.lifecycle else "")
            + f" | {', '.join(runs_on)} | {upstream}"
            + (f"; in vLLM >= {p.fixed_in}" if p.fixed_in else "")
            + f" | {p.platform or 'any'} | {p.condition or '-'} |"
        )
    head = "| patch | module | order | tested | followed releases in it | upstream | platform | also decided by |"
    return "\n".join([head, "|---|---|---|---|---|---|---|---|", *rows])


def metrics_table() -> str:
    from .metrics import reference as metric_rows

    rows = [f"| `{name}` | {kind} | {doc} |" for name, kind, doc in metric_rows()]
    return "\n".join(["| metric | type | meaning |", "|---|---|---|", *rows])


BLOCKS = {
    "patches": patch_table,
    "patch-declarations": patch_declarations_table,
    "metrics": metrics_table,
    "usage": usage,
    "settings": settings_table,
    "common-settings": common_settings_table,
    "vllm-settings": vllm_settings_table,
    "shutdown": shutdown,
    "exit-codes": exit_codes,
    "orchestrator": orchestrator,
}
FILES = (
    "README.md",
    "docs/CONVENTIONS.md",
    "docs/deploy.md",
    "docs/settings.md",
    "docs/patches.md",
)


def help_text() -> str:
    """`entrypoint.py --help`."""
    plain_exit = "\n".join(
        f"  {code:<11} {re.sub('`', '', meaning)}" for code, meaning in reference.EXIT_CODES
    )
    plain_settings = "\n".join(
        f"  {s.name.replace('`', '')}  (default {s.default.strip('`')})" for s in reference.SETTINGS
    )
    return (
        f"Run `vllm serve` under a PID-1 supervisor that drains on SIGTERM and never hangs.\n\n"
        f"Usage:\n{reference.USAGE}\n\nSettings:\n{plain_settings}\n\n"
        f"vLLM settings also read (command line > --config FILE.yaml > vLLM's default):\n"
        + "\n".join(f"  {s.name.replace('`', '')}: {s.meaning}" for s in reference.VLLM_SETTINGS)
        + "\n\n"
        f"Shutdown timing:\n{timing.SHUTDOWN_FORMULA}\n\nExit codes:\n{plain_exit}"
    )


def render(text: str) -> str:
    """text with every generated block replaced by its current rendering."""

    def one(m: re.Match) -> str:
        return f"<!-- generated:{m.group(1)} -->\n{BLOCKS[m.group(1)]()}\n<!-- end:{m.group(1)} -->"

    return re.sub(r"<!-- generated:([\w-]+) -->\n.*?<!-- end:\1 -->", one, text, flags=re.S)


def main(argv: list[str]) -> int:
    root = paths.ROOT
    stale = []
    for name in FILES:
        path = pathlib.Path(root, name)
        text = path.read_text()
        new = render(text)
        if new != text:
            stale.append(name)
            if "--check" not in argv:
                path.write_text(new)
    for name in stale:
        print(f"{name}: {'out of date' if '--check' in argv else 'rewritten'}")
    return 1 if stale and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
