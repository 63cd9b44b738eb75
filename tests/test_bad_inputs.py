"""The bad-input battery (issue 22) as one table: command -> exit code and message fragment.

Every bad input is refused before any work is done, in one line (``error: ...``, no traceback)
that says what to do, or is handled correctly (exit 0). No case trains more than a few steps of
a tiny BERT; every output folder of a refused command is absent or empty, and no hidden
temporary folder is left beside it.
"""

import csv
import dataclasses
import errno
import json
import re
import shlex
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from linearize.cli import app
from linearize.convert import convert_checkpoint
from linearize.pipeline import RunState
from linearize.attention.feature_maps import options_for
from linearize.recipes import load_recipe
from linearize.report import StageResult
from tiny_models import save_tiny_text_classifier

runner = CliRunner()
GOOD = ["good", "fine", "great", "nice"]
BAD = ["bad", "awful", "dull", "poor"]


def _write_csv(path, rows, encoding="utf-8"):
    with open(path, "w", newline="", encoding=encoding) as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        writer.writerows(rows)


@pytest.fixture(scope="module")
def ws(tmp_path_factory, minilm_path):
    """Tiny models (a classifier, a base model, both converted) and small data files."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("bad-inputs")
    save_tiny_text_classifier(root / "tiny", minilm_path)
    save_tiny_text_classifier(root / "base", minilm_path)
    config = json.loads((root / "base" / "config.json").read_text())
    config["architectures"] = ["BertModel"]  # the same weights read as a model without a head
    (root / "base" / "config.json").write_text(json.dumps(config))
    save_tiny_text_classifier(root / "twelve", minilm_path)
    config = json.loads((root / "twelve" / "config.json").read_text())
    config["num_attention_heads"] = "twelve"
    (root / "twelve" / "config.json").write_text(json.dumps(config))
    convert_checkpoint(str(root / "tiny"), "relu", root / "converted")
    convert_checkpoint(str(root / "base"), "relu", root / "converted-base")
    pairs = [(f"{g} {i}", "pos") for i in range(3) for g in GOOD] + [(f"{b} {i}", "neg") for i in range(3) for b in BAD]
    for split in ("train", "dev", "test"):
        _write_csv(root / f"{split}.csv", pairs)
    _write_csv(root / "one-class.csv", [(f"good {i}", "pos") for i in range(12)])
    _write_csv(root / "header-only.csv", [])
    _write_csv(root / "latin1.csv", [("café crème", "pos"), ("bad", "neg")], encoding="latin-1")
    _write_csv(root / "long-cell.csv", [("x" * 200_000, "pos")] + pairs)
    (root / "afile.txt").write_text("a file, not a folder")
    recipe = {"model": str(root / "tiny"), "task": "files", "method": "hedgehog",
              "data": {"train_file": str(root / "train.csv"), "validation_file": str(root / "dev.csv"),
                       "max_length": 16},
              "teacher": {"epochs": 1, "batch_size": 8}, "stage1": {"epochs": 1, "batch_size": 8},
              "stage2": {"epochs": 1, "batch_size": 8}}
    (root / "tiny.yaml").write_text(yaml.safe_dump(recipe))
    (root / "list.yaml").write_text("- model: minilm\n")
    (root / "typo.yaml").write_text(yaml.safe_dump({**recipe, "options": {"luna": {"projection": 16}}}))
    (root / "outs").mkdir()
    (root / "empty").mkdir()
    return root


FILES = "--train-file {ws}/train.csv --validation-file {ws}/dev.csv --test-file {ws}/test.csv --max-length 16"
RUN = "run {ws}/tiny.yaml --out {out}"
FINETUNE = "finetune {ws}/tiny --task files --out {out} --epochs 1 --batch-size 8 --max-length 16"
DISTILL = "distill {ws}/tiny --task files --out {out} --method hedgehog " + FILES
CONVERT = "convert {ws}/tiny --out {out} --method relu"
COMPARE = "compare {ws}/tiny.yaml --out {out} --no-without-stage1"


def finished_teacher(ws, out, monkeypatch):
    """``out`` holds a hedgehog run of tiny.yaml whose teacher is finished."""
    recipe = load_recipe(str(ws / "tiny.yaml"))
    config = dataclasses.replace(recipe, options=options_for("hedgehog", recipe.options))
    RunState(out, config).finish("teacher", StageResult())


def home_is_workspace(ws, out, monkeypatch):
    monkeypatch.setenv("HOME", str(ws))


def in_empty_folder(ws, out, monkeypatch):
    monkeypatch.chdir(ws / "empty")


def disk_full(ws, out, monkeypatch):
    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("transformers.modeling_utils.safe_save_file", no_space)


def work_removed(ws, out):
    assert not Path(f"{out}.work").exists() and (out / "metrics.jsonl").is_file()


def work_kept(ws, out):
    assert (Path(f"{out}.work") / "metrics.jsonl").is_file()


def three_labels(ws, out):
    assert len(json.loads((out / "config.json").read_text())["id2label"]) == 3


def without_gpu(ws, out, monkeypatch):
    """A case about a CPU-only machine: it does not apply where accelerate finds a GPU."""
    from linearize.training.accelerator import has_device

    if has_device():
        pytest.skip("a GPU is here: fp16 is allowed")


def source_kept(ws, out):
    config = ws / "tiny" / "config.json"
    assert config.is_file() and '"linearize"' not in config.read_text(), "the source folder was replaced"


def nothing_trained(ws, out):
    assert not (out / "teacher").exists() and not (out / "work").exists()


def one_layer_converted(ws, out):
    assert len(json.loads((out / "config.json").read_text())["linearize"]["_data"]["layers"]) == 1


def three_label_teacher(ws, out, monkeypatch):
    """``<out>-teacher``: the tiny classifier's files with a config naming 3 classes."""
    teacher = Path(f"{out}-teacher")
    teacher.mkdir(parents=True, exist_ok=True)
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (teacher / name).write_bytes((ws / "tiny" / name).read_bytes())
    config = json.loads((ws / "tiny" / "config.json").read_text())
    config["id2label"] = {str(i): name for i, name in enumerate(("neg", "neutral", "pos"))}
    config["label2id"] = {name: int(i) for i, name in config["id2label"].items()}
    (teacher / "config.json").write_text(json.dumps(config))


def empty_folder_stays_empty(ws, out):
    assert list((ws / "empty").iterdir()) == []


#: (case, command, exit code, fragment of the message (of the error line when the exit is not 0), set-up, check)
CASES = [
    # -- the whole recipe is checked before any stage runs
    ("unknown method", RUN + " --method nope", 1, "unknown method 'nope'; valid methods: luna", None, None),
    ("option name typo", RUN + " --method luna --set options.luna.projection=16", 1,
     "unknown option(s) 'projection' for method 'luna'; valid options: projections", None, None),
    ("option typo of another method's block", "run {ws}/typo.yaml --out {out}", 1,
     "unknown option(s) 'projection' for method 'luna'", None, None),
    ("lr not a number", RUN + " --set stage1.lr=fast", 1, "stage1.lr must be a number, got 'fast'", None, None),
    ("bool option not a bool", RUN + " --method luna --option shared_mlp=maybe", 1,
     "option shared_mlp must be true or false, got 'maybe'", None, None),
    ("int option given a float", RUN + " --method luna --option projections=2.5", 1,
     "option projections must be an integer, got 2.5", None, None),
    ("int option given a word", RUN + " --method luna --option projections=abc", 1,
     "option projections must be an integer, got 'abc'", None, None),
    ("batch size 0", RUN + " --set stage2.batch_size=0", 1, "stage2.batch_size must be >= 1, got 0", None, None),
    ("batch size a float", RUN + " --set stage2.batch_size=8.0", 1, "stage2.batch_size must be an integer", None,
     None),
    ("unknown scheduler", RUN + " --set stage2.scheduler=cos", 1,
     "stage2.scheduler must be cosine | linear | constant, got 'cos'", None, None),
    ("warmup ratio out of range", RUN + " --set teacher.warmup_ratio=1.5", 1,
     "teacher.warmup_ratio must be in [0, 1), got 1.5", None, None),
    ("zero max length", RUN + " --set data.max_length=0", 1, "data.max_length must be >= 3", None, None),
    ("a model path that is not there", RUN + " --model ./nope", 1,
     "./nope is neither a model folder nor a Hub id", None, nothing_trained),
    ("fp16 on a CPU, before the teacher trains", RUN + " --set stage2.mixed_precision=fp16", 1,
     "stage2.mixed_precision fp16 needs a GPU", without_gpu, nothing_trained),
    ("a max length that leaves no text", RUN + " --set data.max_length=1", 1, "data.max_length must be >= 3 (a text's",
     None, None),
    ("negative seed", RUN + " --seed -1", 1, "seed must be in [0, 2**32), got -1", None, None),
    ("a seed numpy cannot take", RUN + " --set seed=4294967296", 1, "seed must be in [0, 2**32), got 4294967296",
     None, None),
    ("a recipe file that is a YAML list", "run {ws}/list.yaml --out {out}", 1,
     "list.yaml holds a YAML list, not a recipe: a recipe is a mapping of keys", None, None),
    ("unknown head", RUN + " --set head=sequence", 1, "unknown head 'sequence'; valid heads: base", None, None),
    ("layer out of range, before the teacher trains", RUN + " --layers 0,7", 1,
     "layers [0, 7]: 7 is out of range; give a non-empty list of distinct integers in 0..1", None, nothing_trained),
    ("convert into its own source folder", "convert {ws}/tiny --out {ws}/tiny --overwrite", 1,
     "--out {ws}/tiny is, holds or lies inside {ws}/tiny, which this command reads", None, source_kept),
    ("distill into a folder inside its input", "distill {ws}/converted --task files --out {ws}/converted/s1", 1,
     "--out {ws}/converted/s1 is, holds or lies inside {ws}/converted", None, None),
    ("run --teacher-from a missing folder", RUN + " --teacher-from {ws}/nowhere", 1,
     "--teacher-from {ws}/nowhere does not exist; pass a run folder whose teacher finished", None, nothing_trained),
    ("run --teacher-from a folder without a finished teacher", RUN + " --teacher-from {ws}/converted", 1,
     "{ws}/converted has no finished teacher to share (no state.json recording one)", None, nothing_trained),
    ("run into a folder that is not a run (a converted model)", "run {ws}/tiny.yaml --out {ws}/converted", 1,
     "{ws}/converted is not a run folder (it holds config.json", None, None),
    ("a converted model as the source", RUN + " --model {ws}/converted", 1,
     "is already converted to linear attention (relu", None, nothing_trained),
    ("rerun with another recipe", RUN + " --method t2r", 1,
     "different recipe (method: 'hedgehog' -> 't2r'); run into another --out with --teacher-from {out}",
     finished_teacher, None),
    ("output under a file", "run {ws}/tiny.yaml --out {ws}/afile.txt/sub", 1,
     "{ws}/afile.txt is a file, not a folder; choose another --out", None, None),
    ("~ expanded in --set data.data_dir", RUN + " --task sst2 --set data.train_file= --set data.validation_file= "
     "--set data.data_dir=~/glue", 1,
     "GLUE data folder {ws}/glue does not exist", home_is_workspace, None),
    ("compare checks every run first", "compare {ws}/tiny.yaml --out {out} --methods luna,hedgehog --seeds 0 "
     "--no-without-stage1 --set options.hedgehog.nope=1", 1, "unknown option(s) 'nope' for method 'hedgehog'",
     None, None),
    ("another method's options set", RUN + " --method hedgehog --set options.luna.projections=16", 1,
     "--set options.luna.* sets luna's options, but this converts with hedgehog", None, nothing_trained),
    ("compare: options of a method not compared",
     COMPARE + " --methods hedgehog --seeds 0 --set options.t2r.feature_dim=8", 1,
     "sets t2r's options, but this converts with hedgehog", None, None),
    ("compare --seeds not integers", COMPARE + " --methods luna --seeds a,b", 1,
     "--seeds 'a,b' is not a comma-separated list of seeds (example: 0,1,2)", None, None),
    ("compare --seeds naming none", COMPARE + " --methods luna --seeds ''", 1, "--seeds '' names no seed", None, None),
    ("compare --methods naming none", COMPARE + " --methods '' --seeds 0", 1, "--methods '' names no method", None,
     None),
    ("compare a seed twice", COMPARE + " --methods luna --seeds 0,0", 1,
     "two runs of the comparison would write {out}/seed0/luna: a method, seed or variant is named twice", None, None),
    ("compare a method twice", COMPARE + " --methods luna,luna --seeds 0", 1,
     "two runs of the comparison would write {out}/seed0/luna:", None, None),
    ("compare a variant name twice", COMPARE + " --methods luna --seeds 0 --variant 'a: seed=1' --variant 'a: seed=2'",
     1, "--variant 'a' is given twice", None, None),
    ("compare variants of one folder name", COMPARE + " --methods luna --seeds 0 --variant 'a b: seed=1' "
     "--variant 'a-b: seed=2'", 1, "two runs of the comparison would write {out}/seed0/luna--a-b:", None, None),
    ("compare --teachers-from a missing folder", COMPARE + " --methods luna --seeds 0 --teachers-from {ws}/nope", 1,
     "--teachers-from {ws}/nope is not a folder", None, None),
    ("bench attention at lengths beyond memory", "bench attention --methods relu --model none --seq-lens "
     "100000000000 --out {out}", 2, "--seq-lens 100,000,000,000: q, k and v alone would take", None, None),
    ("bench long --softmax-max-gib 0", "bench long --geometries minilm --seq-lens 8 --softmax-max-gib 0 --out {out}",
     2, "--softmax-max-gib 0.0 skips softmax at every length", None, None),
    ("bench attention --methods ''", "bench attention --methods '' --model none --seq-lens 8 --out {out}", 2,
     "--methods '' names nothing", None, None),
    ("bench long --geometries ','", "bench long --geometries , --seq-lens 8 --out {out}", 2,
     "--geometries ',' names nothing", None, None),
    # -- data
    ("one-class data", FINETUNE + " --train-file {ws}/one-class.csv", 1,
     "one-class.csv has one class only (pos) in column 'label': a classifier needs at least two", None, None),
    ("header-only CSV", FINETUNE + " --train-file {ws}/header-only.csv --validation-file {ws}/dev.csv", 1,
     "header-only.csv has no records", None, None),
    ("Latin-1 CSV", FINETUNE + " --train-file {ws}/latin1.csv --validation-file {ws}/dev.csv", 1,
     "latin1.csv is not UTF-8 text (byte 0xe9", None, None),
    ("a missing label column", FINETUNE + " --train-file {ws}/train.csv --label-column nope", 1,
     "has no column 'nope'", None, None),
    ("a 200,000-character cell trains; <out>.work removed", FINETUNE + " --train-file {ws}/long-cell.csv "
     "--validation-file {ws}/dev.csv", 0, "saved to", None, work_removed),
    ("--keep-work keeps <out>.work", FINETUNE + " --train-file {ws}/train.csv --keep-work", 0, "saved to", None,
     work_kept),
    ("~ expanded in data file paths", "eval text {ws}/tiny --task files --train-file ~/train.csv "
     "--validation-file ~/dev.csv", 0, "validation", home_is_workspace, None),
    # -- stage settings and heads
    ("distill --epochs 0", DISTILL + " --epochs 0", 1, "epochs must be > 0, got 0.0", None, None),
    ("distill --batch-size 0", DISTILL + " --batch-size 0", 1, "batch_size must be >= 1, got 0", None, None),
    ("distill removes <out>.work", DISTILL + " --max-steps 1 --eval-batches 1", 0, "saved to", None, work_removed),
    ("finetune --lr 0", FINETUNE + " --train-file {ws}/train.csv --lr 0", 1, "lr must be > 0, got 0.0", None, None),
    ("finetune --kd-weight without --teacher", FINETUNE + " --train-file {ws}/train.csv --kd-weight 0.5", 1,
     "kd_weight 0.5 distils toward a softmax teacher's outputs, and none is given: pass --teacher", None,
     nothing_trained),
    ("finetune --kd-weight 2", FINETUNE + " --train-file {ws}/train.csv --kd-weight 2", 1,
     "kd_weight must be in [0, 1], got 2.0", None, None),
    ("eval text without a task head", "eval text {ws}/converted-base --task files " + FILES, 1,
     "is a BertModel, without a classification head", None, None),
    ("finetune without a task head", "finetune {ws}/converted-base --task files --out {out} " + FILES, 1,
     "without a classification head: convert or fine-tune its softmax source with --head", None, None),
    ("eval of a converted folder asks nothing", "eval text {ws}/converted --task files " + FILES, 0, "validation",
     None, None),
    # -- convert
    ("--num-labels 0", CONVERT + " --num-labels 0", 1, "--num-labels 0: a head needs at least 1 output", None, None),
    ("--num-labels without a head", "convert {ws}/base --out {out} --method relu --num-labels 3", 1,
     "loads as BertModel, which has none; add --head sequence-classification", None, None),
    ("--num-labels with --head is honoured", "convert {ws}/base --out {out} --method relu --num-labels 3 "
     "--head sequence-classification", 0, "linearize model", None, three_labels),
    ("convert an already-converted folder", "convert {ws}/converted --out {out}", 1,
     "is already converted to linear attention (relu, from {ws}/tiny)", None, None),
    ("config field of the wrong type", "convert {ws}/twelve --out {out}", 1,
     "Field 'num_attention_heads' expected int, got str (value: 'twelve')", None, None),
    ("convert --out under a file", "convert {ws}/tiny --out {ws}/afile.txt/sub", 1,
     "{ws}/afile.txt is a file, not a folder", None, None),
    ("convert --out .", "convert {ws}/tiny --out .", 1, "--out . is the folder you are in", in_empty_folder,
     empty_folder_stays_empty),
    ("full disk", CONVERT, 1, "no space left on the disk while writing {out}", disk_full, None),
    ("convert --method nope", "convert {ws}/tiny --out {out} --method nope", 1, "unknown method 'nope'", None, None),
    ("convert option of the wrong type", "convert {ws}/tiny --out {out} --method luna --option shared_mlp=maybe", 1,
     "option shared_mlp must be true or false", None, None),
    # -- a second new user's battery (issue 36): settings that could not take effect, infinite numbers
    ("convert --gamma without --window or --sinks", CONVERT + " --gamma 0.5", 1,
     "--gamma 0.5 weighs the linear part of a hybrid against its exact part, and without --window or --sinks "
     "there is none", None, None),
    ("convert --hybrid-layers without --window or --sinks", CONVERT + " --hybrid-layers 1", 1,
     "--hybrid-layers [1] names the layers that get the window and the sinks, and without --window or --sinks "
     "there are none", None, None),
    ("convert --hybrid-layers of a layer not converted",
     "convert {ws}/tiny --out {out} --method hedgehog --window 4 --layers 0 --hybrid-layers 1", 1,
     "--hybrid-layers [1]: not converted (converted: [0])", None, None),
    ("convert --gamma inf", "convert {ws}/tiny --out {out} --method hedgehog --window 4 --gamma inf", 1,
     "gamma must be a finite number > 0, got inf", None, None),
    ("distill --epochs inf", DISTILL + " --epochs inf", 1, "epochs must be a finite number > 0, got inf", None, None),
    ("distill --negative-weight-penalty -1", DISTILL + " --negative-weight-penalty -1", 1,
     "negative_weight_penalty must be >= 0, got -1.0", None, None),
    ("distill --keep-softmax of every layer", DISTILL + " --keep-softmax 2", 1,
     "--keep-softmax 2 would give softmax back to every converted layer (2); pass fewer", None, None),
    ("distill --keep-softmax gives layers back", DISTILL + " --max-steps 1 --eval-batches 1 --keep-softmax 1", 0,
     "saved to", None, one_layer_converted),
    ("finetune --teacher without --kd-weight", FINETUNE + " --train-file {ws}/train.csv --teacher {ws}/tiny", 1,
     "is used only by the distillation term, and kd_weight is 0: add --kd-weight", None, None),
    ("finetune --teacher without a head", FINETUNE + " --train-file {ws}/train.csv --teacher {ws}/base "
     "--kd-weight 0.5", 1, "the teacher {ws}/base is a BertModel, without a classification head", None, None),
    ("finetune --teacher with other classes", FINETUNE + " --train-file {ws}/train.csv --teacher {out}-teacher "
     "--kd-weight 0.5", 1, "the teacher {out}-teacher has 3 labels but task files has 2", three_label_teacher, None),
    ("finetune --head on a converted folder", "finetune {ws}/converted --task files --out {out} --head base --epochs 1 "
     "--batch-size 8 --max-length 16 --train-file {ws}/train.csv", 1,
     "is converted already, with the head it was converted with, so --head base cannot take effect", None, None),
]


def _files_under(path):
    return [p for p in Path(path).rglob("*") if p.is_file()] if Path(path).exists() else []


@pytest.mark.parametrize("case, command, code, fragment, setup, check", CASES, ids=[case[0] for case in CASES])
def test_bad_input(ws, monkeypatch, case, command, code, fragment, setup, check):
    out = ws / "outs" / re.sub(r"[^A-Za-z0-9]+", "-", case)
    monkeypatch.delenv("LINEARIZE_DEBUG", raising=False)
    if setup is not None:
        setup(ws, out, monkeypatch)
    args = shlex.split(command.format(ws=ws, out=out))
    result = runner.invoke(app, args)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output and "Do you wish to run the custom code" not in result.output
    fragment = fragment.format(ws=ws, out=out)
    if code:
        errors = [line for line in lines if line.startswith("error:")]
        assert len(errors) == 1 and lines[-1] == errors[0], lines[-5:]
        assert fragment in errors[0], errors[0]
        if setup is not finished_teacher:  # (that run folder is the user's own)
            assert _files_under(out) == [], "a refused command wrote output (or trained before refusing)"
    else:
        assert fragment in result.output, result.output
    assert not [p.name for p in (ws / "outs").iterdir() if p.name.startswith(".")], "a temporary folder was left"
    if check is not None:
        check(ws, out)


def test_the_battery_has_at_least_30_cases():
    assert len(CASES) >= 30 and len({case[0] for case in CASES}) == len(CASES)


def test_a_failed_write_removes_its_temporary_folder_and_keeps_the_bug_traceback(ws, monkeypatch):
    """A failure that is not the user's keeps its traceback, and still leaves no temporary folder."""
    def broken(*args, **kwargs):
        raise RuntimeError("boom: a bug while saving")

    monkeypatch.setattr("transformers.modeling_utils.safe_save_file", broken)
    out = ws / "outs" / "bug"
    result = runner.invoke(app, shlex.split(CONVERT.format(ws=ws, out=out)))
    assert isinstance(result.exception, RuntimeError) and "boom" in str(result.exception)
    assert not out.exists() and not [p for p in (ws / "outs").iterdir() if p.name.startswith(".")]
