"""Every doc that shows the supervisor's facts shows the ones in its code (reference, timing, errors)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.harness import ROOT
from vllm_intel.supervisor import docs, reference, timing


@pytest.mark.parametrize("name", docs.FILES)
def test_generated_blocks_match_the_code(name):
    text = (ROOT / name).read_text()
    assert "<!-- generated:" in text
    assert docs.render(text) == text, (
        f"{name} is out of date: run `python -m vllm_intel.supervisor.docs`"
    )


def test_help_shows_every_exit_code_setting_and_the_formula():
    out = subprocess.run(
        [sys.executable, str(ROOT / "entrypoint.py"), "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for code, _ in reference.EXIT_CODES:
        assert re.search(rf"^  {re.escape(code)} ", out, re.M), code
    for s in (*reference.SETTINGS, *reference.VLLM_SETTINGS):
        assert s.name.replace("`", "") in out
    assert timing.SHUTDOWN_FORMULA in out and reference.USAGE in out


def tracked_text_files():
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for f in files:
        path = ROOT / f
        if (
            path.suffix in (".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".cpu", ".xpu", "")
            and path.is_file()
            and "fake_vllm" not in f
        ):
            try:
                yield f, path.read_text()
            except UnicodeDecodeError:
                continue


OUTSIDE = ".." + "/shared"  # spelled apart so that this file does not match itself


def test_no_file_points_outside_the_repository_or_cites_project_issues():
    bad = []
    for name, text in tracked_text_files():
        for n, line in enumerate(text.splitlines(), 1):
            # upstream references name their repository: "vllm#123", "vLLM PR #123"
            if (
                OUTSIDE in line
                or re.search(r"\b(project )?issue \d+\b", line)
                or re.search(r"(?<![\w#])(?<!PR )#\d{1,4}\b", line)
            ):
                bad.append(f"{name}:{n}: {line.strip()[:100]}")
    assert not bad, "\n".join(bad)


README_MAX_LINES = 200  # README.md is the user's guide; detail lives in docs/*.md


def test_readme_is_a_guide_of_at_most_200_lines():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, (
        f"README.md has {n} lines, at most {README_MAX_LINES}: move detail to a page of docs/"
    )


def doc_pages() -> list:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose(text: str):
    """(line number, line) outside fenced code blocks, inline code spans blanked."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"\s*(```|~~~)", line)
        if m:
            fence = None if fence == m.group(1) else fence or m.group(1)
            continue
        if fence is None:
            yield n, re.sub(r"`[^`]*`", "code", line)


def anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens;
    a repeated heading gets -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    fence = None
    for line in text.splitlines():
        m = re.match(r"\s*(```|~~~)", line)
        if m:
            fence = None if fence == m.group(1) else fence or m.group(1)
            continue
        heading = re.match(r"#{1,6} +(.*?) *#* *$", line) if fence is None else None
        if heading:
            words = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1)).replace("`", "")
            slug = re.sub(r"[^\w\- ]", "", words.lower()).replace(" ", "-")
            out.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return out


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(<?([^)\s>]+)>?(?: +\"[^\"]*\")?\)")


def test_every_relative_link_in_the_docs_points_to_a_file_that_exists():
    bad = []
    for page in doc_pages():
        for n, line in prose(page.read_text()):
            for target in LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                    continue
                path, _, anchor = target.partition("#")
                dest = (page.parent / path).resolve() if path else page
                where = f"{page.relative_to(ROOT)}:{n}: {target}"
                if not dest.exists():
                    bad.append(f"{where}: no such file")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
                    bad.append(f"{where}: no such heading in {dest.relative_to(ROOT)}")
    assert not bad, "\n".join(bad)


def test_each_setting_is_explained_in_docs_settings_and_its_numbers_are_the_codes():
    """The prose lives in docs/settings.md, one heading per setting of the generated table; the
    numbers it states are the supervisor's own constants."""
    from vllm_intel.supervisor.errors import Exit
    from vllm_intel.supervisor.timing import (
        DEFAULT_DRAIN_S,
        MARGIN_S,
        MAX_DRAIN_S,
        XPU_MIN_DRAIN_S,
    )
    from vllm_intel.supervisor.vllm_args import MAX_CONFIG_BYTES, MAX_PARALLEL

    text = (ROOT / "docs" / "settings.md").read_text()
    explained = re.findall(r"^#### `(.+)`$", text, re.M)
    assert explained == [s.name for s in reference.SETTINGS]
    numbers = {
        r"after SIGTERM \(0 to (\d+)\)": MAX_DRAIN_S,
        r"after a drain \(0 to (\d+)\)": MARGIN_S,
        r"one above (\d+) s": MAX_DRAIN_S,
        r"On XPU never below (\d+)": XPU_MIN_DRAIN_S,
        r"Default: `(\d+)`\. Seconds in-flight": DEFAULT_DRAIN_S,
        r"over (\d+) MiB": MAX_CONFIG_BYTES >> 20,
        r"their product above (\d+)": MAX_PARALLEL,
    }
    for pattern, value in numbers.items():
        found = re.findall(pattern, text)
        assert found and {int(f) for f in found} == {value}, (pattern, found, value)
    for said in re.findall(r"\bexit(?:s)? \(?(\d+)", text):
        assert int(said) in {int(e) for e in Exit} | {0, 1}, said
