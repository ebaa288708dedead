"""Which of the shipped scripts (docker/*.sh, .buildkite/steps/*.sh) this pytest session saw run.

A script nothing runs is broken until it runs: every test that runs one says so with `ran()`
after checking its outcome, or hands the BuildKit log of a build to `ran_in_build()`, and
tests/conftest.py fails a whole-suite run in which any shipped script was never seen to run.
A build step that BuildKit took from its cache counts: its cache key includes the bind-mounted
script's content, so that very script ran to success in an earlier build.
"""

from __future__ import annotations

import re

from . import ROOT

SEEN: set[str] = set()
_STEP = re.compile(r"^#(\d+) \[[^\]]+\] RUN (.*)$", re.M)
_END = re.compile(r"^#(\d+) (DONE|CACHED)\b", re.M)
_MOUNTED = re.compile(r"source=((?:docker|tests/standins)/[\w.-]+\.sh)")


def shipped() -> set[str]:
    """The scripts that must be seen to run: every shell script of docker/ and .buildkite/steps/."""
    paths = [*ROOT.glob("docker/*.sh"), *ROOT.glob(".buildkite/steps/*.sh")]
    return {str(p.relative_to(ROOT)) for p in paths}


def ran(*paths: str) -> None:
    unknown = [p for p in paths if not (ROOT / p).is_file()]
    assert not unknown, f"no such script: {unknown}"
    SEEN.update(paths)


def ran_in_build(log: str) -> set[str]:
    """Mark the scripts bind-mounted into RUN steps that completed in a BuildKit plain log."""
    scripts: dict[str, set[str]] = {}
    for number, command in _STEP.findall(log):
        scripts.setdefault(number, set()).update(_MOUNTED.findall(command))
    done = {number for number, _ in _END.findall(log)}
    found = {s for number, names in scripts.items() if number in done for s in names}
    SEEN.update(found)
    return found
