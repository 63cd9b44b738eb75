"""Stage 2's model selection with the stage-1 model as candidate epoch 0: in `finetune`, across a
resume, in `linearize finetune` of a stage-1 output, in the pipeline, and in the report."""

import json

import pytest
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader

import linearize
from linearize.errors import OptionError
from linearize.finetune import FinetuneConfig, finetune
from linearize.finetune import stage2 as stage2_module
from linearize.report import Report, Selection, StageResult, render_markdown
from test_pipeline import workspace  # noqa: F401  (the module's tiny model and csv files)
from tiny_models import inputs

QUIET = {"progress": False, "log": lambda *a, **k: None}


def _student():
    """A tiny BERT (dropout on: training draws from torch's global generator) converted to LUNA."""
    from tiny_models import build

    model = build("bert", seed=0)
    torch.manual_seed(1)
    return linearize.convert(model, "luna", projections=4, hidden=8)


def _loader(shuffle=True, n=24, batch_size=4):
    examples = []
    for i in range(n):
        batch = inputs("bert", batch=2, seq=10, pad=1 + i % 3, seed=100 + i)
        examples.append({k: v[i % 2] for k, v in batch.items()} | {"labels": torch.tensor(i % 2)})
    if not shuffle:  # no generator of its own: iterating it draws its seed from torch's global one
        return DataLoader(examples, batch_size=8)
    return DataLoader(examples, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))


def _scripted(monkeypatch, values):
    """Stage 2's dev evaluations (each run for real) report ``values`` in turn (the last one
    repeated); returns the list the calls are counted in."""
    real, calls = stage2_module.evaluate, []

    def evaluate(*args, **kwargs):
        real(*args, **kwargs)
        calls.append(None)
        return {"accuracy": values[min(len(calls), len(values)) - 1]}

    monkeypatch.setattr(stage2_module, "evaluate", evaluate)
    return calls


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_equal_states(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_the_stage1_model_is_kept_when_no_epoch_beats_it(tmp_path, monkeypatch):
    """Epoch 0 scores 0.7 on dev, the epochs 0.6 and 0.7 (no margin: a tie keeps the earlier
    model): the model returned is the one given, every weight exactly, the head included."""
    calls = _scripted(monkeypatch, [0.7, 0.6, 0.7, 0.7])
    model = _student()
    given = _state(model)
    result = finetune(model, _loader(), _loader(False), "sst2", tmp_path, initial_candidate=True,
                      config=FinetuneConfig(lr=1e-3, epochs=2, patience=0, stage1_margin=0), **QUIET)
    assert (result.best_epoch, result.initial_metric, result.best_metric) == (0, 0.7, 0.7)
    assert len(calls) == 4 and len(result.history) == 2  # epoch 0, the two epochs, the final check
    _assert_equal_states(_state(model), given)


def test_a_stage2_epoch_that_beats_it_is_kept_and_trains_as_without_it(tmp_path, monkeypatch):
    """Epoch 1 beats epoch 0: it is kept, with exactly the weights of a run where the model given
    did not compete (scoring it first leaves the training's random draws untouched)."""
    config = FinetuneConfig(lr=1e-3, epochs=2, patience=0, stage1_margin=0)
    _scripted(monkeypatch, [0.6, 0.55, 0.6])
    reference = _student()
    finetune(reference, _loader(), _loader(False), "sst2", tmp_path / "a", config=config, **QUIET)
    _scripted(monkeypatch, [0.5, 0.6, 0.55, 0.6])
    model = _student()
    given = _state(model)
    result = finetune(model, _loader(), _loader(False), "sst2", tmp_path / "b", config=config,
                      initial_candidate=True, **QUIET)
    assert (result.best_epoch, result.initial_metric) == (1, 0.5)
    _assert_equal_states(_state(model), _state(reference))
    assert any(not torch.equal(v, given[k]) for k, v in _state(model).items())  # it trained


def test_given_dev_metrics_are_reused_not_measured_again(tmp_path, monkeypatch):
    calls = _scripted(monkeypatch, [0.9])
    result = finetune(_student(), _loader(), _loader(False), "sst2", tmp_path, initial_candidate=True,
                      initial_metrics={"accuracy": 0.95, "f1": 0.1},
                      config=FinetuneConfig(lr=1e-3, epochs=1, stage1_margin=0),
                      **QUIET)
    assert len(calls) == 2  # the epoch and the final check: none for epoch 0
    assert (result.best_epoch, result.initial_metric) == (0, 0.95)


def test_a_resumed_run_keeps_the_stage1_candidate(tmp_path, monkeypatch):
    """Killed after epoch 1 of 3 (epoch 0 leading), resumed with another model in hand: the
    candidate's weights and score come from the checkpoint, it is not scored again, and it wins."""
    config = FinetuneConfig(lr=1e-3, epochs=3, patience=0, stage1_margin=0)
    _scripted(monkeypatch, [0.9, 0.5])
    model = _student()
    given = _state(model)

    def crash_after_epoch_1(message, *args, **kwargs):
        if message.startswith("epoch 1:"):
            raise KeyboardInterrupt("simulated kill")

    with pytest.raises(KeyboardInterrupt):
        finetune(model, _loader(), _loader(False), "sst2", tmp_path, config=config, initial_candidate=True,
                 progress=False, log=crash_after_epoch_1)
    saved = json.loads((tmp_path / "checkpoint.json").read_text())
    assert (saved["epoch"], saved["extra"]["best_epoch"], saved["extra"]["initial_metric"]) == (1, 0, 0.9)
    calls = _scripted(monkeypatch, [0.6, 0.7, 0.7])
    other = _student()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)  # whatever the resumed process holds, the checkpoint decides
    result = finetune(other, _loader(), _loader(False), "sst2", tmp_path, config=config, initial_candidate=True,
                      **QUIET)
    assert result.extra["resumed"] and result.extra["epochs_run"] == 3 and len(calls) == 3  # epochs 2, 3, the final check
    assert (result.best_epoch, result.initial_metric, result.best_metric) == (0, 0.9, 0.9)
    _assert_equal_states(_state(other), given)


@pytest.mark.parametrize("lead_in_errors, kept", [(0.5, 1), (2.0, 0)])
def test_the_stage1_model_needs_a_lead_of_the_margin_to_be_kept(tmp_path, monkeypatch, lead_in_errors, kept):
    """The default margin, one standard error of the stage-1 model's dev metric (on its own dev
    predictions): an epoch trailing it by half that is kept; one trailing by two, not."""
    from linearize.evaluation import predict
    from linearize.metrics import standard_error

    model = _student()
    logits, labels = predict(model, _loader(False))
    error = standard_error("sst2", logits, labels, "accuracy")
    assert error > 0.02  # 24 dev examples
    _scripted(monkeypatch, [0.9 - lead_in_errors * error])
    result = finetune(model, _loader(), _loader(False), "sst2", tmp_path, initial_candidate=True,
                      initial_metrics={"accuracy": 0.9}, config=FinetuneConfig(lr=1e-3, epochs=1), **QUIET)
    assert result.best_epoch == kept and result.extra["stage1_margin"] == pytest.approx(error)
    selection = result.selection("accuracy")
    assert selection.margin == pytest.approx(error) and selection.stage1_kept == (kept == 0)
    assert Selection.from_json(selection.to_json()) == selection


def test_the_margin_is_a_standard_error_of_the_metric():
    """For accuracy, the jackknife's standard error is the binomial one, sqrt(p(1 - p) / n), within
    the spread of 200 subsets; for an F1 or a correlation it is of the same size."""
    import numpy as np

    from linearize.metrics import standard_error

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 400)
    predictions = np.where(rng.random(400) < 0.8, labels, 1 - labels)
    accuracy = float(np.mean(predictions == labels))
    binomial = (accuracy * (1 - accuracy) / 400) ** 0.5
    assert standard_error("sst2", predictions, labels, "accuracy") == pytest.approx(binomial, rel=0.15)
    assert 0.5 * binomial < standard_error("mrpc", predictions, labels, "f1") < 3 * binomial
    assert standard_error("sst2", predictions[:3], labels[:3], "accuracy") == 0.0  # too few examples
    values = rng.normal(size=400)
    assert 0.01 < standard_error("stsb", values + rng.normal(size=400), values, "pearson") < 0.1


def test_a_margin_that_cannot_take_effect_is_an_error():
    from linearize.recipes import load_recipe

    with pytest.raises(OptionError, match="stage2.stage1_margin 2 weighs a stage-1 model"):
        load_recipe("minilm-moviereviews", overrides={"stage1": {"enabled": False}, "stage2": {"stage1_margin": 2.0}})
    # the embeddings recipe sets 0 itself: the line says how to run it without stage 1
    with pytest.raises(OptionError, match="stage2.stage1_margin 0 weighs .* set it to 1 where a recipe sets it"):
        load_recipe("minilm-embeddings", overrides={"stage1": {"enabled": False}})
    assert not load_recipe("minilm-embeddings", overrides={"stage1": {"enabled": False},
                                                           "stage2": {"stage1_margin": 1.0}}).stage1.enabled
    with pytest.raises(OptionError, match="stage1_margin must be >= 0"):
        load_recipe("minilm-moviereviews", overrides={"stage2": {"stage1_margin": -1.0}})
    assert load_recipe("minilm-moviereviews", overrides={"stage2": {"stage1_margin": 2.0}}).stage2.stage1_margin == 2


def _weights(folder):
    return load_file(str(folder / "model.safetensors"))


def test_linearize_finetune_of_a_stage1_output_can_keep_it(workspace, tmp_path, monkeypatch):  # noqa: F811
    """`linearize finetune` of a `linearize distill` folder: the stage-1 model competes, and when
    stage 2 does not beat it the saved model is the stage-1 model; a softmax checkpoint does not compete."""
    from linearize.config import Stage1Config
    from linearize.pipeline import distill_model, finetune_model
    from linearize.pipeline.single_stage import is_stage1_output

    data = {"train_file": str(workspace / "train.csv"), "validation_file": str(workspace / "dev.csv"),
            "test_file": str(workspace / "test.csv"), "max_length": 16}
    distill_model(str(workspace / "tiny"), "files", tmp_path / "s1", method="hedgehog", data=data,
                  config=Stage1Config(lr=1e-2, epochs=1, batch_size=8), **QUIET)
    assert is_stage1_output(tmp_path / "s1") and not is_stage1_output(workspace / "tiny")
    _scripted(monkeypatch, [0.9, 0.5])
    config = FinetuneConfig(lr=1e-3, batch_size=8, epochs=1, stage1_margin=0)
    result = finetune_model(str(tmp_path / "s1"), "files", tmp_path / "s2", config=config, data=data, **QUIET)
    assert (result.best_epoch, result.initial_metric) == (0, 0.9)
    _assert_equal_states(_weights(tmp_path / "s2"), _weights(tmp_path / "s1"))
    with pytest.raises(OptionError, match="--stage1-margin 0 weighs a stage-1 model against stage 2's epochs"):
        finetune_model(str(workspace / "tiny"), "files", tmp_path / "teacher", config=config, data=data, **QUIET)
    result = finetune_model(str(workspace / "tiny"), "files", tmp_path / "teacher", data=data, **QUIET,
                            config=FinetuneConfig(lr=1e-3, batch_size=8, epochs=1))
    assert result.initial_metric is None and result.best_epoch == 1 and result.extra["stage1_margin"] is None


def test_the_pipeline_reuses_the_stage1_score_and_reports_the_winner(workspace, tmp_path, monkeypatch):  # noqa: F811
    """Stage 2 scoring below the stage-1 model on dev (every epoch at its real dev accuracy − 1):
    the saved student is the stage-1 model and the report says so; scoring above it (+ 1), the
    stage-2 epoch is kept. The stage-1 model's dev score is the one stage 1 recorded, not measured again."""
    from linearize.pipeline import run
    from linearize.recipes import load_recipe

    real, calls = stage2_module.evaluate, []

    def shifted(by):
        def evaluate(*args, **kwargs):
            calls.append(None)
            return {name: value + by for name, value in real(*args, **kwargs).items()}
        return evaluate

    recipe = load_recipe(str(workspace / "tiny.yaml"), overrides={"teacher": {"epochs": 1}, "stage1": {"epochs": 1}})
    monkeypatch.setattr(stage2_module, "evaluate", shifted(-1.0))
    report = run(recipe, tmp_path / "worse", **QUIET)
    stage2_epochs = recipe.stage2.epochs
    assert len(calls) == recipe.teacher.epochs + 1 + stage2_epochs + 1  # each: its epochs, the final check
    dev_stage1 = report.scores_of("student_stage1", "validation")["accuracy"]
    assert report.selection.selected_epoch == 0 and report.selection.stage1_kept
    assert report.selection.candidates[0] == (0, dev_stage1) and len(report.selection.candidates) == 1 + stage2_epochs
    assert report.scores["student"] == report.scores["student_stage1"]
    _assert_equal_states(_weights(tmp_path / "worse" / "model"), _weights(tmp_path / "worse" / "stage1"))
    markdown = (tmp_path / "worse" / "report.md").read_text()
    assert "Stage 2 kept the stage-1 model (epoch 0)" in markdown and "final student (the stage-1 model" in markdown
    assert json.loads((tmp_path / "worse" / "report.json").read_text())["selection"]["selected_epoch"] == 0

    monkeypatch.setattr(stage2_module, "evaluate", shifted(1.0))
    report = run(recipe, tmp_path / "better", teacher_from=tmp_path / "worse", **QUIET)
    assert report.selection.selected_epoch >= 1 and not report.selection.stage1_kept
    assert f"Stage 2 kept its epoch {report.selection.selected_epoch}, which beat the stage-1 model" in \
        (tmp_path / "better" / "report.md").read_text()


def test_the_report_reads_writes_and_renders_the_selection():
    from linearize.compare import render, summarize
    from linearize.report.card import build_card
    from test_report import full_report

    stage2 = StageResult.from_dict({"best_epoch": 0, "initial_metric": 0.806,
                                    "history": [{"epoch": 1, "step": 90, "dev_accuracy": 0.794}]})
    selection = stage2.selection("accuracy")
    assert selection == Selection(metric="accuracy", candidates=((0, 0.806), (1, 0.794)), selected_epoch=0)
    assert StageResult.from_dict({"skipped": True}).selection("accuracy") == Selection()
    data = dict(full_report(), selection=selection.to_json())
    report = Report.from_json(data)
    assert report.selection == selection and report.selection.stage1_kept
    assert Report.from_json(report.to_json()) == report
    assert Report.from_json(full_report()).selection == Selection()  # written before: none, and none written
    assert "selection" not in Report.from_json(full_report()).to_json()
    note = ("Stage 2 kept the stage-1 model (epoch 0): none of its own epochs beat it on the validation split "
            "(accuracy: the stage-1 model 0.806; epoch 1 0.794; a tie keeps the earlier model).")
    assert note in render_markdown(report)
    assert "No stage-2 epoch beat that model on the validation split" in render_markdown(report)
    card = str(build_card("me/tiny", {"linearize": {"method": "luna"}}, report))
    assert f"Model selection: {note}" in card
    within = Report.from_json(dict(data, selection=dict(selection.to_json(), selected_epoch=1, margin=0.022)))
    assert within.selection.margin == 0.022 and not within.selection.stage1_kept
    assert ("Stage 2 kept its epoch 1: the stage-1 model led it by 0.012, under the margin of 0.022 on the validation "
            "split (accuracy: the stage-1 model 0.806; epoch 1 0.794; the stage-1 model is kept only when ahead by at "
            "least the margin, stage2.stage1_margin standard errors of its dev accuracy).") in render_markdown(within)
    later = Report.from_json(dict(data, selection=dict(selection.to_json(), selected_epoch=1)))
    table = summarize({"luna + stage 1": [report, later]})
    assert table["rows"][1]["stage1_kept"] == 1
    assert "Stage 2 kept the stage-1 model (no stage-2 epoch beat it on the dev split) in: luna + stage 1 (1 of 2) " \
           "seeds." in render(table)


def test_the_comparison_table_gives_every_score_and_the_speed_up_at_the_longer_lengths():
    """``compare.md`` gave the primary metric only: an embedding comparison lost its top-10 overlap and its
    document scores (issue 34, item 4), and the long-length speed-ups of each run's report were not tabulated."""
    from linearize.compare import render, summarize
    from test_report import full_report

    def report(seed, cosine, doc, speedup):
        data = dict(full_report(), seeds={"seed": seed})
        data["task"] = dict(data["task"], name="embeddings", metric_names=["cosine", "top10_overlap"],
                            primary_metric="cosine")
        split = data["task"].get("report_split", "test")
        teacher = {"cosine": 1.0, "top10_overlap": 1.0, "doc_cosine": 1.0}
        data["scores"] = {"teacher": {split: teacher},
                          "student": {split: {"cosine": cosine, "top10_overlap": 0.5, "doc_cosine": doc}}}
        data["latency"] = dict(data["latency"], at_lengths=[{"seq_len": 2048, "teacher_ms": 2.0, "student_ms": 1.0,
                                                             "speedup": speedup}])
        return Report.from_json(data)

    table = summarize({"luna": [report(0, 0.9, 0.8, 1.5), report(1, 0.94, 0.6, 1.7)]})
    assert table["other_metrics"] == ["top10_overlap", "doc_cosine"] and table["speedup_lengths"] == [2048]
    teacher, student = table["rows"]
    assert teacher["others"]["doc_cosine"] == [1.0, 0.0]
    assert student["others"]["doc_cosine"][0] == pytest.approx(0.7)
    assert student["speedups"]["2048"] == pytest.approx(1.6)
    # each run's own scores, so that tables made apart can be pooled from their JSON alone
    assert [(entry["seed"], entry["scores"]["cosine"]) for entry in student["per_seed"]] == [(0, 0.9), (1, 0.94)]
    assert [entry["recovery"] for entry in student["per_seed"]] == pytest.approx([90.0, 94.0])
    assert [entry["seed"] for entry in teacher["per_seed"]] == [0, 1] and "recovery" not in teacher["per_seed"][0]
    markdown = render(table)
    assert "| top10_overlap | doc_cosine |" in markdown and "| speed-up at 2,048 |" in markdown
    assert "| 0.700 ± 0.141 |" in markdown and "| 1.60× |" in markdown
