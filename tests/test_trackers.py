"""Experiment trackers (``--report-to``) through accelerate's own, for both stages
(linearize/trackers.py). TensorBoard (via tensorboardX, a test dependency) is the one
tracker checked end to end; the others differ only in accelerate's class."""

import csv
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from linearize.cli import app
from linearize.trackers import tracker_names, valid_report_to
from tiny_models import save_tiny_text_classifier

GOOD = "good fine warm funny sharp clever great".split()
BAD = "bad dull flat tedious mess awful weak".split()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, minilm_path):
    root = tmp_path_factory.mktemp("trackers")
    save_tiny_text_classifier(root / "tiny", minilm_path)
    for split, count in {"train": 16, "dev": 8, "test": 8}.items():
        with open(root / f"{split}.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["text", "label"])
            for i in range(count):
                words = GOOD if i % 2 == 0 else BAD
                writer.writerow([" ".join(words[(i + j) % len(words)] for j in range(6)), "pos" if i % 2 == 0 else "neg"])
    return root


def files(root):
    return ["--task", "files", "--train-file", str(root / "train.csv"), "--validation-file", str(root / "dev.csv"),
            "--test-file", str(root / "test.csv"), "--max-length", "16"]


def scalars(logs):
    """``{tag: [(step, value), ...]}`` read back from every TensorBoard event file under ``logs``
    (TFRecord framing: length, its CRC, the Event protobuf, its CRC)."""
    from tensorboardX.proto.event_pb2 import Event

    found = {}
    for path in sorted(Path(logs).rglob("events.out.tfevents.*")):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found


def invoke(*arguments):
    return CliRunner().invoke(app, [str(a) for a in arguments])


def test_tracker_names():
    assert tracker_names("none") == tracker_names("") == tracker_names(None) == []
    assert tracker_names("tensorboard, wandb") == ["tensorboard", "wandb"]
    assert valid_report_to("tensorboard,mlflow") and valid_report_to("none")
    assert not valid_report_to("tensorbord") and not valid_report_to(3)


def test_both_stages_log_their_curves_to_tensorboard(workspace):
    pytest.importorskip("tensorboardX")
    distilled, tuned = workspace / "distilled", workspace / "tuned"
    done = invoke("distill", workspace / "tiny", "--method", "hedgehog", "--epochs", "2", "--batch-size", "4",
                  "--report-to", "tensorboard", "--out", distilled, *files(workspace))
    assert done.exit_code == 0, done.output
    logged = scalars(distilled / "logs")  # moved out of <out>.work with metrics.jsonl
    assert [step for step, _ in logged["ce"]] == list(range(1, 9)) and "lr" in logged and "kl" in logged
    done = invoke("finetune", distilled, "--epochs", "2", "--batch-size", "4", "--report-to", "tensorboard",
                  "--out", tuned, *files(workspace))
    assert done.exit_code == 0, done.output
    logged = scalars(tuned / "logs")
    assert [step for step, _ in logged["loss"]] == list(range(1, 9))
    assert [step for step, _ in logged["dev_accuracy"]] == [4, 8]  # the dev metrics at each epoch's end


@pytest.mark.parametrize("report_to, message", [
    ("tensorbord", "report_to must be none or a comma-separated list of tensorboard"),
    ("wandb", "--report-to wandb needs the wandb package: pip install wandb"),
])
def test_an_unknown_or_missing_tracker_is_a_one_line_error_before_training(workspace, report_to, message):
    if report_to == "wandb":
        pytest.importorskip("accelerate.tracking")
        from accelerate.tracking import get_available_trackers

        if "wandb" in {str(t) for t in get_available_trackers()}:
            pytest.skip("wandb is installed here")
    out = workspace / f"refused-{report_to}"
    done = invoke("distill", workspace / "tiny", "--method", "hedgehog", "--report-to", report_to, "--out", out,
                  *files(workspace))
    assert done.exit_code == 1 and message in done.output and "Traceback" not in done.output
    assert not out.exists()
