"""The benchmark runs end to end on tiny settings and writes valid outputs (no timing is asserted:
benchmarks stay out of the test suite)."""

import json

import torch

from linearize.config import MeasureConfig


def test_run_bench_writes_json_markdown_and_plot(tmp_path):
    import transformers as T

    from linearize.bench import run_bench

    torch.manual_seed(0)
    config = T.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=64)
    model = T.BertForSequenceClassification(config).eval()
    lines = []
    result = run_bench(tmp_path / "out", methods=["luna", "elu"], seq_lens=(16, 32), num_heads=2, head_dim=8,
                       measure=MeasureConfig(repeats=1, warmup=0, threads=1), model=model, model_seq_lens=(8, 128),
                       log=lines.append)
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert data["methods"] == ["luna", "elu"]
    assert [row["seq_len"] for row in data["attention"]] == [16, 32]
    for row in data["attention"]:
        assert set(row["results"]) == {"sdpa", "eager", "luna", "elu"}
        for entry in row["results"].values():
            assert entry["median_ms"] > 0 and entry["runs"] == 1 and entry["peak_extra_bytes"] >= 0
    assert set(data["crossover"]) == {"luna", "elu"}
    assert data["machine"]["torch"] == torch.__version__ and data["machine"]["torch_threads"] == 1
    assert data["machine"]["cpu_model"]
    assert [row["seq_len"] for row in data["model"]["rows"]] == [8]  # 128 > max_position_embeddings
    assert set(data["model"]["rows"][0]["results"]) == {"softmax (sdpa)", "softmax (eager)", "luna", "elu"}
    assert set(data["model"]["crossover"]) == {"luna", "elu"}
    assert result["attention"] == data["attention"]
    markdown = (tmp_path / "out" / "bench.md").read_text()
    assert "| N | sdpa | eager | luna | elu |" in markdown and "Whole model" in markdown
    assert (tmp_path / "out" / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any(line.startswith("crossover luna") for line in lines)
    assert model.config._attn_implementation != "linearize"  # the caller's model is left unconverted


def test_eager_is_skipped_beyond_its_memory_budget(tmp_path):
    from linearize.bench import run_bench

    result = run_bench(tmp_path, methods=["relu"], seq_lens=(8, 64), num_heads=1, head_dim=4,
                       measure=MeasureConfig(repeats=1, warmup=0, memory=False), eager_max_bytes=2 * 4 * 8 * 8,
                       log=None)
    assert "eager" in result["attention"][0]["results"]
    assert "eager" not in result["attention"][1]["results"] and "eager" in result["attention"][1]["skipped"]
    assert "| skipped |" in (tmp_path / "bench.md").read_text() or "skipped" in (tmp_path / "bench.md").read_text()


def test_cpu_clock_is_recorded_and_an_unknown_clock_is_refused(tmp_path):
    import pytest

    from linearize.bench import run_bench
    from linearize.errors import LinearizeError

    result = run_bench(tmp_path, methods=["relu"], seq_lens=(8,), num_heads=1, head_dim=4, log=None,
                       measure=MeasureConfig(repeats=2, warmup=0, threads=1, memory=False, clock="cpu"))
    assert result["config"]["clock"] == "cpu" and "process CPU time" in result["config"]["timing"]
    assert all(entry["runs"] == 2 and entry["median_ms"] >= 0 for entry in result["attention"][0]["results"].values())
    assert "process CPU time" in (tmp_path / "bench.md").read_text()
    with pytest.raises(LinearizeError, match="unknown clock 'gpu'; use one of: wall, cpu"):
        run_bench(tmp_path, methods=["relu"], seq_lens=(8,), log=None, measure=MeasureConfig(clock="gpu"))


def test_method_list_takes_options_in_parentheses():
    import pytest

    from linearize.bench import method_specs, parse_method_list
    from linearize.errors import LinearizeError

    assert parse_method_list("luna, luna(projections=16,shared_projections=false),elu") == [
        "luna", ("luna", {"projections": 16, "shared_projections": False}), "elu"]
    specs = method_specs("luna,luna(projections=16)")
    assert specs == [("luna", "luna", {}), ("luna(projections=16)", "luna", {"projections": 16})]
    for bad, message in [("luna(projections=16", "unbalanced"), ("luna(projections)", "is not key=value"),
                         ("luna(projections=16)x", "nothing may follow")]:
        with pytest.raises(LinearizeError, match=message):
            parse_method_list(bad)
    with pytest.raises(ValueError, match="unknown option.*bogus.*valid options: .*projections"):
        method_specs("luna(bogus=1)")
    with pytest.raises(ValueError, match="unknown method 'lunar'"):
        method_specs("lunar")


def _tiny_bert():
    import transformers as T

    torch.manual_seed(0)
    config = T.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=64)
    return T.BertForSequenceClassification(config).eval()


def test_a_placement_the_machine_cannot_run_is_a_one_line_error():
    import pytest

    from linearize.errors import LinearizeError
    from linearize.bench import Placement

    assert Placement.parse("CPU", "BF16") == Placement("cpu", "bf16")
    with pytest.raises(LinearizeError, match="not one of fp32, bf16, fp16"):
        Placement.parse("cpu", "fp64")
    with pytest.raises(LinearizeError, match="is not cpu or cuda"):
        Placement.parse("tpu")
    with pytest.raises(LinearizeError, match="fp16 needs --device cuda"):
        Placement.parse("cpu", "fp16")
    if not torch.cuda.is_available():
        with pytest.raises(LinearizeError, match="no CUDA GPU is visible here"):
            Placement.parse("cuda")


def test_bench_in_bf16_runs_attention_and_model_in_bf16(tmp_path, monkeypatch):
    import linearize.bench as bench
    import linearize.bench.attention
    import linearize.bench.models

    seen = []
    measure = bench.measure_candidates

    def spy(candidates, *args, **kwargs):  # every candidate's output dtype, then the real measurement
        with torch.inference_mode():
            seen.extend(getattr(fn(), "dtype", None) or fn().logits.dtype for fn in candidates.values())
        return measure(candidates, *args, **kwargs)

    for module in (linearize.bench.attention, linearize.bench.models):  # the attention layer and the whole model
        monkeypatch.setattr(module, "measure_candidates", spy)
    result = bench.run_bench(tmp_path, methods=["hedgehog"], seq_lens=(16,), num_heads=2, head_dim=8,
                             measure=MeasureConfig(repeats=1, warmup=0, memory=False, dtype="bf16"),
                             model=_tiny_bert(), model_seq_lens=(8,), log=None)
    assert result["config"]["dtype"] == "bfloat16" and result["config"]["placement"] == "cpu, bfloat16"
    assert seen and set(seen) == {torch.bfloat16}
    assert "cpu, bfloat16" in (tmp_path / "bench.md").read_text()


def test_bench_on_cuda_times_sdpas_kernels_beside_every_method(tmp_path):
    import pytest

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from linearize.bench import SDPA_EFFICIENT, SDPA_FLASH, run_bench

    result = run_bench(tmp_path, methods=["hedgehog", "luna"], seq_lens=(512, 2048),
                       measure=MeasureConfig(repeats=2, warmup=1, device="cuda", dtype="bf16"),
                       model=_tiny_bert(), model_seq_lens=(32,), log=None)
    for row in result["attention"]:
        assert {"sdpa", SDPA_FLASH, SDPA_EFFICIENT, "hedgehog", "luna"} <= set(row["results"])
        assert all(entry["peak_extra_bytes"] > 0 for entry in row["results"].values())
    assert result["config"]["placement"].startswith("cuda (")
