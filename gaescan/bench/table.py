"""Output of ``gaescan bench``: the text table, JSON, CSV and the plot."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from typing import Any

_CSV_FIELDS = ("shape", "B", "T", "dtype", "layout", "flags", "method", "kind", "device", "status", "median_s",
               "speedup", "gbps", "roofline_gbps", "roofline_frac", "bytes", "bytes_per_step", "detail")


def fmt_time(seconds: float | None) -> str:
    """``0.0528`` -> ``"52.8 ms"`` (3 significant digits, s / ms / us)."""
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale or unit == "us":
            x = seconds / scale
            return f"{x:.3g} {unit}" if x < 1000 else f"{x:.0f} {unit}"
    return "-"  # pragma: no cover


def _ratio(x: float | None, digits: int = 2) -> str:
    if x is None:
        return ""
    return f"{x:.{digits}g}x" if x < 10 else f"{x:.0f}x"


def _unique(seq: Sequence[Any]) -> list[Any]:
    return list(dict.fromkeys(seq))


def format_table(result: dict[str, Any]) -> str:
    """The human-readable table: one block per (dtype, layout); rows are shapes
    (times flags), columns are methods.

    Each row has four lines: the median time (or ``WRONG`` / ``error`` /
    ``n/a``), the speed-up against the serial loop, the achieved bandwidth and
    its fraction of the roofline measured in the same run.
    """
    recs = result["results"]
    meta = result["meta"]
    methods = _unique([r["method"] for r in recs]) or list(meta.get("methods", {}))
    lines = [
        f"gaescan bench: GAE (gamma={meta['gamma']}, lam={meta['lam']}), median of {meta['repeat']} timed runs "
        f"after warm-up; every cell checked against a float64 reference first",
        f"gaescan {meta['gaescan']}, numpy {meta['numpy']}, numba {meta['numba']}, python {meta['python']}, "
        f"{meta['cpu_count']} CPUs; {meta['date']}",
    ]
    footnotes: list[str] = []
    na: dict[str, set[str]] = {}
    wl = max([len("shape flags")] + [len(f"{r['shape']} {r['flags']}") for r in recs]) + 2
    cw = max([11] + [len(m) + 2 for m in methods])
    for dtype in _unique([r["dtype"] for r in recs]):
        for layout in _unique([r["layout"] for r in recs if r["dtype"] == dtype]):
            block = [r for r in recs if r["dtype"] == dtype and r["layout"] == layout]
            axis = {"batch-major": "[B, T], axis=-1", "time-major": "[T, B], axis=0",
                    "packed": "1-D, cu_seqlens, about B segments of B*T steps"}.get(layout, layout)
            bps = _unique([f"{r['flags']}: {r['bytes_per_step']}" for r in block])
            lines += ["", f"{dtype}, {layout} ({axis}); bytes/step {', '.join(bps)}"]
            lines.append("shape flags".ljust(wl) + "".join(m.rjust(cw) for m in methods) + "   roofline")
            lines.append("-" * (wl + cw * len(methods) + 12))
            for key in _unique([(r["shape"], r["flags"]) for r in block]):
                row = {r["method"]: r for r in block if (r["shape"], r["flags"]) == key}
                t_cells, s_cells, g_cells, f_cells = [], [], [], []
                roofs = []
                for m in methods:
                    r = row.get(m)
                    if r is None:
                        cells = ("", "", "", "")
                    elif r["status"] == "ok":
                        cells = (fmt_time(r["median_s"]), _ratio(r["speedup"]), f"{r['gbps']:.3g}",
                                 f"{r['roofline_frac']:.2f}")
                        roofs.append(f"{r['roofline_gbps']:.3g}" + (" (gpu)" if r["device"] == "gpu" else ""))
                    elif r["status"] == "n/a":
                        na.setdefault(m, set()).add(r["detail"])
                        cells = ("n/a", "", "", "")
                    else:
                        label = "WRONG" if r["status"] == "wrong" else "error"
                        footnotes.append(f"{label}: {m} on {key[0]} {dtype} {layout} {key[1]}: {r['detail']}")
                        cells = (f"{label}[{len(footnotes)}]", "", "", "")
                    for lst, c in zip((t_cells, s_cells, g_cells, f_cells), cells, strict=True):
                        lst.append(c)
                label = f"{key[0]} {key[1]}"
                lines.append(label.ljust(wl) + "".join(c.rjust(cw) for c in t_cells))
                lines.append("  vs serial".ljust(wl) + "".join(c.rjust(cw) for c in s_cells))
                roof = " / ".join(_unique(roofs))
                lines.append("  GB/s".ljust(wl) + "".join(c.rjust(cw) for c in g_cells)
                             + (f"   {roof} GB/s" if roof else ""))
                lines.append("  x roofline".ljust(wl) + "".join(c.rjust(cw) for c in f_cells))
    lines += ["", "methods:"]
    for m in methods:
        lines.append(f"  {m:<10s} {meta.get('methods', {}).get(m, '')}")
    roof_names = _unique([r["name"] for r in result.get("rooflines", [])])
    lines.append("GB/s = bytes/step x steps / median time; roofline = "
                 + (" and ".join(roof_names) if roof_names else "(none measured)")
                 + " over the same element count, measured in this run; x roofline = GB/s / roofline GB/s.")
    for m, why in na.items():
        lines.append(f"n/a: {m}: {'; '.join(sorted(why))}")
    for i, note in enumerate(footnotes, 1):
        lines.append(f"[{i}] {note}")
    for note in meta.get("notes", []):
        lines.append(f"note: {note}")
    lines.append(f"({meta['seconds']:.1f} s)")
    return "\n".join(lines)


def write_json(result: dict[str, Any], path: str) -> None:
    """Write the whole result (meta, every cell with its individual times, rooflines)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


def write_csv(result: dict[str, Any], path: str) -> None:
    """Write one row per cell (no per-run times; see the JSON for those)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=_CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in result["results"]:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in _CSV_FIELDS})


def plot(result: dict[str, Any], path: str) -> None:
    """Time against T, log-log, one line per method, one panel per (dtype,
    layout, flags), with the roofline time of the same bytes as a dashed line.

    matplotlib is imported here only (``pip install matplotlib``).
    """
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    recs = result["results"]
    panels = _unique([(r["dtype"], r["layout"], r["flags"]) for r in recs])
    # One colour per method across all panels.
    colors = {m: f"C{i % 10}" for i, m in enumerate(_unique([r["method"] for r in recs]))}
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(5.5 * max(len(panels), 1), 4.5), squeeze=False)
    for ax, (dtype, layout, flags) in zip(axes[0], panels, strict=False):
        block = [r for r in recs if (r["dtype"], r["layout"], r["flags"]) == (dtype, layout, flags)]
        for m in _unique([r["method"] for r in block]):
            pts = sorted((r["T"], r["median_s"]) for r in block if r["method"] == m and r["status"] == "ok")
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=colors[m], label=m)
        for device, style in (("cpu", "k--"), ("gpu", "k:")):
            roof = sorted({(r["T"], r["bytes"] / (r["roofline_gbps"] * 1e9), r["shape"]) for r in block
                           if r["status"] == "ok" and r["device"] == device})
            if roof:
                ax.plot([p[0] for p in roof], [p[1] for p in roof], style,
                        label=f"roofline ({'triad' if device == 'cpu' else 'D2D copy'}): same bytes")
                for T, t, shape in roof:  # rows may differ in B: name each point's shape
                    ax.annotate(shape, (T, t), fontsize=6, textcoords="offset points", xytext=(3, -8))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("T (steps per row)")
        ax.set_ylabel("median time (s)")
        title = f"GAE {dtype}, {flags}" + ("" if layout == "packed" else f", {layout}")
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
