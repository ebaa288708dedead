"""Comments and docstrings state invariants and reasons, never measurements: every measured number
lives once, in docs/bench.md, and the code names the section that holds it.

Checked: the comments (``tokenize`` COMMENT tokens; consecutive comment lines read as one text)
and the module, class and function docstrings (``ast``) of vllm_intel/**/*.py and patches/*.py.
A text fails when it holds a "measured figure", i.e. any of (DURATION = a number with a unit of
time, s / ms / us):

* throughput: a number with a rate unit, ``\\d[\\d.,]* ?(tokens/s|tok/s|req/s|requests/s)``
  ("1400 tokens/s");
* a range of durations, percentages or factors, ``\\d+(\\.\\d+)? ?[-–] ?\\d+(\\.\\d+)? ?(s|ms|us|%|x)``
  ("5-23 s", "82-97 %"); a range without a unit (a port range "1-65535") is not one;
* a ratio of a measurement, ``0.\\d+ of`` or ``0.\\d+ / 0.\\d+ of`` ("0.81 / 0.79 of a cpuset's");
* a confidence interval, ``[0.78, 0.86]``;
* an approximation of a quantity, ``~`` before a DURATION, a size (KB/MB/GB) or a percentage
  ("~13 ms", "~2.3 GB");
* a comparison: a DURATION or percentage before ``instead of``, ``faster``, ``slower``, ``more`` or
  ``less`` ("7-10 s instead of under 3 s", "~15 s faster");
* time spent: ``spent``, ``spends``, ``took``, ``waited``, ``cost(s)`` right before a DURATION, or
  a DURATION before ``went to`` ("0.3 s went to the worker's gc.collect()");
* ``measured`` followed, in the same sentence, by a DURATION, percentage, factor or size
  ("measured: a process ... exits 0.2 s after its last line").

Not figures, and not matched: our own constants explained ("one day", "every 10 s", "at most 5 ms
per wait"), sizes that are definitions ("107 bytes", "24 MiB chunks x 10"), vLLM's constants ("the
1 s window"), version numbers ("0.27.1"), upstream pull requests, "not yet measured" without a
figure. ``test_the_checker_tells_figures_from_facts`` holds both kinds.
"""

from __future__ import annotations

import ast
import io
import pathlib
import re
import tokenize

from tests.harness import ROOT

DURATION = r"\d+(?:\.\d+)?(?: ?[-–] ?\d+(?:\.\d+)?)? ?(?:s|ms|us|µs)\b"  # "0.3 s", "5-23 s"
FIGURES = {
    "throughput": re.compile(r"\d[\d.,]* ?(?:tokens/s|tok/s|req/s|requests/s)"),
    "range": re.compile(
        r"\b\d+(?:\.\d+)? ?[-–] ?\d+(?:\.\d+)? ?(?:s|ms|us|µs|x)\b|\d ?[-–] ?\d+(?:\.\d+)? ?%"
    ),
    "ratio": re.compile(r"\b0\.\d+(?: / 0\.\d+)* of\b"),
    "interval": re.compile(r"\[\d+\.\d+, \d+\.\d+\]"),
    "approximation": re.compile(r"~ ?\d+(?:\.\d+)? ?(?:s|ms|us|µs|KB|MB|GB|KiB|MiB|GiB|%)(?!\w)"),
    "comparison": re.compile(
        rf"(?:{DURATION}|\d ?%|\d(?:\.\d+)?x\b) (?:instead of|faster|slower|more|less)\b"
    ),
    "time spent": re.compile(
        rf"\b(?:spent|spends|took|waited|costs?) (?:about |~)?{DURATION}|{DURATION} went to\b"
    ),
    "measured": re.compile(
        r"\bmeasured\b(?:[^.]|\.\d)*?\b\d+(?:\.\d+)? ?(?:s|ms|us|µs|%|x|KB|MB|GB|KiB|MiB|GiB)(?!\w)",
        re.IGNORECASE,
    ),
}
SOURCES = sorted((ROOT / "vllm_intel").rglob("*.py")) + sorted((ROOT / "patches").glob("*.py"))


def figures_in(text: str) -> list[tuple[int, str, str]]:
    """(offset in `text`, kind, matched text) of each measured figure in `text`; every run of
    blanks and line breaks reads as one blank, so a figure split over two lines is found."""
    flat, where = [], []  # the text with blanks collapsed; each of its characters' offset
    for m in re.finditer(r"\s+|\S+", text):
        piece = " " if m.group().isspace() else m.group()
        flat.append(piece)
        where += range(m.start(), m.start() + len(piece))
    joined = "".join(flat)
    found = []
    for kind, pattern in FIGURES.items():
        found += [(where[m.start()], kind, m.group()) for m in pattern.finditer(joined)]
    return sorted(found)


def texts_of(path: pathlib.Path) -> list[tuple[int, str]]:
    """(first line, text) of every comment block and docstring of a module."""
    source = path.read_text()
    texts, block, start, last = [], [], 0, -2
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        line = token.start[0]
        if line != last + 1 and block:
            texts.append((start, "\n".join(block)))
            block = []
        if not block:
            start = line
        block.append(token.string.lstrip("#").strip())
        last = line
    if block:
        texts.append((start, "\n".join(block)))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                texts.append((node.body[0].lineno, doc))
    return texts


def offenders(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    out = []
    for start, text in texts_of(path):
        for offset, kind, figure in figures_in(text):
            line = start + text[:offset].count("\n")
            out.append((line, f"{path.relative_to(root)}:{line}: {kind}: {figure!r}"))
    return [text for _, text in sorted(out)]


def test_comments_and_docstrings_state_no_measured_figure():
    bad = [line for path in SOURCES for line in offenders(path)]
    assert SOURCES and not bad, (
        "measured figures belong in docs/bench.md (state the invariant here and name the "
        "section):\n" + "\n".join(bad)
    )


MUST_MATCH = [
    "the 100 us sleep served 0.81 / 0.79 of a one-CPU cpuset's tokens/s",
    "new connections waited 5-23 s and streams got their first byte",
    "an idle docker stop took\n   7-10 s instead of under 3 s",
    "then, of the rest, 0.3 s went to the worker's gc.collect()",
    "spends 0.15-0.25 s in interpreter finalization",
    "(measured: a process that imported torch exits 0.2 s after its last Python line",
    "A scan reads the maps (~13 ms of CPU with vLLM's libraries mapped)",
    "a 100 us sleep there cost a one-CPU cpuset 1400 / 1500 tokens/s of 2070",
    "Keep compiled kernels across runs (a warm start is ~15 s faster)",
    "throttled in 82-97 % of CFS periods",
    "~2.3 GB of memory per pair",
    "tokens/s ratio 0.86 [0.82, 0.96]",
    "the container used 1.6x more CPU time per token",
]
MUST_NOT_MATCH = [
    "one day: a longer drain is a typo, and grace-period must print a sane number",
    "vLLM binds ZeroMQ ipc sockets in the run dir; a unix socket path has 107 bytes.",
    "one response MessageQueue per worker (24 MiB chunks x 10); an arena of 8 x 256 MiB slots",
    "Sources and precedence, as in vLLM 0.27.1 and 0.32.0 (vllm/utils/argparse_utils.py)",
    "Upstream: vllm PR #52848 adds this same variable, default 0 (no sleep)",
    "in the busy branch only (the 1 s window and the idle path stay vLLM's)",
    "The engine aborts every unfinished request min(2 s, N/4) before the window ends",
    "a port outside 1-65535, or a drain of 10**20 s",
    "An estimate, not yet measured: the image serves the built-in model under --memory 4g.",
    "a directory listing every 10 s, at most 5 ms per wait with no wake-up",
    "a wake-up this late: frozen (a CFS quota stops a thread for under 0.1 s)",
    'the default drain, 120 s (docs/bench.md, "The drain window: why 120 s")',
]


def test_the_checker_tells_figures_from_facts():
    missed = [text for text in MUST_MATCH if not figures_in(text)]
    wrong = [(text, figures_in(text)) for text in MUST_NOT_MATCH if figures_in(text)]
    assert not missed and not wrong, f"not found: {missed}\nfound in facts: {wrong}"


def test_a_figure_is_reported_at_its_line(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        '"""A module.\n\nIt waited\n5-23 s."""\n\nX = 1  # fine\n# two lines, then\n# ~13 ms of CPU\n'
    )
    assert offenders(module, tmp_path) == [
        "m.py:3: time spent: 'waited 5-23 s'",
        "m.py:4: range: '5-23 s'",
        "m.py:8: approximation: '~13 ms'",
    ]
