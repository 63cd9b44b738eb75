"""Stage 1 and stage 2 on every kind of data source, resume, and bad input (CPU, small models)."""

import json
import math
import random

import numpy as np
import pytest
import torch
import transformers as T
from PIL import Image
from torch.utils.data import DataLoader
from typer.testing import CliRunner

import linearize
from linearize.cli import app
from linearize.config import Stage1Config
from linearize.convert import conversion_record, feature_maps_of
from linearize.distill import DistillConfig, attention_distances, distill
from linearize import evaluation as evaluation_module
from linearize.distill import stage1 as stage1_module
from linearize.errors import LinearizeError
from linearize.finetune import FinetuneConfig, finetune
from linearize.pipeline import distill_model, finetune_model
from linearize.report import StageResult
from linearize.training import loop as training_loop
from tiny_models import SMALL, VOCAB, build, inputs, save_tiny_text_classifier

runner = CliRunner()
GOOD = ["good", "great", "fine", "lovely", "superb", "warm"]
BAD = ["bad", "awful", "dull", "poor", "weak", "cold"]


def _sentence(rng, positive):
    words = GOOD if positive else BAD
    return f"the film was {rng.choice(words)} and {rng.choice(words)}"


def write_glue(root, rng):
    """A few dozen rows per task in GLUE's own file layout (headers and columns as distributed)."""
    def rows(n):
        return [(i, rng.random() < 0.5) for i in range(n)]

    (root / "SST-2").mkdir(parents=True)
    (root / "CoLA").mkdir()
    (root / "MRPC").mkdir()
    (root / "STS-B").mkdir()
    for split, n in (("train", 32), ("dev", 12)):
        sst = ["sentence\tlabel"] + [f"{_sentence(rng, p)}\t{int(p)}" for _, p in rows(n)]
        (root / "SST-2" / f"{split}.tsv").write_text("\n".join(sst) + "\n")
        cola = [f"gj04\t{int(p)}\t{'' if p else '*'}\t{_sentence(rng, p)}" for _, p in rows(n)]
        (root / "CoLA" / f"{split}.tsv").write_text("\n".join(cola) + "\n")
        mrpc = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
        for i, p in rows(n):
            mrpc.append(f"{int(p)}\t{1000 + i}\t{2000 + i}\t{_sentence(rng, p)}\t{_sentence(rng, p)}")
        (root / "MRPC" / f"{split}.tsv").write_text("\n".join(mrpc) + "\n")
        sts = ["index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"]
        for i, p in rows(n):
            sts.append(f"{i}\tmain-captions\tMSRvid\t2012test\t{i:04d}\tnone\tnone\t{_sentence(rng, p)}\t"
                       f"{_sentence(rng, p)}\t{4.5 if p else 0.5}")
        (root / "STS-B" / f"{split}.tsv").write_text("\n".join(sts) + "\n")


@pytest.fixture(scope="module")
def tiny_text(tmp_path_factory, minilm_path):
    root = tmp_path_factory.mktemp("training")
    save_tiny_text_classifier(root / "tiny", minilm_path)
    write_glue(root / "glue", random.Random(0))
    return root


@pytest.mark.parametrize("task", ["sst2", "mrpc", "stsb", "cola"])
def test_glue_layout_stage1_then_stage2(tiny_text, task):
    root = tiny_text
    data = {"data_dir": str(root / "glue"), "max_length": 24}
    distilled = root / f"{task}-s1"
    result = distill_model(str(root / "tiny"), task, distilled, method="hedgehog",
                           config=Stage1Config(lr=1e-2, epochs=3, batch_size=8), data=data, progress=False,
                           log=lambda *a, **k: None)
    before = np.mean([v["ce"] for v in result.per_layer_before.values()])
    after = np.mean([v["ce"] for v in result.per_layer_after.values()])
    assert after < before
    assert conversion_record(linearize.load(distilled)).method == "hedgehog"  # the checkpoint reloads
    final = root / f"{task}-s2"
    result = finetune_model(str(distilled), task, final, config=FinetuneConfig(lr=2e-3, batch_size=8, epochs=4,
                                                                               patience=0),
                            data=data, progress=False, log=lambda *a, **k: None)
    losses = [entry["train_loss"] for entry in result.history]
    assert losses[-1] < losses[0]
    reloaded = linearize.load(final)
    assert reloaded.config.num_labels == (1 if task == "stsb" else 2)
    assert set(result.scores) == {"validation"}


def test_image_folder_stage1_then_stage2(tmp_path):
    rng = np.random.default_rng(0)
    for split, count in (("train", 12), ("validation", 4)):
        for label, tone in (("dark", 40), ("light", 210)):
            folder = tmp_path / "imgs" / split / label
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = np.clip(rng.normal(tone, 30, (32, 32, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    torch.manual_seed(0)
    config = T.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, num_labels=2, initializer_range=0.2)
    T.ViTForImageClassification(config).save_pretrained(tmp_path / "vit")
    T.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path / "vit")
    data = {"data_dir": str(tmp_path / "imgs")}
    result = distill_model(str(tmp_path / "vit"), "imagefolder", tmp_path / "s1", method="t2r",
                           config=Stage1Config(lr=1e-2, epochs=3, batch_size=8), data=data, progress=False,
                           log=lambda *a, **k: None)
    assert np.mean([v["ce"] for v in result.per_layer_after.values()]) < \
        np.mean([v["ce"] for v in result.per_layer_before.values()])
    result = finetune_model(str(tmp_path / "s1"), "imagefolder", tmp_path / "s2",
                            config=FinetuneConfig(lr=2e-3, batch_size=8, epochs=3, patience=0), data=data,
                            progress=False, log=lambda *a, **k: None)
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]
    assert type(linearize.load(tmp_path / "s2")).__name__ == "LinearizeViTForImageClassification"


@pytest.mark.slow
def test_real_minilm_luna_stage1_lowers_attention_ce(minilm_path):
    """The real all-MiniLM-L6-v2 on real movie-review sentences (a small slice of the test split
    is enough: stage 1 needs no labels): LUNA's mean attention CE drops within 30 steps."""
    from linearize.data import load_task_data, make_dataloaders

    data, spec = load_task_data("moviereviews")
    data = {"train": data["test"].select(range(96)), "validation": data["validation"].select(range(32))}
    tokenizer = T.AutoTokenizer.from_pretrained(minilm_path)
    from datasets import DatasetDict

    loaders = make_dataloaders(DatasetDict(data), spec, tokenizer=tokenizer, batch_size=16, max_length=48)
    torch.manual_seed(0)
    model = T.AutoModelForSequenceClassification.from_pretrained(minilm_path, num_labels=2)
    linearize.convert(model, "luna")
    result = distill(model, loaders["train"], DistillConfig(lr=5e-3, max_steps=30), eval_loader=loaders["validation"],
                     progress=False, log=lambda *a, **k: None)
    before = np.mean([v["ce"] for v in result.per_layer_before.values()])
    after = np.mean([v["ce"] for v in result.per_layer_after.values()])
    assert after < before - 0.05, (before, after)
    assert result.steps == 30


def _loader(seed=0, n=24, batch_size=4):
    examples = []
    for i in range(n):
        batch = inputs("bert", batch=2, seq=10, pad=1 + i % 3, seed=100 + i)
        examples.append({k: v[i % 2] for k, v in batch.items()} | {"labels": torch.tensor(i % 2)})
    return DataLoader(examples, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed))


def _student():
    model = build("bert", seed=0)
    torch.manual_seed(1)
    return linearize.convert(model, "luna", projections=4, hidden=8)


@pytest.mark.parametrize("accumulation", [1, 2])
def test_stage1_resume_after_interruption_gives_the_same_weights(tmp_path, monkeypatch, accumulation):
    """Killed right after the step-8 checkpoint (epoch 2 of 2, 6 steps each), then resumed."""
    config = DistillConfig(lr=1e-2, epochs=2, checkpoint_every=1, gradient_accumulation_steps=accumulation)
    quiet = {"progress": False, "log": lambda *a, **k: None}
    train = _loader(batch_size=4 // accumulation)
    reference = _student()
    distill(reference, train, config, checkpoint_dir=tmp_path / "a", **quiet)

    original = training_loop.Trainer.save_checkpoint

    def crash_after_step_8(trainer, directory, **progress):
        original(trainer, directory, **progress)
        if progress["step"] == 8:
            raise KeyboardInterrupt("simulated kill")

    monkeypatch.setattr(training_loop.Trainer, "save_checkpoint", crash_after_step_8)
    with pytest.raises(KeyboardInterrupt):
        distill(_student(), train, config, checkpoint_dir=tmp_path / "b", **quiet)
    monkeypatch.setattr(training_loop.Trainer, "save_checkpoint", original)
    resumed = _student()  # a fresh process: same construction, state from the checkpoint
    result = distill(resumed, train, config, checkpoint_dir=tmp_path / "b", **quiet)
    assert result.steps == 12
    _assert_same_weights(reference, resumed)
    assert [e["step"] for e in _jsonl(tmp_path / "b" / "metrics.jsonl")] == list(range(1, 13))  # none twice


def test_stage2_resume_after_interruption_gives_the_same_weights(tmp_path):
    config = FinetuneConfig(lr=1e-3, batch_size=4, epochs=3, patience=0)
    reference = _student()
    finetune(reference, _loader(), _loader(), "sst2", tmp_path / "a", config=config, progress=False,
             log=lambda *a, **k: None)

    def crash_after_epoch_1(message, *args, **kwargs):
        if message.startswith("epoch 1:"):
            raise KeyboardInterrupt("simulated kill")

    with pytest.raises(KeyboardInterrupt):
        finetune(_student(), _loader(), _loader(), "sst2", tmp_path / "b", config=config, progress=False,
                 log=crash_after_epoch_1)
    resumed = _student()
    result = finetune(resumed, _loader(), _loader(), "sst2", tmp_path / "b", config=config, progress=False,
                      log=lambda *a, **k: None)
    assert result.extra["resumed"] and result.extra["epochs_run"] == 3
    for (name, a), (_, b) in zip(reference.named_parameters(), resumed.named_parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)


def test_attention_distances_are_zero_for_softmax():
    model = linearize.convert(build("bert"), "softmax")
    distances = attention_distances(model, [inputs("bert")])
    assert all(abs(v["kl"]) < 1e-5 for v in distances.values())


@pytest.mark.parametrize("args,message", [
    (["--task", "no-such-task-xyz"], "could not"),
    (["--task", "sst2", "--data-dir", "/nonexistent/glue"], "/nonexistent/glue"),
    (["--task", "files", "--train-file", "TRAIN", "--label-column", "stars"], "stars"),
])
def test_distill_bad_inputs(tiny_text, tmp_path, args, message):
    train = tmp_path / "train.csv"
    train.write_text("text,label\ngood film,1\nbad film,0\n" * 4)
    args = [a.replace("TRAIN", str(train)) for a in args]
    result = runner.invoke(app, ["distill", str(tiny_text / "tiny"), "--out", str(tmp_path / "o"), "--method", "t2r",
                                 *args])
    assert result.exit_code == 1, result.output
    assert message in " ".join(result.output.split())
    assert len(result.output.strip().splitlines()) <= 3


def test_distill_refuses_a_method_without_learnable_feature_maps(tiny_text, tmp_path):
    train = tmp_path / "train.csv"
    train.write_text("text,label\ngood film,1\nbad film,0\n" * 4)
    result = runner.invoke(app, ["distill", str(tiny_text / "tiny"), "--out", str(tmp_path / "o"), "--method",
                                 "performer", "--task", "files", "--train-file", str(train)])
    assert result.exit_code == 1
    assert "performer has no learnable feature-map parameters" in " ".join(result.output.split())


def test_eval_refuses_a_head_that_cannot_serve_the_task(tiny_text, tmp_path):
    model = T.BertForSequenceClassification.from_pretrained(tiny_text / "tiny", num_labels=3,
                                                            ignore_mismatched_sizes=True)
    model.save_pretrained(tmp_path / "three")
    T.AutoTokenizer.from_pretrained(tiny_text / "tiny").save_pretrained(tmp_path / "three")
    linearize.convert(model, "elu").save_pretrained(tmp_path / "three-elu")
    T.AutoTokenizer.from_pretrained(tiny_text / "tiny").save_pretrained(tmp_path / "three-elu")
    result = runner.invoke(app, ["eval", "glue", str(tmp_path / "three-elu"), "--task", "sst2", "--data-dir",
                                 str(tiny_text / "glue")])
    assert result.exit_code == 1
    assert "has 3 labels but task sst2 has 2" in " ".join(result.output.split())


def test_non_finite_losses_stop_with_the_step_named(tmp_path):
    student = _student()
    with torch.no_grad():
        next(iter(feature_maps_of(student).values())).proj_weight.fill_(float("nan"))
    with pytest.raises(LinearizeError, match="stage 1: the attention loss is nan at step 1"):
        distill(student, _loader(), DistillConfig(), checkpoint_dir=tmp_path / "s1", progress=False,
                log=lambda *a, **k: None)
    model = _student()
    with torch.no_grad():
        model.classifier.weight.fill_(float("inf"))
    with pytest.raises(LinearizeError, match="fine-tuning: the loss is nan at step 1"):
        finetune(model, _loader(), _loader(), "sst2", tmp_path / "s2", config=FinetuneConfig(epochs=1),
                 progress=False, log=lambda *a, **k: None)


class _RecordingBar:
    """Stands in for the rich progress bar; keeps every info text."""

    infos = []

    def __init__(self, *args):
        pass

    def update(self, completed, info=""):
        self.infos.append(info)

    def close(self):
        pass


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_metrics_jsonl_logs_every_step_with_throughput(tmp_path, monkeypatch):
    monkeypatch.setattr(training_loop, "ProgressBar", _RecordingBar)  # both stages' training bars
    monkeypatch.setattr(evaluation_module, "ProgressBar", _RecordingBar)  # the dev evaluations' bars
    distill(_student(), _loader(), DistillConfig(epochs=1), checkpoint_dir=tmp_path / "s1", log=lambda *a, **k: None)
    entries = _jsonl(tmp_path / "s1" / "metrics.jsonl")
    assert [entry["step"] for entry in entries] == list(range(1, 7))
    assert all(entry["examples_per_second"] > 0 for entry in entries)
    assert len(_RecordingBar.infos) == 6 and all(" ex/s" in info and "CE " in info for info in _RecordingBar.infos)
    _RecordingBar.infos.clear()
    finetune(_student(), _loader(), _loader(), "sst2", tmp_path / "s2", config=FinetuneConfig(epochs=2),
             log=lambda *a, **k: None)
    entries = _jsonl(tmp_path / "s2" / "metrics.jsonl")
    steps = [entry for entry in entries if "loss" in entry]
    epochs = [entry for entry in entries if "train_loss" in entry]
    assert [entry["step"] for entry in steps] == list(range(1, 13)) and len(entries) == 14
    assert [(entry["epoch"], entry["step"]) for entry in epochs] == [(1, 6), (2, 12)]
    assert all(entry["examples_per_second"] > 0 for entry in entries)
    training = [info for info in _RecordingBar.infos if info]  # the dev evaluations' bars carry no info
    assert len(training) == 12 and all(" ex/s" in info and "loss " in info for info in training)


def _equal_length_loader(batch_size, n=24, seq=10):
    """Shuffled sequences of one length: a batch's mean loss is the mean of its parts' mean losses."""
    ids = torch.randint(3, VOCAB, (n, seq), generator=torch.Generator().manual_seed(0))
    examples = [{"input_ids": row, "attention_mask": torch.ones(seq, dtype=torch.long), "labels": torch.tensor(i % 2)}
                for i, row in enumerate(ids)]
    return DataLoader(examples, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))


def _dropout_free_student():
    """Like ``_student`` but without dropout: stage 2 is then a deterministic function of the batches."""
    torch.manual_seed(0)
    config = T.BertConfig(vocab_size=VOCAB, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **SMALL)
    model = T.BertForSequenceClassification(config).eval()
    torch.manual_seed(1)
    return linearize.convert(model, "luna", projections=4, hidden=8)


def _assert_same_weights(a, b, atol=1e-6):
    for (name, x), (_, y) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(x, y, atol=atol, rtol=1e-5, msg=name)


@pytest.mark.parametrize("stage", ["distill", "finetune"])
@pytest.mark.parametrize("batch,accumulation", [(2, 2), (2, 5)])  # 12 micro-batches: 5 + 5 + 2 with k=5
def test_gradient_accumulation_equals_one_larger_batch(tmp_path, stage, batch, accumulation):
    """k micro-batches of b examples per step train exactly like batches of k·b (the seedable
    sampler shuffles both the same way, so a big batch is the union of k consecutive small ones;
    the epoch's shorter last step is scaled by its own size)."""
    def train(batch_size, k, folder):
        model = _dropout_free_student()
        if stage == "distill":
            result = distill(model, _equal_length_loader(batch_size),
                             DistillConfig(lr=1e-2, epochs=2, gradient_accumulation_steps=k), progress=False,
                             log=lambda *a, **k: None)
        else:
            config = FinetuneConfig(lr=1e-3, batch_size=batch_size, epochs=2, patience=0, gradient_accumulation_steps=k)
            result = finetune(model, _equal_length_loader(batch_size), _equal_length_loader(8), "sst2", folder,
                              config=config, progress=False, log=lambda *a, **k: None)
        return model, result

    accumulated, result = train(batch, accumulation, tmp_path / "a")
    reference, expected = train(batch * accumulation, 1, tmp_path / "b")
    assert result.steps == expected.steps == 2 * math.ceil(24 / (batch * accumulation))
    _assert_same_weights(accumulated, reference, atol=1e-5)
    untrained = dict(_dropout_free_student().named_parameters())
    assert any(not torch.equal(p, untrained[name]) for name, p in reference.named_parameters())  # it trained


@pytest.mark.parametrize("accumulation", [1, 2])
def test_stage2_resume_mid_epoch_gives_the_same_weights(tmp_path, monkeypatch, accumulation):
    """Killed right after the step-8 checkpoint (epoch 2 of 3, 6 steps each), then resumed."""
    config = FinetuneConfig(lr=1e-3, epochs=3, patience=0, checkpoint_every=4, gradient_accumulation_steps=accumulation)
    quiet = {"progress": False, "log": lambda *a, **k: None}
    train = _loader(batch_size=4 // accumulation)
    reference = _student()
    expected = finetune(reference, train, _loader(), "sst2", tmp_path / "a", config=config, **quiet)

    original = training_loop.Trainer.save_checkpoint

    def crash_after_step_8(trainer, directory, **progress):
        original(trainer, directory, **progress)
        if progress["step"] == 8:
            raise KeyboardInterrupt("simulated kill")

    monkeypatch.setattr(training_loop.Trainer, "save_checkpoint", crash_after_step_8)
    with pytest.raises(KeyboardInterrupt):
        finetune(_student(), train, _loader(), "sst2", tmp_path / "b", config=config, **quiet)
    monkeypatch.setattr(training_loop.Trainer, "save_checkpoint", original)
    saved = json.loads((tmp_path / "b" / "checkpoint.json").read_text())
    assert (saved["epoch"], saved["step"], saved["extra"]["epoch_step"]) == (1, 8, 2)
    assert [p.name for p in (tmp_path / "b").iterdir() if "state" in p.name] == [saved["state"]]
    resumed = _student()  # a fresh process: same construction, state from the checkpoint
    result = finetune(resumed, train, _loader(), "sst2", tmp_path / "b", config=config, **quiet)
    assert result.extra["resumed"] and result.steps == 18 and result.extra["epochs_run"] == 3
    assert [e["train_loss"] for e in result.history] == pytest.approx([e["train_loss"] for e in expected.history])
    _assert_same_weights(reference, resumed)
    assert [e["step"] for e in _jsonl(tmp_path / "b" / "metrics.jsonl")] == \
        [e["step"] for e in _jsonl(tmp_path / "a" / "metrics.jsonl")]  # no step logged twice


@pytest.mark.parametrize("stage", ["distill", "finetune"])
def test_no_resume_clears_the_checkpoint_and_starts_afresh(tmp_path, stage):
    """A finished run at lr 0.1 in the folder: resume=False trains from scratch at lr 0.01."""
    quiet = {"progress": False, "log": lambda *a, **k: None}

    def train(lr, folder, **kwargs):
        model = _student()
        if stage == "distill":
            distill(model, _loader(), DistillConfig(lr=lr, epochs=1), checkpoint_dir=folder, **quiet, **kwargs)
        else:
            finetune(model, _loader(), _loader(), "sst2", folder, config=FinetuneConfig(lr=lr, epochs=1, patience=0),
                     **quiet, **kwargs)
        return model

    reference = train(1e-2, tmp_path / "a")
    train(1e-1, tmp_path / "b")
    fresh = train(1e-2, tmp_path / "b", resume=False)
    _assert_same_weights(reference, fresh)
    assert len(_jsonl(tmp_path / "b" / "metrics.jsonl")) == len(_jsonl(tmp_path / "a" / "metrics.jsonl"))


@pytest.mark.parametrize("stage", ["distill", "finetune"])
def test_a_checkpoint_of_an_earlier_version_is_removed_and_the_run_starts_afresh(tmp_path, stage):
    """Stage 1's ``stage1_state.pt``, stage 2's ``progress.json`` and its state folder: not read,
    removed with one line, and the run trains as a fresh one."""
    folder, lines = tmp_path / "b", []
    (folder / "state-1-8").mkdir(parents=True)
    (folder / "progress.json").write_text('{"epoch": 1, "step": 8, "state": "state-1-8"}')
    (folder / "stage1_state.pt").write_bytes(b"an earlier format")
    (folder / "metrics.jsonl").write_text('{"step": 9}\n')

    def train(directory, log):
        model = _student()
        if stage == "distill":
            distill(model, _loader(), DistillConfig(epochs=1), checkpoint_dir=directory, progress=False, log=log)
        else:
            finetune(model, _loader(), _loader(), "sst2", directory, config=FinetuneConfig(epochs=1, patience=0),
                     progress=False, log=log)
        return model

    _assert_same_weights(train(tmp_path / "a", lambda *a, **k: None), train(folder, lines.append))
    assert [line for line in lines if "earlier linearize version" in line] == [lines[0]]
    assert sorted(p.name for p in folder.iterdir() if p.name != "best.pt") == ["checkpoint.json", "metrics.jsonl",
                                                                             "state-1-6"]
    assert len(_jsonl(folder / "metrics.jsonl")) == len(_jsonl(tmp_path / "a" / "metrics.jsonl"))


def test_cli_passes_the_training_options_through(monkeypatch, tmp_path):
    import linearize.pipeline as pipeline

    calls = {}

    def fake_distill_model(model, task, out, **kwargs):
        calls["distill"] = kwargs
        return StageResult()

    def fake_finetune_model(model, task, out, **kwargs):
        calls["finetune"] = kwargs
        return StageResult(scores={"validation": {"accuracy": 1.0}}, best_epoch=1)

    monkeypatch.setattr(pipeline, "distill_model", fake_distill_model)
    monkeypatch.setattr(pipeline, "finetune_model", fake_finetune_model)
    common = ["--gradient-accumulation-steps", "3", "--checkpoint-every", "7", "--mixed-precision", "bf16"]
    kd = ["--teacher", "t", "--kd-weight", "0.5", "--kd-temperature", "3"]
    for command in ("distill", "finetune"):
        result = runner.invoke(app, [command, "m", "--out", str(tmp_path / command), *common])
        assert result.exit_code == 0, result.output
        config = calls[command]["config"]
        assert (config.gradient_accumulation_steps, config.checkpoint_every, config.mixed_precision) == (3, 7, "bf16")
        assert calls[command]["resume"] is True
        runner.invoke(app, [command, "m", "--out", str(tmp_path / command), "--no-resume"])
        assert calls[command]["resume"] is False
    assert calls["finetune"]["config"].checkpoint_every == 200  # the recipe's default when not given
    runner.invoke(app, ["finetune", "m", "--out", str(tmp_path / "kd"), *kd])
    assert calls["finetune"]["teacher"] == "t"
    assert (calls["finetune"]["config"].kd_weight, calls["finetune"]["config"].kd_temperature) == (0.5, 3.0)
    assert calls["finetune"]["config"].trainable == "all"
    runner.invoke(app, ["finetune", "m", "--out", str(tmp_path / "maps"), "--trainable", "attention"])
    assert calls["finetune"]["config"].trainable == "attention"
    result = runner.invoke(app, ["finetune", "m", "--out", str(tmp_path / "bad"), "--trainable", "maps"])
    assert result.exit_code != 0 and "trainable must be all | attention, got 'maps'" in " ".join(result.output.split())
    help_text = " ".join(runner.invoke(app, ["distill", "--help"]).output.split())
    assert "--no-resume" in help_text


def test_fp16_on_cpu_is_refused_with_a_hint():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: fp16 is real there")
    with pytest.raises(LinearizeError, match="use bf16 or no"):
        stage1_module.make_accelerator("fp16")


def test_losses_go_through_accelerate_and_skipped_steps_hold_the_schedule(tmp_path, monkeypatch):
    """fp16 on a GPU: accelerate's backward scales the loss and its scaler may skip a step with
    inf gradients; stage 1's per-layer losses must take accelerate's backward, and neither stage
    may advance its learning-rate schedule on a skipped step (faked here: steps 2 and 3)."""
    import itertools

    from accelerate.optimizer import AcceleratedOptimizer

    quiet = {"progress": False, "log": lambda *a, **k: None}
    for stage in ("distill", "finetune"):
        accelerator = stage1_module.make_accelerator()
        calls, original = [], accelerator.backward
        monkeypatch.setattr(accelerator, "backward", lambda loss, **kw: (calls.append(loss), original(loss, **kw)))
        skipped = itertools.chain([False, True, True], itertools.repeat(False))
        monkeypatch.setattr(AcceleratedOptimizer, "step_was_skipped", property(lambda self: next(skipped)))
        if stage == "distill":
            student = _student()
            distill(student, _loader(), DistillConfig(epochs=1, scheduler="linear"), accelerator=accelerator,
                    checkpoint_dir=tmp_path / stage, **quiet)
            assert len(calls) == 6 * len(feature_maps_of(student))  # every layer's loss at each of 6 steps
        else:
            finetune(_student(), _loader(), _loader(), "sst2", tmp_path / stage, accelerator=accelerator,
                     config=FinetuneConfig(epochs=1, scheduler="linear", warmup_ratio=0.0), **quiet)
            assert len(calls) == 6
        lrs = [entry["lr"] for entry in _jsonl(tmp_path / stage / "metrics.jsonl") if "lr" in entry]
        assert lrs[0] == lrs[1] == lrs[2] > lrs[3] > lrs[4], (stage, lrs)


def test_logit_distillation_matches_its_definition():
    from linearize.distill.losses import logit_distillation

    student, teacher = torch.tensor([[1.0, 0.0], [0.5, 2.0]]), torch.tensor([[2.0, -1.0], [0.0, 1.0]])
    t = 2.0
    p = torch.softmax(teacher / t, -1)
    expected = (p * (p.log() - torch.log_softmax(student / t, -1))).sum(-1).mean() * t * t
    torch.testing.assert_close(logit_distillation(student, teacher, t), expected)
    assert logit_distillation(teacher, teacher, t).abs() < 1e-6
    torch.testing.assert_close(logit_distillation(torch.tensor([[1.0], [3.0]]), torch.tensor([[2.0], [3.0]]),
                                                  regression=True), torch.tensor(0.5))


def test_stage2_distils_toward_the_teacher_outputs(tmp_path):
    """kd_weight = 1: only the teacher's outputs are fitted (the labels are ignored), so the
    student's logits move toward the teacher's; kd_weight without a teacher is refused."""
    teacher = _student()
    torch.manual_seed(5)
    for p in teacher.parameters():
        p.data.add_(0.5 * torch.randn_like(p))
    config = FinetuneConfig(lr=3e-3, batch_size=4, epochs=3, patience=0, kd_weight=1.0, kd_temperature=1.0)
    student = _student()
    batch = next(iter(_loader(batch_size=24)))
    model_inputs = {k: v for k, v in batch.items() if k != "labels"}
    teacher.eval(), student.eval()
    with torch.no_grad():
        target = teacher(**model_inputs).logits.softmax(-1)
        before = (student(**model_inputs).logits.softmax(-1) - target).abs().mean()
    finetune(student, _loader(), _loader(), "sst2", tmp_path / "kd", config=config, teacher=teacher, progress=False,
             log=lambda *a, **k: None)
    student.eval()
    with torch.no_grad():
        after = (student(**model_inputs).logits.softmax(-1) - target).abs().mean()
    assert after < 0.5 * before, (before, after)
    with pytest.raises(LinearizeError, match="needs the softmax teacher"):
        finetune(_student(), _loader(), _loader(), "sst2", tmp_path / "no-teacher", config=config, progress=False,
                 log=lambda *a, **k: None)


def test_stage2_with_trainable_attention_moves_only_the_feature_maps(tmp_path):
    """stage2.trainable = attention: the feature maps (and hybrid gamma) train; every pretrained weight and the
    head stay bit-identical; afterwards every weight requires a gradient again. A model with no converted
    attention to train is one line."""
    student = _student()
    attention = {id(p) for fm in feature_maps_of(student).values() for p in fm.parameters()}
    before = {name: p.detach().clone() for name, p in student.named_parameters()}
    config = FinetuneConfig(lr=3e-2, batch_size=4, epochs=1, patience=0, trainable="attention")
    finetune(student, _loader(), _loader(), "sst2", tmp_path / "attention", config=config, progress=False,
             log=lambda *a, **k: None)
    named = dict(student.named_parameters())
    moved = {name for name, p in named.items() if not torch.equal(p.detach(), before[name])}
    assert moved and all(id(named[name]) in attention for name in moved), sorted(moved)
    assert {name for name, p in named.items() if id(p) in attention} == moved
    assert all(p.requires_grad for p in student.parameters())
    with pytest.raises(LinearizeError, match="trainable=attention: the model has no converted attention"):
        finetune(build("bert", seed=0), _loader(), _loader(), "sst2", tmp_path / "softmax", config=config,
                 progress=False, log=lambda *a, **k: None)


def test_stage2_with_trainable_attention_takes_batches_inside_the_hybrid_window(tmp_path):
    """A hybrid whose window covers every sequence runs exact softmax in every layer: with trainable = attention no
    trained weight takes part in the loss. Stage 2 goes on (it failed in backward on such a batch), its steps add
    zero gradients, and the maps are as they came."""
    torch.manual_seed(1)
    student = linearize.convert(build("bert", seed=0), "hedgehog", window=16, sinks="first")
    maps = {name: p.detach().clone() for name, p in student.named_parameters() if "linearize_map" in name}
    assert maps
    config = FinetuneConfig(lr=3e-2, batch_size=4, epochs=1, patience=0, trainable="attention")
    result = finetune(student, _loader(), _loader(), "sst2", tmp_path / "inside", config=config, progress=False,
                      log=lambda *a, **k: None)
    assert result.steps == 6
    named = dict(student.named_parameters())
    assert all(torch.equal(named[name].detach(), before) for name, before in maps.items())


def test_stage1_that_raises_the_attention_kl_is_flagged():
    before = {"0": {"kl": 1.0, "ce": 2.0}, "1": {"kl": 3.0, "ce": 4.0}}
    learned = {"0": {"kl": 0.5, "ce": 1.5}, "1": {"kl": 1.0, "ce": 2.0}}
    worse = {"0": {"kl": 1.5, "ce": 2.5}, "1": {"kl": 3.0, "ce": 4.0}}
    assert stage1_module.stage1_warning("luna", before, learned) is None
    message = stage1_module.stage1_warning("flexformer-s", before, worse)
    assert "did not lower the attention KL (2.000 -> 2.250)" in message and "flexformer-s" in message
    assert "\n" not in message
    assert stage1_module.stage1_warning("luna", before, {"0": {"kl": float("nan")}}) is None
    at_teacher = {"0": {"kl": 0.0}}
    assert stage1_module.stage1_warning("luna", at_teacher, at_teacher) is None
    # a hybrid whose window covers every input is exact softmax: rounding leaves a KL of ~1e-7 (it warned)
    rounding = {"0": {"kl": 2e-7}}
    assert stage1_module.stage1_warning("luna", rounding, {"0": {"kl": 3e-7}}) is None


def test_micro_batches_group_an_epoch_into_optimizer_steps():
    """12 micro-batches with k=5: steps of 5, 5 and 2 (each scaled by its own size); a resumed
    epoch starts after its done steps without loading them."""
    from linearize.training import make_accelerator, micro_batches

    accelerator = make_accelerator()
    loader = DataLoader(list(range(12)), batch_size=1)
    grouped = [(int(batch), window, boundary) for batch, window, boundary in micro_batches(accelerator, loader, 5)]
    assert [window for _, window, _ in grouped] == [5] * 10 + [2] * 2
    assert [batch for batch, _, boundary in grouped if boundary] == [4, 9, 11]
    assert [int(batch) for batch, _, _ in micro_batches(accelerator, loader, 5, done_steps=2)] == [10, 11]


def test_a_resumed_metrics_log_forgets_the_steps_after_the_checkpoint(tmp_path):
    from linearize.training import append_jsonl, truncate_jsonl

    path = tmp_path / "metrics.jsonl"
    for step in range(1, 6):
        append_jsonl(path, {"step": step, "loss": 1.0 / step})
    truncate_jsonl(path, 3)
    assert [entry["step"] for entry in _jsonl(path)] == [1, 2, 3]
    append_jsonl(None, {"step": 4})  # not the main process: nothing is written
    assert len(_jsonl(path)) == 3


def test_stages_with_different_mixed_precision_in_one_process_each_get_their_own():
    """accelerate refuses a second precision in a process; a run whose teacher trains in float32 and
    whose student trains in bf16 (or back) needs both, in the order it asks for them."""
    from linearize.training import make_accelerator

    assert make_accelerator("no").mixed_precision == "no"
    assert make_accelerator("bf16").mixed_precision == "bf16"
    assert make_accelerator("no").mixed_precision == "no"
