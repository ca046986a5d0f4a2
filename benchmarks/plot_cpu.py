"""Plot ``× triad`` per case from committed ``cpu_bench.py`` results, one series per machine.

Run: ``python benchmarks/plot_cpu.py [RESULT ...] [--out docs/img/cpu-x-triad.svg]``.
Without arguments it reads every ``benchmarks/results/*cpu_bench*.txt`` that
``benchmarks/cpu_bench.py`` wrote (those with a ``machine:`` header line),
the newest file per machine (the median of its runs, where it holds
several).  The output is a plain SVG (no plotting library
needed): one group of bars per case, one bar per machine, and a line at each
target the table states.
"""

from __future__ import annotations

import argparse
import glob
import html
import os
import re
import statistics

_ROW = re.compile(r"^(?P<name>.+?)\s+(?P<median>[\d.]+)(?P<unit>ms|us)\s+(?P<per>\d+)\s+(?P<gbs>[\d.]+)\s+"
                  r"(?P<ratio>[\d.]+)\s*(?P<note>.*)$")
_TARGET = re.compile(r"target >= ([\d.]+)x")
_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def parse(path: str) -> tuple[str, str, list[tuple[str, float, float | None]]] | None:
    """``(machine, date, [(case, x_triad, target), ...])`` of one result file, or
    ``None`` when it is not a ``cpu_bench.py`` table with a machine header."""
    machine = date = model = None
    cases = []
    with open(path) as f:
        for line in f:
            # A header line written by hand may name the CPU's family and model, which
            # cpu_bench.py's own line does not: two machines of one vendor stay apart.
            fam = re.search(r"machine:.*?\((family \d+, model \d+[^)]*)\)", line)
            if line.startswith("#") and fam and model is None:
                model = fam.group(1)
            if line.startswith("#") and "machine:" in line:
                date = line[1:].split(";", 1)[0].strip()[:10]
                # cpu_bench.py's own line names the family and model too: the vendor
                # name is what precedes them.
                head = re.sub(r"\s*\(family \d+, model \d+[^)]*\)", "", line.split("machine:", 1)[1])
                machine = head.split(",", 1)[0].strip()
                cores = re.search(r"(\d+) logical CPUs", line)
                if cores:
                    machine += f", {cores.group(1)} CPUs"
                continue
            m = _ROW.match(line.rstrip())
            if m is None or m["name"].startswith("STREAM"):
                continue
            t = _TARGET.search(m["note"])
            cases.append((m["name"].strip(), float(m["ratio"]), float(t.group(1)) if t else None))
    if machine is None or not cases:
        return None
    if model is not None:
        machine = machine.replace(",", f" ({model}),", 1)
    return machine, date, cases


def svg(series: list[tuple[str, str, list]], title: str) -> str:
    names: list[str] = []
    targets: dict[str, float] = {}
    for _, _, cases in series:
        for name, _, target in cases:
            if name not in names:
                names.append(name)
            if target is not None:
                targets[name] = target
    top = max([1.0] + [x for _, _, cases in series for _, x, _ in cases]) * 1.1
    left, width, bar = 330, 420, 12
    group = bar * len(series) + 10
    height = 60 + group * len(names) + 20 * len(series) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 40}" height="{height}" '
           'font-family="sans-serif" font-size="11">',
           f'<text x="10" y="18" font-size="13">{html.escape(title)}</text>']
    y0 = 40

    def x(val: float) -> float:
        return left + width * val / top

    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        if tick <= top:
            out.append(f'<line x1="{x(tick):.1f}" y1="{y0 - 5}" x2="{x(tick):.1f}" '
                       f'y2="{y0 + group * len(names)}" stroke="#ddd"/>')
            out.append(f'<text x="{x(tick):.1f}" y="{y0 - 8}" text-anchor="middle">{tick:g}×</text>')
    for i, name in enumerate(names):
        gy = y0 + i * group
        out.append(f'<text x="{left - 6}" y="{gy + group / 2:.1f}" text-anchor="end" '
                   f'dominant-baseline="middle">{html.escape(name)}</text>')
        for j, (_, _, cases) in enumerate(series):
            # A file of several runs: the median of its runs' ratios.
            runs = [r for n, r, _ in cases if n == name]
            if not runs:
                continue
            val = statistics.median(runs)
            out.append(f'<rect x="{left}" y="{gy + j * bar}" width="{x(val) - left:.1f}" height="{bar - 2}" '
                       f'fill="{_COLOURS[j % len(_COLOURS)]}"><title>{val:.2f}×</title></rect>')
            out.append(f'<text x="{x(val) + 3:.1f}" y="{gy + j * bar + bar / 2:.1f}" '
                       f'dominant-baseline="middle" font-size="9">{val:.2f}</text>')
        if name in targets:
            tx = x(targets[name])
            out.append(f'<line x1="{tx:.1f}" y1="{gy}" x2="{tx:.1f}" y2="{gy + group - 8}" '
                       'stroke="black" stroke-dasharray="3,2"/>')
    ly = y0 + group * len(names) + 15
    for j, (machine, date, _) in enumerate(series):
        out.append(f'<rect x="{left}" y="{ly + 20 * j}" width="12" height="12" '
                   f'fill="{_COLOURS[j % len(_COLOURS)]}"/>')
        out.append(f'<text x="{left + 18}" y="{ly + 20 * j + 10}">{html.escape(machine)} ({date})</text>')
    out.append(f'<text x="10" y="{ly + 10}" font-size="9">dashed: target</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _stamp(path: str) -> str:
    """The time ``cpu_bench.py`` wrote on its header line (``YYYY-MM-DD HH:MM``,
    the last one in the file), else the file's name: the order of runs."""
    stamp = ""
    with open(path) as f:
        for line in f:
            m = re.match(r"#\s*(\d{4}-\d{2}-\d{2} \d{2}:\d{2}) UTC; machine:", line)
            if m:
                stamp = m.group(1)
    return stamp or os.path.basename(path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="*")
    ap.add_argument("--out", default=os.path.join("docs", "img", "cpu-x-triad.svg"))
    args = ap.parse_args(argv)
    paths = args.results or sorted(glob.glob(os.path.join("benchmarks", "results", "*cpu_bench*.txt")),
                                   key=_stamp)
    newest: dict[str, tuple] = {}
    for path in paths:
        parsed = parse(path)
        if parsed is not None:
            newest[parsed[0]] = parsed  # sorted by run time: the newest last
    if not newest:
        raise SystemExit("no cpu_bench.py result with a machine header found")
    with open(args.out, "w") as f:
        f.write(svg(list(newest.values()), "gaescan \"numba\" backend: effective bandwidth / STREAM triad, same run"))
    print(f"wrote {args.out}: {', '.join(newest)}")


if __name__ == "__main__":
    main()
