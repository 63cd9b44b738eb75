"""``figures/*.png``: the figures of a :class:`~linearize.report.results.Report` (matplotlib, Agg).

- ``curves.png``: stage 1's CE/KL to the teacher's attention, and the teacher's and the
  student's task training (train loss, dev metric);
- ``per_layer_kl.png``: the attention KL per layer before/after stage 1 and the entropies;
- ``luna_channels.png``: a feature map's probe data, LUNA's ψ_ℓ(u) over the empirical u (LUNA Fig. 3);
- ``cls_attention.png``: attention from [CLS], softmax teacher vs linear student (LUNA Fig. 4).

A figure whose data are absent is not drawn (and an earlier copy of it is removed).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from .results import FIGURES_DIR, as_report, finite

TEACHER_COLOR = "#d62728"
STUDENT_COLOR = "#1f77b4"
STAGE1_COLOR = "#7f7f7f"


def _display_token(token):
    """Tokenizer markers that only say "a word starts here" are dropped for display."""
    token = str(token)
    for marker in ("Ġ", "▁"):
        if token.startswith(marker) and len(token) > 1:
            token = token[1:]
    return token


def _is_special(token):
    token = str(token)
    return bool(re.fullmatch(r"\[[A-Z]+\]|<\/?s>|<pad>|<unk>|<mask>|<cls>|<sep>", token))


def _new_figure(width, height):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _save_figure(fig, path):
    """Save through a temporary file beside ``path`` (``outputs.atomic_path``): never a half-written PNG."""
    from ..outputs import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=fig.dpi, facecolor="white")


def _style(ax):
    ax.spines["top"].set_visible(False)
    ax.spines["right"].set_visible(False)
    ax.grid(True, color="#e6e6e6", linewidth=0.8)
    ax.set_axisbelow(True)
    ax.tick_params(labelsize=9)


def _smooth(values, window):
    """Centered moving average (the ends use a shorter window)."""
    if window <= 1:
        return list(values)
    half = window // 2
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - half): i + half + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def _series(entries, key):
    """``(x, y, xlabel)`` of ``key`` over epochs (steps when the log has several entries per epoch)."""
    rows = [e for e in entries if isinstance(e, dict) and finite(e.get(key)) is not None]
    if not rows:
        return [], [], None
    epochs = [finite(e.get("epoch")) for e in entries if isinstance(e, dict)]
    use_epoch = all(v is not None for v in epochs) and len(set(epochs)) == len(epochs)
    if use_epoch:
        return [finite(e["epoch"]) for e in rows], [finite(e[key]) for e in rows], "epoch"
    if all(finite(e.get("step")) is not None for e in rows):
        return [finite(e["step"]) for e in rows], [finite(e[key]) for e in rows], "step"
    return list(range(1, len(rows) + 1)), [finite(e[key]) for e in rows], "log entry"


def _plot_noisy(ax, x, y, color, label, marker=None):
    if len(y) > 30:
        ax.plot(x, y, color=color, alpha=0.25, linewidth=0.8)
        ax.plot(x, _smooth(y, max(3, len(y) // 20)), color=color, linewidth=1.8, label=label)
    else:
        ax.plot(x, y, color=color, linewidth=1.8, label=label, marker=marker or "o", markersize=4)


def _curves_figure(report):
    """Stage 1's losses, the task training loss and the dev metric by epoch, teacher and student
    side by side: one panel for each that the run's curves have."""
    curves = report.curves or {}
    stage1 = curves.get("stage1") if isinstance(curves.get("stage1"), list) else []
    runs = [(curves[name], label, color) for name, label, color in
            (("teacher", "teacher (softmax)", TEACHER_COLOR), ("stage2", "student (stage 2)", STUDENT_COLOR))
            if isinstance(curves.get(name), list) and curves.get(name)]
    dev_key = _dev_key(runs, f"dev_{report.primary_metric}")
    panels = [panel for panel, present in (
        ("stage1", any(_series(stage1, k)[0] for k in ("ce", "kl"))),
        ("loss", any(_series(series, "train_loss")[0] for series, _, _ in runs)),
        ("dev", dev_key is not None)) if present]
    if not panels:
        return None
    fig = _new_figure(4.6 * len(panels), 3.6)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, panel in zip(axes, panels):
        _style(ax)
        if panel == "stage1":
            _stage1_panel(ax, stage1)
        else:
            _task_panel(ax, runs, "train_loss" if panel == "loss" else dev_key, report)
        ax.legend(fontsize=8.5, frameon=False)
    fig.tight_layout()
    return fig


def _dev_key(runs, preferred):
    """The dev metric the curves plot: the primary one where a run logged it, else the first
    ``dev_*`` key any run logged; ``None`` when no run logged a dev metric."""
    if any(_series(series, preferred)[0] for series, _, _ in runs):
        return preferred
    keys = sorted({k for series, _, _ in runs for e in series if isinstance(e, dict) for k in e
                   if k.startswith("dev_")})
    return next((key for key in keys if any(_series(series, key)[0] for series, _, _ in runs)), None)


def _stage1_panel(ax, stage1):
    xlabel = None
    for key, label, color in (("ce", "cross-entropy", "#ff7f0e"), ("kl", "KL", "#2ca02c")):
        x, y, xlabel = _series(stage1, key)
        if x:
            _plot_noisy(ax, x, y, color, label)
    ax.set_xlabel(xlabel or "step")
    ax.set_ylabel("nats")
    ax.set_title("Stage 1: attention distillation", fontsize=11)


def _task_panel(ax, runs, key, report):
    """Teacher and student curves of ``key``: ``train_loss``, or a ``dev_*`` metric with its best
    epoch starred."""
    dev = key != "train_loss"
    xlabels = set()
    for series, label, color in runs:
        x, y, xlabel = _series(series, key)
        if not x:
            continue
        xlabels.add(xlabel)
        _plot_noisy(ax, x, y, color, label)
        if dev and len(y) > 1:
            best = max(range(len(y)), key=lambda i: y[i])
            ax.plot([x[best]], [y[best]], marker="*", markersize=13, color=color, markeredgecolor="black",
                    markeredgewidth=0.6, linestyle="none", zorder=5)
    ax.set_xlabel(" / ".join(sorted(xlabels)) or "epoch")
    if xlabels == {"epoch"}:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if not dev:
        ax.set_ylabel("train loss")
        ax.set_title("Task training loss", fontsize=11)
        return
    metric = key[len("dev_"):]
    ax.set_ylabel(f"dev {metric}")
    selection = report.task.selection_split
    ax.set_title(f"Dev {metric}" + (f" ({selection})" if selection else "") + ", ★ = best", fontsize=11)


def _per_layer_figure(report):
    attention = report.attention
    skipped = attention.stage1_skipped
    kl_rows = [r for r in attention.per_layer if r.kl_before is not None or r.kl_after is not None]
    entropy_rows = [r for r in attention.per_layer if r.teacher_entropy is not None and r.student_entropy is not None]
    if not kl_rows:
        return None
    ncols = 2 if entropy_rows else 1
    width = max(4.8, 0.55 * len(kl_rows) + 2.5)
    fig = _new_figure(width * ncols, 3.6)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    ax = axes[0]
    _style(ax)
    ax.grid(axis="x", visible=False)
    labels = [_layer_label(r, i) for i, r in enumerate(kl_rows)]
    positions = list(range(len(kl_rows)))
    before = [r.kl_before or 0.0 for r in kl_rows]
    after = [r.kl_after for r in kl_rows]
    has_after = not skipped and any(v is not None for v in after)
    bar_width = 0.4 if has_after else 0.6
    offset = bar_width / 2 if has_after else 0.0
    ax.bar([p - offset for p in positions], before, bar_width, color="#c7c7c7", edgecolor="#8c8c8c", linewidth=0.6,
           label="untrained conversion" if skipped else "before stage 1")
    if has_after:
        ax.bar([p + offset for p in positions], [v or 0.0 for v in after], bar_width, color=STUDENT_COLOR,
               label="after stage 1")
    worst, key = attention.worst_layer()
    if worst is not None and worst in kl_rows and key.startswith("kl") and len(kl_rows) > 1:
        i = kl_rows.index(worst)
        height = getattr(worst, key)
        x = positions[i] + (offset if key == "kl_after" else -offset)
        ax.annotate("worst", (x, height), xytext=(0, 4), textcoords="offset points", ha="center", fontsize=8.5,
                    color=TEACHER_COLOR, fontweight="bold")
    ax.set_xticks(positions, labels)
    ax.set_xlabel("layer")
    ax.set_ylabel("KL(teacher ‖ student), nats")
    top = max(before + [v or 0.0 for v in after])
    ax.set_ylim(0, top * 1.18 if top > 0 else 1)
    ax.set_title("Attention KL to the teacher per layer", fontsize=11)
    ax.legend(fontsize=8.5, frameon=False)
    if entropy_rows:
        ax = axes[1]
        _style(ax)
        xs = list(range(len(entropy_rows)))
        ax.plot(xs, [r.teacher_entropy for r in entropy_rows], marker="o", color=TEACHER_COLOR,
                label="teacher (softmax)")
        ax.plot(xs, [r.student_entropy for r in entropy_rows], marker="s", color=STUDENT_COLOR,
                label="student (linear)")
        ax.set_xticks(xs, [_layer_label(r, i) for i, r in enumerate(entropy_rows)])
        ax.set_xlabel("layer")
        ax.set_ylabel("attention entropy, nats")
        ax.set_title("Attention entropy (higher = more diffuse)", fontsize=11)
        ax.legend(fontsize=8.5, frameon=False)
    fig.tight_layout()
    return fig


def _layer_label(row, index):
    return str(index if row.layer is None else row.layer)


def _psi_channel(ax, c, grid, y, top, histogram=None):
    """One ψ channel's curve ``y`` over ``grid`` (marked "dead" when it is zero everywhere), over the
    histogram ``(counts, edges)`` of u scaled into the axes."""
    if histogram is not None:  # behind the line
        counts, edges = histogram
        heights = [finite(v) or 0.0 for v in counts]
        peak = max(heights) or 1.0
        ax.stairs([0.95 * top * h / peak for h in heights], [finite(v) or 0.0 for v in edges], fill=True,
                  color="#dcdcdc", zorder=0)
    ax.plot(grid, y, color=STUDENT_COLOR, linewidth=1.6)
    ax.set_ylim(-0.03 * top, top)
    ax.tick_params(labelsize=7, length=2)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_title(f"ψ$_{{{c + 1}}}$", fontsize=9, pad=2)
    if max((abs(v) for v in y if v == v), default=0.0) < 1e-6:
        ax.text(0.5, 0.5, "dead", transform=ax.transAxes, ha="center", va="center", fontsize=9,
                color="#8a8a8a", style="italic",
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1.5})


def _luna_figure(report):
    entries = (report.visuals or {}).get("luna_channels") or []
    if not entries:
        return None
    channels = max(len(e["psi"][0]) for e in entries)
    cols = min(channels, 8)
    rows_per_layer = math.ceil(channels / cols)
    nrows = rows_per_layer * len(entries)
    from matplotlib.ticker import MaxNLocator

    width, height = 1.75 * cols + 0.6, 1.55 * nrows + 0.75
    fig = _new_figure(width, height)
    # Fixed margins and tick positions: tight_layout and tick locators over dozens of small axes are slow.
    fig.subplots_adjust(left=0.75 / width, right=1 - 0.12 / width, bottom=0.5 / height, top=1 - 0.6 / height,
                        wspace=0.22, hspace=0.5)
    axes = fig.subplots(nrows, cols, squeeze=False)
    for li, entry in enumerate(entries):
        grid = [finite(v) or 0.0 for v in entry["grid"]]
        psi = entry["psi"]
        edges, counts = entry.get("hist_edges"), entry.get("hist_counts")
        has_hist = (isinstance(edges, list) and isinstance(counts, list) and len(edges) == len(counts) + 1
                    and len(counts) > 0)
        values = [finite(v) for row in psi for v in row]
        top = max([v for v in values if v is not None] + [0.0])
        top = top * 1.1 if top > 0 else 1.0
        lo, hi = min(grid), max(grid)
        xticks = [t for t in MaxNLocator(nbins=4).tick_values(lo, hi) if lo <= t <= hi]
        yticks = [t for t in MaxNLocator(nbins=3).tick_values(0, top) if 0 <= t <= top]
        for c in range(rows_per_layer * cols):
            ax = axes[li * rows_per_layer + c // cols][c % cols]
            if c >= len(psi[0]):
                ax.set_visible(False)
                continue
            y = [finite(row[c]) if c < len(row) else None for row in psi]
            _psi_channel(ax, c, grid, [v if v is not None else float("nan") for v in y], top,
                         (counts, edges) if has_hist else None)
            ax.set_xlim(lo, hi)
            ax.set_xticks(xticks)
            ax.set_yticks(yticks)
            if c % cols == 0:
                ax.set_ylabel(f"layer {entry.get('layer', '?')}\nψ(u)", fontsize=9)
            else:
                ax.tick_params(labelleft=False)
            last_row = (li == len(entries) - 1) and (c // cols == rows_per_layer - 1)
            if last_row:
                ax.set_xlabel("u", fontsize=9)
    fig.suptitle("LUNA channels ψ$_ℓ$(u) over the empirical distribution of u = wᵢᵀx + bᵢ (gray)", fontsize=11,
                 y=1 - 0.12 / height, va="top")
    return fig


def _cls_figure(report):
    entries = (report.visuals or {}).get("cls_attention") or []
    if not entries:
        return None
    return (_cls_text_figure if "tokens" in entries[0] else _cls_image_figure)(report, entries)


def _wrap_tokens(tokens, widths, left, right, gap):
    """Lines of ``(index, token, x, width)`` boxes: tokens placed left to right from ``left``, a new
    line where the next box would pass ``right``."""
    x, line = left, []
    lines = [line]
    for i, (token, w) in enumerate(zip(tokens, widths)):
        if x + w > right and line:
            x, line = left, []
            lines.append(line)
        line.append((i, token, x, w))
        x += w + gap
    return lines


def _cls_text_figure(report, entries):
    import matplotlib.patches as patches
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextPath

    fontsize, pad, gap = 11.0, 3.5, 3.0
    box_h, row_gap, line_gap, sentence_gap = 17.0, 2.0, 7.0, 16.0
    label_w, width = 62.0, 760.0
    prop = FontProperties(size=fontsize)

    def text_width(text):
        return TextPath((0, 0), text, prop=prop).get_extents().width if text.strip() else fontsize * 0.4

    # Lay out: each sentence is wrapped into lines; each line shows a teacher row and a student row.
    layout, y = [], 44.0
    for entry in entries:
        tokens = [_display_token(t) for t in entry["tokens"]]
        teacher = [max(finite(v) or 0.0, 0.0) for v in entry["teacher"]]
        student = [max(finite(v) or 0.0, 0.0) for v in entry["student"]]
        # Shade against the largest weight on a content token: [CLS]/[SEP] often soak up most of the
        # attention, and normalising by them would wash every word out (they are clipped instead).
        content = [i for i, t in enumerate(entry["tokens"]) if not _is_special(t)] or list(range(len(tokens)))
        scale = max([teacher[i] for i in content] + [student[i] for i in content]) or 1.0
        widths = [text_width(token) + 2 * pad for token in tokens]
        for n, line in enumerate(_wrap_tokens(tokens, widths, label_w, width - 8, gap)):
            layout.append((y, line, teacher, student, scale, n == 0))
            y += 2 * box_h + row_gap + line_gap
        y += sentence_gap - line_gap
    height = y + 4
    fig = _new_figure(width / 72, height / 72)
    fig.dpi = 110
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.axis("off")
    layers = list(dict.fromkeys(str(e["layer"]) for e in entries if e.get("layer") is not None))
    where = f"layer {', '.join(layers)}, " if layers else ""
    ax.text(label_w, 13, f"Attention from [CLS] ({where}mean over heads): softmax teacher vs linear student",
            fontsize=11, va="center", parse_math=False)
    ax.text(label_w, 28, "shade ∝ attention weight, one scale per sentence (weights above the largest word's "
            "are clipped, e.g. on [CLS]/[SEP])", fontsize=8.5, color="#777777", va="center", parse_math=False)
    from matplotlib.colors import to_rgb

    for y0, line, teacher, student, scale, first in layout:
        if first and y0 > 45:
            ax.plot([label_w - 50, width - 8], [y0 - sentence_gap / 2 - 1] * 2, color="#e3e3e3", linewidth=0.8)
        for r, (weights, color, label) in enumerate(((teacher, TEACHER_COLOR, "teacher"),
                                                     (student, STUDENT_COLOR, "student"))):
            top = y0 + r * (box_h + row_gap)
            ax.text(label_w - 8, top + box_h / 2, label, color=color, fontsize=9, ha="right", va="center",
                    parse_math=False)
            for i, token, x, w in line:
                strength = min(weights[i] / scale, 1.0)
                rgb = to_rgb(color)
                face = tuple(1 - (1 - c) * (0.06 + 0.94 * strength) for c in rgb)  # blend with white
                ax.add_patch(patches.FancyBboxPatch((x, top), w, box_h, boxstyle="round,pad=0,rounding_size=3",
                                                    facecolor=face, edgecolor="#d0d0d0", linewidth=0.5))
                ax.text(x + w / 2, top + box_h / 2 + 0.5, token, fontsize=fontsize, ha="center", va="center",
                        color="white" if strength > 0.6 else "#111111", parse_math=False)
    return fig


def _entry_image(entry):
    """The example's pixels as an array for ``imshow`` (grayscale 2-D, or RGB(A) scaled to [0, 1]), or None."""
    import numpy as np

    pixels = entry.get("pixels")
    if not (isinstance(pixels, list) and pixels):
        return None
    try:
        array = np.asarray(pixels, dtype=float)
    except (TypeError, ValueError):
        return None
    if array.ndim == 3 and array.shape[-1] in (3, 4):
        return np.clip(array / 255.0, 0, 1)
    return array if array.ndim == 2 else None


def _weight_overlay(weights, color, vmax, gh, gw):
    """The patch grid as RGBA: the role's colour with opacity proportional to the weight."""
    import numpy as np
    from matplotlib.colors import to_rgb

    rgba = np.zeros((gh, gw, 4))
    rgba[..., :3] = to_rgb(color)
    rgba[..., 3] = 0.04 + 0.86 * np.clip(np.asarray(weights, dtype=float).reshape(gh, gw) / vmax, 0, 1)
    return rgba


def _cls_image_figure(report, entries):
    entries = entries[:6]
    images = [_entry_image(e) for e in entries]
    has_pixels = any(image is not None for image in images)
    ncols = 3 if has_pixels else 2
    fig = _new_figure(2.5 * ncols + 0.3, 2.55 * len(entries) + 0.45)
    axes = fig.subplots(len(entries), ncols, squeeze=False)
    for r, (entry, image) in enumerate(zip(entries, images)):
        gh, gw = (int(v) for v in entry["grid"])
        teacher = [finite(v) or 0.0 for v in entry["teacher"]]
        student = [finite(v) or 0.0 for v in entry["student"]]
        vmax = max(teacher + student) or 1.0
        name = f"image {entry['image_index']}" if entry.get("image_index") is not None else f"example {r + 1}"
        col = 0
        if has_pixels:
            ax = axes[r][0]
            if image is not None:
                ax.imshow(image, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
            ax.set_title(name, fontsize=10)
            col = 1
        for weights, color, label in ((teacher, TEACHER_COLOR, "teacher (softmax)"),
                                      (student, STUDENT_COLOR, "student (linear)")):
            ax = axes[r][col]
            if image is not None:
                extent = (-0.5, image.shape[1] - 0.5, image.shape[0] - 0.5, -0.5)
                # the image faded towards white, so the colour on top reads on dark images too
                ax.imshow(image, cmap="gray", vmin=0, vmax=255, interpolation="nearest", extent=extent, alpha=0.4)
                ax.imshow(_weight_overlay(weights, color, vmax, gh, gw), interpolation="nearest", extent=extent)
            else:
                ax.imshow(_weight_overlay(weights, color, vmax, gh, gw), interpolation="nearest")
            ax.set_title(label if has_pixels else f"{name}: {label}", fontsize=10, color=color)
            col += 1
        for ax in axes[r]:
            ax.set_xticks([])
            ax.set_yticks([])
    layers = list(dict.fromkeys(str(e["layer"]) for e in entries if e.get("layer") is not None))
    where = f"layer {', '.join(layers)}, " if layers else ""
    fig.suptitle(f"Attention from [CLS] to each patch ({where}mean over heads)\nopacity ∝ weight, one scale per row",
                 fontsize=10.5)
    fig.tight_layout(h_pad=1.5)
    return fig


_FIGURES = (("curves.png", _curves_figure), ("per_layer_kl.png", _per_layer_figure),
            ("luna_channels.png", _luna_figure), ("cls_attention.png", _cls_figure))


def make_figures(report, run_dir):
    """Draw the figures whose data exist into ``run_dir/figures/``; return their paths relative to
    ``run_dir`` (``["figures/curves.png", ...]``). A figure whose data vanished is removed, so the
    folder always matches the report."""
    report, run_dir = as_report(report), Path(run_dir)
    written = []
    for name, draw in _FIGURES:
        path = run_dir / FIGURES_DIR / name
        fig = draw(report)
        if fig is None:
            path.unlink(missing_ok=True)
            continue
        _save_figure(fig, path)
        written.append(f"{FIGURES_DIR}/{name}")
    return written

