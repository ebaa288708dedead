"""The patch states the tests expect, from what each patch declares (patches/_base.py:
``lifecycle``, ``fixed_in``, ``platform``, ``condition``) and its record (patches/tested_code.py:
the releases it was tested on, ``tested`` its range), and the releases the suite runs each patch
on: those of its record (``recorded_releases``). No test keeps a list of patches or of releases: a
new patch brings its declarations in its module and its record by ``tools/upstream_release.py
record --add``."""

from __future__ import annotations


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


def recorded_releases(name: str) -> tuple[str, ...]:
    """The releases a patch was tested on, oldest first: its record's (patches/tested_code.py),
    what its tests parametrize over."""
    from vllm_intel.patches._release_gate import recorded, release_key

    return tuple(sorted(recorded(name), key=release_key))


def unrecorded(patches, runnable) -> list[str]:
    """One line per patch without a record, or with a recorded release the suite cannot run it
    on (not in ``runnable``)."""
    out = []
    for p in patches:
        releases = recorded_releases(p.name)
        if not releases or set(releases) - set(runnable):
            out.append(f"{p.name}: recorded {list(releases)}, the suite runs {sorted(runnable)}")
    return out
