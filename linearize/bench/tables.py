"""The Markdown of the benchmarks: ``bench.md`` (:func:`markdown_report`) and ``bench-long.md``
(:func:`long_markdown`), every table written by :func:`linearize.markdown.markdown_table`."""

from __future__ import annotations

from ..markdown import markdown_table
from .crossover import crossover_text
from .methods import EAGER, SDPA, SOFTMAX_LABELS


def mib(nbytes):
    """``bytes`` in MiB with one decimal (``—`` for None)."""
    return "—" if nbytes is None else f"{nbytes / 2**20:.1f}"


def softmax_labels(rows):
    """The softmax columns: sdpa, its pinned CUDA kernels where measured, eager."""
    return [label for label in SOFTMAX_LABELS
            if label in (SDPA, EAGER) or any(label in row["results"] for row in rows)]


def _length_table(rows, labels, cell, length=str):
    """A table with one line per measured length (``length(N)``) and one column per label:
    ``cell(row, label)``."""
    return markdown_table(["N", *labels], [[length(row["seq_len"]), *(cell(row, label) for label in labels)]
                                           for row in rows], align=["---:"] * (len(labels) + 1))


def _has_memory(rows):
    return any("peak_extra_bytes" in entry for row in rows for entry in row["results"].values())


# ---- bench.md --------------------------------------------------------------------------------------

def markdown_report(result):
    """The tables of ``bench.md``."""
    lines = _header_lines(result["config"], result["machine"])
    lines += _attention_tables(result["attention"], softmax_labels(result["attention"]) + result["methods"])
    crossover_rows = []
    for label, cross in result["crossover"].items():
        measured = "never" if cross["measured"] is None else (
            f"≤ {cross['measured']}" if cross["faster_at_all_lengths"] else str(cross["measured"]))
        crossover_rows.append([label, measured, cross["estimate"] or "—"])
    lines += ["", "## Crossover against sdpa", "",
              markdown_table(["method", "faster from N", "estimated crossover N"], crossover_rows,
                             align=["none", "---:", "---:"])]
    if result.get("model"):
        lines += _model_tables(result["model"])
    if result.get("targets"):
        lines += _target_lines(result["targets"])
    return "\n".join(lines) + "\n"


def _header_lines(cfg, machine):
    return [
        "# linearize benchmark: linear attention against softmax", "",
        f"Machine: {machine['cpu_model']}, {machine['usable_cores']} usable cores, torch {machine['torch']}, "
        f"{machine['torch_threads']} threads; load average at start {machine['load_average_start']}, "
        f"at end {machine.get('load_average_end')}; other processes used "
        f"{machine.get('other_processes_cores')} cores on average during the run.",
        *([f"**Warning: {machine['busy_warning']}.**"] if machine.get("busy_warning") else []),
        f"Attention layer: batch {cfg['batch_size']}, {cfg['num_heads']} heads, head dim {cfg['head_dim']}, "
        f"{cfg.get('placement', 'cpu, float32')}, no padding; {cfg['warmup']} warm-up + {cfg['repeats']} timed "
        f"rounds, candidates interleaved; medians in ms of "
        f"{'process CPU time' if cfg.get('clock') == 'cpu' else 'wall-clock time'}. ×sdpa = sdpa time / method "
        "time (above 1: faster than sdpa).",
        "Peak memory: extra MiB allocated during one forward, output included (CPU: PyTorch's allocator through "
        "torch.profiler memory events; CUDA: torch.cuda.max_memory_allocated).", ""]


def _attention_tables(rows, labels):
    def latency(row, label):
        entry = row["results"].get(label)
        if entry is None:
            return "skipped"
        if label == SDPA:
            return f"{entry['median_ms']:.2f}"
        return f"{entry['median_ms']:.2f} ({1 / entry['time_vs_sdpa']:.2f}×)"

    def memory(row, label):
        return mib(row["results"][label].get("peak_extra_bytes")) if label in row["results"] else "skipped"

    lines = ["## Attention layer: median latency (ms)", "", _length_table(rows, labels, latency)]
    if _has_memory(rows):
        lines += ["", "## Attention layer: peak extra memory (MiB)", "", _length_table(rows, labels, memory)]
    return lines


def _model_tables(model):
    rows, info = model["rows"], model["info"]
    labels = list(rows[0]["results"]) if rows else []

    def latency(row, label):
        entry = row["results"][label]
        return f"{entry['median_ms']:.2f} ({entry['time_vs_softmax']:.2f})"

    lines = ["", f"## Whole model: {info['name']} ({info['architecture']}), median forward ms", "",
             f"Ratio in brackets: time / {info['softmax_label']} time (below 1: faster).", "",
             _length_table(rows, labels, latency)]
    lines += ["", "Whole model, crossover:", ""] + [
        f"- {label}: {crossover_text(cross, info['softmax_label'])}" for label, cross in model.get("crossover", {}).items()]
    if _has_memory(rows):
        lines += ["", "Whole model: peak extra memory (MiB) of one forward", "",
                  _length_table(rows, labels, lambda row, label: mib(row["results"][label].get("peak_extra_bytes")))]
    return lines


def _target_lines(targets):
    lines = ["", "## Targets", ""]
    att = targets.get("attention")
    if att:
        lines.append(f"- attention layer at N={att['seq_len']}, every method ≥ {att['min_speedup']}× faster than "
                     f"sdpa: {'met' if att['all_met'] else 'NOT met'} ("
                     + ", ".join(f"{k} {v['speedup_vs_sdpa']:.1f}×" for k, v in att["methods"].items()) + ")")
    mod = targets.get("model")
    if mod:
        lines.append(f"- whole model at N={mod['seq_len']}, converted no slower than {mod['reference']}: "
                     f"{'met' if mod['all_met'] else 'NOT met'} ("
                     + ", ".join(f"{k} {v['time_vs_softmax']:.2f}" for k, v in mod["methods"].items()) + ")")
    return lines


# ---- bench-long.md ---------------------------------------------------------------------------------

def long_cell(row, label, softmax):
    """``"ms (speed-up×) / MiB"`` of one label at one length, or why it is missing."""
    measured = row["results"].get(label)
    if measured is None:
        return "skipped" if label in row["skipped"] else "—"
    ratio = measured.get("time_vs_softmax")
    speed = f" ({1 / ratio:.2f}×)" if ratio and label != softmax else ""
    return f"{measured['median_ms']:.1f}{speed} / {mib(measured.get('peak_extra_bytes'))}"


def target_line(label, n, target):
    """One target of ``bench-long.md``: the speed-up at ``n`` against the target, pass or miss."""
    need = target["min_speedup"]
    if target["met"] is None:
        return f"- {label} at N = {int(n):,}: ≥ {need}× — not measured"
    verdict = "pass" if target["met"] else (f"miss by {need - target['speedup']:.2f}×" if target["speedup"] < need
                                            else "miss: a process fell more than 15% below the median")
    spread = f", lowest process {target['lowest']:.2f}×" if "lowest" in target else ""
    return f"- {label} at N = {int(n):,}: {target['speedup']:.2f}×{spread} (target ≥ {need}×) — **{verdict}**"


def _geometry_notes(info):
    """The lines above a geometry's table: how its positions were extended, which layers stayed softmax."""
    lines = []
    if info["positions"].get("extended_to"):
        lines += [f"Positions extended from {info['positions']['learned']} to {info['positions']['extended_to']:,} "
                  "by `linearize.convert(..., max_length=N)` (tiling); softmax gets the same table.", ""]
    if info["positions"].get("note"):
        lines += [info["positions"]["note"] + ".", ""]
    for label in info["keeps_softmax_layers"]:
        lines += [f"{label} converts attention layers {info['converted_layers'][label]} of {info['num_layers']}; the "
                  "others stay softmax (and share softmax's memory cap).", ""]
    return lines


def _geometry_markdown(entry):
    info, rows = entry["info"], entry["rows"]
    softmax = info["softmax_label"]
    labels = [softmax] + entry["methods"]
    lines = [f"## {entry['geometry']}: {info['architecture']}, {info['num_layers']} layers, hidden "
             f"{info['hidden_size']}, {info['num_heads']} heads", "", info["geometry"] + ".", ""]
    lines += _geometry_notes(info)
    if entry["refused"]:
        lines += [f"- {label}: not measured — convert refused: {reason}" for label, reason in entry["refused"].items()]
        lines.append("")
    lines += ["Median forward ms; in brackets softmax time ÷ the method's "
              "(above 1: faster). Peak extra MiB of one forward after the slash.", "",
              _length_table(rows, labels, lambda row, label: long_cell(row, label, softmax), length="{:,}".format)]
    skipped = [f"- N = {row['seq_len']:,}: {label} skipped: {reason}"
               for row in rows for label, reason in row["skipped"].items()]
    lines += [""] + skipped if skipped else []
    if entry["crossover"]:
        lines += ["", "Crossover against softmax:", ""]
        lines += [f"- {label}: {crossover_text(cross)}" for label, cross in entry["crossover"].items()]
    if entry["targets"]:
        lines += ["", "Targets (issues 19 and 34: whole model ≥ 1.5× faster at 2,048, ≥ 2.5× at 4,096, ≥ 4× at 8,192):", ""]
        lines += [target_line(label, n, target) for label, per in entry["targets"].items() for n, target in per.items()]
    return lines + [""]


def long_markdown(result):
    """The tables of ``bench-long.md``."""
    machine, cfg = result["machine"], result["config"]
    lines = ["# linearize benchmark: whole models at long lengths", "",
             f"Machine: {machine['cpu_model']}, {machine['usable_cores']} usable cores, {machine['memory_gib']} GiB, "
             f"torch {machine['torch']}, {machine['torch_threads']} threads; other processes used "
             f"{machine.get('other_processes_cores')} cores on average during the run.",
             *([f"**Warning: {machine['busy_warning']}.**"] if machine.get("busy_warning") else []),
             *([] if result.get("complete") else ["**Partial: the run has not finished every model yet.**"]),
             f"Batch {cfg['batch_size']}, {cfg.get('placement', 'cpu, float32')}, no padding; {cfg['warmup']} warm-up + {cfg['repeats']} timed rounds, "
             "candidates interleaved; medians. Crossover: " + cfg["crossover_rule"] + ".",
             *(["Sliding-window layers converted too (windowed linear attention, `--convert-sliding-window`)."]
               if cfg.get("convert_sliding_window") else []), ""]
    for entry in result["models"]:
        lines += _geometry_markdown(entry)
    return "\n".join(lines)
