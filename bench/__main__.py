"""python -m bench [--quick] [--repeat N] [--only drain,overhead,patches,idle,limits,stall,image,metrics,rolling,memory,real,runtime]

Measures each figure for our variant and its alternative in one run on this machine, alternating
A/B/A/B so drift hits both alike, prints a Markdown table (min / median / max of the repeats) and
writes bench/results/latest.json. docs/bench.md explains every figure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
import traceback

from . import stats
from .common import RAW, RESULTS, Row, cell, log, spread

SECTIONS = (
    "image",
    "metrics",
    "overhead",
    "idle",
    "limits",
    "stall",
    "patches",
    "drain",
    "rolling",
    "memory",
    "real",
    "runtime",
)  # cheapest first: a partial run keeps the most


def machine() -> dict:
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import importlib.metadata as md

        vllm = md.version("vllm")
    except Exception:
        vllm = "unknown"
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "loadavg_at_start": os.getloadavg(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "vllm": vllm,
    }


def table(rows: list[Row], info: dict, args) -> str:
    la = " ".join(f"{x:.2f}" for x in info["loadavg_at_start"])
    out = [
        f"Measured {info['date']} on {info['nproc']} x {info['cpu']}, load average at start "
        f"{la}; vLLM {info['vllm']}; repeats {args.repeat}{' (--quick)' if args.quick else ''}.",
        "Cells: min / median / max over the repeats (one value: one sample). Ratio: ours / "
        f"alternative, per A/B pair; its {stats.LEVEL:.0%} interval is the median's (sign test). "
        "A `ratio` goal is met when the whole interval meets it (docs/bench.md, method).",
        "",
        f"| section | figure | unit | ours | alternative | ratio | {stats.LEVEL:.0%} interval "
        "| goal | met |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        iv = stats.interval(r.ratio)
        met = {True: "yes", False: "**no**", None: ""}.get(r.met, r.met)
        out.append(
            f"| {r.section} | {r.figure} | {r.unit} | {cell(r.ours, r.fmt)} | "
            f"{cell(r.alt, r.fmt)} | {cell(r.ratio, '{:.3f}')} | {iv.text() if iv else ''} | "
            f"{r.goal} | {met} |"
        )
    notes = [f"- {r.section} / {r.figure}: {r.note}" for r in rows if r.note]
    if notes:
        out += ["", "Notes:"] + notes
    return "\n".join(out)


def save(path, rows, info, args, done, failed) -> None:
    data = {
        "machine": info,
        "args": vars(args),
        "sections_done": done,
        "sections_failed": failed,
        "rows": [
            dict(
                vars(r),
                ours_spread=spread(r.ours),
                alt_spread=spread(r.alt),
                ratio_spread=spread(r.ratio),
                ratio_interval=stats.as_dict(stats.interval(r.ratio)),
            )
            for r in rows
        ],
        "runs": RAW,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick", action="store_true", help="1 repeat, fewer/smaller cases (development)"
    )
    p.add_argument("--repeat", type=int, default=None, help="repeats of each figure (default 3)")
    p.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections (default all: {','.join(SECTIONS)})",
    )
    p.add_argument("--out", default=str(RESULTS / "latest.json"), help="JSON output file")
    p.add_argument(
        "--limits-arms",
        default=None,
        help="section limits: comma-separated arms to run (default all; e.g. quota+plan,cpuset "
        "for more rounds of the goal's pair in the same time)",
    )
    p.add_argument(
        "--limits-starts",
        type=int,
        default=1,
        help="section limits: start the arms this many times (fresh containers, rotated start "
        "order), the rounds split between the starts",
    )
    p.add_argument(
        "--limits-shape",
        default=None,
        help="section limits: a shape of tools/build_model.py (e.g. qwen2.5-0.5b) served instead "
        "of the built-in tiny model, with fewer tokens per round",
    )
    p.add_argument(
        "--real-shapes",
        default=None,
        help="section real: comma-separated shapes of tools/build_model.py (default "
        "qwen2.5-0.5b,llama-3.2-1b; --quick: qwen2.5-0.5b)",
    )
    p.add_argument(
        "--real-drains",
        default=None,
        help="section real: comma-separated answer lengths of the drain runs (default "
        "256,512,1024); the speeds run stays, it makes the drain runs' starts warm",
    )
    p.add_argument(
        "--runtime-shapes",
        default=None,
        help="section runtime: comma-separated shapes of tools/build_model.py (default "
        "qwen2.5-0.5b,llama-3.2-1b; --quick: qwen2.5-0.5b)",
    )
    p.add_argument(
        "--runtime-quota",
        choices=("both", "off", "on"),
        default=None,
        help="section runtime: the CPU settings, each a start of the arms of its own: off = the "
        "host's CPUs, on = --cpus 1, both (default; --quick: off)",
    )
    p.add_argument(
        "--runtime-arms",
        help="section runtime: comma-separated arms of bare, upstream, ours, ours-spin (default "
        "all; ours and upstream always run): fewer arms for a shape whose memory limits do not "
        "fit the host four times",
    )
    p.add_argument(
        "--runtime-starts",
        type=int,
        default=1,
        help="section runtime: start the arms this many times per shape and setting (fresh "
        "containers and compile caches, the start order rotated), the rounds split between the "
        "starts (default 1)",
    )
    return p


def section_options(name: str, args: argparse.Namespace) -> dict:
    """The options of section `name`'s run() (keyword arguments beside repeat and quick)."""
    return {
        "limits": {
            "arms": args.limits_arms,
            "starts": args.limits_starts,
            "shape": args.limits_shape,
        },
        "real": {"shapes": args.real_shapes, "drains": args.real_drains},
        "runtime": {
            "shapes": args.runtime_shapes,
            "quota": args.runtime_quota,
            "arms": args.runtime_arms,
            "starts": args.runtime_starts,
        },
    }.get(name, {})


def main(argv: list[str]) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        p.error(f"unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}")
    import importlib
    import pathlib

    out = pathlib.Path(args.out)
    info = machine()
    log(f"machine: {info}")
    rows: list[Row] = []
    done, failed = [], {}
    t0 = time.monotonic()
    for name in SECTIONS:
        if name not in only:
            continue
        log(f"section {name} ...")
        t = time.monotonic()
        try:
            module = importlib.import_module(f"bench.{name}")
            rows += module.run(args.repeat, args.quick, **section_options(name, args))
            done.append(name)
        except Exception as e:  # a broken section must not cost the others' results
            traceback.print_exc()
            failed[name] = f"{type(e).__name__}: {e}"[:500]
            rows.append(
                Row(
                    name,
                    "section failed",
                    "",
                    [],
                    [],
                    [],
                    "",
                    False,
                    note=failed[name].splitlines()[0],
                )
            )
        for r in rows:  # a ratio goal is judged by its interval, whatever the section said
            judged = stats.verdict(r.goal, stats.interval(r.ratio))
            if judged is not None:
                r.met = judged
        log(f"section {name} took {time.monotonic() - t:.0f} s")
        save(out, rows, info, args, done, failed)
    text = table(rows, info, args)
    print(text)
    (out.with_suffix(".md")).write_text(text + "\n")
    log(f"total {time.monotonic() - t0:.0f} s; wrote {out} and {out.with_suffix('.md')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
