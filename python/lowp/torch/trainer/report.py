"""The report of ``python -m lowp.torch.trainer --recipes ...`` (compare mode): report.md with
the settings and one row per recipe (final validation loss, tokens/s, ratio to bf16), and
val_loss.svg, validation loss against step, drawn by hand as `lowp compare` does
(tools/report.c), so no plotting library is needed.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

from .checkpoint import write_atomic

__all__ = ["Run", "write_report", "svg"]

# Okabe and Ito's colour-blind-safe palette, as tools/report.c.
COLORS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
          "#F0E442"]
W, H, LEFT, TOP, RIGHT, BOT = 820, 480, 72, 48, 600, 410


@dataclass
class Run:
    recipe: str
    steps: list = field(default_factory=list)  # the step of each evaluation
    val_loss: list = field(default_factory=list)
    final_train_loss: float = math.nan
    tokens_per_s: float = 0.0  # median over updates
    gflops: float = 0.0
    seconds: float = 0.0
    skipped: int = 0
    wrapped: str = ""

    @property
    def final_val(self) -> float:
        return self.val_loss[-1] if self.val_loss else math.nan


def _nice_step(span: float, want: int) -> float:
    if not span > 0:
        return 1.0
    raw = span / want
    p = 10.0 ** math.floor(math.log10(raw))
    m = raw / p
    return (1.0 if m < 1.5 else 2.0 if m < 3.5 else 5.0 if m < 7.5 else 10.0) * p


def _tick(v: float, step: float) -> str:
    dec = 0 if step >= 1 else min(6, math.ceil(-math.log10(step) - 1e-9))
    return f"{0.0 if abs(v) < step * 1e-9 else v:.{dec}f}"


def _frange(a: float, b: float, step: float):
    i = 0
    while a + i * step <= b + step * 1e-6:
        yield a + i * step
        i += 1


def _scales(runs: list[Run]):
    """The plot's axes: (px, py, x ticks, y ticks), px / py mapping a step / a loss to the
    canvas, the ticks as (first, last, step)."""
    xmax = max([1.0] + [float(s) for r in runs for s in r.steps])
    ys = [v for r in runs for v in r.val_loss if math.isfinite(v)]
    ymin, ymax = (min(ys), max(ys)) if ys else (0.0, 1.0)
    if ymax - ymin < 1e-6:
        ymin, ymax = ymin - 0.5, ymax + 0.5
    ystep = _nice_step(ymax - ymin, 6)
    y0, y1 = math.floor(ymin / ystep) * ystep, math.ceil(ymax / ystep) * ystep
    xstep = _nice_step(xmax, 8)
    x1 = math.ceil(xmax / xstep) * xstep

    def px(x):
        return LEFT + x / x1 * (RIGHT - LEFT)

    def py(y):
        return BOT - (y - y0) / (y1 - y0) * (BOT - TOP)

    return px, py, (0.0, x1, xstep), (y0, y1, ystep)


def _grid(px, py, xt, yt) -> list[str]:
    """The grid, the tick labels, the axis titles and the frame."""
    o = ['<g stroke="#dddddd" stroke-width="1">']
    for y in _frange(*yt):
        o.append(f'<line x1="{LEFT}" y1="{py(y):.1f}" x2="{RIGHT}" y2="{py(y):.1f}"/>')
    for x in _frange(*xt):
        o.append(f'<line x1="{px(x):.1f}" y1="{TOP}" x2="{px(x):.1f}" y2="{BOT}"/>')
    o.append('</g>\n<g fill="#333333">')
    for y in _frange(*yt):
        o.append(f'<text x="{LEFT - 8}" y="{py(y) + 4:.1f}" text-anchor="end">'
                 f"{_tick(y, yt[2])}</text>")
    for x in _frange(*xt):
        o.append(f'<text x="{px(x):.1f}" y="{BOT + 18}" text-anchor="middle">'
                 f"{_tick(x, xt[2])}</text>")
    mid = (TOP + BOT) // 2
    o.append(f'<text x="{(LEFT + RIGHT) // 2}" y="{BOT + 42}" text-anchor="middle">step</text>')
    o.append(f'<text x="18" y="{mid}" text-anchor="middle" transform="rotate(-90 18 {mid})">'
             "validation loss (nats/char)</text>\n</g>")
    o.append(f'<rect x="{LEFT}" y="{TOP}" width="{RIGHT - LEFT}" height="{BOT - TOP}" '
             'fill="none" stroke="#333333"/>')
    return o


def _curves(runs: list[Run], px, py) -> list[str]:
    """One group per recipe: polylines broken at non-finite points, a dot per finite one."""
    o = []
    for i, r in enumerate(runs):
        col = COLORS[i % len(COLORS)]
        o.append(f'<g class="recipe" data-recipe="{escape(r.recipe)}">')
        seg: list[str] = []
        for s, v in list(zip(r.steps, r.val_loss)) + [(None, math.nan)]:
            if math.isfinite(v):
                seg.append(f"{px(float(s)):.1f},{py(v):.1f}")
            elif seg:
                o.append(f'<polyline fill="none" stroke="{col}" stroke-width="2" '
                         f'points="{" ".join(seg)}"/>')
                seg = []
        for s, v in zip(r.steps, r.val_loss):
            if math.isfinite(v):
                o.append(f'<circle cx="{px(float(s)):.1f}" cy="{py(v):.1f}" r="2.5" '
                         f'fill="{col}"/>')
        o.append("</g>")
    return o


def _legend(runs: list[Run]) -> list[str]:
    """The legend right of the plot: each recipe's colour, final val loss and tokens/s."""
    lx = RIGHT + 20
    o = [f'<g font-size="12">\n<text x="{lx}" y="{TOP + 4}" font-weight="bold">recipe</text>']
    for i, r in enumerate(runs):
        y = TOP + 26 + 36 * i
        o.append(f'<line x1="{lx}" y1="{y - 4}" x2="{lx + 22}" y2="{y - 4}" '
                 f'stroke="{COLORS[i % len(COLORS)]}" stroke-width="3"/>')
        o.append(f'<text x="{lx + 30}" y="{y}">{escape(r.recipe)}</text>')
        val = f"val {r.final_val:.3f}, " if math.isfinite(r.final_val) else ""
        o.append(f'<text x="{lx + 30}" y="{y + 15}" fill="#555555" font-size="11">'
                 f"{val}{r.tokens_per_s:.0f} tok/s</text>")
    o.append("</g>\n</svg>\n")
    return o


def svg(runs: list[Run]) -> str:
    """Validation loss against step, one polyline per recipe (broken at non-finite points)."""
    px, py, xt, yt = _scales(runs)
    o = ['<?xml version="1.0" encoding="UTF-8"?>',
         f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
         f'<rect x="0" y="0" width="{W}" height="{H}" fill="white"/>',
         f'<text x="{(LEFT + RIGHT) // 2}" y="28" font-size="16" text-anchor="middle">'
         "Validation loss against step (PyTorch)</text>"]
    o += _grid(px, py, xt, yt) + _curves(runs, px, py) + _legend(runs)
    return "\n".join(o)


def _loss(v: float) -> str:
    return f"{v:.4f}" if math.isfinite(v) else "-"


def table(runs: list[Run]) -> str:
    """The results table: final val loss, its ratio to bf16's, tokens/s and its ratio."""
    ref = next((r for r in runs if r.recipe == "bf16"), None)
    lines = ["| recipe | final val loss | vs bf16 | best val loss | final train loss | "
             "tokens/s | tokens/s vs bf16 | GFLOP/s | time (s) | skipped |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in runs:
        best = min([v for v in r.val_loss if math.isfinite(v)], default=math.nan)
        dv = (f"{(r.final_val / ref.final_val - 1) * 100:+.2f}%"
              if ref and math.isfinite(r.final_val) and math.isfinite(ref.final_val) else "-")
        dt = f"{r.tokens_per_s / ref.tokens_per_s:.2f}x" if ref and ref.tokens_per_s else "-"
        lines.append(f"| {r.recipe} | {_loss(r.final_val)} | {dv} | {_loss(best)} | "
                     f"{_loss(r.final_train_loss)} | {r.tokens_per_s:.0f} | {dt} | "
                     f"{r.gflops:.2f} | {r.seconds:.1f} | {r.skipped} |")
    return "\n".join(lines) + "\n"


def write_report(out_dir: str, settings: dict, runs: list[Run]) -> tuple[str, str]:
    """Writes out_dir/report.md and out_dir/val_loss.svg (atomically); returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    md = ["# lowp.torch.trainer compare: validation loss and throughput per recipe", "",
          "| setting | value |", "| --- | --- |"]
    md += [f"| {k} | {v} |" for k, v in settings.items()]
    md += ["", "## Results", "", table(runs), "![validation loss against step](val_loss.svg)", "",
           "Validation loss is the mean cross-entropy (nats per character) over the same "
           "held-out batches at every evaluation (the last 10% of the text). Tokens/s is the "
           "median over updates of tokens / update time (forward, backward and optimizer; "
           "evaluation excluded). \"vs bf16\" is the relative difference of the final "
           "validation loss from bf16's.", ""]
    if any(r.wrapped for r in runs):
        md += ["## What each recipe wrapped", ""]
        md += [f"- **{r.recipe}**: {r.wrapped}" for r in runs if r.wrapped]
        md.append("")
    md += ["## Validation loss by step", "",
           "| step | " + " | ".join(r.recipe for r in runs) + " |",
           "| ---: |" + " ---: |" * len(runs)]
    for s in sorted({s for r in runs for s in r.steps}):
        row = [_loss(dict(zip(r.steps, r.val_loss)).get(s, math.nan)) for r in runs]
        md.append(f"| {s} | " + " | ".join(row) + " |")
    md_path, svg_path = os.path.join(out_dir, "report.md"), os.path.join(out_dir, "val_loss.svg")
    write_atomic(md_path, ("\n".join(md) + "\n").encode())
    write_atomic(svg_path, svg(runs).encode())
    return md_path, svg_path
