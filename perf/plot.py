"""Draws perf/run.sh's results as one SVG chart.

Input: the raw loadgen results of a run, one JSON object per line (the lines
perf/out/last-run.md lists), each with scenario, label (server, ceiling,
baseline), rps and the latency percentiles p50_us, p90_us, p99_us, p999_us.
Every figure is the median over the run's rounds, as in the table.

Output: two panels, one above the other.
- Throughput per scenario: hf3fs-meta beside the bare-hyper ceiling (and the
  --baseline server when there is one), with server/ceiling over each group.
- Latency percentiles per scenario (log scale): p50, p90, p99 and p99.9 of
  each target.

perf/run.sh calls this with the Python of a scratch venv it makes
(perf/plot-requirements.txt); perf/chart.sh calls it with two runs' results
(vLLM's scenarios against vLLM's own server, SGLang's against SGLang's), the
baseline named for what it is, and a note on how the chart was made; by hand:
    python perf/plot.py --results results.jsonl [--results more.jsonl]
        --out perf/out/last-run.svg --title "..." [--baseline-name NAME] [--note TEXT]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

LABELS = ["server", "ceiling", "baseline"]
NAMES = {"server": "hf3fs-meta", "ceiling": "bare hyper (ceiling)", "baseline": "baseline"}
COLORS = {"server": "#1f77b4", "ceiling": "#b0b0b0", "baseline": "#ff7f0e"}
PERCENTILES = [("p50_us", "p50"), ("p90_us", "p90"), ("p99_us", "p99"), ("p999_us", "p99.9")]
HATCHES = ["", "//", "xx", ".."]


def medians(paths: list[str]) -> tuple[list[str], dict[tuple[str, str], dict[str, float]]]:
    runs: dict[tuple[str, str], list[dict]] = defaultdict(list)
    scenarios: list[str] = []
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line)
                if r["scenario"].startswith("_"):  # not a loadgen run (e.g. "_memory")
                    continue
                if r["scenario"] not in scenarios:
                    scenarios.append(r["scenario"])
                runs[(r["scenario"], r["label"])].append(r)
    out = {}
    for key, rs in runs.items():
        fields = ["rps"] + [p for p, _ in PERCENTILES]
        out[key] = {f: statistics.median(r[f] for r in rs) for f in fields if all(f in r for r in rs)}
    return scenarios, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", required=True, action="append", help="loadgen JSON lines (repeatable)")
    ap.add_argument("--out", required=True, help="SVG file to write")
    ap.add_argument("--title", default="hf3fs-meta perf run")
    ap.add_argument("--baseline-name", default=NAMES["baseline"], help="the legend's name of the baseline")
    ap.add_argument("--note", default="", help="how the chart was made, printed under the title")
    args = ap.parse_args()
    NAMES["baseline"] = args.baseline_name

    scenarios, med = medians(args.results)
    labels = [l for l in LABELS if any((s, l) in med for s in scenarios)]
    if not scenarios or "server" not in labels:
        raise SystemExit(f"plot.py: no server results in {args.results}")

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "hf3fs-meta", "font.size": 9})
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 9.6 if args.note else 9), constrained_layout=True)
    fig.suptitle(args.title + (f"\n{args.note}" if args.note else ""), fontsize=10)
    x = range(len(scenarios))

    # Throughput.
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        xs = [j - 0.4 + width * (i + 0.5) for j in x]
        ys = [med.get((s, label), {}).get("rps", 0) for s in scenarios]
        bars = top.bar(xs, ys, width, label=NAMES[label], color=COLORS[label], edgecolor="black", linewidth=0.4)
        top.bar_label(bars, labels=[f"{y / 1000:.1f}k" if y else "" for y in ys], fontsize=7, padding=1)
    for j, s in enumerate(scenarios):
        srv = med.get((s, "server"), {}).get("rps")
        ceil = med.get((s, "ceiling"), {}).get("rps")
        base = med.get((s, "baseline"), {}).get("rps")
        if srv and ceil:
            top_y = max(med.get((s, l), {}).get("rps", 0) for l in labels)
            text = f"{srv / ceil:.2f}× ceiling"
            if base is not None and base >= 100:
                text += f"\n{srv / base:.1f}× baseline"
            elif base is not None:
                # A ratio to a server that stalled says nothing useful.
                text += f"\nbaseline stalled ({base:.1f}/s)"
            top.annotate(text, (j, top_y), xytext=(0, 12), textcoords="offset points",
                         ha="center", fontsize=8, fontweight="bold")
    top.set_xticks(list(x), scenarios)
    top.set_ylabel("requests/s (median over rounds)")
    top.set_title("Throughput per endpoint scenario", fontsize=9)
    top.margins(y=0.2)
    top.legend(loc="upper right", fontsize=8)
    top.grid(axis="y", alpha=0.3)

    # Latency percentiles.
    groups = [(label, p, name) for label in labels for p, name in PERCENTILES]
    width = 0.8 / len(groups)
    for i, (label, p, name) in enumerate(groups):
        xs = [j - 0.4 + width * (i + 0.5) for j in x]
        ys = [med.get((s, label), {}).get(p, float("nan")) for s in scenarios]
        k = [q for q, _ in PERCENTILES].index(p)
        bottom.bar(xs, ys, width, color=COLORS[label], hatch=HATCHES[k], edgecolor="black", linewidth=0.4,
                   label=f"{NAMES[label]} {name}")
    bottom.set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    bottom.yaxis.set_major_formatter(plain)
    bottom.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(
        lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))
    bottom.set_xticks(list(x), scenarios)
    bottom.set_ylabel("latency, µs (log scale; closed loop, includes queueing)")
    bottom.set_title("Latency percentiles per endpoint scenario", fontsize=9)
    bottom.grid(axis="y", which="both", alpha=0.3)
    bottom.legend(ncol=len(labels), fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.08), frameon=False)

    fig.savefig(args.out, format="svg", metadata={"Date": None})


if __name__ == "__main__":
    main()
