"""Draw the semantics diagram (``docs/img/semantics.svg``) as plain SVG.

Run ``python docs/_ext/diagrams.py`` after changing it; the test suite checks that
the committed SVG is this script's output.  No dependencies.
"""

from __future__ import annotations

import math
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "img" / "semantics.svg"

W = 760
BOX = 46  # step box width
GAP = 14
X0 = 40
FONT = "font-family='Helvetica, Arial, sans-serif'"

COL = {
    "step": "#e8f0fe", "stroke": "#3b5bdb", "masked": "#eeeeee", "mstroke": "#aaaaaa",
    "adv": "#3b5bdb", "boot": "#2b8a3e", "cut": "#c92a2a", "text": "#222222", "muted": "#777777",
}


def x_of(i: int) -> float:
    return X0 + i * (BOX + GAP)


class Svg:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, s: str) -> None:
        self.parts.append(s)

    def text(self, x, y, s, size=13, anchor="middle", color=COL["text"], weight="normal", style="normal"):
        self.add(f"<text x='{x:.0f}' y='{y:.0f}' {FONT} font-size='{size}' text-anchor='{anchor}' "
                 f"fill='{color}' font-weight='{weight}' font-style='{style}'>{s}</text>")

    def box(self, i, y, label, masked=False, sub=None):
        fill, stroke = (COL["masked"], COL["mstroke"]) if masked else (COL["step"], COL["stroke"])
        dash = " stroke-dasharray='4 3'" if masked else ""
        self.add(f"<rect x='{x_of(i):.0f}' y='{y}' width='{BOX}' height='34' rx='5' fill='{fill}' "
                 f"stroke='{stroke}' stroke-width='1.5'{dash}/>")
        self.text(x_of(i) + BOX / 2, y + 22, label, size=11 if len(label) > 4 else 13,
                  color=COL["muted"] if masked else COL["text"])
        if sub is not None:
            self.text(x_of(i) + BOX / 2, y + 52, sub, size=11, color=COL["muted"])

    def arrow(self, x1, y1, x2, y2, color, dashed=False, curve=0.0):
        """A line or quadratic curve from (x1, y1) to (x2, y2) with a drawn arrowhead
        (a polygon, not an SVG marker, so every renderer points it the same way)."""
        dash = " stroke-dasharray='5 4'" if dashed else ""
        if curve:
            cx, cy = (x1 + x2) / 2, min(y1, y2) - curve
            d = f"M{x1:.1f},{y1:.1f} Q{cx:.1f},{cy:.1f} {x2:.1f},{y2:.1f}"
        else:
            cx, cy = x1, y1
            d = f"M{x1:.1f},{y1:.1f} L{x2:.1f},{y2:.1f}"
        self.add(f"<path d='{d}' fill='none' stroke='{color}' stroke-width='1.8'{dash}/>")
        # arrowhead along the end tangent (control point -> end point)
        dx, dy = x2 - cx, y2 - cy
        n = math.hypot(dx, dy) or 1.0
        ux, uy = dx / n, dy / n
        L, H = 9.0, 4.0
        bx, by = x2 - L * ux, y2 - L * uy
        pts = [(x2, y2), (bx - H * uy, by + H * ux), (bx + H * uy, by - H * ux)]
        self.add(f"<polygon points='{' '.join(f'{px:.1f},{py:.1f}' for px, py in pts)}' fill='{color}'/>")

    def adv_link(self, src, dst, y, curve=16.0):
        """``A_src`` feeds ``A_dst`` (dst earlier in time): an arrow above the boxes."""
        self.arrow(x_of(src) + BOX / 2 - 4, y - 2, x_of(dst) + BOX / 2 + 4, y - 2, COL["adv"], curve=curve)

    def cut(self, i, y):
        """A red bar after step ``i``: nothing flows backwards across it."""
        x = x_of(i) + BOX + GAP / 2
        self.add(f"<line x1='{x:.0f}' y1='{y - 26}' x2='{x:.0f}' y2='{y + 40}' stroke='{COL['cut']}' "
                 f"stroke-width='3'/>")

    def render(self, height: int) -> str:
        body = "\n".join(self.parts)
        return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{height}' "
                f"viewBox='0 0 {W} {height}' role='img' aria-label='gaescan semantics: "
                f"terminated vs truncated, masks, packed sequences'>\n"
                f"<rect width='{W}' height='{height}' fill='white'/>\n{body}\n</svg>\n")


def draw() -> str:
    s = Svg()

    # 1. terminated vs truncated ------------------------------------------------------
    y = 62
    s.text(X0 - 20, 24, "1. One row, three episodes: terminated vs truncated", size=15, anchor="start",
           weight="bold")
    labels = ["t=0", "t=1", "t=2", "t=3", "t=4", "t=5", "t=6", "t=7"]
    subs = ["", "", "term", "", "trunc", "", "", "end"]
    for i, lab in enumerate(labels):
        s.box(i, y, lab, sub=subs[i] or None)
    for src, dst in ((2, 1), (1, 0), (4, 3), (6, 5), (7, 6)):
        s.adv_link(src, dst, y)
    s.cut(2, y)
    s.cut(4, y)
    # truncation: bootstrap from V(final observation)
    fx = x_of(4) + BOX / 2
    s.add(f"<circle cx='{fx + 50:.0f}' cy='{y + 90}' r='17' fill='white' stroke='{COL['boot']}' "
          f"stroke-width='1.5' stroke-dasharray='4 3'/>")
    s.text(fx + 50, y + 94, "V(s′)", size=11, color=COL["boot"])
    s.arrow(fx + 40, y + 76, fx + 22, y + 37, COL["boot"])
    s.text(fx + 72, y + 94, "next_values[4]: value of the final observation", size=12, anchor="start",
           color=COL["boot"])
    # termination: no bootstrap
    s.text(x_of(2) + BOX / 2, y + 78, "δ = r − V", size=12, color=COL["cut"])
    s.text(x_of(2) + BOX / 2, y + 94, "(no bootstrap)", size=11, color=COL["cut"])
    # end of the rollout: last_value
    ex = x_of(7) + BOX
    s.add(f"<circle cx='{ex + 40:.0f}' cy='{y + 17}' r='17' fill='white' stroke='{COL['boot']}' "
          f"stroke-width='1.5' stroke-dasharray='4 3'/>")
    s.text(ex + 40, y + 21, "V", size=12, color=COL["boot"])
    s.arrow(ex + 22, y + 17, ex + 3, y + 17, COL["boot"])
    s.text(ex + 40, y + 52, "last_value", size=11, color=COL["boot"])
    s.text(X0 - 20, y + 126, "Blue: the later advantage feeds the earlier one (γλ·A). Red bar: the "
           "advantage sum is cut (terminated or truncated).", size=12, anchor="start", color=COL["muted"])
    s.text(X0 - 20, y + 142, "Green: the bootstrap value V′ in δ = r + γV′ − V (a truncation keeps it, "
           "a termination drops it).", size=12, anchor="start", color=COL["muted"])

    # 2. masks ------------------------------------------------------------------------
    y2 = 272
    s.text(X0 - 20, y2 - 38, "2. mask (skip semantics): prompt, tool output and padding are not steps",
           size=15, anchor="start", weight="bold")
    kinds = ["prompt", "prompt", "resp", "resp", "tool", "resp", "resp", "pad"]
    valid = [False, False, True, True, False, True, True, False]
    for i, (k, ok) in enumerate(zip(kinds, valid, strict=True)):
        s.box(i, y2, k, masked=not ok, sub=None if ok else "out 0")
    s.adv_link(3, 2, y2)
    s.adv_link(5, 3, y2, curve=30)
    s.adv_link(6, 5, y2)
    s.text(x_of(4) + BOX / 2, y2 + 70, "V′ and A come from the next unmasked position; "
           "masked inputs are never read", size=12, color=COL["muted"])

    # 3. packed -----------------------------------------------------------------------
    y3 = 412
    s.text(X0 - 20, y3 - 38, "3. cu_seqlens = [0, 3, 3, 8]: sequences packed in one 1-D array", size=15, anchor="start", weight="bold")
    for i in range(8):
        s.box(i, y3, f"{i}")
    for src, dst in ((2, 1), (1, 0), (7, 6), (6, 5), (5, 4), (4, 3)):
        s.adv_link(src, dst, y3)
    s.cut(2, y3)
    for seg, i in ((0, 2), (2, 7)):
        bx = x_of(i) + BOX / 2
        s.text(bx, y3 + 56, f"last_value[{seg}]", size=11, color=COL["boot"])
        s.arrow(bx, y3 + 44, bx, y3 + 37, COL["boot"])
    s.text(x_of(1) + BOX / 2, y3 + 78, "segment 0", size=12, color=COL["muted"])
    s.text(x_of(5) + BOX / 2, y3 + 78, "segment 2 (segment 1 is empty)", size=12, color=COL["muted"])
    return s.render(510)


if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(draw(), encoding="utf-8")
    print(f"wrote {OUT}")
