"""Whole-model benchmarks at long lengths and a converted folder's crossover (tiny models, one
repeat: the structure is checked, never a timing)."""

import json
import math

import torch
import transformers as T
from typer.testing import CliRunner

from linearize.cli import app
from linearize.config import MeasureConfig

runner = CliRunner()


def tiny_bert(positions=64):
    torch.manual_seed(0)
    config = T.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=positions)
    return T.BertModel(config).eval()


def test_crossover_point_on_synthetic_ratios():
    from linearize.bench import crossover_point

    # slower at 128 and 512, faster from 2,048: log r linear in log N between (512, 1.5) and (2048, 0.5)
    cross = crossover_point([(2048, 0.5), (128, 2.0), (512, 1.5), (4096, 0.25)])
    t = math.log(1.5) / (math.log(1.5) - math.log(0.5))
    assert cross["measured"] == 2048 and not cross["faster_at_all_lengths"]
    assert cross["estimate"] == round(512 * 4 ** t) == 854
    # a faster point followed by a slower one is noise, not the crossover
    assert crossover_point([(128, 0.9), (512, 1.1), (2048, 0.5)])["measured"] == 2048
    # exactly level at 512: the ratio crosses 1 there
    assert crossover_point([(512, 1.0), (2048, 0.5)])["estimate"] == 512
    faster = crossover_point([(128, 0.9), (512, 0.5)])
    assert faster["measured"] == 128 and faster["faster_at_all_lengths"] and faster["estimate"] is None
    never = crossover_point([(128, 1.3), (512, 0.9), (2048, 1.2)])
    assert never["measured"] is None and never["estimate"] is None
    assert crossover_point([]) is None


def test_long_targets_pass_miss_and_unmeasured():
    from linearize.bench import LONG_TARGETS, long_targets, target_line

    assert LONG_TARGETS == {2048: 1.5, 4096: 2.5, 8192: 4.0}
    rows = [{"seq_len": 2048, "results": {"softmax": {"median_ms": 30.0}, "hh": {"median_ms": 10.0}}},
            {"seq_len": 4096, "results": {"softmax": {"median_ms": 60.0}, "hh": {"median_ms": 30.0}}},
            {"seq_len": 8192, "results": {"hh": {"median_ms": 50.0}}, "skipped": {"softmax": "cap"}}]
    targets = long_targets(rows, ["hh"], "softmax")["hh"]
    assert targets["2048"] == {"min_speedup": 1.5, "speedup": 3.0, "met": True}
    assert targets["4096"] == {"min_speedup": 2.5, "speedup": 2.0, "met": False}
    assert targets["8192"]["met"] is None
    assert "**pass**" in target_line("hh", "2048", targets["2048"])
    assert "**miss by 0.50×**" in target_line("hh", "4096", targets["4096"])
    assert "not measured" in target_line("hh", "8192", targets["8192"])


def test_target_labels_take_hedgehog_hybrid_or_not_and_the_recipe_luna():
    from linearize.bench import RECIPE_LUNA, recipe_luna
    from linearize.bench.long import target_labels
    from linearize.bench.methods import method_specs

    specs = method_specs({"hedgehog": "hedgehog", "hybrid": ("hedgehog", {"window": 32, "sinks": "first",
                                                                           "hybrid_layers": [1, 2]}),
                          "t2r hybrid": ("t2r", {"window": 32}), RECIPE_LUNA: recipe_luna(), "luna": "luna"})
    assert target_labels(specs) == ["hedgehog", "hybrid", RECIPE_LUNA]


def test_long_bench_extends_positions_records_refusals_and_skips(tmp_path):
    from linearize.bench import RECIPE_LUNA, default_long_methods, run_long_bench

    methods = default_long_methods()
    assert methods[RECIPE_LUNA] == ("luna", {"shared_projections": False, "projections": 16})
    assert list(methods)[1:] == ["luna", "hedgehog", "t2r", "darkformer", "performer", "flexformer-n"]
    torch.manual_seed(0)
    gpt2 = T.GPT2Model(T.GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=4, n_positions=256,
                                  bos_token_id=0, eos_token_id=0)).eval()
    bert = tiny_bert(positions=64)
    # the cap lets SDPA softmax run at 64 and 128 (its N×N mask, N²·4 B = 64 KiB at 128) but not at 256
    result = run_long_bench(tmp_path, geometries={"tiny-bert": bert, "tiny-gpt2": gpt2},
                            methods={RECIPE_LUNA: methods[RECIPE_LUNA], "hedgehog": "hedgehog"},
                            seq_lens=(128, 64, 256), measure=MeasureConfig(threads=1, repeats=1, warmup=0),
                            softmax_max_bytes=128 * 128 * 4, log=None)
    data = json.loads((tmp_path / "bench-long.json").read_text())
    assert data["config"]["seq_lens"] == [64, 128, 256] and data["targets"]["labels"] == [RECIPE_LUNA, "hedgehog"]
    bert_entry, gpt2_entry = data["models"]
    assert bert_entry["info"]["positions"] == {"learned": 64, "extended_to": 256, "config_limit": 64}
    assert bert.config.max_position_embeddings == 64  # the caller's model is left as it was
    assert bert_entry["refused"] == {} and bert_entry["methods"] == [RECIPE_LUNA, "hedgehog"]
    assert bert_entry["info"]["converted_layers"] == {RECIPE_LUNA: [0, 1], "hedgehog": [0, 1]}
    assert bert_entry["info"]["keeps_softmax_layers"] == [] and data["complete"] is True
    softmax = bert_entry["info"]["softmax_label"]
    for row in bert_entry["rows"]:
        assert {RECIPE_LUNA, "hedgehog"} <= set(row["results"])
        for entry in row["results"].values():
            assert entry["median_ms"] > 0 and entry["runs"] == 1 and entry["peak_extra_bytes"] >= 0
    assert [softmax in row["results"] for row in bert_entry["rows"]] == [True, True, False]
    # 256²·4 B = 0.25 MiB against the cap 128²·4 B = 0.0625 MiB
    assert "SDPA's N×N attention mask would take 0.2 MiB > the cap of 0.1 MiB" in \
        bert_entry["rows"][2]["skipped"][softmax]
    assert "time_vs_softmax" not in bert_entry["rows"][2]["results"]["hedgehog"]
    assert set(bert_entry["crossover"]) == {RECIPE_LUNA, "hedgehog"}
    assert set(bert_entry["targets"]) == {RECIPE_LUNA, "hedgehog"}
    assert all(t["met"] is None for per in bert_entry["targets"].values() for t in per.values())
    # convert refuses GPT-2 (not an encoder it supports): recorded, softmax still measured
    assert set(gpt2_entry["refused"]) == {RECIPE_LUNA, "hedgehog"}
    assert all("unsupported architecture 'gpt2'" in reason for reason in gpt2_entry["refused"].values())
    assert gpt2_entry["methods"] == [] and gpt2_entry["crossover"] == {} and gpt2_entry["targets"] == {}
    markdown = (tmp_path / "bench-long.md").read_text()
    assert "not measured — convert refused: unsupported architecture 'gpt2'" in markdown
    assert f"{RECIPE_LUNA} at N = 8,192: ≥ 4.0× — not measured" in markdown and "| 256 |" in markdown
    assert "Positions extended from 64 to 256" in markdown
    assert result["models"][0]["rows"] == bert_entry["rows"]


def test_the_memory_cap_skips_every_model_that_keeps_a_softmax_layer():
    import copy

    import linearize
    from linearize.bench import measure_lengths

    bert = tiny_bert(positions=64)
    models = {"softmax": bert, "t2r layer 0": linearize.convert(copy.deepcopy(bert), "t2r", layers=[0]),
              "t2r": linearize.convert(copy.deepcopy(bert), "t2r")}
    rows = measure_lengths(models, "softmax", (16, 64), repeats=1, warmup=0, memory=False,
                           softmax_max_bytes=16 * 16 * 4, capped=["softmax", "t2r layer 0"])
    assert set(rows[0]["results"]) == set(models) and rows[0]["skipped"] == {}
    assert set(rows[1]["results"]) == {"t2r"} and set(rows[1]["skipped"]) == {"softmax", "t2r layer 0"}


def test_softmax_memory_estimate_follows_the_attention_implementation():
    from linearize.bench import softmax_bytes

    bert = tiny_bert()
    assert softmax_bytes(bert, 2, 100) == (2 * 100 * 100 * 4, "SDPA's N×N attention mask")
    bert.set_attn_implementation("eager")
    assert softmax_bytes(bert, 2, 100)[0] == 2 * 2 * 4 * 100 * 100 * 4  # scores + probabilities, 4 heads


def test_converted_folder_crossover_in_info_and_card(tmp_path):
    import linearize
    from linearize.bench import FOLDER_BENCH_JSON, folder_speed_lines, read_folder_bench
    from linearize.report.card import build_card

    folder = tmp_path / "tiny-hedgehog"
    linearize.convert(tiny_bert(positions=64), "hedgehog").save_pretrained(folder)
    result = runner.invoke(app, ["bench", "folder", str(folder), "--seq-lens", "16,32,128", "--repeats",
                                 "1", "--warmup", "0", "--threads", "1"])
    assert result.exit_code == 0, result.output
    record = json.loads((folder / FOLDER_BENCH_JSON).read_text())
    assert read_folder_bench(folder) == record and record["method"] == "hedgehog"
    assert [row["seq_len"] for row in record["rows"]] == [16, 32]
    assert "longer than the model's 64 positions" in record["skipped_lengths"]["128"]
    assert set(record["rows"][0]["results"]) == {record["reference"], "hedgehog"}
    assert record["reference"] == "softmax (sdpa)" and record["crossover"] is not None
    assert record["machine"]["cpu_model"] and record["machine"]["torch_threads"] == 1
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # written atomically
    result = runner.invoke(app, ["info", str(folder)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "crossover" in text and "softmax (sdpa)" in text and record["machine"]["cpu_model"].split()[0] in text
    assert "N = 16" in text and "measured on" in text and "not measured at N = 128" in text
    config = json.loads((folder / "config.json").read_text())
    card = str(build_card("me/tiny-hedgehog", config, speed=record))
    assert "## Speed" in card and "Crossover: " in card and record["machine"]["cpu_model"] in card
    assert "## Speed" not in str(build_card("me/tiny-hedgehog", config))
    busy = {**record, "machine": {**record["machine"], "busy_warning": "other processes kept 1.02 of 2 cores busy"}}
    assert "warning: other processes kept 1.02 of 2 cores busy" in str(build_card("me/tiny-hedgehog", config,
                                                                                 speed=busy))
    assert "warning" in folder_speed_lines(busy)["measured on"] and "warning" not in folder_speed_lines(
        {**record, "machine": {**record["machine"], "busy_warning": None}})["measured on"]
    from linearize import push

    plan = push.plan(folder, "me/tiny-hedgehog", no_report=True)  # builds the card, uploads nothing
    assert plan.files[FOLDER_BENCH_JSON] == folder / FOLDER_BENCH_JSON and "## Speed" in plan.card
    result = runner.invoke(app, ["bench", "attention", "--model", str(folder), "--methods", "t2r"])
    assert result.exit_code == 1 and f"measure its crossover with `linearize bench folder {folder}`" in " ".join(
        result.output.split())
    result = runner.invoke(app, ["bench", "folder", str(folder), "--seq-lens", "128"])
    assert result.exit_code == 1 and "longer than the model's 64 positions" in result.output


def test_info_without_a_measurement_says_how_to_get_one(tmp_path):
    import linearize

    folder = tmp_path / "m"
    linearize.convert(tiny_bert(), "t2r").save_pretrained(folder)
    result = runner.invoke(app, ["info", str(folder)])
    assert result.exit_code == 0 and "not measured: run" in " ".join(result.output.split())


def test_long_bench_command(tmp_path):
    folder = tmp_path / "tiny-bert"
    tiny_bert(positions=64).save_pretrained(folder)
    result = runner.invoke(app, ["bench", "long", "--geometries", str(folder), "--methods", "t2r", "--seq-lens",
                                 "32,128", "--out", str(tmp_path / "out"), "--repeats", "1", "--warmup", "0",
                                 "--no-memory", "--threads", "1"])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "out" / "bench-long.json").read_text())
    entry = data["models"][0]
    assert entry["info"]["positions"]["extended_to"] == 128 and [r["seq_len"] for r in entry["rows"]] == [32, 128]
    assert set(entry["rows"][1]["results"]) == {entry["info"]["softmax_label"], "t2r"}
    assert data["targets"]["labels"] == []
    result = runner.invoke(app, ["bench", "long", "--geometries", str(folder), "--seq-lens", "0,64",
                                 "--out", str(tmp_path / "bad")])
    assert result.exit_code == 2 and "give positive integers" in result.output  # a bad option value, as typer


def test_long_bench_converts_sliding_window_layers_only_when_asked(tmp_path):
    from linearize.bench import run_long_bench

    torch.manual_seed(0)
    config = T.ModernBertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                intermediate_size=64, local_attention=4, global_attn_every_n_layers=3,
                                max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                cls_token_id=1, sep_token_id=2)
    model = T.ModernBertModel(config).eval()
    for convert_sliding_window, layers in ((False, [0]), (True, [0, 1, 2])):
        out = tmp_path / str(convert_sliding_window)
        run_long_bench(out, geometries={"tiny-modernbert": model}, methods=["t2r"], seq_lens=(16,),
                       measure=MeasureConfig(threads=1, repeats=1, warmup=0, memory=False), log=None,
                       convert_sliding_window=convert_sliding_window)
        data = json.loads((out / "bench-long.json").read_text())
        entry = data["models"][0]
        assert data["config"]["convert_sliding_window"] is convert_sliding_window
        assert entry["info"]["converted_layers"] == {"t2r": layers}
        assert entry["info"]["keeps_softmax_layers"] == ([] if convert_sliding_window else ["t2r"])
        assert ("Sliding-window layers converted too" in (out / "bench-long.md").read_text()) is convert_sliding_window
    result = runner.invoke(app, ["bench", "attention", "--convert-sliding-window", "--model", "none", "--out",
                                 str(tmp_path / "x")])
    assert result.exit_code == 2 and "No such option" in result.output  # whole models at long lengths only
