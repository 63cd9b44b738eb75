"""The training commands under ``torchrun --nproc_per_node 2`` (CPU, gloo) through the real CLI
entry point (``python -m linearize.cli``), against one process with the same global batch.

Two processes with batch ``b`` each and one process with batch ``2b`` see the same examples per
optimizer step (accelerate's seedable sampler shuffles by seed and epoch; process ``i`` of 2 gets
batches ``2t+i`` of that order, whose union is batch ``t`` of the one-process loader), so their
trained weights agree to float tolerance: a gradient is a mean over the batch in one process and
the mean of two half-batch means after the all-reduce in two, the same numbers added in another
order. For that every text is longer than ``--max-length`` (no padding: a half batch's mean loss
is then exactly half of the sum) and the tiny model has no dropout (the random masks of one and
two processes differ).
"""

import csv
import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import yaml
from safetensors.torch import load_file

from tiny_models import save_tiny_text_classifier

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="this torch build has no torch.distributed with the gloo backend")

REPO = Path(__file__).resolve().parents[1]
KILLED = Path(__file__).with_name("killed_cli.py")
GOOD = "good fine warm funny sharp clever great tender wise".split()
BAD = "bad dull flat tedious mess awful clumsy weak poor".split()
EXAMPLES = {"train": 24, "dev": 10, "test": 10}  # dev and test: an uneven last batch at --batch-size 4
# a float tolerance like tests/test_distributed.py's (measured there: at most ~1e-7)
TOLERANCE = {"atol": 1e-5, "rtol": 1e-4}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, minilm_path):
    """A tiny dropout-free BERT classifier (MiniLM's tokenizer) and a CSV task of 20-word texts."""
    root = tmp_path_factory.mktemp("distributed_cli")
    save_tiny_text_classifier(root / "tiny", minilm_path, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    rng = random.Random(0)
    for split, count in EXAMPLES.items():
        with open(root / f"{split}.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["text", "label"])
            for i in range(count):
                positive = i % 2 == 0
                words = rng.choices(GOOD if positive else BAD, k=14) + rng.choices(GOOD + BAD, k=6)
                writer.writerow([" ".join(rng.sample(words, len(words))), "pos" if positive else "neg"])
    recipe = {
        "model": str(root / "tiny"), "task": "files", "method": "hedgehog",
        "data": {"train_file": str(root / "train.csv"), "validation_file": str(root / "dev.csv"),
                 "test_file": str(root / "test.csv"), "max_length": 16},
        # the tiny model as it is: a fine-tuned softmax teacher's key biases would differ by rounding
        # noise between one and two processes (see the fine-tuning test) and carry it into the student
        "teacher": {"finetune": False},
        "stage1": {"lr": 1e-2, "batch_size": 8, "epochs": 3, "eval_batches": 2, "checkpoint_every": 1},
        "stage2": {"lr": 1e-3, "batch_size": 8, "epochs": 3, "checkpoint_every": 1},
        "eval": {"batch_size": 4, "latency_repeats": 1, "examples": 2},
        "quick": {"stage1": {"epochs": 2}, "stage2": {"epochs": 2}},
    }
    (root / "tiny.yaml").write_text(yaml.safe_dump(recipe))
    return root


def files(root):
    return ["--task", "files", "--train-file", root / "train.csv", "--validation-file", root / "dev.csv",
            "--test-file", root / "test.csv", "--max-length", "16"]


def environment(**extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), **extra}
    env.pop("LINEARIZE_DEBUG", None)
    return env


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def linearize(*args, processes=1, killed_at=None, launcher="torchrun"):
    """``linearize ARGS`` as ``processes`` processes: ``torchrun --standalone`` (or ``accelerate
    launch``) for more than one; ``killed_at=(FOLDER, STEP)``: killed after that checkpoint
    (tests/killed_cli.py)."""
    program = [str(KILLED), *map(str, killed_at)] if killed_at else ["-m", "linearize.cli"]
    launchers = {"torchrun": ["-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--standalone"],
                 # --multi_gpu: accelerate's torchrun-based launcher, which also serves CPUs (gloo)
                 "accelerate": ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
                                "--num_machines", "1", "--dynamo_backend", "no", "--mixed_precision", "no",
                                "--main_process_port", str(free_port())]}
    command = [sys.executable, *(launchers[launcher] if processes > 1 or killed_at else []), *program,
               *map(str, args)]
    return subprocess.run(command, env=environment(), cwd=REPO, capture_output=True, text=True, timeout=300)


def succeeded(done):
    """``done``'s output, after checking it exited 0 (else its command, errors and output's end)."""
    output = done.stdout + done.stderr
    errors = [line for line in output.splitlines() if "Error" in line or "error:" in line]
    assert done.returncode == 0, "\n".join([" ".join(done.args), *errors[-20:], output[-3000:]])
    return done.stdout


def assert_same_weights(folder_a, folder_b, skip=(), **tolerance):
    """Every weight equal to float tolerance, but those whose names end with one of ``skip``."""
    a, b = load_file(folder_a / "model.safetensors"), load_file(folder_b / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        if not name.endswith(tuple(skip)):
            torch.testing.assert_close(a[name], b[name], **(tolerance or TOLERANCE), msg=name)


def assert_one_writer(done, out):
    """One process reported (the others are quiet) and no temporary folder is left beside ``out``."""
    assert succeeded(done).count(f"saved to {out}") == 1
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")] == []


def test_distill_under_two_processes_equals_one_process(workspace):
    common = ["distill", workspace / "tiny", "--method", "hedgehog", "--epochs", "2", "--lr", "1e-2",
              "--checkpoint-every", "1", *files(workspace)]
    one, two = workspace / "distill-1", workspace / "distill-2"
    succeeded(linearize(*common, "--out", one, "--batch-size", "8"))
    # --keep-work: the resume checkpoints stay to be looked at (by default they go after success)
    assert_one_writer(linearize(*common, "--out", two, "--batch-size", "4", "--keep-work", processes=2), two)
    assert not one.with_name("distill-1.work").exists() and (one / "metrics.jsonl").is_file()
    # the feature maps learned (the CLI path averages their gradients over the processes by
    # hand: the model is not wrapped for data parallelism), to the same weights as one process
    assert_same_weights(one, two)
    a, b = (json.loads((folder / "distill.json").read_text()) for folder in (one, two))
    assert a["steps"] == b["steps"] == 2 * EXAMPLES["train"] // 8
    assert [e["ce"] for e in b["history"]] == pytest.approx([e["ce"] for e in a["history"]], abs=1e-5)
    assert b["per_layer_after"]["0"]["kl"] < b["per_layer_before"]["0"]["kl"]
    assert (two.with_name("distill-2.work") / "checkpoint.json").is_file()
    log = [json.loads(line) for line in (two.with_name("distill-2.work") / "metrics.jsonl").read_text().splitlines()]
    assert [entry["step"] for entry in log] == list(range(1, 7))  # one writer: every step once


def test_finetune_and_eval_under_two_processes_equal_one_process(workspace):
    common = ["finetune", workspace / "tiny", "--epochs", "2", "--lr", "1e-3", *files(workspace)]
    one, two = workspace / "finetune-1", workspace / "finetune-2"
    succeeded(linearize(*common, "--out", one, "--batch-size", "8"))
    assert_one_writer(linearize(*common, "--out", two, "--batch-size", "4", processes=2), two)
    # Not the softmax key biases: softmax(q·(k + b)) = softmax(q·k) along the keys (q·b is one
    # shift per row), so their gradient is 0 but for rounding, which AdamW's g/sqrt(v) turns into
    # steps of full size and sign of the noise (measured: ~2e-4 apart after 6 steps, all else < 1e-6)
    assert_same_weights(one, two, skip=("attention.self.key.bias",))
    a, b = (json.loads((folder / "finetune.json").read_text()) for folder in (one, two))
    assert a["steps"] == b["steps"] == 2 * EXAMPLES["train"] // 8
    assert [e["train_loss"] for e in b["history"]] == pytest.approx([e["train_loss"] for e in a["history"]], abs=1e-5)
    assert b["scores"] == a["scores"] and b["dev_metrics"] == a["dev_metrics"]
    # the same model evaluated by one process and by two (accelerate launch): every prediction is
    # gathered once, the uneven last batch (10 examples, 4 per process) included: equal scores
    evaluate = ["eval", "text", two, *files(workspace), "--batch-size", "4", "--json"]
    succeeded(linearize(*evaluate, workspace / "scores-1.json"))
    succeeded(linearize(*evaluate, workspace / "scores-2.json", processes=2, launcher="accelerate"))
    scores = [json.loads((workspace / f"scores-{n}.json").read_text())["scores"] for n in (1, 2)]
    assert scores[0] == scores[1] == b["scores"]


def run_quick(workspace, out, processes, batch_size, killed_at=None):
    batches = [f"--set={section}.batch_size={batch_size}" for section in ("stage1", "stage2")]
    return linearize("run", workspace / "tiny.yaml", "--quick", "--out", out, *batches, processes=processes,
                     killed_at=killed_at)


@pytest.fixture(scope="module")
def two_process_run(workspace):
    out = workspace / "run-2"
    succeeded(run_quick(workspace, out, 2, 4))
    return out


def test_run_quick_under_two_processes_writes_the_one_process_report(workspace, two_process_run):
    one = workspace / "run-1"
    succeeded(run_quick(workspace, one, 1, 8))
    a, b = (json.loads((folder / "report.json").read_text()) for folder in (one, two_process_run))
    assert b["scores"] == a["scores"] and b["recovery"] == a["recovery"]
    assert b["task"] == a["task"] and b["model"] == a["model"] and b["data_hash"] == a["data_hash"]
    for key in ("mean_kl_before", "mean_kl_after"):
        assert b["attention"][key] == pytest.approx(a["attention"][key], abs=1e-5)
    for stage in ("stage1", "stage2"):
        assert len(b["curves"][stage]) == len(a["curves"][stage]) > 0
        for x, y in zip(a["curves"][stage], b["curves"][stage]):
            for key in set(x) - {"examples_per_second", "lr"}:
                assert y[key] == pytest.approx(x[key], abs=1e-5), (stage, key)
    assert_same_weights(one / "model", two_process_run / "model")
    assert sorted(p.name for p in two_process_run.parent.iterdir() if p.name.startswith(".")) == []


def test_killed_run_resumes_under_two_processes_to_the_uninterrupted_weights(workspace, two_process_run):
    out = workspace / "run-killed"
    # killed in stage 1 after step 2 (of 6), resumed and killed in stage 2 after step 4 (mid-epoch 2 of 2)
    for stage, step, finished in (("stage1", 2, ["teacher"]), ("stage2", 4, ["teacher", "stage1"])):
        killed = run_quick(workspace, out, 2, 4, killed_at=(stage, step))
        assert killed.returncode != 0
        assert list(json.loads((out / "state.json").read_text())["stages"]) == finished
        # one process cannot continue what two began: one line says so, and nothing is touched
        refused = run_quick(workspace, out, 1, 4)
        assert refused.returncode == 1
        errors = [line for line in refused.stderr.splitlines() if line.strip()]
        assert len(errors) == 1 and "written by 2 process(es) and this run has 1" in errors[0], refused.stderr
    succeeded(run_quick(workspace, out, 2, 4))
    assert_same_weights(two_process_run / "model", out / "model", atol=1e-6, rtol=1e-5)
    a, b = (json.loads((folder / "report.json").read_text()) for folder in (two_process_run, out))
    assert b["scores"] == a["scores"]
    assert [e["step"] for e in b["curves"]["stage2"]] == [e["step"] for e in a["curves"]["stage2"]]


def test_compare_under_two_processes_tabulates_the_runs_once(workspace, two_process_run):
    out = workspace / "compare-2"
    batches = [f"--set={section}.batch_size=4" for section in ("stage1", "stage2")]
    done = linearize("compare", workspace / "tiny.yaml", "--quick", "--out", out, "--methods", "hedgehog", "--seeds",
                     "0", "--no-without-stage1", *batches, processes=2)
    assert succeeded(done).count(f"written to {out / 'compare.md'}") == 1
    row = json.loads((out / "compare.json").read_text())["rows"][1]
    report = json.loads((two_process_run / "report.json").read_text())  # the same recipe and seed, run alone
    assert row["metric_mean"] == report["scores"]["student"]["test"]["accuracy"]
    assert_same_weights(two_process_run / "model", out / "seed0" / "hedgehog" / "model", atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(("launcher", "command", "expected"), [("no", "no", "no"), ("bf16", "no", "bf16"),
                                                               ("no", "bf16", "bf16")])
def test_the_launchers_mixed_precision_applies_unless_the_command_asks_for_one(launcher, command, expected):
    """``accelerate launch --mixed_precision bf16`` sets ACCELERATE_MIXED_PRECISION in every process."""
    code = f"from linearize.training import make_accelerator; print(make_accelerator({command!r}).mixed_precision)"
    done = subprocess.run([sys.executable, "-c", code], env=environment(ACCELERATE_MIXED_PRECISION=launcher),
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert succeeded(done).split() == [expected]
