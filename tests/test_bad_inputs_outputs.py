"""Outputs a new user could not write, or wrote twice at once (issue 36): each case one row.

- An output path that cannot be written is one line, found before any work (the atomic writers'
  temporary siblings count as the user's path, and are never named).
- A write that fails for want of space (``ulimit -f``: EFBIG, as a full disk) is one line naming
  the path and the cause; nothing is half-written, the old folder is kept, a re-run resumes.
- An output folder is locked while a command or a library function (called from Python) writes it:
  a second writer is refused in one line naming the holder; a killed holder's lock is taken over
  and its leftovers are removed.
- Ctrl-C ends a command with one line saying what a re-run does, exit 130.
- Saved files follow the umask (``model.safetensors`` included); transformers' LOAD REPORT is
  plain text when stderr is not a terminal.
"""

import errno
import importlib
import logging
import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from linearize.cli import app, is_user_path_error
from linearize.cli.common import user_path_message
from linearize.convert.loading import PlainText, plain_transformers_logs
from linearize.errors import LinearizeError
from linearize.outputs import (atomic_dir, atomic_path, check_writable_inside, is_disk_full, lock_file_of,
                               locked_output, remove_stale_temporaries, write_errno)
from tiny_models import build, save_tiny_text_classifier

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]
AS_ROOT = os.geteuid() == 0
LOCKED = "is being written by another linearize process"
LOCKED_HERE = "is being written by another writer in this process"  # the holder is this process (its pid)
DISTILL = "distill {ws}/tiny --method hedgehog --task files --train-file {ws}/train.csv --max-length 16 " \
          "--eval-batches 1 --out {out}"


@pytest.fixture(scope="module")
def ws(tmp_path_factory, minilm_path):
    """A tiny BERT (no tokenizer), a tiny classifier with MiniLM's tokenizer, its conversion and a CSV."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("bad-outputs")
    build("bert").save_pretrained(root / "tiny-bert")
    save_tiny_text_classifier(root / "tiny", minilm_path)
    assert invoke("convert", root / "tiny", "--method", "relu", "--out", root / "converted")[0] == 0
    (root / "train.csv").write_text("text,label\n" + "good film,1\nbad film,0\n" * 8)
    return root


def invoke(*args):
    """``linearize ARGS`` in this process: (exit code, output lines)."""
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, [line for line in result.output.splitlines() if line.strip()]


def cli_env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def linearize_process(*args, file_size_limit=None, env=None):
    """``linearize ARGS`` as a user runs it (a fresh process), with an optional file size limit
    (``ulimit -f``: a write past it fails with EFBIG; SIGXFSZ is ignored so the write fails instead
    of killing the process). Ctrl-C (SIGINT) reaches it as in a terminal, whatever the test run inherited: a suite
    started in the background by a non-interactive shell (``pytest ... &``) ignores SIGINT, and an ignored SIGINT
    is inherited across exec (Python then installs no KeyboardInterrupt handler)."""
    def prepare():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if file_size_limit:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    return subprocess.Popen([sys.executable, "-m", "linearize.cli", *map(str, args)], env={**cli_env(), **(env or {})},
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=prepare)


def finished(process, timeout=600):
    """(exit code, stderr lines that are not progress bars) of ``process``."""
    _, err = process.communicate(timeout=timeout)
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip()]
    return process.returncode, [line for line in lines if "it/s]" not in line and "examples/s]" not in line]


def hidden(folder):
    return sorted(p.name for p in Path(folder).iterdir() if p.name.startswith("."))


def one_error(code, lines, *fragments, exit_code=1):
    assert code == exit_code, lines
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and not any("Traceback" in line for line in lines), lines
    message = " ".join(errors[0].split())
    for fragment in fragments:
        assert fragment in message, message
    return message


# ---- 1. an unwritable output path: one line, before any work --------------------------------------

@pytest.mark.parametrize("command", [
    "convert {ws}/tiny-bert --out {out}",
    DISTILL,
    "finetune {ws}/tiny --task files --train-file {ws}/train.csv --out {out}",
    "run --quick --out {out}",
    "compare --quick --out {out}",
    "bench attention --methods relu --seq-lens 8 --model none --out {out}",
    "bench long --geometries minilm --seq-lens 8 --out {out}",
])
@pytest.mark.parametrize("out", ["/proc/x", "/proc/x/y"])
def test_an_output_under_proc_is_one_line_before_any_work(ws, monkeypatch, command, out):
    def never(*args, **kwargs):
        raise AssertionError("work started before the output path was checked")

    for module, name in (("linearize.convert", "convert_checkpoint"), ("linearize.pipeline", "distill_model"),
                         ("linearize.pipeline", "finetune_model"), ("linearize.pipeline", "run")):
        monkeypatch.setattr(importlib.import_module(module), name, never)
    code, lines = invoke(*command.format(ws=ws, out=out).split())
    one_error(code, lines, f"cannot write --out {out}: /proc does not accept new files",
              "choose a folder you can write to")


def test_eval_json_under_proc_is_one_line_before_the_evaluation(ws, monkeypatch):
    monkeypatch.setattr(importlib.import_module("linearize.pipeline"), "evaluate_model",
                        lambda *a, **k: pytest.fail("the evaluation ran"))
    code, lines = invoke("eval", "text", ws / "converted", "--task", "files", "--train-file", ws / "train.csv",
                         "--json", "/proc/x.json")
    one_error(code, lines, "cannot write --json /proc/x.json: /proc does not accept new files")


def test_eval_of_a_checkpoint_without_the_tasks_trained_head_is_one_line(ws, tmp_path):
    """A softmax checkpoint saved as the base model (all-MiniLM-L6-v2 is a BertModel) has no classifier: transformers
    would start one at random and the scores would be noise, so the evaluation refuses; the classifier it came from
    (a trained head in its checkpoint) is scored."""
    import transformers

    transformers.BertModel.from_pretrained(ws / "tiny").save_pretrained(tmp_path / "base")
    transformers.AutoTokenizer.from_pretrained(ws / "tiny").save_pretrained(tmp_path / "base")
    data = ["--task", "files", "--train-file", ws / "train.csv", "--batch-size", "8"]
    code, lines = invoke("eval", "text", tmp_path / "base", *data)
    one_error(code, lines, "has no trained sequence-classification head (a BertModel): transformers would start one "
                           "at random", "fine-tune it first (linearize finetune")
    code, lines = invoke("eval", "text", ws / "tiny", *data)
    assert code == 0 and not any(line.startswith("error:") for line in lines), lines


def test_a_run_folder_stands_for_its_model_in_info_eval_and_bench_folder(ws, tmp_path):
    """`linearize run` writes the student into <run>/model/: the commands that take a converted folder take the run
    folder too, as export and push already did (info and bench folder said "no config.json", eval "not a Hugging Face
    model folder")."""
    import shutil

    shutil.copytree(ws / "converted", tmp_path / "run" / "model")
    (tmp_path / "run" / "report.json").write_text("{}")
    code, lines = invoke("info", tmp_path / "run")
    assert code == 0 and any(str(tmp_path / "run" / "model") in line for line in lines), lines
    code, lines = invoke("eval", "text", tmp_path / "run", "--task", "files", "--train-file", ws / "train.csv")
    assert code == 0 and not any(line.startswith("error:") for line in lines), lines
    code, lines = invoke("bench", "folder", tmp_path / "run", "--seq-lens", "16", "--repeats", "1", "--warmup", "0",
                         "--threads", "1")
    assert code == 0, lines
    assert (tmp_path / "run" / "model" / "bench.json").is_file() and not (tmp_path / "run" / "bench.json").exists()


def test_a_stage_reads_a_run_folder_as_its_model(ws, tmp_path):
    from linearize.pipeline.single_stage import stage_model

    (tmp_path / "run" / "model").mkdir(parents=True)
    (tmp_path / "run" / "model" / "config.json").write_text("{}")
    assert stage_model(tmp_path / "run") == str(tmp_path / "run" / "model")  # distill, finetune, eval
    assert stage_model(str(ws / "converted")) == str(ws / "converted")  # a model folder as it is
    assert stage_model("minilm") == "minilm" and stage_model("org/name") == "org/name"  # an alias, a Hub id
    model = object()
    assert stage_model(model) is model


def test_export_out_under_proc_is_one_line_before_the_export(ws, monkeypatch):
    pytest.importorskip("onnxscript")
    monkeypatch.setattr(importlib.import_module("linearize.export"), "export_model",
                        lambda *a, **k: pytest.fail("the export ran"))
    code, lines = invoke("export", ws / "converted", "--out", "/proc/x.onnx", "--no-check")
    one_error(code, lines, "cannot write --out /proc/x.onnx: /proc does not accept new files")


def test_a_file_in_the_way_of_the_output_is_one_line(ws, tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    code, lines = invoke("convert", ws / "tiny-bert", "--out", tmp_path / "a-file" / "model")
    one_error(code, lines, "a-file is a file, not a folder")
    code, lines = invoke("eval", "text", ws / "converted", "--json", tmp_path / "a-file" / "x.json")
    one_error(code, lines, "a-file is a file, not a folder; choose another --json")


@pytest.mark.skipif(AS_ROOT, reason="root writes into a read-only folder: /proc stands for it above")
@pytest.mark.parametrize("empty_out", [False, True], ids=["new", "empty-existing"])
def test_an_output_in_a_read_only_folder_is_one_line_naming_the_users_path(ws, tmp_path, empty_out):
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    if empty_out:
        (read_only / "model").mkdir()  # an empty --out: once a one-liner naming an internal rename
    read_only.chmod(0o555)
    try:
        code, lines = invoke("convert", ws / "tiny-bert", "--out", read_only / "model")
        message = one_error(code, lines, f"cannot write --out {read_only / 'model'}", "permission denied")
        assert ".old-" not in message and ".model." not in message
        code, lines = invoke("export", ws / "converted", "--out", read_only / "x.onnx", "--no-check")
        one_error(code, lines, f"cannot write --out {read_only / 'x.onnx'}")
    finally:
        read_only.chmod(0o755)


@pytest.mark.skipif(AS_ROOT, reason="root writes into a read-only folder: /proc stands for it below")
def test_bench_folder_of_a_read_only_folder_is_one_line_before_the_bench(ws, monkeypatch):
    """`bench folder DIR` writes DIR/bench.json after minutes of timing: a DIR that takes no new
    file is one line before any of it."""
    monkeypatch.setattr(importlib.import_module("linearize.bench"), "bench_folder",
                        lambda *a, **k: pytest.fail("the bench ran"))
    folder = ws / "converted"
    folder.chmod(0o555)
    try:
        code, lines = invoke("bench", "folder", folder)
    finally:
        folder.chmod(0o755)
    one_error(code, lines, f"cannot write {folder / 'bench.json'}: {folder} does not accept new files (permission "
                           "denied); make it writable, or work on a copy of the folder")


def test_a_folder_that_takes_no_new_file_is_one_line_naming_the_file():
    """What `bench folder` checks first (above), where root meets it: /proc takes no new file."""
    with pytest.raises(LinearizeError) as refused:
        check_writable_inside(Path("/proc"), "bench.json")
    message = str(refused.value)
    assert message.startswith("cannot write /proc/bench.json: /proc does not accept new files (")
    assert message.endswith("); make it writable, or work on a copy of the folder")


@pytest.mark.parametrize("writer", ["file", "folder"])
def test_the_atomic_writers_name_the_users_path_not_their_temporary(writer):
    target = Path("/proc/linearize-test-output")
    with pytest.raises(LinearizeError) as refused:
        with (atomic_path if writer == "file" else atomic_dir)(target):
            pytest.fail("the temporary was made under /proc")
    message = str(refused.value)
    assert message.startswith(f"cannot write {target}: ") and ".linearize-test-output." not in message


def test_an_empty_out_whose_move_aside_is_refused_is_one_line_without_the_internal_name(tmp_path, monkeypatch):
    """An empty --out in a folder that refuses renames (as root: simulated): once a one-liner
    naming the internal ``.<name>.old-<pid>`` rename."""
    out = (tmp_path / "model").resolve()
    out.mkdir()
    rename = os.replace

    def refuse_moving_the_output(source, target):
        if Path(source) == out:
            raise PermissionError(errno.EACCES, "Permission denied", str(source), str(target))
        rename(source, target)

    monkeypatch.setattr(os, "replace", refuse_moving_the_output)
    with pytest.raises(LinearizeError) as refused:
        with atomic_dir(out) as tmp:
            (tmp / "config.json").write_text("{}")
    assert str(refused.value) == f"cannot write {out}: permission denied; choose a folder you can write to"
    assert out.is_dir() and hidden(tmp_path) == []


def test_a_path_error_on_a_temporary_sibling_is_the_users_and_names_their_path(tmp_path):
    out = tmp_path / "model"
    error = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / ".model.k2j4h5g6.partial"))
    assert is_user_path_error(error, [str(out)])
    assert user_path_message(error, [str(out)]) == f"[Errno 13] Permission denied: '{out}'"
    rename = PermissionError(errno.EACCES, "Permission denied", str(out), str(tmp_path / ".model.old-12.partial"))
    assert ".old-" not in user_path_message(rename, [str(out)])
    assert not is_user_path_error(PermissionError(errno.EACCES, "x", str(tmp_path / ".other.k2j4h5g6")), [str(out)])


# ---- 2. a write that fails for want of space: one line, nothing half-written, a re-run resumes ----

def test_disk_full_during_convert_is_one_line_and_leaves_nothing(ws, tmp_path):
    out = tmp_path / "model"
    code, lines = finished(linearize_process("convert", ws / "tiny", "--out", out, file_size_limit=1_000_000))
    one_error(code, lines, "the file size limit (ulimit -f) was reached while writing", str(out),
              "nothing was half-written")
    assert not out.exists() and hidden(tmp_path) == []


def test_disk_full_during_convert_overwrite_keeps_the_old_folder(ws, tmp_path):
    out = tmp_path / "model"
    assert invoke("convert", ws / "tiny", "--method", "relu", "--out", out)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, lines = finished(linearize_process("convert", ws / "tiny", "--method", "hedgehog", "--out", out,
                                             "--overwrite", file_size_limit=1_000_000))
    one_error(code, lines, "the file size limit (ulimit -f) was reached while writing", str(out))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and hidden(tmp_path) == []


@pytest.mark.parametrize("limit,resumes", [(1_000_000, True), (10_000, False)],
                         ids=["saving-the-model", "saving-a-checkpoint"])
def test_disk_full_during_distill_is_one_line_and_a_rerun_resumes(ws, tmp_path, limit, resumes):
    """Past 1 MB the model's save fails (its 2-step checkpoint is kept: the re-run resumes); past
    10 kB a checkpoint's ``torch.save`` fails, with an error that names no cause: it is diagnosed."""
    out = tmp_path / "d"
    args = DISTILL.format(ws=ws, out=out).split() + ["--max-steps", "2"]
    code, lines = finished(linearize_process(*args, file_size_limit=limit))
    written = str(out) if resumes else "random_states_0.pt"
    one_error(code, lines, "the file size limit (ulimit -f) was reached while writing", written,
              "nothing was half-written", "then run the command again")
    assert not out.exists() and hidden(tmp_path) == []
    code, lines = invoke(*args)
    assert code == 0, lines
    assert any("resumed at step 2/2" in line for line in lines) == resumes, lines
    assert (out / "model.safetensors").is_file()


def test_write_errors_say_disk_full_for_enospc_edquot_efbig_and_safetensors():
    for code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        assert is_disk_full(OSError(code, os.strerror(code)))
    assert not is_disk_full(OSError(errno.ENOENT, "missing"))
    SafetensorError = type("SafetensorError", (Exception,), {})
    assert write_errno(SafetensorError("Error while serializing: I/O error: File too large (os error 27)")) == 27
    assert not is_disk_full(RuntimeError("a bug"), written=[__file__])


# ---- 3 and 5. one writer per output folder; a killed writer's lock and leftovers are taken over ----

@pytest.mark.parametrize("command", [
    "convert {ws}/tiny --out {out}",
    DISTILL + " --seed 2",
    "finetune {ws}/tiny --task files --train-file {ws}/train.csv --out {out}",
    "run --quick --out {out}",
])
def test_a_second_writer_is_refused_in_one_line_naming_the_holder(ws, tmp_path, command):
    out = tmp_path / "out"
    with locked_output(out, command="linearize distill ... --seed 1"):
        (out / "kept.txt").parent.mkdir()
        (out / "kept.txt").write_text("the first writer's")
        code, lines = invoke(*command.format(ws=ws, out=out).split())
        one_error(code, lines, f"{out} {LOCKED_HERE} (pid {os.getpid()} on ", "linearize distill ... --seed 1",
                  "wait until it ends, or choose another --out")
        assert (out / "kept.txt").read_text() == "the first writer's"
    assert hidden(tmp_path) == []  # the lock file goes with the lock


def test_bench_folder_of_a_folder_being_written_is_one_line_and_benches_nothing(ws, monkeypatch):
    """Two `bench folder DIR` at once both wrote DIR/bench.json and said so, the last one's kept; a
    `convert --out DIR --overwrite` could replace DIR under a bench. DIR is held while it is benched."""
    monkeypatch.setattr(importlib.import_module("linearize.bench"), "bench_folder",
                        lambda *a, **k: pytest.fail("the bench ran"))
    folder = ws / "converted"
    with locked_output(folder, command="linearize bench folder ... --seq-lens 8"):
        code, lines = invoke("bench", "folder", folder, "--seq-lens", "16")
    one_error(code, lines, f"{folder} {LOCKED_HERE} (pid {os.getpid()} on ", "linearize bench folder ... --seq-lens 8",
              "wait until it ends, or choose another DIR")
    assert hidden(ws) == []


WRITERS_AT_ONCE = """
import os, sys
from pathlib import Path
from linearize.errors import LinearizeError
from linearize.outputs import locked_output
root = Path(sys.argv[1])
overlaps = 0
for i in range(800):
    out = root / f"out{i % 8}"
    try:
        with locked_output(out, command="a writer"):
            try:
                os.close(os.open(root / f"in-{out.name}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                overlaps += 1
                continue
            os.unlink(root / f"in-{out.name}")
    except LinearizeError as error:
        assert "is being written by another linearize process" in str(error), error
print("overlaps", overlaps)
"""


def test_writers_that_check_lock_and_clear_one_folder_at_once_never_fail_nor_overlap(tmp_path):
    """CI: of two converts into one new --out, one failed with a bare "No such file or directory". The
    lock's holder, clearing stale temporaries, took the other's write-check file for one and removed
    it while the other did too. Two processes now check and lock eight folders 800 times each: each
    attempt holds its folder alone or is refused in one line, and nothing is left beside them."""
    writers = [subprocess.Popen([sys.executable, "-c", WRITERS_AT_ONCE, str(tmp_path)], env=cli_env(), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    for writer in writers:
        out, err = writer.communicate(timeout=300)
        assert writer.returncode == 0, err
        assert out.split() == ["overlaps", "0"]
    assert hidden(tmp_path) == []


def test_two_converts_into_one_new_out_at_once_one_succeeds_nothing_is_lost(ws, tmp_path):
    out = tmp_path / "same"
    first = linearize_process("convert", ws / "tiny", "--method", "relu", "--out", out)
    second = linearize_process("convert", ws / "tiny", "--method", "hedgehog", "--out", out)
    results = [finished(first), finished(second)]
    assert sorted(code for code, _ in results) == [0, 1], results
    code, lines = next(result for result in results if result[0] == 1)
    # started together, the loser meets the lock; started after the winner ended, its folder
    message = one_error(code, lines)
    assert LOCKED in message or "exists and is not empty; pass --overwrite" in message
    winner = "relu" if results[0][0] == 0 else "hedgehog"
    assert f'"method": "{winner}"' in (out / "config.json").read_text()
    assert hidden(tmp_path) == []


def library_writers():
    """``{name: call(ws, out)}``: each library function that writes an output folder, writing ``out``
    (the other arguments are never read when the folder is held: the lock comes first)."""
    from linearize.bench import run_bench, run_long_bench
    from linearize.compare import compare
    from linearize.convert import convert_checkpoint
    from linearize.pipeline import distill_model, finetune_model, run, run_teacher

    return {
        "convert_checkpoint": lambda ws, out: convert_checkpoint(str(ws / "tiny"), "relu", out),
        "distill_model": lambda ws, out: distill_model(str(ws / "converted"), "files", out),
        "finetune_model": lambda ws, out: finetune_model(str(ws / "converted"), "files", out),
        "run": lambda ws, out: run(None, out),
        "run_teacher": lambda ws, out: run_teacher(None, out),
        "compare": lambda ws, out: compare(None, out),
        "run_bench": lambda ws, out: run_bench(out),
        "run_long_bench": lambda ws, out: run_long_bench(out),
    }


@pytest.mark.parametrize("writer", ["convert_checkpoint", "distill_model", "finetune_model", "run", "run_teacher",
                                    "compare", "run_bench", "run_long_bench"])
def test_a_library_writer_called_from_python_is_refused_a_held_folder(ws, tmp_path, writer):
    """Only the command line took the lock: a script's ``convert_checkpoint(..., out)`` wrote over
    a folder another writer held."""
    out = tmp_path / "out"
    with locked_output(out, command="linearize distill ... --seed 1"):
        with pytest.raises(LinearizeError) as refused:
            library_writers()[writer](ws, out)
    message = str(refused.value)
    assert message.startswith(f"{out} {LOCKED_HERE} (pid {os.getpid()} on ") and "linearize distill ... --seed 1" in message
    assert hidden(tmp_path) == [] and not out.exists()


def test_two_library_converts_into_one_folder_the_second_is_refused_the_first_succeeds(ws, tmp_path, monkeypatch):
    """Two ``convert_checkpoint`` calls from Python (two threads) into one folder: the first holds it
    from its start (its model load waits until the second has tried), the second is refused in
    one line naming the first, and the first writes the folder."""
    from linearize.convert import convert_checkpoint

    loading = sys.modules["linearize.convert.loading"]
    load, holding, tried = loading.load_source_model, threading.Event(), threading.Event()

    def first_waits_for_the_second(*args, **kwargs):
        if not holding.is_set():
            holding.set()
            assert tried.wait(120)
        return load(*args, **kwargs)

    monkeypatch.setattr(loading, "load_source_model", first_waits_for_the_second)
    out, first = tmp_path / "model", {}
    thread = threading.Thread(target=lambda: first.update(info=convert_checkpoint(str(ws / "tiny"), "relu", out)))
    thread.start()
    try:
        assert holding.wait(120)
        with pytest.raises(LinearizeError) as refused:
            convert_checkpoint(str(ws / "tiny"), "hedgehog", out)
    finally:
        tried.set()
        thread.join(300)
    message = str(refused.value)
    assert message.startswith(f"{out} {LOCKED_HERE} (pid {os.getpid()} on ") and "\n" not in message
    assert "convert_checkpoint() called by " in message
    assert message.endswith("wait until it ends, or choose another --out")
    assert first["info"]["method"] == "relu" and '"method": "relu"' in (out / "config.json").read_text()
    assert hidden(tmp_path) == []


KILLED_WRITER = """
import os, signal, sys
from linearize.outputs import atomic_dir, atomic_path, locked_output
out = sys.argv[1]
with locked_output(out, command="a writer about to be killed"):
    with atomic_dir(out) as tmp:  # a convert killed while saving: its temporary sibling is left
        (tmp / "model.safetensors").write_bytes(b"0" * 1000)
        with atomic_path(os.path.join(out + ".work", "metrics.jsonl")) as half:
            print("ready", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_writers_lock_is_taken_over_and_its_leftovers_removed(ws, tmp_path):
    out = tmp_path / "model"
    done = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(out)], env=cli_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL and done.stdout.strip() == "ready", done.stderr
    assert ".model.lock" in hidden(tmp_path) and any(name.endswith(".partial") for name in hidden(tmp_path))
    assert hidden(out.with_name("model.work"))  # the half-written file inside <out>.work
    assert "a writer about to be killed" in (tmp_path / ".model.lock.holder").read_text()
    code, lines = invoke("convert", ws / "tiny", "--out", out)
    assert code == 0, lines
    assert hidden(tmp_path) == [] and hidden(out.with_name("model.work")) == []


def test_a_folder_moved_aside_by_a_killed_writer_comes_back(tmp_path):
    """Killed between moving the old output aside and renaming the new one in: the old one returns."""
    (tmp_path / ".model.old-123.partial").mkdir()
    (tmp_path / ".model.old-123.partial" / "config.json").write_text("{}")
    (tmp_path / ".model.ab12cd34.partial").mkdir()  # the new, complete but never renamed in
    (tmp_path / ".other.ab12cd34.partial").mkdir()  # another output's: not this writer's to remove
    (tmp_path / ".bashrc.20231101").write_text("a user's backup")  # not a temporary name
    removed = remove_stale_temporaries(tmp_path / "model")
    assert [p.name for p in removed] == [".model.ab12cd34.partial"]
    assert (tmp_path / "model" / "config.json").is_file()
    assert hidden(tmp_path) == [".bashrc.20231101", ".other.ab12cd34.partial"]


def test_a_run_folders_leftover_stage_temporaries_are_removed_when_its_lock_is_taken(tmp_path):
    run = tmp_path / "run"
    (run / ".teacher.ab12cd34.partial").mkdir(parents=True)
    (run / ".state.json.ab12cd34.partial").write_text("{")
    (run / "teacher").mkdir()
    with locked_output(run):
        assert hidden(run) == []
    assert (run / "teacher").is_dir()


def test_a_writer_that_fails_before_writing_leaves_no_empty_folder(tmp_path):
    """A folder the writer made (as `linearize run` does before its data loads) goes when it fails empty;
    a folder that was there before, or one the writer put something in, stays."""
    fresh, there, written = tmp_path / "fresh", tmp_path / "there", tmp_path / "written"
    there.mkdir()
    for folder, content in ((fresh, None), (there, None), (written, "state.json")):
        with pytest.raises(LinearizeError), locked_output(folder):
            folder.mkdir(exist_ok=True)
            if content:
                (folder / content).write_text("{}")
            raise LinearizeError("the data set could not be loaded")
    assert not fresh.exists() and there.is_dir() and (written / "state.json").is_file()
    assert hidden(tmp_path) == []  # the lock files went too


# ---- 4. Ctrl-C: one line saying what a re-run does, exit 130 ----------------------------------------

def test_ctrl_c_during_distill_says_how_to_resume(ws, tmp_path):
    out = tmp_path / "d"
    process = linearize_process(*DISTILL.format(ws=ws, out=out).split(), "--epochs", "100000")
    deadline = time.monotonic() + 300
    metrics = Path(f"{out}.work") / "metrics.jsonl"
    while not metrics.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # training has begun once its first step is logged (a Ctrl-C while a model
        # loads is the wrapped case: test_a_ctrl_c_wrapped_by_a_library_is_still_an_interrupt)
    process.send_signal(signal.SIGINT)
    interrupted = time.monotonic()
    code, lines = finished(process, timeout=60)
    assert time.monotonic() - interrupted < 30
    assert code == 130, lines
    assert lines[-1] == (f"interrupted: run the same command again to resume from the last checkpoint in {out}.work "
                         "(--no-resume would start afresh)"), lines
    assert not any("Traceback" in line for line in lines) and hidden(tmp_path) == []


def test_ctrl_c_during_convert_says_there_is_nothing_to_resume(ws, tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib.import_module("linearize.convert"), "convert_checkpoint", interrupted)
    code, lines = invoke("convert", ws / "tiny", "--out", tmp_path / "model")
    assert code == 130 and lines == ["interrupted: a conversion has nothing to resume (its output folder is written "
                                     "whole or not at all); run the same command again to start over"], lines
    assert hidden(tmp_path) == []


# ---- 6. saved files follow the umask ------------------------------------------------------------------

def test_a_saved_model_folder_follows_the_umask(ws, tmp_path):
    mask = os.umask(0o022)
    try:
        code, lines = invoke("convert", ws / "tiny", "--out", tmp_path / "model")
        assert code == 0, lines
        modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "model").iterdir()}
        assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}, modes
        assert (tmp_path / "model").stat().st_mode & 0o777 == 0o755
        from safetensors.torch import save_file

        with atomic_path(tmp_path / "weights.safetensors") as tmp:  # safetensors makes its files 0600
            save_file({"w": torch.zeros(2)}, tmp)
        assert (tmp_path / "weights.safetensors").stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(mask)


# ---- 7. transformers' LOAD REPORT is plain text in a log ----------------------------------------------

def test_the_load_report_has_no_colour_codes_in_a_log(ws, tmp_path):
    process = linearize_process("convert", ws / "tiny-bert", "--head", "sequence-classification", "--num-labels", "3",
                                "--out", tmp_path / "model", env={"TRANSFORMERS_VERBOSITY": "warning"})  # shown
    code, lines = finished(process)
    assert code == 0, lines
    assert any("LOAD REPORT" in line for line in lines) and not any("\x1b[" in line for line in lines), lines


def test_the_plain_text_filter_strips_colour_codes():
    record = logging.LogRecord("transformers", logging.WARNING, __file__, 1, "\x1b[1m%s LOAD REPORT\x1b[0m", ("X",),
                               None)
    assert PlainText().filter(record) and record.getMessage() == "X LOAD REPORT"
    plain_transformers_logs()  # pytest's stderr is no terminal: the filter is installed once
    plain_transformers_logs()
    import transformers

    handlers = transformers.utils.logging.get_logger().handlers
    assert all(sum(isinstance(f, PlainText) for f in handler.filters) == 1 for handler in handlers)


def test_a_ctrl_c_wrapped_by_a_library_is_still_an_interrupt():
    """transformers' lazy modules re-raise a KeyboardInterrupt met while importing as a RuntimeError
    "from" it (seen when Ctrl-C lands while a model loads): still one line and exit 130."""
    from linearize.cli.common import caused_by_interrupt

    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as interrupt:
            raise RuntimeError("Failed to import transformers.models.bert") from interrupt
    except RuntimeError as error:
        assert caused_by_interrupt(error)
    assert not caused_by_interrupt(RuntimeError("a bug"))


def test_save_refuses_a_non_empty_folder_and_replaces_it_whole_with_overwrite(tmp_path):
    """linearize.save into a folder holding another model's files mixed the two (battery API45)."""
    import linearize
    from tiny_models import build

    model = linearize.convert(build("bert"), "hedgehog")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "pytorch_model.bin").write_bytes(b"another model")
    with pytest.raises(LinearizeError, match=r"model exists and is not empty; pass overwrite=True to replace it"):
        linearize.save(model, folder)
    assert sorted(p.name for p in folder.iterdir()) == ["pytorch_model.bin"]  # untouched
    linearize.save(model, folder, overwrite=True)
    assert not (folder / "pytorch_model.bin").exists() and (folder / "config.json").is_file()
    ids = torch.randint(5, 50, (1, 6))
    with torch.no_grad():
        torch.testing.assert_close(linearize.load(folder)(input_ids=ids).logits, model(input_ids=ids).logits)
