"""The user's-state bench (issue 35): saved folders timed in fresh processes that load them with
plain transformers, linearize not importable, glibc's default allocator."""

import pytest

import linearize
from linearize.bench.user_state import user_environment, user_state_rows
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
