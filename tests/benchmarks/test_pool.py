"""bench/pool.py: a figure of several bench runs pooled into one interval, judged like a run's."""

from __future__ import annotations

import json

from bench import pool, stats


def result(path, date, figures: dict[str, list[float]], goal="ratio >= 0.95"):
    rows = [{"figure": f, "ratio": r, "goal": goal} for f, r in figures.items()]
    rows.append({"figure": "a figure without pairs", "ratio": [], "goal": ""})
    path.write_text(json.dumps({"machine": {"date": date}, "rows": rows}))
    return str(path)


def test_the_pooled_interval_is_over_every_runs_pairs_and_judged(tmp_path, capsys):
    # Neither run alone resolves the goal (six pairs: the interval is [min, max]); both together do.
    a = [0.97, 1.02, 0.96, 1.05, 0.99, 0.90]
    b = [1.01, 0.98, 1.04, 0.97, 1.00, 1.06, 0.99, 1.03, 0.98, 1.02, 1.01, 0.97, 1.05, 0.96]
    files = [
        result(tmp_path / "one.json", "2026-12-02T01:05:00", {"x vs y": a, "other": [2.0] * 6}),
        result(tmp_path / "two.json", "2026-12-02T03:09:00", {"x vs y": b}),
    ]
    assert stats.verdict("ratio >= 0.95", stats.interval(a)) == "not resolved"
    rows = pool.load(files, "x vs")
    assert list(rows) == ["x vs y"]
    ratios, iv = pool.pooled(rows["x vs y"])
    assert sorted(ratios) == sorted(a + b) and iv.n == 20
    assert stats.verdict("ratio >= 0.95", iv) is True

    assert pool.main(files + ["--figure", "x vs"]) == 0
    out = capsys.readouterr().out
    assert "x vs y: 2 run(s), 20 pairs" in out
    assert "one.json (2026-12-02T01:05): median 0.980 of 6" in out
    assert iv.contains(1.0)
    assert (
        f"pooled: median {iv.median:.3f} [{iv.low:.3f}, {iv.high:.3f}] n=20: not distinguishable "
        "from 1; ratio >= 0.95: met" in out
    )
    assert "other" not in out


def test_no_matching_figure_is_an_error(tmp_path, capsys):
    files = [result(tmp_path / "one.json", "2026-12-02", {"x vs y": [1.0] * 6})]
    assert pool.main(files + ["--figure", "nothing like it"]) == 1
    assert "no figure" in capsys.readouterr().err
