"""`linearize compare`: several methods on one task, same budget and seeds, one table.

Rows follow the papers' tables (LUNA Table 2, Flexformer Table 3): the softmax teacher, then
each method with stage 1 and — for methods with learnable feature maps — without it (``t2r``
without stage 1 is the papers' "T2R", with it "T2R-HH"). Per seed one teacher is fine-tuned
and shared by every method's run. Cells are mean ± std over seeds of the report split's
primary metric and of the recovery; model selection only ever used the dev split (the stage-1
model competes with stage 2's epochs there, as epoch 0).
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from .attention import create_feature_map
from .attention.feature_maps import default_comparison
from .markdown import markdown_table
from .outputs import atomic_write_json, atomic_write_text, writes_output
from .pipeline import run
from .training import on_main_process

DEFAULT_METHODS = default_comparison()  # every map with ``in_default_comparison``


def has_learnable_parameters(method):
    return create_feature_map(method, 8, 1).num_learnable_parameters() > 0


def variants(methods, without_stage1=True):
    """``[(row label, method, stage1 enabled)]`` in table order."""
    rows = []
    for method in methods:
        rows.append((f"{method} + stage 1" if has_learnable_parameters(method) else method, method, True))
        if without_stage1 and has_learnable_parameters(method):
            rows.append((f"{method}, no stage 1", method, False))
    return rows


def parse_variant(text):
    """``"NAME: key=value key=value"`` (a ``--variant``) -> ``(NAME, overrides dict)``.

    Example: ``"stage 1 x3 at lr 1e-2: stage1.epochs=3 stage1.lr=1e-2"``; NAME alone (no
    settings) is the recipe as it is, e.g. the baseline row of a lever study.
    """
    from .errors import LinearizeError
    from .recipes import parse_set

    name, _, settings = text.partition(":")
    if not name.strip():
        raise LinearizeError(f"--variant {text!r}: give it a name, as 'NAME: key=value ...'")
    return name.strip(), parse_set(settings.split())


def variant_settings(texts):
    """``{NAME: overrides}`` of the ``--variant`` ``texts`` (:func:`parse_variant`); a name given twice
    is one line (the second would silently replace the first)."""
    from .errors import LinearizeError

    settings = {}
    for name, overrides in map(parse_variant, texts):
        if name in settings:
            raise LinearizeError(f"--variant {name!r} is given twice: give each variant its own name")
        settings[name] = overrides
    return settings


def slug(text):
    """A folder name for a row label."""
    import re

    return re.sub(r"[^A-Za-z0-9.=+-]+", "-", text).strip("-").lower() or "default"


def shared_teacher(folder):
    """The first run under ``folder`` (one seed's folder of a compare) with a finished teacher."""
    from .pipeline import RunState

    for candidate in sorted(Path(folder).glob("*/state.json")):
        if RunState(candidate.parent, None).done("teacher"):
            return candidate.parent
    return None


def shared_stage1(folder, config, teacher_run):
    """The first run under ``folder`` (one seed's folder) whose finished stage 1 ``config`` would make
    again (the same :data:`~linearize.config.STAGE1_KEYS`) from the seed's shared teacher
    (``teacher_run``'s), or None: a variant of stage 2 alone does not distil stage 1 again."""
    from .config import STAGE1_KEYS, config_difference
    from .pipeline import RunState

    teacher = RunState(teacher_run, None).get("teacher") if teacher_run is not None else None
    for candidate in sorted(Path(folder).glob("*/state.json")):
        state = RunState(candidate.parent, None)
        if (state.done("stage1") and state.get("teacher") == teacher
                and config_difference(state.config, config, STAGE1_KEYS) is None):
            return candidate.parent
    return None


def finished_report(folder, config):
    """The report of the run in ``folder`` when it finished with ``config`` (every stage and its latency
    recorded, its report written), else None: a continued comparison reads a finished row instead of
    loading its data, models and teacher targets again to rewrite the same report. A folder holding
    another configuration is refused in one line, as :func:`~linearize.pipeline.run` refuses it."""
    from .pipeline import RunState
    from .pipeline.stages import STAGES
    from .report import REPORT_JSON, load_report

    if not (Path(folder) / REPORT_JSON).is_file():
        return None
    state = RunState(folder, config)
    return load_report(folder) if all(state.done(stage) for stage in (*STAGES, "latency")) else None


@writes_output("out_dir")
def compare(recipe, out_dir, *, methods=None, seeds=(0, 1, 2), without_stage1=True, settings=None,
            teachers_from=None, table_only=False, progress=True, log=print):
    """Run every (method, stage-1 variant, setting, seed); write ``compare.json`` and ``compare.md``.

    ``settings``: ``{name: recipe overrides}``, one row per method and setting (a lever study:
    ``{"plain": {}, "stage 1 x3": {"stage1": {"epochs": 3}}}``); default one row per method.
    Per seed one teacher is fine-tuned and shared by every row (a compare continued with other
    methods reuses the teacher already in ``out_dir``); ``teachers_from``: another compare folder
    whose teachers (``seed<N>/...``) are reused instead. Finished runs are reused,
    so an interrupted compare continues where it stopped. ``table_only``: run nothing, build the
    table from the runs that are finished (the rest are listed in ``missing``).
    """
    from .errors import LinearizeError
    from .report import REPORT_JSON, load_report

    out_dir, settings = Path(out_dir), settings or {"": {}}
    if teachers_from is not None and not Path(teachers_from).expanduser().is_dir():
        raise LinearizeError(f"--teachers-from {teachers_from} is not a folder: give a compare folder whose seed<N>/ "
                             "runs hold finished teachers")
    plan = run_plan(recipe, out_dir, methods or DEFAULT_METHODS, seeds, without_stage1, settings)
    if not table_only:
        for *_, run_config in plan:  # every run's configuration is checked before the first one starts
            run_config.validate()
    results, missing, teacher_runs = {}, [], {}
    for seed, row, folder, run_config in plan:
        if table_only:
            if not (folder / REPORT_JSON).is_file():
                missing.append(f"seed {seed}: {row}")
                continue
            results.setdefault(row, []).append(load_report(folder))
            continue
        if seed not in teacher_runs:
            teacher_runs[seed] = shared_teacher(Path(teachers_from or out_dir) / f"seed{seed}")
            if teachers_from and teacher_runs[seed] is None:
                log(f"no finished teacher for seed {seed} in {teachers_from}: fine-tuning one")
        log(f"== seed {seed}: {row} -> {folder}")
        report = finished_report(folder, run_config)
        if report is not None:
            log("finished before: its report as written (delete report.json to write it again)")
        else:
            stage1_from = teacher_runs[seed] and shared_stage1(out_dir / f"seed{seed}", run_config, teacher_runs[seed])
            report = run(run_config, folder, progress=progress, log=log, teacher_from=teacher_runs[seed],
                         stage1_from=stage1_from if stage1_from != folder else None)
        teacher_runs[seed] = teacher_runs[seed] or folder
        results.setdefault(row, []).append(report)
    if not results:
        raise LinearizeError(f"no finished runs in {out_dir} to tabulate; run without --table-only first")
    table = summarize(results)
    table["settings"] = {name: overrides for name, overrides in settings.items() if name}
    table["missing"] = missing
    if missing:
        log(f"not finished (left out of the table): {'; '.join(missing)}")
    on_main_process(_write_table, out_dir, table)
    return table


def _write_table(out_dir, table):
    atomic_write_json(out_dir / "compare.json", table)
    atomic_write_text(out_dir / "compare.md", render(table))


def run_plan(config, out_dir, methods, seeds, without_stage1, settings):
    """``[(seed, row label, run folder, run configuration)]``: every run of a comparison, in
    order; ``config``: the recipe's :class:`~linearize.config.RunConfig`, each run's made from it
    by its setting's overrides and ``dataclasses.replace``."""
    plan = []
    for seed in seeds:
        for label, method, stage1 in variants(methods, without_stage1):
            for name, overrides in settings.items():
                varied = config.with_overrides(overrides)
                run_config = dataclasses.replace(varied, method=method, seed=seed, stage1=dataclasses.replace(
                    varied.stage1, enabled=stage1 and varied.stage1.enabled))
                folder = out_dir / f"seed{seed}" / (method + ("" if stage1 else "-no-stage1")
                                                    + (f"--{slug(name)}" if name else ""))
                plan.append((seed, f"{label} ({name})" if name else label, folder, run_config))
    folders = [folder for _, _, folder, _ in plan]
    repeated = next((folder for folder in folders if folders.count(folder) > 1), None)
    if repeated is not None:  # the second run would resume the first's folder and count it twice
        from .errors import LinearizeError

        raise LinearizeError(f"two runs of the comparison would write {repeated}: a method, seed or variant is named "
                             "twice (variant names are compared as folder names); name each once")
    return plan


def _mean_std(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarize(results):
    """Aggregate the reports (:class:`~linearize.report.Report`) of every row over seeds: the
    mean ± std of the primary metric and of each run's recovery on the report split."""
    first = next(iter(results.values()))[0]
    metric, split = first.task.primary_metric, first.split
    teacher_scores = [r.scores_of("teacher")[metric] for reports in results.values() for r in reports[:1]]
    teacher_by_seed = {r.seeds["seed"]: r.scores_of("teacher")[metric] for reports in results.values() for r in reports}
    mean, std = _mean_std(list(teacher_by_seed.values()) or teacher_scores)
    others = [name for name in first.metric_names if name != metric]  # e.g. top-10 overlap, the document scores
    lengths = sorted({row.seq_len for reports in results.values() for r in reports for row in r.latency.at_lengths})
    rows = [{"row": "softmax (teacher)", "metric_mean": mean, "metric_std": std, "recovery_mean": 100.0,
             "recovery_std": 0.0, "parameters_added": 0, "kl_mean": 0.0, "latency_ms": None,
             "others": _other_scores(results, "teacher", others), "seeds": len(teacher_by_seed),
             "per_seed": [_seed_scores(r, "teacher", metric) for r in _one_run_per_seed(results)]}]
    for label, reports in results.items():
        metric_mean, metric_std = _mean_std([r.scores_of("student")[metric] for r in reports])
        rec_mean, rec_std = _mean_std([r.recovery().per_metric.get(metric) for r in reports])
        rows.append({"row": label, "metric_mean": metric_mean, "metric_std": metric_std, "recovery_mean": rec_mean,
                     "recovery_std": rec_std, "parameters_added": reports[0].model.parameters_added,
                     "parameters_added_percent": reports[0].model.parameters_added_percent,
                     "kl_mean": _mean_std([r.attention.mean_kl_after for r in reports])[0],
                     "latency_ms": _mean_std([r.latency.student_ms for r in reports])[0],
                     "teacher_latency_ms": _mean_std([r.latency.teacher_ms for r in reports])[0],
                     "seconds_mean": _mean_std([r.timing.stage1_seconds + r.timing.stage2_seconds
                                                for r in reports])[0],
                     "others": _other_scores({label: reports}, "student", others),
                     "speedups": {str(n): _mean_std([row.speedup for r in reports for row in r.latency.at_lengths
                                                     if row.seq_len == n])[0] for n in lengths},
                     "own_length_speedup": _mean_std([r.latency.own_lengths.speedup for r in reports
                                                      if r.latency.own_lengths is not None])[0],
                     "stage1_kept": sum(r.selection.stage1_kept for r in reports), "seeds": len(reports),
                     "per_seed": [_seed_scores(r, "student", metric) for r in reports]})
    return {"task": first.task.name, "model": first.model.source, "metric": metric, "split": split,
            "latency_seq_len": first.latency.seq_len, "rows": rows, "recipe": first.recipe.get("name"),
            "other_metrics": others, "speedup_lengths": lengths}


def _one_run_per_seed(results):
    """One report per seed of ``results`` (the last run of each seed): where the seed's shared teacher is read."""
    return list({r.seeds["seed"]: r for reports in results.values() for r in reports}.values())


def _seed_scores(report, stage, metric):
    """One run's own figures in a row (``per_seed``): its seed, ``stage``'s scores on the report split and, for the
    student, its recovery, so that tables of comparisons run apart (another folder, another machine) can be pooled
    from their compare.json alone."""
    entry = {"seed": report.seeds["seed"], "scores": dict(report.scores_of(stage))}
    if stage == "student":
        entry["recovery"] = report.recovery().per_metric.get(metric)
    return entry


def _other_scores(results, stage, names):
    """``{metric: [mean, std]}`` over the runs of ``results`` of ``stage``'s scores (the teacher's once per seed)
    on the report split, for the metrics ``names`` beside the primary one."""
    if stage == "teacher":
        runs = _one_run_per_seed(results)
    else:
        runs = [r for reports in results.values() for r in reports]
    return {name: list(_mean_std([r.scores_of(stage).get(name) for r in runs])) for name in names}


def render(table):
    """``compare.md``: one table line per row of :func:`summarize` (mean ± std over seeds), then notes."""

    def cell(mean, std, fmt="{:.3f}"):
        if mean is None:
            return "—"
        return fmt.format(mean) + (f" ± {fmt.format(std)}" if std else "")

    others, lengths = table.get("other_metrics", []), table.get("speedup_lengths", [])
    own = any(row.get("own_length_speedup") is not None for row in table["rows"])  # reports before it have none
    header = [f"{table['model']} on {table['task']}", f"{table['metric']} ({table['split']})", "recovery %",
              *others, "attention KL after stage 1", "params added", f"latency ms (N={table['latency_seq_len']})",
              *(["speed-up per example (own lengths)"] if own else []),
              *(f"speed-up at {n:,}" for n in lengths), "conversion time s", "seeds"]
    rows = []
    for row in table["rows"]:
        params = f"{row['parameters_added']:,}" + (f" ({row['parameters_added_percent']:.2f}%)"
                                                    if row.get("parameters_added_percent") else "")
        speedups = [cell(row.get("speedups", {}).get(str(n)), None, "{:.2f}×") for n in lengths]
        rows.append([row["row"], cell(row["metric_mean"], row["metric_std"]),
                     cell(row["recovery_mean"], row["recovery_std"], "{:.1f}"),
                     *(cell(*row.get("others", {}).get(name, (None, None))) for name in others),
                     cell(row["kl_mean"], None), params, cell(row["latency_ms"], None, "{:.1f}"),
                     *([cell(row.get("own_length_speedup"), None, "{:.2f}×")] if own else []), *speedups,
                     cell(row.get("seconds_mean"), None, "{:.0f}"), row["seeds"]])
    lines = [markdown_table(header, rows)]
    kept = [f"{row['row']} ({row['stage1_kept']} of {row['seeds']})" for row in table["rows"] if row.get("stage1_kept")]
    if kept:
        lines += ["", "Stage 2 kept the stage-1 model (no stage-2 epoch beat it on the dev split) in: "
                      f"{'; '.join(kept)} seeds."]
    if table.get("missing"):
        lines += ["", f"Not finished, left out: {'; '.join(table['missing'])}."]
    return "\n".join(lines) + "\n"
