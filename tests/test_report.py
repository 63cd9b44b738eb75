"""The recovery report: report.json -> report.md + figures, and `linearize report RUN_DIR`."""

import json
import math
import random
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import linearize.cli.report  # noqa: F401  (registers `report` until cli/__init__ imports it)
from linearize.cli import app
from linearize.errors import LinearizeError
from linearize.report import (Report, StageResult, load_report, make_figures, recovery, render_markdown, render_report,
                              write_report)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
runner = CliRunner()


def _softmaxish(values):
    total = sum(values)
    return [v / total for v in values]


def full_report():
    """A realistic report of a MiniLM -> LUNA run on movie reviews (every section present)."""
    rng = random.Random(0)
    layers = list(range(6))
    per_layer = []
    for layer in layers:
        teacher_entropy = 2.0 - 0.1 * layer
        kl_before = 1.0 + 0.05 * layer
        kl_after = 0.55 + 0.04 * layer + (0.35 if layer == 4 else 0.0)
        per_layer.append({"layer": layer, "ce_before": teacher_entropy + kl_before, "kl_before": kl_before,
                          "ce_after": teacher_entropy + kl_after, "kl_after": kl_after,
                          "teacher_entropy": teacher_entropy, "student_entropy": teacher_entropy + 0.3})
    grid = [-4 + 8 * i / 199 for i in range(200)]
    edges = [-4 + 8 * i / 40 for i in range(41)]
    counts = [round(1000 * math.exp(-0.5 * ((a + b) / 2) ** 2)) for a, b in zip(edges, edges[1:])]

    def channels(seed):
        r = random.Random(seed)
        params = [(r.uniform(-1.5, 1.5), r.uniform(-1, 1)) for _ in range(8)]
        params[5] = (0.0, -1.0)  # a dead channel
        return [[max(0.0, a * u + b + 0.2 * math.sin(u)) for a, b in params] for u in grid]

    sentence = ["[CLS]", "a", "gripping", ",", "beautifully", "acted", "film", "about", "loss", "and", "memory",
                "that", "never", "quite", "finds", "its", "footing", "in", "the", "final", "act", ".", "[SEP]"]
    teacher_w = _softmaxish([3.0] + [rng.uniform(0.1, 1.0) for _ in sentence[1:-1]] + [4.0])
    student_w = _softmaxish([1.0] + [rng.uniform(0.3, 1.0) for _ in sentence[1:-1]] + [1.5])
    short = ["[CLS]", "dull", "and", "lifeless", ".", "[SEP]"]
    return {
        "schema": "linearize.report", "schema_version": 1, "created": "2026-11-22T07:00:00Z",
        "recipe": {"name": "minilm-luna-moviereviews", "model": "minilm", "task": "moviereviews", "method": "luna",
                   "options": {"projections": 8, "channels": 8, "hidden": 64}, "layers": None, "seed": 0,
                   "teacher": {"epochs": 3, "lr": 5e-5, "batch_size": 32},
                   "stage1": {"epochs": 1, "lr": 1e-3, "scheduler": "cosine"},
                   "stage2": {"epochs": 3, "lr": 5e-5, "batch_size": 32},
                   "data": {"max_length": 64, "train": 2880, "validation": 320, "test": 800}},
        "task": {"name": "moviereviews", "kind": "text", "metric_names": ["accuracy"], "primary_metric": "accuracy",
                 "selection_split": "validation", "report_split": "test",
                 "num_examples": {"train": 2880, "validation": 320, "test": 800}},
        "model": {"source": "minilm", "architecture": "BertForSequenceClassification", "method": "luna",
                  "options": {"projections": 8}, "layers": layers, "num_attention_layers": 6,
                  "parameters_base": 22713986, "parameters_added": 5472, "parameters_added_percent": 0.0241},
        "scores": {"teacher": {"validation": {"accuracy": 0.8125}, "test": {"accuracy": 0.815}},
                   "student_stage1": {"validation": {"accuracy": 0.74}, "test": {"accuracy": 0.7417}},
                   "student": {"validation": {"accuracy": 0.80}, "test": {"accuracy": 0.8003}}},
        "recovery": {"split": "test", "per_metric": {"accuracy": 98.2}, "average": 98.2,
                     "stage1_per_metric": {"accuracy": 91.0}, "stage1_average": 91.0},
        "attention": {"per_layer": per_layer, "mean_kl_before": 1.125, "mean_kl_after": 0.71,
                      "stage1_skipped": False},
        "timing": {"teacher_seconds": 246.0, "stage1_seconds": 120.0, "stage2_seconds": 570.0,
                   "total_seconds": 951.0},
        "latency": {"seq_len": 64, "batch_size": 32, "teacher_ms": 40.1, "student_ms": 38.0, "speedup": 1.055},
        "curves": {
            "teacher": [{"epoch": e, "step": 90 * e, "train_loss": 0.6 / e, "lr": 5e-5 * (1 - e / 4),
                         "dev_accuracy": 0.78 + 0.012 * e} for e in (1, 2, 3)],
            "stage1": [{"step": s, "ce": 3.1 - 0.4 * (1 - math.exp(-s / 30)) + rng.gauss(0, 0.04),
                        "kl": 1.12 - 0.4 * (1 - math.exp(-s / 30)) + rng.gauss(0, 0.04), "lr": 1e-3}
                       for s in range(1, 91)],
            "stage2": [{"epoch": e, "step": 90 * e, "train_loss": 0.55 / e, "lr": 5e-5,
                        "dev_accuracy": acc} for e, acc in ((1, 0.78), (2, 0.80), (3, 0.795))]},
        "visuals": {
            "luna_channels": [
                {"layer": 0, "grid": grid, "psi": channels(1), "hist_edges": edges, "hist_counts": counts},
                {"layer": 5, "grid": grid, "psi": channels(2), "hist_edges": edges, "hist_counts": counts}],
            "cls_attention": [
                {"text": " ".join(sentence[1:-1]), "tokens": sentence, "teacher": teacher_w, "student": student_w,
                 "layer": 5},
                {"text": "dull and lifeless.", "tokens": short, "teacher": _softmaxish([2, 1, 0.2, 1.5, 0.3, 3]),
                 "student": _softmaxish([1, 0.8, 0.5, 1.0, 0.5, 1]), "layer": 5}]},
        "seeds": {"seed": 0},
        "environment": {"python": "3.11.2", "torch": "2.9.0", "transformers": "5.23.0", "linearize": "0.1.0",
                        "platform": "Linux-x86_64", "cpu": "x86_64", "threads": 2},
        "data_hash": "sha256:0123456789abcdef",
    }


def minimal_report():
    """A T2R run without stage 1 and without visuals, curves, timing or latency."""
    report = full_report()
    for key in ("recovery", "curves", "visuals", "timing", "latency", "seeds", "environment", "data_hash"):
        del report[key]
    del report["scores"]["student_stage1"]
    report["model"]["method"] = "t2r"
    report["attention"] = {"per_layer": [{"layer": r["layer"], "ce_before": r["ce_before"], "kl_before": r["kl_before"],
                                          "teacher_entropy": r["teacher_entropy"],
                                          "student_entropy": r["student_entropy"]}
                                         for r in report["attention"]["per_layer"]],
                           "mean_kl_before": 1.125, "stage1_skipped": True}
    return report


def assert_png(path, min_bytes=8000):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert len(data) > min_bytes, (path, len(data))


def test_full_report_renders_markdown_and_all_figures(tmp_path):
    report = full_report()
    written = write_report(report, tmp_path)
    assert report["figures"] == ["figures/curves.png", "figures/per_layer_kl.png", "figures/luna_channels.png",
                                 "figures/cls_attention.png"]
    for figure in report["figures"]:
        assert_png(tmp_path / figure)
    assert {p.name for p in written} >= {"report.json", "report.md", "curves.png"}
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["figures"] == report["figures"] and saved["scores"] == report["scores"]
    assert not [p for p in tmp_path.rglob(".*")]  # no temporary file left behind

    md = (tmp_path / "report.md").read_text()
    assert md == render_markdown(saved)
    assert md.startswith("# minilm → luna on moviereviews\n")
    assert "keeps 98.2% of the teacher's accuracy on the test split" in md
    assert "(student 0.800, teacher 0.815)" in md and "kept 91.0%" in md
    # LUNA Table 2 style: teacher / after stage 1 / after stage 2, score and recovery
    assert "| teacher (softmax) | 0.815 | 100.0% |" in md
    assert "| student after stage 1 | 0.742 | 91.0% |" in md
    assert "| student after stage 2 | 0.800 | **98.2%** |" in md
    assert "accuracy (validation)" in md and "0.812" in md
    assert "5,472 (0.0241% of 22,713,986)" in md
    # per-layer table with before -> after and the worst layer (4) highlighted
    assert "| 0 | 3.000 → 2.550 | 1.000 → 0.550 | 2.000 | 2.300 | +0.300 |" in md
    assert "| **4** | **2.800 → 2.660** | **1.200 → 1.060** | 1.600 | 1.900 | +0.300 | ◀ worst |" in md
    assert "layer 4 lags most" in md.lower() and "1.125 → 0.710" in md
    assert "4.1 min" in md and "9.5 min" in md and "15.8 min" in md
    assert "40.1 ms" in md and "38.0 ms" in md and "1.05×" in md
    for figure in report["figures"]:
        assert f"]({figure})" in md
    assert "```yaml\nname: minilm-luna-moviereviews\n" in md and "lr: 0.001" in md
    assert "sha256:0123456789abcdef" in md and "`5.23.0`" in md and "standard error" in md


def test_minimal_report_omits_the_missing_parts(tmp_path):
    report = minimal_report()
    write_report(report, tmp_path)
    assert report["figures"] == ["figures/per_layer_kl.png"]
    assert_png(tmp_path / "figures" / "per_layer_kl.png", min_bytes=4000)
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# minilm → t2r on moviereviews")
    assert "keeps 98.2% of the teacher's accuracy" in md  # recovery computed from the scores
    assert "student after stage 1" not in md and "kept" not in md
    assert "Stage 1 was skipped" in md and "KL (untrained)" in md and "→" not in md.split("## Attention")[1]
    for absent in ("## Time", "## Inference latency", "curves.png", "luna_channels", "cls_attention", "data hash"):
        assert absent not in md


def test_bare_minimum_report_still_renders():
    report = {"schema": "linearize.report", "schema_version": 1, "recipe": {}, "task": {}, "model": {},
              "scores": {"teacher": {"test": {"accuracy": 0.9}}}}
    md = render_markdown(report)
    assert md.startswith("# model → linear attention on task")
    assert "recovery is unknown" in md


def test_multi_metric_and_image_report(tmp_path):
    report = full_report()
    report["task"].update(name="mrpc", metric_names=["f1", "accuracy"], primary_metric="combined")
    report["scores"] = {"teacher": {"test": {"f1": 0.88, "accuracy": 0.84}},
                        "student": {"test": {"f1": 0.86, "accuracy": 0.80}}}
    del report["recovery"]
    md = render_markdown(report)
    assert "keeps 96.5% of the teacher's score on the test split" in md
    assert "0.860 (97.7%)" in md and "0.800 (95.2%)" in md

    report = {key: full_report()[key] for key in ("schema", "schema_version", "recipe", "task", "model", "scores")}
    report["task"]["kind"] = "image"
    rng = random.Random(1)
    report["visuals"] = {"cls_attention": [
        {"image_index": 3, "grid": [7, 7], "teacher": _softmaxish([rng.random() ** 3 for _ in range(49)]),
         "student": _softmaxish([rng.random() for _ in range(49)]), "layer": 11,
         "pixels": [[(i * 9 + j * 5) % 256 for j in range(28)] for i in range(28)]}]}
    figures = make_figures(report, tmp_path)
    assert figures == ["figures/cls_attention.png"]
    assert_png(tmp_path / "figures" / "cls_attention.png")


def test_load_report_rejects_bad_inputs(tmp_path):
    with pytest.raises(LinearizeError, match="no report at"):
        load_report(tmp_path)
    path = tmp_path / "report.json"
    for content, message in (("{not json", "is not valid JSON"),
                             ("[1, 2]", "is not a JSON object"),
                             (json.dumps({**full_report(), "schema": "other"}), "has schema 'other'"),
                             (json.dumps({**full_report(), "schema_version": 2}), "upgrade linearize"),
                             (json.dumps({**full_report(), "schema_version": "1"}), "schema_version '1'"),
                             (json.dumps({k: v for k, v in full_report().items() if k != "scores"}),
                              "lacks the section(s) scores")):
        path.write_text(content)
        with pytest.raises(LinearizeError, match=re.escape(message)) as error:
            load_report(path)
        assert "\n" not in str(error.value)
    path.write_text(json.dumps(full_report()))
    assert load_report(tmp_path).task.name == "moviereviews"


def test_cli_rerenders_from_report_json(tmp_path):
    (tmp_path / "report.json").write_text(json.dumps(full_report()))  # as the pipeline leaves it
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "report.md" in result.output and "4 figure(s)" in result.output
    assert "keeps 98.2%" in (tmp_path / "report.md").read_text()
    assert json.loads((tmp_path / "report.json").read_text())["figures"][0] == "figures/curves.png"
    assert_png(tmp_path / "figures" / "curves.png")
    # the report.json path works too; a figure whose data vanished is removed
    report = full_report()
    del report["visuals"]["cls_attention"]
    (tmp_path / "report.json").write_text(json.dumps(report))
    assert render_report(tmp_path / "report.json")[1] == tmp_path / "report.md"
    assert not (tmp_path / "figures" / "cls_attention.png").exists()
    assert "cls_attention" not in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("case", ["missing", "wrong_version"])
def test_cli_bad_inputs_are_one_line_errors(tmp_path, case):
    if case == "wrong_version":
        (tmp_path / "report.json").write_text(json.dumps({**full_report(), "schema_version": 7}))
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert ("no report at" if case == "missing" else "schema_version 7") in lines[0]
    assert not (tmp_path / "report.md").exists()


def test_a_stage1_that_made_the_attention_worse_is_said_so():
    report = full_report()
    report["attention"]["mean_kl_after"] = 1.3  # above mean_kl_before (1.125)
    md = render_markdown(report)
    assert "Mean KL 1.125 → 1.300: stage 1 did not lower it" in md and "% lower" not in md
    assert "Mean KL 1.125 → 0.710 (37% lower)." in render_markdown(full_report())
    exact = full_report()
    exact["attention"]["mean_kl_before"] = exact["attention"]["mean_kl_after"] = 0.0
    assert "Mean KL 0.000 → 0.000." in render_markdown(exact)


# ---- typed results ---------------------------------------------------------------------------------

OLD_RUN = Path(__file__).parent / "data" / "report_v1"


def test_a_report_written_before_the_typed_results_still_renders(tmp_path):
    """tests/data/report_v1: report.json and report.md as `linearize run` wrote them before the
    report became a typed object (a tiny BERT -> LUNA run). `linearize report` re-renders the same
    report.md and every figure, and the typed report writes back exactly the layout it read."""
    old = json.loads((OLD_RUN / "report.json").read_text())
    shutil.copy(OLD_RUN / "report.json", tmp_path / "report.json")
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "4 figure(s)" in result.output
    assert (tmp_path / "report.md").read_text() == (OLD_RUN / "report.md").read_text()
    for figure in old["figures"]:
        assert_png(tmp_path / figure)
    report = load_report(tmp_path)
    assert report.to_json() == old
    assert report.recovery().per_metric == pytest.approx(old["recovery"]["per_metric"])
    assert report.recovery("student_stage1").average == pytest.approx(old["recovery"]["stage1_average"])


def test_recovery_is_derived_from_the_scores_once():
    report = Report.from_json(full_report())
    teacher, student = report.scores_of("teacher")["accuracy"], report.scores_of("student")["accuracy"]
    assert report.split == "test" and report.metric_names == ["accuracy"]
    assert report.recovery().per_metric == {"accuracy": pytest.approx(100 * student / teacher)}
    assert report.to_json()["recovery"]["average"] == pytest.approx(100 * student / teacher)
    assert recovery({"f1": 0.8, "accuracy": 0.0}, {"f1": 0.4, "accuracy": 0.5}) == ({"f1": 50.0}, 50.0)
    assert recovery({"accuracy": 0.9}, {}) == ({}, None)
    assert report.task.name == "moviereviews" and not hasattr(report, "__getitem__")  # typed, no dict view


def test_timings_taken_on_a_busy_machine_are_flagged_in_the_report_and_the_card():
    """A run's timings record the cores other processes kept busy; from 0.15 cores on (the bench's rule) the report
    and the model card say the timings are inflated; below, and in reports that did not record it, nothing."""
    from linearize.report.card import _recovery_section

    warning = "other processes kept 0.90 cores busy on average during the timings"
    for recorded, flagged in ((None, False), (0.05, False), (0.9, True)):
        data = full_report()
        data["latency"]["at_lengths"] = [{"seq_len": 2048, "teacher_ms": 400.0, "student_ms": 250.0, "speedup": 1.6,
                                          "other_processes_cores": recorded}]
        report = Report.from_json(data)
        assert report.latency.busy_cores() == recorded
        assert (warning in render_markdown(report)) == flagged
        assert (warning in "\n".join(_recovery_section(report, ()))) == flagged


def test_earlier_visual_layouts_are_normalised_when_read():
    """Version 1 allowed ψ channel-major and an image's [CLS] weight included: from_json turns
    both into the one layout the figures draw."""
    data = full_report()
    entry = data["visuals"]["luna_channels"][0]
    entry["psi"] = [list(column) for column in zip(*entry["psi"])]  # L x len(grid)
    weights = _softmaxish([1.0] * 50)
    image = {"image_index": 0, "grid": [7, 7], "teacher": weights, "student": weights, "layer": 11}
    data["visuals"]["cls_attention"] = [image, {"teacher": [1.0], "student": [1.0, 2.0]}]  # the second is unusable
    data["task"]["kind"] = "image"
    visuals = Report.from_json(data).visuals
    assert visuals["luna_channels"][0]["psi"] == full_report()["visuals"]["luna_channels"][0]["psi"]
    (cls,) = visuals["cls_attention"]
    assert cls["teacher"] == weights[1:] and len(cls["student"]) == 49


def test_stage_result_keeps_what_the_stage_returned():
    returned = {"skipped": False, "method": "luna", "steps": 12, "seconds": 3.5, "history": [{"step": 1, "kl": 0.5}],
                "per_layer_before": {0: {"kl": 1.0}}, "per_layer_after": {0: {"kl": 0.5}}, "config": {"lr": 0.1}}
    result = StageResult.from_dict(returned)
    assert (result.seconds, result.skipped, result.method, result.steps) == (3.5, False, "luna", 12)
    assert result.extra == {"config": {"lr": 0.1}} and result.to_dict() == {**returned, "scores": {}}  # round-trips
    scored = result.with_scores({"test": {"accuracy": 0.9}})
    assert StageResult.from_dict(scored.to_dict()) == scored
    assert StageResult.from_dict({"skipped": True, "seconds": None}).seconds == 0.0


def test_a_feature_map_probes_its_own_figure_data():
    """LUNA's probe is its Fig. 3 (ψ_ℓ on a grid over the empirical u, and u's histogram); a map
    without a figure returns None."""
    import torch

    from linearize.attention import create_feature_map

    torch.manual_seed(0)
    luna = create_feature_map("luna", 16, 2, projections=4, channels=3, hidden=8)
    inputs = [torch.randn(2, 2, 5, 16), torch.randn(2, 2, 5, 16)]
    probe = luna.probe(inputs, points=50, bins=10)
    assert len(probe["grid"]) == 50 and len(probe["psi"]) == 50 and len(probe["psi"][0]) == 3
    u_values = 2 * 2 * 2 * 5 * 4  # two inputs of [2, 2, 5] vectors, 4 projections each
    assert len(probe["hist_edges"]) == 11 and 0.95 * u_values <= sum(probe["hist_counts"]) <= u_values  # the range
    assert probe["hist_edges"][0] == pytest.approx(probe["grid"][0], abs=1e-5)  # spans the 0.5-99.5 % quantiles
    grid = torch.tensor(probe["grid"])
    torch.testing.assert_close(torch.tensor(probe["psi"]), luna.psi_mlp(grid).detach())
    assert create_feature_map("hedgehog", 16, 2).probe(inputs) is None


def test_the_luna_figure_of_a_hybrid_whose_window_covers_the_batch_is_left_out():
    """A hybrid LUNA whose window covers every input runs exact softmax (SDPA): its maps see no input, and
    the figure data raised (torch.cat of nothing) at the end of a finished run; those layers have no figure,
    a batch longer than the window has its figure."""
    import torch
    from torch.utils.data import DataLoader

    import linearize
    from linearize.pipeline.measurements import luna_channels
    from tiny_models import build, inputs

    torch.manual_seed(0)
    student = linearize.convert(build("bert"), "luna", window=16, sinks="first")
    short = inputs("bert", batch=2, seq=12)
    assert luna_channels(student, DataLoader([short], batch_size=None)) == []
    long = inputs("bert", batch=2, seq=40)
    figures = luna_channels(student, DataLoader([long], batch_size=None))
    assert [entry["layer"] for entry in figures] == [0, 1] and all(entry["psi"] for entry in figures)


def test_a_runs_timings_say_they_come_from_the_linearize_process():
    """The report and the model card name where a run's latency was timed, and the command that times
    the folder as a user's process loads it (issue 35)."""
    from linearize.report.card import build_card
    from linearize.report.markdown import IN_PROCESS_NOTE, render_markdown

    report = load_report(OLD_RUN)
    assert report.latency.teacher_ms is not None
    assert IN_PROCESS_NOTE in render_markdown(report) and "--processes 5" in IN_PROCESS_NOTE
    card = " ".join(str(build_card("me/tiny", {"linearize": {"method": "luna"}}, report)).split())
    assert "from the `linearize` run's own process" in card and "--processes 5" in card


def test_the_card_says_which_weights_stage_2_trained():
    """Stage 2 fine-tunes the whole student unless the recipe's stage2.trainable says attention: then the card
    says only the feature maps trained, the pretrained weights frozen."""
    from linearize.report.card import build_card

    data = full_report()
    data["recipe"]["stage2"] = {**data["recipe"].get("stage2", {}), "trainable": "all"}
    card = " ".join(str(build_card("me/tiny", {"linearize": {"method": "luna"}}, Report.from_json(data))).split())
    assert "stage 2 fine-tunes the whole student on the task" in card
    data["recipe"]["stage2"]["trainable"] = "attention"
    card = " ".join(str(build_card("me/tiny", {"linearize": {"method": "luna"}}, Report.from_json(data))).split())
    assert "stage 2 fine-tunes only the feature maps (every pretrained weight and the head frozen) on the task" in card


def test_an_embedding_students_card_names_the_similarity_term_when_stage_2_used_it():
    from linearize.report.card import build_card

    data = full_report()
    data["task"] = dict(data["task"], name="embeddings", embedding=True, metric_names=["cosine", "top10_overlap"],
                        primary_metric="cosine")
    split = data["task"].get("report_split", "test")
    data["scores"] = {"teacher": {split: {"cosine": 1.0, "top10_overlap": 1.0}},
                      "student": {split: {"cosine": 0.99, "top10_overlap": 0.8}}}
    data["recipe"]["stage2"] = {**data["recipe"].get("stage2", {}), "similarity_weight": 0.0}

    def card():
        return " ".join(str(build_card("me/tiny", {"linearize": {"method": "luna"}}, Report.from_json(data))).split())

    assert "(mean squared error, Reimers & Gurevych 2020, eq. 1)." in card() and "CompRess" not in card()
    data["recipe"]["stage2"].update(similarity_weight=0.5, similarity_temperature=0.1)
    assert ("eq. 1) and how each text ranks the other texts of its batch (CompRess, Abbasi Koohpayegani et al. "
            "2020: weight 0.5, temperature 0.1).") in card()
    data["recipe"]["stage2"].update(similarity_anchors="train")
    assert "eq. 1) and how each text ranks every other training text (CompRess" in card()
