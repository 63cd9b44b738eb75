"""The pipeline (`linearize run`) and the single-stage commands on a tiny BERT and small files."""

import csv
import dataclasses
import json

import pytest
import torch
import yaml
from typer.testing import CliRunner

import linearize
from linearize.cli import app
from linearize.pipeline import load_data, run
from linearize.recipes import load_recipe
from linearize.report.results import Report
from tiny_models import save_tiny_text_classifier

runner = CliRunner()
POSITIVE = ["a fine, moving film", "warm and funny", "beautifully acted", "a delight", "sharp and clever",
            "great fun", "tender and wise", "a triumph"]
NEGATIVE = ["dull and flat", "a tedious mess", "badly written", "a bore", "lifeless and slow", "awful jokes",
            "clumsy and shrill", "a waste"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, minilm_path):
    root = tmp_path_factory.mktemp("pipeline")
    save_tiny_text_classifier(root / "tiny", minilm_path)
    for split, copies in (("train", 3), ("dev", 1), ("test", 1)):
        with open(root / f"{split}.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["text", "label"])
            for i in range(copies):
                for p, n in zip(POSITIVE, NEGATIVE):
                    writer.writerow([f"{p} {i}" if split == "train" else f"{p}, {split}", "pos"])
                    writer.writerow([f"{n} {i}" if split == "train" else f"{n}, {split}", "neg"])
    recipe = {
        "model": str(root / "tiny"), "task": "files", "method": "hedgehog",
        "data": {"train_file": str(root / "train.csv"), "validation_file": str(root / "dev.csv"),
                 "test_file": str(root / "test.csv"), "max_length": 16},
        "teacher": {"lr": 1e-3, "batch_size": 8, "epochs": 2},
        "stage1": {"lr": 1e-2, "batch_size": 8, "epochs": 2, "eval_batches": 2},
        "stage2": {"lr": 1e-3, "batch_size": 8, "epochs": 2},
        "eval": {"latency_repeats": 2, "examples": 2},
    }
    (root / "tiny.yaml").write_text(yaml.safe_dump(recipe))
    return root


def test_run_writes_report_model_and_resumes(workspace):
    recipe = load_recipe(str(workspace / "tiny.yaml"))
    out = workspace / "run"
    report = run(recipe, out, progress=False, log=lambda *a, **k: None).to_json()
    assert report["schema_version"] == 1 and report["model"]["method"] == "hedgehog"
    assert report["task"]["selection_split"] == "validation" and report["task"]["report_split"] == "test"
    teacher, student = report["scores"]["teacher"]["test"], report["scores"]["student"]["test"]
    assert report["recovery"]["per_metric"]["accuracy"] == pytest.approx(100 * student["accuracy"] /
                                                                          teacher["accuracy"])
    layers = report["attention"]["per_layer"]
    assert [row["layer"] for row in layers] == [0, 1]
    assert report["attention"]["mean_kl_after"] < report["attention"]["mean_kl_before"]  # stage 1 learned
    assert report["model"]["parameters_added"] == 2 * 4 * 8 * 8  # hedgehog: per layer H·d·d
    assert len(report["curves"]["stage1"]) == report["recipe"]["stage1"]["epochs"] * 6  # 48 rows, batch 8
    assert report["latency"]["seq_len"] == 16 and report["latency"]["teacher_ms"] > 0
    # and at eval.latency_lengths (default 2,048 and 4,096): the tiny model's 512 positions tiled on copies
    longer = report["latency"]["at_lengths"]
    assert [row["seq_len"] for row in longer] == [2048, 4096]
    assert all(row["teacher_ms"] > 0 and row["student_ms"] > 0 and row["repeats"] == 2 for row in longer)
    assert all(row["speedup"] == pytest.approx(row["teacher_ms"] / row["student_ms"]) for row in longer)
    assert "| 4,096 |" in (out / "report.md").read_text()
    # and on the test examples at their own lengths (eval.latency_examples, default 100: the split's 16 here), each
    # with its real tokens only: the texts are shorter than max_length 16, so the mean length is under it
    own = report["latency"]["own_lengths"]
    assert own["examples"] == 15 and own["teacher_ms"] > 0 and own["student_ms"] > 0  # 16 less the warm-up
    assert 2 < own["mean_tokens"] < 16 and own["speedup"] == pytest.approx(own["teacher_ms"] / own["student_ms"])
    assert "At the task's own lengths: 15 examples" in (out / "report.md").read_text()
    # each timing records how busy other processes kept the CPU meanwhile (the report warns above 0.15 cores)
    assert all(part["other_processes_cores"] >= 0 for part in (report["latency"], *longer, own))
    from linearize.push import plan

    card = plan(out / "model", "someone/model").card
    assert "Time per example at the task's own lengths (15 examples" in card
    assert linearize.load(out / "model").config.max_position_embeddings == 512  # the saved model is not extended
    assert report["visuals"]["cls_attention"][0]["tokens"][0] == "[CLS]"
    assert report["data_hash"].startswith("sha256:")
    for name in ("report.json", "report.md", "state.json", "model/report.json", "model/model.safetensors",
                 "teacher/model.safetensors", "stage1/model.safetensors"):
        assert (out / name).is_file(), name
    # finished stages keep their training curves, not their resume checkpoints
    assert sorted(f.relative_to(out / "work").as_posix() for f in (out / "work").rglob("*") if f.is_file()) == [
        "stage1/metrics.jsonl", "stage2/metrics.jsonl", "teacher/metrics.jsonl"]
    # the saved student scores what the report says
    model = linearize.load(out / "model")
    from linearize.evaluation import evaluate
    from linearize.pipeline import TaskData

    task = TaskData.load(recipe)
    assert evaluate(model, task.loaders(8, 0)["test"], task.spec)["accuracy"] == pytest.approx(student["accuracy"])
    # a second run resumes: every stage is reused, the scores are identical
    again = run(recipe, out, progress=False, log=lambda *a, **k: None).to_json()
    assert again["scores"] == report["scores"]
    assert again["latency"] == report["latency"]  # measured once, by the run that made the model
    stages = sum(again["timing"][f"{stage}_seconds"] for stage in ("teacher", "stage1", "stage2"))
    assert again["timing"]["total_seconds"] >= stages > 0
    # another recipe in the same folder is refused
    other = load_recipe(str(workspace / "tiny.yaml"), overrides={"method": "t2r"})
    with pytest.raises(linearize.errors.LinearizeError, match=r"different recipe \(method: .hedgehog. -> .t2r.\)"):
        run(other, out, progress=False, log=lambda *a, **k: None)


def test_a_run_resumed_inside_stage_1_counts_its_earlier_training_in_the_total(workspace, monkeypatch):
    """A run killed in stage 1 and run again: the report's total time holds what stage 1 took before the kill (its
    checkpoint's seconds, set here to 1,000 s as a long first call would leave them), not this call's alone."""
    from linearize.training import checkpoint, loop

    recipe = load_recipe(str(workspace / "tiny.yaml"), overrides={"stage1": {"checkpoint_every": 1},
                                                                  "eval": {"latency_lengths": []}})
    out = workspace / "resumed-in-stage1"
    original = loop.Trainer.save_checkpoint

    def killed_after_step_2(trainer, directory, **progress):
        original(trainer, directory, **progress)
        if "stage1" in str(directory) and progress["step"] == 2:
            raise KeyboardInterrupt("simulated kill")

    monkeypatch.setattr(loop.Trainer, "save_checkpoint", killed_after_step_2)
    with pytest.raises(KeyboardInterrupt):
        run(recipe, out, progress=False, log=lambda *a, **k: None)
    monkeypatch.setattr(loop.Trainer, "save_checkpoint", original)
    record_path = out / "work" / "stage1" / checkpoint.CHECKPOINT_FILE
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps({**record, "seconds": 1000.0}))
    # resumed with checkpoints at another cadence (how the run is kept, not what it computes): not another recipe
    recipe = load_recipe(str(workspace / "tiny.yaml"), overrides={"stage1": {"checkpoint_every": 3},
                                                                  "eval": {"latency_lengths": []}})
    timing = run(recipe, out, progress=False, log=lambda *a, **k: None).to_json()["timing"]
    assert timing["stage1_seconds"] > 1000
    assert timing["total_seconds"] >= timing["teacher_seconds"] + timing["stage1_seconds"] + timing["stage2_seconds"]


def test_keep_softmax_gives_the_layer_with_the_highest_stage1_kl_back_to_softmax(workspace):
    """stage1.keep_softmax: 1 of the tiny model's 2 converted layers stays softmax after stage 1 (the one
    whose attention KL stays highest); the other keeps its distilled map, through stage 2, saving and loading."""
    recipe = load_recipe(str(workspace / "tiny.yaml"),
                         overrides={"stage1": {"keep_softmax": 1}, "stage2": {"epochs": 1}, "eval": {"latency_lengths": []}})
    out = workspace / "keep-softmax"
    lines = []
    report = run(recipe, out, progress=False, log=lines.append).to_json()
    kl = {row["layer"]: row["kl_after"] for row in report["attention"]["per_layer"]}
    kept = max(kl, key=kl.get)
    assert report["model"]["layers"] == [layer for layer in (0, 1) if layer != kept]
    assert any(f"keeping softmax in layer {kept}" in line for line in lines)
    # the report names the layer given back softmax, and its means and worst layer cover the one still converted
    assert report["attention"]["softmax_kept"] == [kept]
    assert report["attention"]["mean_kl_after"] == pytest.approx(kl[1 - kept])
    markdown = (out / "report.md").read_text()
    assert f"| {kept} |" in markdown and "softmax kept" in markdown
    assert f"**{kept}**" not in markdown  # the kept layer is not bolded as the worst
    assert f"Given back softmax attention after stage 1 (stage1.keep_softmax), the highest KL: layer {kept}" in markdown
    stage1 = linearize.load(out / "stage1")
    model = linearize.load(out / "model")
    from linearize.convert import conversion_record, feature_maps_of

    assert list(feature_maps_of(model)) == list(feature_maps_of(stage1)) == report["model"]["layers"]
    assert list(conversion_record(model).layers) == report["model"]["layers"]
    with pytest.raises(linearize.errors.LinearizeError, match="stage1.keep_softmax 2 would give softmax back to every"):
        run(load_recipe(str(workspace / "tiny.yaml"), overrides={"stage1": {"keep_softmax": 2}}), workspace / "k2",
            progress=False, log=lambda *a, **k: None)
    assert not (workspace / "k2" / "teacher").exists()  # refused before the teacher trained


def test_revert_layers_keeps_the_other_layers_trained_maps():
    from tiny_models import build

    from linearize.convert import conversion_record, feature_maps_of
    from linearize.convert.api import revert_layers

    model = linearize.convert(build("bert"), "hedgehog", window=4, sinks="first")
    for fm in feature_maps_of(model).values():
        with torch.no_grad():
            for parameter in fm.parameters():
                parameter.add_(0.5)  # "trained"
    before = {layer: {k: v.clone() for k, v in fm.state_dict().items()} for layer, fm in feature_maps_of(model).items()}
    revert_layers(model, [0])
    after = feature_maps_of(model)
    assert list(after) == [1] and list(conversion_record(model).layers) == [1]
    assert after[1].window == 4 and after[1].sinks == ("first",)  # the hybrid settings stay
    for key, value in before[1].items():
        torch.testing.assert_close(after[1].state_dict()[key], value)
    with pytest.raises(linearize.errors.LinearizeError, match="some, not all"):
        revert_layers(model, [1])
    # what the first conversion did beyond the attention stays in the record
    extended = linearize.convert(build("bert"), "hedgehog", max_length=1024)
    revert_layers(extended, [1])
    record = conversion_record(extended)
    assert (list(record.layers), record.max_length, record.position_init) == ([0], 1024, "tile")
    assert extended.config.max_position_embeddings == 1024


def test_selection_and_reported_splits_are_disjoint(workspace):
    recipe = load_recipe(str(workspace / "tiny.yaml"))
    data, _ = load_data(recipe.task, recipe.data)
    assert not set(data["validation"]["text"]) & set(data["test"]["text"])
    assert not set(data["train"]["text"]) & set(data["test"]["text"])


def test_cli_stages_and_eval(workspace):
    files = ["--train-file", workspace / "train.csv", "--validation-file", workspace / "dev.csv",
             "--test-file", workspace / "test.csv", "--max-length", "16"]
    teacher = workspace / "cli-teacher"
    result = runner.invoke(app, [str(a) for a in ["finetune", workspace / "tiny", "--task", "files", "--out", teacher,
                                                  "--lr", "1e-3", "--epochs", "1", *files]])
    assert result.exit_code == 0, result.output
    assert "best checkpoint" in result.output
    distilled = workspace / "cli-distilled"
    result = runner.invoke(app, [str(a) for a in ["distill", teacher, "--task", "files", "--out", distilled,
                                                  "--method", "t2r", "--epochs", "1", *files]])
    assert result.exit_code == 0, result.output
    assert "KL before" in result.output
    assert json.loads((distilled / "distill.json").read_text())["method"] == "t2r"
    result = runner.invoke(app, [str(a) for a in ["eval", "text", distilled, "--task", "files", *files,
                                                  "--json", workspace / "scores.json"]])
    assert result.exit_code == 0, result.output
    scores = json.loads((workspace / "scores.json").read_text())
    assert scores["converted"] and set(scores["scores"]) == {"validation", "test"}
    result = runner.invoke(app, ["distill", str(teacher), "--task", "files", "--out", str(workspace / "x"),
                                 *map(str, files)])
    assert result.exit_code == 1 and "pass --method" in result.output


def test_recipes_resolve_and_reject_unknown_keys():
    from linearize.recipes import list_recipes

    assert {"minilm-moviereviews", "bert-base-glue", "roberta-base-glue", "vit-base-imagenet",
            "vit-fashionmnist"} <= set(list_recipes())
    for name in list_recipes():
        recipe = load_recipe(name, quick=True)
        assert recipe.model and recipe.task
    bert = load_recipe("bert-base-glue")
    assert (bert.stage2.lr, bert.stage2.batch_size, bert.stage2.patience) == (1e-5, 8, 3)
    with pytest.raises(linearize.errors.LinearizeError, match="unknown recipe key 'stage1.learning_rate'"):
        load_recipe(overrides={"stage1": {"learning_rate": 1}})
    with pytest.raises(linearize.errors.LinearizeError, match="did you mean 'stage1.epochs'"):
        load_recipe(overrides={"stage1": {"epoch": 1}})
    with pytest.raises(linearize.errors.LinearizeError, match="no recipe 'nope'; built-in recipes"):
        load_recipe("nope")
    result = runner.invoke(app, ["run", "--set", "stage1.lr"])
    assert result.exit_code == 1 and "is not key=value" in result.output


def test_compare_shares_one_teacher_per_seed_and_writes_the_table(workspace):
    from linearize.compare import compare

    recipe = load_recipe(str(workspace / "tiny.yaml"), overrides={"stage2": {"epochs": 1}, "teacher": {"epochs": 1},
                                                                   "options": {"t2r": {"feature_dim": 4}}})
    out = workspace / "compare"
    table = compare(recipe, out, methods=["t2r", "elu"], seeds=[0], progress=False, log=lambda *a, **k: None)
    labels = [row["row"] for row in table["rows"]]
    assert labels == ["softmax (teacher)", "t2r + stage 1", "t2r, no stage 1", "elu"]
    assert (out / "seed0" / "t2r" / "work" / "teacher").is_dir()  # fine-tuned once ...
    assert not (out / "seed0" / "elu" / "work" / "teacher").exists()  # ... and shared
    reports = [json.loads((out / "seed0" / name / "report.json").read_text()) for name in ("t2r", "t2r-no-stage1", "elu")]
    assert len({json.dumps(r["scores"]["teacher"]) for r in reports}) == 1
    assert [r["model"]["options"] for r in reports] == [{"feature_dim": 4}, {"feature_dim": 4}, {}]  # t2r's own
    assert not reports[1]["curves"]["stage1"] and reports[0]["curves"]["stage1"]
    markdown = (out / "compare.md").read_text()
    assert "| t2r, no stage 1 |" in markdown and "recovery %" in markdown
    # the mean speed-up per example at the test texts' own lengths, a column beside the fixed-length ones
    assert "speed-up per example (own lengths)" in markdown
    elu = reports[2]["latency"]["own_lengths"]
    assert table["rows"][3]["own_length_speedup"] == pytest.approx(elu["teacher_ms"] / elu["student_ms"])
    more = compare(recipe, out, methods=["relu"], seeds=[0], progress=False, log=lambda *a, **k: None)
    assert not (out / "seed0" / "relu" / "work" / "teacher").exists()  # continued: the seed's teacher is reused
    assert more["rows"][1]["row"] == "relu"


def test_a_continued_comparison_reads_its_finished_rows_without_running_them(workspace, monkeypatch):
    """Re-invoked, a comparison takes each finished row's report as written: no run reloads its data and
    models to write the same report again; a finished folder of another configuration is still refused."""
    import linearize.compare
    from linearize.compare import compare
    from linearize.errors import LinearizeError

    out = workspace / "compare"
    if not (out / "compare.json").is_file():
        test_compare_shares_one_teacher_per_seed_and_writes_the_table(workspace)
    recipe = load_recipe(str(workspace / "tiny.yaml"), overrides={"stage2": {"epochs": 1}, "teacher": {"epochs": 1},
                                                                   "options": {"t2r": {"feature_dim": 4}}})
    written = {name: (out / "seed0" / name / "report.json").stat().st_mtime_ns for name in ("t2r", "elu")}

    def no_run(*args, **kwargs):
        raise AssertionError("a finished row ran again")

    monkeypatch.setattr(linearize.compare, "run", no_run)
    lines = []
    again = compare(recipe, out, methods=["t2r", "elu"], seeds=[0], progress=False, log=lines.append)
    assert [row["row"] for row in again["rows"]] == ["softmax (teacher)", "t2r + stage 1", "t2r, no stage 1", "elu"]
    elu = json.loads((out / "seed0" / "elu" / "report.json").read_text())
    assert again["rows"][3]["metric_mean"] == elu["scores"]["student"]["test"][elu["task"]["primary_metric"]]
    assert {name: (out / "seed0" / name / "report.json").stat().st_mtime_ns for name in written} == written
    assert sum("finished before" in line for line in lines) == 3  # t2r, t2r without stage 1, elu
    other = dataclasses.replace(recipe, stage2=dataclasses.replace(recipe.stage2, lr=recipe.stage2.lr * 2))
    with pytest.raises(LinearizeError, match="holds a run of a different recipe"):
        compare(other, out, methods=["elu"], seeds=[0], progress=False, log=lambda *a, **k: None)


def test_a_variant_of_stage_2_alone_shares_stage_1(workspace):
    """A lever on stage 2 (the KD weight): the variant takes the plain run's finished stage 1 (hard-linked,
    as a resumed run reuses its own) instead of distilling it again; a variant of stage 1 does not."""
    from linearize.compare import compare
    from linearize.errors import LinearizeError
    from linearize.pipeline import RunState

    recipe = load_recipe(str(workspace / "tiny.yaml"), overrides={"stage2": {"epochs": 1}, "teacher": {"epochs": 1},
                                                                   "options": {"t2r": {"feature_dim": 4}}})
    settings = {"plain": {}, "kd": {"stage2": {"kd_weight": 0.5}}, "lr": {"stage1": {"lr": 0.02}}}
    out = workspace / "stage1-shared"
    compare(recipe, out, methods=["t2r"], seeds=[0], without_stage1=False, settings=settings, progress=False,
            log=lambda *a, **k: None)
    plain, kd, lr = (out / "seed0" / name for name in ("t2r--plain", "t2r--kd", "t2r--lr"))
    assert (plain / "work" / "stage1").is_dir() and (lr / "work" / "stage1").is_dir()  # distilled ...
    assert not (kd / "work" / "stage1").exists() and (kd / "stage1" / "config.json").is_file()  # ... and shared
    assert RunState(kd, None).get("stage1") == RunState(plain, None).get("stage1") != RunState(lr, None).get("stage1")
    reports = {run.name: json.loads((run / "report.json").read_text()) for run in (plain, kd)}
    assert reports["t2r--kd"]["recipe"]["stage2"]["kd_weight"] == 0.5
    assert reports["t2r--kd"]["attention"] == reports["t2r--plain"]["attention"]  # stage 1's KL, the same
    with pytest.raises(LinearizeError, match="stage 1 was made with other settings"):
        run(dataclasses.replace(recipe, method="elu"), workspace / "wrong-stage1", stage1_from=plain, progress=False,
            log=lambda *a, **k: None)


def test_a_student_starts_from_its_seed_whether_its_teacher_was_fine_tuned_in_the_run_or_reused(workspace):
    """The feature maps' initial weights depend on the seed alone, not on the randomness the teacher's fine-tuning
    drew before them: a run that fine-tunes its teacher and one that takes it finished make the same student."""
    from safetensors.torch import load_file

    recipe = load_recipe(str(workspace / "tiny.yaml"), overrides={
        "method": "t2r", "options": {"t2r": {"feature_dim": 4}}, "teacher": {"epochs": 1},
        "stage1": {"enabled": False}, "stage2": {"epochs": 1}})
    here, reused = workspace / "init-teacher-here", workspace / "init-teacher-reused"
    run(recipe, here, progress=False, log=lambda *a, **k: None)
    run(recipe, reused, teacher_from=here, progress=False, log=lambda *a, **k: None)
    first, second = (load_file(folder / "stage1" / "model.safetensors") for folder in (here, reused))
    maps = [name for name in first if "linearize_map" in name]
    assert maps and first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)


def test_compare_variants_reuse_the_teachers_of_another_comparison(workspace):
    """A lever study: one row per setting, the teachers taken from an earlier comparison."""
    from linearize.compare import compare, parse_variant

    first = workspace / "compare"
    if not (first / "compare.json").is_file():
        test_compare_shares_one_teacher_per_seed_and_writes_the_table(workspace)
    recipe = load_recipe(str(workspace / "tiny.yaml"), overrides={"stage2": {"epochs": 1}, "teacher": {"epochs": 1}})
    settings = dict(parse_variant(v) for v in ["plain", "stage 1 x2: stage1.epochs=2 stage1.lr=0.02"])
    assert settings == {"plain": {}, "stage 1 x2": {"stage1": {"epochs": 2, "lr": 0.02}}}
    out = workspace / "levers"
    table = compare(recipe, out, methods=["t2r"], seeds=[0], without_stage1=False, settings=settings,
                    teachers_from=first, progress=False, log=lambda *a, **k: None)
    assert [row["row"] for row in table["rows"]] == ["softmax (teacher)", "t2r + stage 1 (plain)",
                                                       "t2r + stage 1 (stage 1 x2)"]
    assert table["settings"] == settings
    assert not list(out.glob("seed0/*/work/teacher"))  # no teacher fine-tuned here
    longer = json.loads((out / "seed0" / "t2r--stage-1-x2" / "report.json").read_text())
    assert longer["recipe"]["stage1"]["epochs"] == 2 and longer["recipe"]["stage1"]["lr"] == 0.02
    teacher = json.loads((first / "seed0" / "t2r" / "report.json").read_text())["scores"]["teacher"]
    assert longer["scores"]["teacher"] == teacher
    from linearize.errors import LinearizeError

    partial = compare(recipe, out, methods=["t2r", "elu"], seeds=[0], without_stage1=False, settings=settings,
                      table_only=True, log=lambda *a, **k: None)
    assert [row["row"] for row in partial["rows"]] == [row["row"] for row in table["rows"]]  # elu never ran ...
    assert partial["missing"] == ["seed 0: elu (plain)", "seed 0: elu (stage 1 x2)"]  # ... and is listed
    assert not list(out.glob("seed0/elu*")) and "Not finished, left out" in (out / "compare.md").read_text()
    other_seed = dataclasses.replace(recipe, seed=1)
    with pytest.raises(LinearizeError, match=r"another recipe \(seed: 0 -> 1\)"):
        run(other_seed, workspace / "wrong-teacher", teacher_from=first / "seed0" / "t2r", progress=False,
            log=lambda *a, **k: None)
    with pytest.raises(LinearizeError, match="unknown recipe key 'stage1.epoch'"):
        compare(recipe, out, methods=["t2r"], seeds=[0], settings={"typo": {"stage1": {"epoch": 2}}},
                progress=False, log=lambda *a, **k: None)


def test_options_keyed_by_method_reach_only_that_method(tmp_path):
    """One recipe serves every method of a compare: ``options.luna`` is LUNA's, a plain key is
    everyone's and wins; ``--set`` merges into the recipe's options instead of replacing them."""
    from linearize.errors import LinearizeError
    from linearize.attention.feature_maps import options_for
    from linearize.recipes import parse_set

    recipe = load_recipe(None, overrides={"options": {"luna": {"projections": 16, "channels": 4}}})
    # merged into the default recipe's own LUNA block (per-head projections)
    assert options_for("luna", recipe.options) == {"shared_projections": False, "projections": 16, "channels": 4}
    assert options_for("hedgehog", recipe.options) == {}
    (tmp_path / "r.yaml").write_text("model: minilm\ntask: moviereviews\noptions: {luna: {projections: 16, channels: 4}}\n")
    more = load_recipe(str(tmp_path / "r.yaml"), overrides=parse_set(["options.luna.channels=2"]))
    assert more.options == {"luna": {"projections": 16, "channels": 2}}
    everyone = dict(recipe.options, feature_dim=16)
    assert options_for("hedgehog", everyone) == {"feature_dim": 16}
    assert options_for("luna", dict(recipe.options, projections=4))["projections"] == 4
    with pytest.raises(LinearizeError, match="options.luna.projections=16"):
        options_for("luna", {"luna": 16})


def test_set_values_are_typed_like_yaml_with_exponent_numbers_as_floats():
    from linearize.recipes import parse_set

    parsed = parse_set(["stage1.lr=1e-2", "stage2.lr=5E-5", "stage1.epochs=3", "method=luna", "stage1.enabled=false",
                        "layers="])
    assert parsed == {"stage1": {"lr": 0.01, "epochs": 3, "enabled": False}, "stage2": {"lr": 5e-5},
                      "method": "luna", "layers": None}


def test_option_values_are_typed_like_set_values():
    from linearize.recipes import parse_options

    assert parse_options(["eps=1e-2", "projections=16", "shared_projections=false", "init=identity"]) == {
        "eps": 0.01, "projections": 16, "shared_projections": False, "init": "identity"}


def test_a_run_folder_from_before_a_new_recipe_key_still_resumes(tmp_path):
    """A key added to the recipes since a run was written counts as its default; a real change
    is named (the run folder's state.json read back as a RunConfig)."""
    from linearize.pipeline import RunState

    current = load_recipe(None)
    saved = json.loads(json.dumps(current.to_recipe()))
    del saved["stage2"]["kd_temperature"]  # a key the recipe leaves at its default
    (tmp_path / "state.json").write_text(json.dumps({"recipe": saved, "stages": {}}))
    assert RunState(tmp_path, current).config == current
    changed = load_recipe(None, overrides={"stage2": {"kd_temperature": 3.0}})
    (tmp_path / "state.json").write_text(json.dumps({"recipe": saved, "stages": {}}))
    with pytest.raises(linearize.errors.LinearizeError, match=r"stage2.kd_temperature: 2.0 -> 3.0"):
        RunState(tmp_path, changed)


@pytest.mark.slow
def test_quick_run_of_the_real_default_recipe(tmp_path, minilm_path):
    """`linearize run --quick`: the README's smoke version, on the real MiniLM and movie reviews; the
    report's student score is what the saved model scores on the same (quick) test split, and its teacher is
    above chance (else the recovery it shows a new user says nothing)."""
    from linearize.evaluation import evaluate
    from linearize.pipeline import TaskData

    out = tmp_path / "quick"
    result = runner.invoke(app, ["run", "--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "student keeps" in result.output and "report.md" in result.output and "at chance" not in result.output
    report = json.loads((out / "report.json").read_text())
    scored = Report.read(out)  # the run's own chance check (2 classes: 0.5 + CHANCE_MARGIN)
    assert scored.chance_score() == 0.5 and not scored.teacher_at_chance()
    assert report["recipe"]["name"] == "minilm-moviereviews" and report["recipe"]["quick_mode"]
    assert report["model"]["method"] == "luna" and report["model"]["num_attention_layers"] == 6
    task = TaskData.load(load_recipe(None, quick=True))
    again = evaluate(linearize.load(out / "model"), task.loaders(32, 0)["test"], task.spec)
    assert again["accuracy"] == pytest.approx(report["scores"]["student"]["test"]["accuracy"])
    figures = list((out / "figures").glob("*.png"))
    assert len(figures) >= 3 and all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f.stat().st_size > 1000
                                     for f in figures)


def test_image_latency_sequence_length_counts_patches_and_the_class_token():
    from types import SimpleNamespace

    import torch

    from linearize.pipeline import latency_batch

    recipe = load_recipe("vit-fashionmnist")
    loader = [{"pixel_values": torch.zeros(4, 1, 28, 28), "labels": torch.zeros(4)}]
    model = SimpleNamespace(config=SimpleNamespace(patch_size=4))
    batch, seq_len = latency_batch(recipe, SimpleNamespace(kind="image"), loader, model)
    assert seq_len == 7 * 7 + 1 and batch["pixel_values"].shape == (1, 1, 28, 28)


def test_teacher_attention_dropout_reaches_the_source_models_attention(workspace):
    """teacher.attention_dropout sets the attention-probability dropout the teacher trains with
    (BERT's config field and its self-attention modules); null keeps the checkpoint's own."""
    import transformers

    from linearize.errors import LinearizeError
    from linearize.pipeline.inputs import attention_dropout_kwargs, build_source_model

    def attention_dropouts(dropout):
        recipe = load_recipe(str(workspace / "tiny.yaml"), overrides={"teacher": {"attention_dropout": dropout}})
        model, _ = build_source_model(recipe, load_data(recipe.task, recipe.data)[1])
        probabilities = {m.dropout.p for m in model.modules() if type(m).__name__ == "BertSelfAttention"}
        return model.config.attention_probs_dropout_prob, probabilities

    own = transformers.AutoConfig.from_pretrained(workspace / "tiny").attention_probs_dropout_prob
    assert own > 0 and attention_dropouts(None) == (own, {own})
    assert attention_dropouts(0.0) == (0.0, {0.0})
    with pytest.raises(LinearizeError, match="no attention dropout setting"):
        attention_dropout_kwargs(0.0, transformers.PretrainedConfig())


def test_long_cpu_teacher_with_attention_dropout_is_warned_about(workspace):
    """A teacher about to train on the CPU at ≥ 1,024 tokens with attention dropout gets a warning
    that names the setting turning it off; none on a GPU, at short lengths or without dropout."""
    from linearize.pipeline.inputs import LONG_DROPOUT_LENGTH, attention_dropout_warning, build_source_model

    recipe = load_recipe(str(workspace / "tiny.yaml"))
    model, _ = build_source_model(recipe, load_data(recipe.task, recipe.data)[1])
    dropout = model.config.attention_probs_dropout_prob
    assert dropout > 0
    warning = attention_dropout_warning(model, LONG_DROPOUT_LENGTH, on_device=False)
    assert f"dropout {dropout:g}" in warning and "teacher.attention_dropout=0" in warning
    assert attention_dropout_warning(model, LONG_DROPOUT_LENGTH, on_device=True) is None
    assert attention_dropout_warning(model, LONG_DROPOUT_LENGTH - 1, on_device=False) is None
    model.config.attention_probs_dropout_prob = 0.0
    assert attention_dropout_warning(model, LONG_DROPOUT_LENGTH, on_device=False) is None


def test_latency_is_timed_at_most_at_eval_latency_max_length():
    """A huge data.max_length (issue 36: 100,000 tokens sat for minutes at the latency step) is
    timed at eval.latency_max_length tokens; the returned length is the one timed."""
    from types import SimpleNamespace

    import torch

    from linearize.pipeline import latency_batch

    loader = [{"input_ids": torch.arange(10).view(1, 10), "attention_mask": torch.ones(1, 10, dtype=torch.long)}]
    text = SimpleNamespace(kind="text")
    long = load_recipe(None, overrides={"data": {"max_length": 100000}})
    batch, seq_len = latency_batch(long, text, loader)
    assert seq_len == long.eval.latency_max_length == 8192 and batch["input_ids"].shape == (1, 8192)
    short = load_recipe(None, overrides={"data": {"max_length": 100}, "eval": {"latency_max_length": 4096}})
    assert latency_batch(short, text, loader)[1] == 100
    with pytest.raises(linearize.errors.LinearizeError, match="eval.latency_max_length must be >= 1"):
        load_recipe(None, overrides={"eval": {"latency_max_length": 0}})
