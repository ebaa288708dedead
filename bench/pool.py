"""python -m bench.pool RESULT.json... [--figure TEXT]: the same figure of several bench runs pooled.

One run of a noisy figure (section limits on a shared 2-core host: one round of two alike servers
can differ by a quarter) gives an interval too wide to judge a 5 % goal, and a run's median moves
with the hour. Pooling the rounds of runs that measured the same arms with the same code gives the
interval of all of them, judged like a run's (stats.verdict), with each run's median beside it so
that a run unlike the others shows. Which runs are alike is the caller's claim: the tool pools
figures by their exact name and prints each run's file and date.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

from . import stats


def load(paths: list[str], figure: str | None) -> dict[str, list[tuple[str, dict]]]:
    """{figure: [(run label, row), ...]} over the files, in the order given."""
    rows: dict[str, list[tuple[str, dict]]] = {}
    for path in paths:
        data = json.loads(pathlib.Path(path).read_text())
        label = f"{pathlib.Path(path).name} ({data['machine'].get('date', '?')[:16]})"
        for row in data["rows"]:
            if row.get("ratio") and (figure is None or figure in row["figure"]):
                rows.setdefault(row["figure"], []).append((label, row))
    return rows


def pooled(runs: list[tuple[str, dict]]) -> tuple[list[float], stats.Interval | None]:
    ratios = [r for _, row in runs for r in row["ratio"]]
    return ratios, stats.interval(ratios)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pool", description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", help="bench JSON files (bench/results/*.json)")
    p.add_argument("--figure", default=None, help="only figures whose name contains this")
    args = p.parse_args(argv)
    rows = load(args.results, args.figure)
    if not rows:
        print("no figure with ratios in those files", file=sys.stderr)
        return 1
    for figure, runs in rows.items():
        ratios, iv = pooled(runs)
        goal = runs[0][1].get("goal", "")
        judged = stats.verdict(goal, iv) if goal else None
        print(f"{figure}: {len(runs)} run(s), {len(ratios)} pairs")
        for label, row in runs:
            print(f"  {label}: median {statistics.median(row['ratio']):.3f} of {len(row['ratio'])}")
        verdict = {True: "met", False: "not met", None: "no goal"}.get(judged, judged)
        print(
            f"  pooled: median {iv.median:.3f} {iv.text()}"
            + (f"; {goal}: {verdict}" if goal else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
