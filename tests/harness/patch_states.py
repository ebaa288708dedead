"""The patch states the tests expect, from what each patch declares (patches/_base.py: ``tested``,
``lifecycle``, ``fixed_in``, ``platform``, ``condition``), and the releases the suite runs each
patch on, from what the test files observe (their ``EXERCISES``). No test keeps a list of patches:
a new patch brings its declarations in its module and its ``EXERCISES`` in its test file."""

from __future__ import annotations

import ast
import pathlib


def expected_state(patch, release: str, platform: str | None, decided: bool = False) -> str | None:
    """The state ``patch`` (a Patch or its declarations) shows on ``release`` (a public version)
    on ``platform`` ("cpu", "xpu"; None: vLLM found none), in every process; None where its
    declarations leave it open: its ``condition`` (unless ``decided``: the condition holds), or
    a release outside its tested range, where tested code decides (a lifecycle patch applies)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    if patch.fixed_in and Version(release) >= Version(patch.fixed_in):
        return "upstream"  # a verdict that only reads: every platform, every range
    if patch.platform and patch.platform != platform:
        return "not-applicable"
    if patch.condition and not decided:
        return None
    if not patch.lifecycle and not SpecifierSet(patch.tested).contains(release):
        return None
    return "applied"


def serve_expectations(patches, release: str) -> dict[str, str]:
    """{name: state} in every process of a CPU ``vllm serve`` of ``release``, for each patch
    without a ``condition``; ValueError when the declarations leave one of those open (the
    release is outside its tested range: the suite serves only releases it tests)."""
    out = {}
    for p in patches:
        if p.condition:
            continue
        state = expected_state(p, release, "cpu")
        if state is None:
            raise ValueError(f"{p.name}: vLLM {release} is outside its tested range {p.tested}")
        out[p.name] = state
    return out


def exercised(tests: pathlib.Path) -> dict[str, set[str]]:
    """{patch name: the releases the test files in ``tests`` run it on}: the union of their
    module-level ``EXERCISES = {name: (release, ...)}``, read from their sources."""
    out: dict[str, set[str]] = {}
    for path in sorted(tests.glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
                "EXERCISES"
            ]:
                for name, releases in ast.literal_eval(node.value).items():
                    out.setdefault(name, set()).update(releases)
    return out


def range_disagreements(patches, runs: dict[str, set[str]], followed) -> list[str]:
    """One line per patch whose tested range holds other ``followed`` releases than its tests run
    it on (``runs``, from ``exercised``), and per name in ``runs`` that is no patch's."""
    from packaging.specifiers import SpecifierSet

    out = []
    for p in patches:
        in_range = {v for v in followed if SpecifierSet(p.tested).contains(v)}
        if in_range != runs.get(p.name, set()):
            out.append(
                f"{p.name}: tested {p.tested!r} holds {sorted(in_range)}, "
                f"its tests run {sorted(runs.get(p.name, ()))}"
            )
    known = {p.name for p in patches}
    return out + [f"{name}: in an EXERCISES, not a patch" for name in sorted(set(runs) - known)]
