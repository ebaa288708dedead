"""Every doc that shows the supervisor's facts shows the ones in vllm_intel/supervisor/settings.py."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.harness import ROOT
from vllm_intel.supervisor import docs, settings


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
    for code, _ in settings.EXIT_CODES:
        assert re.search(rf"^  {re.escape(code)} ", out, re.M), code
    for s in (*settings.SETTINGS, *settings.VLLM_SETTINGS):
        assert s.name.replace("`", "") in out
    assert settings.SHUTDOWN_FORMULA in out and settings.USAGE in out


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
