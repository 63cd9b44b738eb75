"""The user's-state bench (issue 35): saved folders timed in fresh processes that load them with
plain transformers, linearize not importable, glibc's default allocator."""

import pytest

import linearize
from linearize.bench.user_state import user_environment, user_state_rows
from linearize.config import MeasureConfig
from linearize.errors import LinearizeError
from tiny_models import build


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("user-state")
    softmax = build("bert", head="AutoModel")
    softmax.save_pretrained(root / "softmax")
    converted = linearize.convert(build("bert", head="AutoModel"), "hedgehog")
    linearize.save(converted, root / "hedgehog")
    return {"softmax": root / "softmax", "hedgehog": root / "hedgehog"}


def test_rows_give_medians_per_process_ranges_and_faults(folders):
    lines = []
    rows = user_state_rows(folders, "softmax", [8, 16], processes=2, threads=1, repeats=2, warmup=1,
                           skip={"softmax": [16]}, log=lines.append)
    assert [row["seq_len"] for row in rows] == [8, 16] and len(lines) == 2
    first, second = rows
    assert set(first["results"]) == {"softmax", "hedgehog"} and first["processes"] == 2
    hedgehog = first["results"]["hedgehog"]
    assert len(hedgehog["per_process_ms"]) == 2 and hedgehog["median_ms"] > 0 and hedgehog["faults_per_forward"] >= 0
    assert "peak_extra_bytes" not in hedgehog  # memory is profiled only when asked (memory=True)
    speed = hedgehog["speedup"]
    assert speed["lowest"] <= speed["median"] <= speed["highest"] and len(speed["per_process"]) == 2
    # the figure is the median of the per-process ratios (issue 35), not the ratio of the medians
    assert hedgehog["time_vs_softmax"] == pytest.approx(1 / speed["median"])
    assert set(second["results"]) == {"hedgehog"} and "softmax" in second["skipped"]  # softmax skipped at 16


def test_the_child_environment_is_the_default_allocator(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1073741824")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1")
    env = user_environment()
    assert "MALLOC_MMAP_THRESHOLD_" not in env and "GLIBC_TUNABLES" not in env and env.get("PATH")


def test_a_failing_child_is_one_line(tmp_path):
    with pytest.raises(LinearizeError, match="a measuring process .* failed: ") as error:
        user_state_rows({"x": tmp_path / "missing"}, "x", [8], processes=1)
    assert "\n" not in str(error.value)
    with pytest.raises(LinearizeError, match="processes must be >= 1"):
        user_state_rows({"x": tmp_path}, "x", [8], processes=0)


def test_bench_folder_times_the_saved_folder_in_a_users_processes(tmp_path):
    """``linearize bench folder DIR --processes N``: DIR as saved and its softmax original (saved as plain
    transformers) in fresh processes; the record and ``linearize info`` say which state it was."""
    import json

    from typer.testing import CliRunner

    from linearize.bench import FOLDER_BENCH_JSON
    from linearize.cli import app

    folder = tmp_path / "hedgehog"
    linearize.save(linearize.convert(build("bert", head="AutoModel"), "hedgehog"), folder)
    runner = CliRunner()
    result = runner.invoke(app, ["bench", "folder", str(folder), "--seq-lens", "8,16", "--processes", "2",
                                 "--repeats", "1", "--warmup", "0", "--threads", "1"])
    assert result.exit_code == 0, result.output
    record = json.loads((folder / FOLDER_BENCH_JSON).read_text())
    assert record["config"]["processes"] == 2 and "fresh processes" in record["config"]["state"]
    assert record["config"]["memory"] is True  # measured in the first of the fresh processes
    row = record["rows"][0]
    assert row["processes"] == 2 and len(row["results"]["hedgehog"]["speedup"]["per_process"]) == 2
    assert all(result["peak_extra_bytes"] > 0 for r in record["rows"] for result in r["results"].values())
    info = " ".join(runner.invoke(app, ["info", str(folder)]).output.split())
    assert "medians of 2 fresh" in info and "(a user's state)" in info
    result = runner.invoke(app, ["bench", "folder", str(folder), "--processes", "2", "--clock", "cpu"])
    assert result.exit_code == 1 and "by the wall clock" in result.output


def test_the_users_processes_measure_the_memory_linearizes_process_measures(folders):
    """``memory``: the first fresh process profiles one forward per model and length with the same code as
    linearize's own bench (linearize/bench/peak_memory.py loaded by its path), so the figures agree with
    the in-process ones for the same folders."""
    from linearize.attention.core import release_scratch
    from linearize.bench import measure_lengths, measuring

    lengths = [16, 300]  # at 300 SDPA's CPU kernel allocates per thread: both sides run one
    rows = user_state_rows(folders, "softmax", lengths, processes=1, threads=1, repeats=1, warmup=1, memory=True)
    models = {"softmax": transformers_model(folders["softmax"]), "hedgehog": linearize.load(folders["hedgehog"])}
    release_scratch()  # the reused buffers start empty, as in a fresh process (a warm-up call fills them)
    with measuring(1):
        ours = measure_lengths({k: m.eval() for k, m in models.items()}, "softmax", lengths, batch_size=1,
                               repeats=1, warmup=1, memory=True, seed=0)
    for theirs, mine in zip(rows, ours):
        for label in ("softmax", "hedgehog"):
            assert theirs["results"][label]["peak_extra_bytes"] > 0
            assert theirs["results"][label]["peak_extra_bytes"] == mine["results"][label]["peak_extra_bytes"], \
                (theirs["seq_len"], label)


def transformers_model(folder):
    import transformers

    return transformers.AutoModel.from_pretrained(folder)


def test_the_users_processes_load_the_folders_in_the_asked_dtype(folders):
    """A user who loads the folder with ``dtype=torch.bfloat16``: the child processes load it so (the
    state records it); the same code loads it onto a GPU with ``--device cuda`` (tests/test_devices.py)."""
    rows = user_state_rows(folders, "softmax", [8], processes=1, threads=1, repeats=1, warmup=0, dtype="bfloat16")
    assert rows[0]["results"]["hedgehog"]["median_ms"] > 0 and rows[0]["results"]["softmax"]["median_ms"] > 0


def test_the_users_processes_can_compile_the_models(folders):
    """``--compile-mode``: each process compiles both models with torch.compile (inductor, the host's
    compiler) before timing them; the compiled converted model still runs without linearize."""
    rows = user_state_rows(folders, "softmax", [8], processes=1, threads=1, repeats=1, warmup=1,
                           compile_mode="default")
    assert all(result["median_ms"] > 0 for result in rows[0]["results"].values())


def test_compile_mode_without_processes_is_one_line(tmp_path):
    from typer.testing import CliRunner

    from linearize.cli import app

    folder = tmp_path / "hedgehog"
    linearize.save(linearize.convert(build("bert", head="AutoModel"), "hedgehog"), folder)
    result = CliRunner().invoke(app, ["bench", "folder", str(folder), "--compile-mode", "default"])
    assert result.exit_code != 0 and "give --processes 1 or more" in result.output
    result = CliRunner().invoke(app, ["bench", "folder", str(folder), "--processes", "1", "--compile-mode", "fast"])
    assert result.exit_code != 0 and "compile_mode must be" in " ".join(result.output.split())
    with pytest.raises(LinearizeError, match="give --processes 1 or more"):  # the Python API says so too
        linearize.bench.bench_folder(folder, measure=MeasureConfig(compile_mode="default"), log=None)
