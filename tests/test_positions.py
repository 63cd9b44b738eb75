"""Position extension at conversion (issue 19): ``convert(..., max_length=N, position_init=...)`` and
``linearize convert --max-length N``, on every architecture with a learned absolute position table."""

import copy
import json
import subprocess
import sys
import textwrap

import pytest
import torch
import transformers as T
from typer.testing import CliRunner

import linearize
from linearize.cli import app
from linearize.convert.api import is_converted
from linearize.convert import ConversionRecord, conversion_record
from linearize.convert import positions
from linearize.convert.positions import (INTERPOLATION_MAX_FACTOR, interpolate_positions, max_positions,
                                         position_table, tile_positions)
from linearize.errors import LinearizeError
from tiny_models import SMALL, VOCAB, WITHOUT_LINEARIZE, build, configs, first_output, inputs

ROWS, LONG = 32, 128  # the tiny models' position table, and the length they are extended to
ARCHS = ["bert", "roberta", "xlm-roberta", "camembert", "electra", "albert", "distilbert"]


def short_model(arch, head="AutoModelForSequenceClassification", seed=0):
    """A tiny random model of ``arch`` with a 32-row position table."""
    config = T.CamembertConfig(vocab_size=VOCAB, **SMALL) if arch == "camembert" else configs()[arch]
    config.max_position_embeddings = ROWS
    torch.manual_seed(seed)
    return getattr(T, head).from_config(config).eval()


def table(model):
    return position_table(model)[0].position_embeddings.weight.detach()


@pytest.mark.parametrize("arch", ARCHS)
def test_tiled_softmax_conversion_gives_the_original_output_up_to_the_original_length(arch):
    original = short_model(arch)
    limit = max_positions(original)
    assert limit == (ROWS - 2 if arch in ("roberta", "xlm-roberta", "camembert") else ROWS)  # padding offset
    model = linearize.convert(copy.deepcopy(original), "softmax", max_length=LONG)
    offset = ROWS - limit
    assert model.config.max_position_embeddings == LONG + offset and max_positions(model) == LONG
    grown = table(model)
    assert torch.equal(grown[:ROWS], table(original))  # padding rows and every pretrained position kept
    assert torch.equal(grown[offset + limit:offset + 2 * limit], table(original)[offset:])  # the first copy
    embeddings = position_table(model)[0]
    for name in ("position_ids", "token_type_ids"):
        if hasattr(embeddings, name):
            assert getattr(embeddings, name).shape == (1, LONG + offset), name
    for seq in (7, limit):
        batch = inputs(arch, seq=seq)
        torch.testing.assert_close(first_output(model, batch), first_output(original, batch), atol=1e-5, rtol=0)
    assert first_output(model, inputs(arch, seq=LONG)).isfinite().all()
    record = conversion_record(model)
    assert (record.max_length, record.position_init) == (LONG, "tile")
    assert record.parameters_base == sum(p.numel() for p in original.parameters()) + (LONG - limit) * grown.shape[1]


@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_interpolation_keeps_the_endpoints_and_is_monotone_between_rows(arch):
    original = short_model(arch)
    model = linearize.convert(copy.deepcopy(original), "hedgehog", max_length=LONG, position_init="interpolate")
    offset, limit = ROWS - max_positions(original), max_positions(original)
    old, new = table(original), table(model)
    assert new.shape[0] == LONG + offset
    assert torch.equal(new[:offset], old[:offset])  # RoBERTa's padding rows untouched
    old, new = old[offset:], new[offset:]
    torch.testing.assert_close(new[0], old[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(new[-1], old[-1], atol=1e-6, rtol=0)
    where = torch.arange(LONG, dtype=torch.float64) * (limit - 1) / (LONG - 1)  # position j reads old position x
    below = where.floor().long().clamp(max=limit - 2)
    t = (where - below).float().unsqueeze(1)
    assert (where[1:] >= where[:-1]).all()
    low, high = torch.minimum(old[below], old[below + 1]), torch.maximum(old[below], old[below + 1])
    assert (new >= low - 1e-6).all() and (new <= high + 1e-6).all()  # between its two neighbours
    # and moves monotonically from one to the other: the distance to the lower row grows with t
    torch.testing.assert_close(new, (1 - t) * old[below] + t * old[below + 1], atol=1e-5, rtol=0)
    assert conversion_record(model).position_init == "interpolate"


def test_tile_and_interpolate_on_a_table():
    rows = torch.arange(12.0).reshape(4, 3)
    assert torch.equal(tile_positions(rows, 10), torch.cat([rows, rows, rows[:2]]))
    line = interpolate_positions(rows, 7)  # a straight line stays one: x = j/2 rows
    torch.testing.assert_close(line, torch.arange(7.0).unsqueeze(1) * 1.5 + torch.tensor([0.0, 1.0, 2.0]))


@pytest.mark.parametrize("max_length,position_init,message", [
    (0, None, "max_length must be a positive number of tokens (≥ the model's 32), got 0"),
    (-5, None, "max_length must be a positive number of tokens"),
    (16, None, "max_length 16 is shorter than the model's 32 positions: pass an integer N ≥ 32"),
    (31, "interpolate", "shorter than the model's 32 positions"),
    (INTERPOLATION_MAX_FACTOR * ROWS + 1, "interpolate", f"more than {INTERPOLATION_MAX_FACTOR}× the model's 32 "
                                                         f"positions, beyond what interpolation supports"),
    (64, "spline", "unknown position_init 'spline'; valid: tile, interpolate"),
    (None, "interpolate", "position_init='interpolate' needs max_length"),
    (ROWS, "interpolate", "position_init='interpolate' has nothing to do: max_length 32 is the model's own 32"),
])
def test_bad_lengths_are_one_line_errors(max_length, position_init, message):
    model = short_model("bert")
    with pytest.raises(LinearizeError) as error:
        linearize.convert(model, "hedgehog", max_length=max_length, position_init=position_init)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert not is_converted(model) and model.config.max_position_embeddings == ROWS  # untouched


def test_tiling_takes_any_length_and_the_current_one_is_a_no_op():
    model = linearize.convert(short_model("bert"), "hedgehog", max_length=INTERPOLATION_MAX_FACTOR * ROWS * 2)
    assert max_positions(model) == INTERPOLATION_MAX_FACTOR * ROWS * 2
    same = linearize.convert(short_model("bert"), "hedgehog", max_length=ROWS)
    assert torch.equal(table(same), table(short_model("bert")))


def test_a_table_larger_than_the_machine_memory_is_a_one_line_error(monkeypatch):
    """Tiling takes any length, but not one whose table the machine cannot hold (before: the
    allocator's traceback, e.g. 153 GB asked for MiniLM at 10^8 tokens)."""
    model = short_model("bert")
    row_bytes = model.config.hidden_size * 4 + 16  # float32 row + the int64 position_ids / token_type_ids
    monkeypatch.setattr(positions.machine, "physical_memory", lambda: 1000 * row_bytes)
    with pytest.raises(LinearizeError) as error:
        linearize.convert(model, "hedgehog", max_length=1001)
    assert f"max_length 1001 needs a position table of {1001 * row_bytes / 2**30:.1f} GiB, more than this " \
           f"machine's" in str(error.value) and str(error.value).endswith("pass a smaller N")
    assert not is_converted(model) and model.config.max_position_embeddings == ROWS
    assert max_positions(linearize.convert(model, "hedgehog", max_length=1000)) == 1000


def test_models_without_a_learned_position_table_are_refused():
    for model in (build("vit", "AutoModel"), build("dinov2", "AutoModel")):
        with pytest.raises(LinearizeError, match=r"^'(vit|dinov2)' has no learned absolute position table to extend; "
                                                 r".*applies to BERT, RoBERTa"):
            linearize.convert(model, "hedgehog", max_length=1024)
        assert not is_converted(model)


FRESH_PROCESS = WITHOUT_LINEARIZE + textwrap.dedent("""
    results = {}
    for directory, batch_file in json.loads(sys.argv[1]):
        model = transformers.AutoModelForSequenceClassification.from_pretrained(directory, trust_remote_code=True)
        batch, expected = torch.load(batch_file)
        with torch.no_grad():
            got = model.eval()(**batch)[0]
        results[directory] = {"class": type(model).__name__, "error": float((got - expected).abs().max()),
                              "positions": model.config.max_position_embeddings}
    assert not any(name.split(".")[0] == "linearize" for name in sys.modules)
    print(json.dumps(results))
""")


def test_saved_extended_models_run_long_inputs_after_reload_with_and_without_linearize(tmp_path):
    jobs, expected = [], {}
    for arch in ARCHS:
        model = linearize.convert(short_model(arch), "hedgehog", max_length=LONG)
        out = tmp_path / arch
        model.save_pretrained(out)
        batch = inputs(arch, seq=LONG)  # four times the original limit
        want = first_output(model, batch)
        torch.save((batch, want), tmp_path / f"{arch}.pt")
        jobs.append([str(out), str(tmp_path / f"{arch}.pt")])
        expected[str(out)] = model.config.max_position_embeddings
        reloaded = linearize.load(out)
        assert max_positions(reloaded) == LONG and conversion_record(reloaded).max_length == LONG
        torch.testing.assert_close(first_output(reloaded, batch), want, atol=1e-5, rtol=0)
    done = subprocess.run([sys.executable, "-c", FRESH_PROCESS, json.dumps(jobs)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for directory, _ in jobs:
        assert results[directory]["class"].startswith("Linearize"), results[directory]
        assert results[directory]["positions"] == expected[directory]
        assert results[directory]["error"] <= 1e-5, (directory, results[directory])


# ---- the command line -----------------------------------------------------------------------------

runner = CliRunner()


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.fixture()
def tiny_roberta(tmp_path):
    """A tiny RoBERTa folder with a (tiny, trained here) byte-level BPE tokenizer of 512 positions."""
    from tokenizers import ByteLevelBPETokenizer

    path = tmp_path / "tiny-roberta"
    short_model("roberta").save_pretrained(path)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["a few words to learn a vocabulary from"] * 4, vocab_size=VOCAB,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False)
    bpe.save_model(str(path))
    T.RobertaTokenizer(str(path / "vocab.json"), str(path / "merges.txt"), model_max_length=ROWS - 2).save_pretrained(path)
    return path


def test_cli_extends_positions_and_the_tokenizer_follows(tiny_roberta, tmp_path):
    out = tmp_path / "out"
    code, text = invoke("convert", tiny_roberta, "--method", "softmax", "--max-length", LONG, "--position-init",
                        "interpolate", "--out", out)
    assert code == 0, text
    assert f"{LONG} tokens (interpolate)" in text
    config = json.loads((out / "config.json").read_text())
    assert config["max_position_embeddings"] == LONG + 2  # RoBERTa: positions start at padding_idx + 1
    record = ConversionRecord.from_config(config)
    assert (record.max_length, record.position_init, record.method) == (LONG, "interpolate", "softmax")
    assert T.AutoTokenizer.from_pretrained(out).model_max_length == LONG
    code, text = invoke("info", out)
    assert code == 0 and f"{LONG} tokens (interpolate)" in text


@pytest.mark.parametrize("args,message", [
    (["--max-length", "0"], "max_length must be a positive number of tokens"),
    (["--max-length", "8"], "max_length 8 is shorter than the model's 30 positions: pass an integer N ≥ 30"),
    (["--max-length", "100000", "--position-init", "interpolate"], "beyond what interpolation supports"),
    (["--max-length", "64", "--position-init", "spline"], "unknown position_init 'spline'"),
    (["--position-init", "interpolate"], "needs max_length (--max-length N)"),
])
def test_cli_bad_lengths_are_one_line_errors(tiny_roberta, tmp_path, args, message):
    code, text = invoke("convert", tiny_roberta, "--out", tmp_path / "o", *args)
    assert code == 1 and message in text, text
    assert text.startswith("error:") and len(text.strip().splitlines()) == 1, text
    assert not (tmp_path / "o").exists()


def test_cli_refuses_an_architecture_without_learned_positions(tmp_path):
    path = tmp_path / "vit"
    build("vit", "AutoModel").save_pretrained(path)
    code, text = invoke("convert", path, "--max-length", "1024", "--out", tmp_path / "o")
    assert code == 1 and "'vit' has no learned absolute position table to extend" in text, text


# ---- the real MiniLM ------------------------------------------------------------------------------

MINILM_4K = WITHOUT_LINEARIZE + textwrap.dedent("""
    directory = sys.argv[1]
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, trust_remote_code=True)
    model = transformers.AutoModel.from_pretrained(directory, trust_remote_code=True).eval()
    batch = tokenizer(" ".join(["long"] * 5000), truncation=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    assert not any(name.split(".")[0] == "linearize" for name in sys.modules)
    print(json.dumps({"class": type(model).__name__, "shape": list(hidden.shape),
                      "finite": bool(hidden.isfinite().all()), "model_max_length": tokenizer.model_max_length}))
""")


@pytest.mark.slow
def test_minilm_extended_to_4096_runs_a_4096_token_input_without_linearize(minilm_path, tmp_path):
    out = tmp_path / "minilm-hh-4k"
    code, text = invoke("convert", minilm_path, "--method", "hedgehog", "--max-length", "4096", "--out", out)
    assert code == 0, text
    done = subprocess.run([sys.executable, "-c", MINILM_4K, str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"class": "LinearizeBertModel", "shape": [1, 4096, 384], "finite": True,
                      "model_max_length": 4096}


@pytest.mark.slow
def test_minilm_softmax_conversion_to_4096_equals_the_original_up_to_512_tokens(minilm_path):
    original = T.AutoModel.from_pretrained(minilm_path).eval()
    tokenizer = T.AutoTokenizer.from_pretrained(minilm_path)
    model = linearize.convert(copy.deepcopy(original), "softmax", max_length=4096)
    batch = tokenizer([" ".join(["word"] * 600), "a short sentence"], truncation=True, max_length=512, padding=True,
                      return_tensors="pt")
    assert batch["input_ids"].shape[1] == 512
    torch.testing.assert_close(first_output(model, batch), first_output(original, batch), atol=1e-5, rtol=0)
