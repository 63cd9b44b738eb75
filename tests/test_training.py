"""Stage 1 and stage 2 on every kind of data source, resume, and bad input (CPU, small models)."""

import json
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
from linearize.convert import feature_maps_of
from linearize.distill import DistillConfig, attention_distances, distill
from linearize.distill import stage1 as stage1_module
from linearize.errors import LinearizeError
from linearize.finetune import FinetuneConfig, finetune
from linearize.pipeline import distill_model, finetune_model
from tiny_models import build, inputs, save_tiny_text_classifier

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
                           config=DistillConfig(lr=1e-2, epochs=3), batch_size=8, data=data, progress=False,
                           log=lambda *a, **k: None)
    before = np.mean([v["ce"] for v in result["per_layer_before"].values()])
    after = np.mean([v["ce"] for v in result["per_layer_after"].values()])
    assert after < before
    assert linearize.load(distilled).config.linearize["method"] == "hedgehog"  # the checkpoint reloads
    final = root / f"{task}-s2"
    result = finetune_model(str(distilled), task, final, config=FinetuneConfig(lr=2e-3, batch_size=8, epochs=4,
                                                                               patience=0),
                            data=data, progress=False, log=lambda *a, **k: None)
    losses = [entry["train_loss"] for entry in result["history"]]
    assert losses[-1] < losses[0]
    reloaded = linearize.load(final)
    assert reloaded.config.num_labels == (1 if task == "stsb" else 2)
    assert set(result["scores"]) == {"validation"}


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
                           config=DistillConfig(lr=1e-2, epochs=3), batch_size=8, data=data, progress=False,
                           log=lambda *a, **k: None)
    assert np.mean([v["ce"] for v in result["per_layer_after"].values()]) < \
        np.mean([v["ce"] for v in result["per_layer_before"].values()])
    result = finetune_model(str(tmp_path / "s1"), "imagefolder", tmp_path / "s2",
                            config=FinetuneConfig(lr=2e-3, batch_size=8, epochs=3, patience=0), data=data,
                            progress=False, log=lambda *a, **k: None)
    assert result["history"][-1]["train_loss"] < result["history"][0]["train_loss"]
    assert type(linearize.load(tmp_path / "s2")).__name__ == "LinearizeViTForImageClassification"


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
    before = np.mean([v["ce"] for v in result["per_layer_before"].values()])
    after = np.mean([v["ce"] for v in result["per_layer_after"].values()])
    assert after < before - 0.05, (before, after)
    assert result["steps"] == 30


def _loader(seed=0, n=24):
    examples = []
    for i in range(n):
        batch = inputs("bert", batch=2, seq=10, pad=1 + i % 3, seed=100 + i)
        examples.append({k: v[i % 2] for k, v in batch.items()} | {"labels": torch.tensor(i % 2)})
    return DataLoader(examples, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(seed))


def _student():
    model = build("bert", seed=0)
    torch.manual_seed(1)
    return linearize.convert(model, "luna", projections=4, hidden=8)


def test_stage1_resume_after_interruption_gives_the_same_weights(tmp_path, monkeypatch):
    config = DistillConfig(lr=1e-2, epochs=2, checkpoint_every=1)
    quiet = {"progress": False, "log": lambda *a, **k: None}
    reference = _student()
    distill(reference, _loader(), config, checkpoint_dir=tmp_path / "a", **quiet)

    original = stage1_module._save_state

    def crash_after_step_8(path, maps, optimizer, scheduler, step, *args):
        original(path, maps, optimizer, scheduler, step, *args)
        if step == 8:
            raise KeyboardInterrupt("simulated kill")

    monkeypatch.setattr(stage1_module, "_save_state", crash_after_step_8)
    with pytest.raises(KeyboardInterrupt):
        distill(_student(), _loader(), config, checkpoint_dir=tmp_path / "b", **quiet)
    monkeypatch.setattr(stage1_module, "_save_state", original)
    resumed = _student()  # a fresh process: same construction, state from the checkpoint
    result = distill(resumed, _loader(), config, checkpoint_dir=tmp_path / "b", **quiet)
    assert result["steps"] == 12
    for (name, a), (_, b) in zip(reference.named_parameters(), resumed.named_parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)


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
    assert result["resumed"] and result["epochs_run"] == 3
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


def test_metrics_jsonl_logs_every_step(tmp_path):
    distill(_student(), _loader(), DistillConfig(epochs=1), checkpoint_dir=tmp_path / "s1", progress=False,
            log=lambda *a, **k: None)
    lines = (tmp_path / "s1" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, 7))
    finetune(_student(), _loader(), _loader(), "sst2", tmp_path / "s2", config=FinetuneConfig(epochs=2),
             progress=False, log=lambda *a, **k: None)
    assert len((tmp_path / "s2" / "metrics.jsonl").read_text().splitlines()) == 2
