"""The conversion record (``linearize.convert.record.ConversionRecord``): its versioned block in
config.json, the round trip, and the older blocks it still reads (literal blocks written before it)."""

import copy
import json
import subprocess
import sys
import textwrap

import pytest
import torch

import linearize
from linearize.convert import ConversionRecord, conversion_record, summary
from linearize.convert.record import RECORD_TYPE, RECORD_VERSION
from linearize.errors import LinearizeError
from tiny_models import WITHOUT_LINEARIZE, build, first_output, inputs

SENTENCE_TRANSFORMERS_FILES = {
    "modules.json": [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ],
    "sentence_bert_config.json": {"max_seq_length": 256, "do_lower_case": False},
    "config_sentence_transformers.json": {
        "__version__": {"sentence_transformers": "2.0.0", "transformers": "4.6.1", "pytorch": "1.8.1"}},
    "1_Pooling/config.json": {"word_embedding_dimension": 384, "pooling_mode_cls_token": False,
                              "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
                              "pooling_mode_mean_sqrt_len_tokens": False},
}

#: version 1: the unversioned block (``format_version: 1``), as linearize wrote it before the versioned block
VERSION_1_BLOCK = {
    "format_version": 1, "linearize_version": "0.1.0", "method": "hedgehog", "options": {},
    "layers": [0, 1, 2, 3, 4, 5], "num_attention_layers": 6, "source": "minilm", "base_model_type": "bert",
    "architecture": "BertModel", "previous_attn_implementation": "sdpa",
    "sentence_transformers": SENTENCE_TRANSFORMERS_FILES, "parameters_added": 73728, "parameters_base": 22713216,
}

#: version 2: the config.json block of `linearize convert minilm --method hedgehog`, made before the record
VERSION_2_BLOCK = {"_type": "LinearizeConfig", "_version": 2, "_data": VERSION_1_BLOCK}

#: version 3: the record before hybrid attention (no window, sinks or gamma)
VERSION_3_BLOCK = {"_type": "ConversionRecord", "_version": 3, "_data": {
    **{key: value for key, value in VERSION_1_BLOCK.items() if key not in ("format_version", "sentence_transformers")},
    "sliding_window_layers": [], "sentence_transformers_files": SENTENCE_TRANSFORMERS_FILES, "max_length": None,
    "position_init": None, "image_size": None}}

EXPECTED = ConversionRecord(
    method="hedgehog", layers=(0, 1, 2, 3, 4, 5), options={}, num_attention_layers=6, source="minilm",
    base_model_type="bert", architecture="BertModel", previous_attn_implementation="sdpa",
    sentence_transformers_files=SENTENCE_TRANSFORMERS_FILES, parameters_base=22713216, parameters_added=73728,
    linearize_version="0.1.0")


@pytest.mark.parametrize("stored", [VERSION_1_BLOCK, VERSION_2_BLOCK, VERSION_3_BLOCK],
                         ids=["version-1", "version-2", "version-3"])
def test_old_blocks_read_as_the_record(stored):
    record = ConversionRecord.from_block(copy.deepcopy(stored))
    assert record == EXPECTED
    assert record.window == 0 and record.hybrid is None  # written before hybrid attention: pure linear
    assert record.parameters_added_percent == pytest.approx(100.0 * 73728 / 22713216)
    assert ConversionRecord.from_config({"linearize": stored}) == EXPECTED  # config.json's content
    assert ConversionRecord.from_config({"model_type": "bert"}) is None


def test_the_block_round_trips_through_json():
    stored = json.loads(json.dumps(EXPECTED.to_block()))
    assert set(stored) == {"_type", "_version", "_data"}
    assert (stored["_type"], stored["_version"]) == (RECORD_TYPE, RECORD_VERSION) == ("ConversionRecord", 4)
    assert "format_version" not in stored["_data"] and stored["_data"]["layers"] == [0, 1, 2, 3, 4, 5]
    assert ConversionRecord.from_block(stored) == EXPECTED
    hybrid = ConversionRecord(**{**EXPECTED.__dict__, "window": 32, "sinks": ("first", "last"), "gamma": 0.5})
    stored = json.loads(json.dumps(hybrid.to_block()))
    assert stored["_data"]["sinks"] == ["first", "last"]
    back = ConversionRecord.from_block(stored)
    assert back == hybrid and back.hybrid == {"window": 32, "sinks": ("first", "last"), "gamma": 0.5, "hybrid_layers": None}


def test_blocks_it_cannot_read_are_refused_in_one_line():
    stored = EXPECTED.to_block()
    with pytest.raises(LinearizeError, match="upgrade linearize"):
        ConversionRecord.from_block({**stored, "_version": RECORD_VERSION + 1})
    with pytest.raises(LinearizeError, match="not a ConversionRecord"):
        ConversionRecord.from_block({**stored, "_type": "Other"})
    with pytest.raises(LinearizeError, match="names no method"):
        ConversionRecord.from_block({"layers": [0]})
    with pytest.raises(LinearizeError, match="not an object"):
        ConversionRecord.from_block(["luna"])
    for damaged in ({**stored, "_version": "abc"}, {**stored, "_data": {**stored["_data"], "layers": ["x"]}},
                    {**stored, "_data": {**stored["_data"], "hybrid_layers": [None]}}):
        with pytest.raises(LinearizeError, match="'linearize' block is malformed .*; re-convert"):
            ConversionRecord.from_block(damaged)


def test_a_converted_model_carries_its_record(tmp_path):
    model = linearize.convert(build("bert"), "luna", projections=4)
    record = conversion_record(model)
    assert record.method == "luna" and record.options == {"projections": 4} and record.base_model_type == "bert"
    assert model.config.linearize == record.to_block()  # in memory as in config.json
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["linearize"] == record.to_block()
    assert conversion_record(linearize.load(tmp_path)) == record
    info = summary(tmp_path)
    assert (info["method"], info["layers"], info["parameters_added"]) == ("luna", list(record.layers),
                                                                          record.parameters_added)
    assert conversion_record(linearize.revert(model)) is None


REMOTE_LOAD = WITHOUT_LINEARIZE + textwrap.dedent("""
    directory, batch_file = sys.argv[1:3]
    model = transformers.AutoModelForSequenceClassification.from_pretrained(directory, trust_remote_code=True).eval()
    batch, expected = torch.load(batch_file)
    with torch.no_grad():
        got = model(**batch)[0]
    assert not any(name.split(".")[0] == "linearize" for name in sys.modules)
    print((got - expected).abs().max().item())
""")


@pytest.mark.parametrize("version", [1, 2])
def test_a_folder_with_an_old_block_loads_with_and_without_linearize(version, tmp_path):
    """A folder whose config.json holds a version 1 or 2 block: linearize.load reads it, a re-save
    writes this version's block, and the remote code (linearize blocked) reads it too."""
    model = linearize.convert(build("bert"), "luna", projections=4)
    batch = inputs("bert")
    expected = first_output(model, batch)
    model.save_pretrained(tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    config = json.loads(path.read_text())
    old = {**config["linearize"]["_data"], "format_version": 1}
    old["sentence_transformers"] = old.pop("sentence_transformers_files")
    config["linearize"] = old if version == 1 else {"_type": "LinearizeConfig", "_version": 2, "_data": old}
    path.write_text(json.dumps(config))
    reloaded = linearize.load(tmp_path / "m")
    assert conversion_record(reloaded) == conversion_record(model)
    torch.testing.assert_close(first_output(reloaded, batch), expected, atol=1e-5, rtol=1e-5)
    reloaded.save_pretrained(tmp_path / "resaved")
    assert json.loads((tmp_path / "resaved" / "config.json").read_text())["linearize"]["_version"] == RECORD_VERSION
    torch.save((batch, expected), tmp_path / "batch.pt")
    done = subprocess.run([sys.executable, "-c", REMOTE_LOAD, str(tmp_path / "m"), str(tmp_path / "batch.pt")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.strip().splitlines()[-1]) < 1e-5


def test_a_block_naming_a_method_this_code_lacks_is_refused_in_one_line(tmp_path):
    """A newer linearize's method, or a hand edit: linearize (load, info) and the folder's own remote code (linearize
    blocked) both refuse it naming the block and what to do, instead of an unknown-option error or a made-up summary."""
    linearize.convert(build("bert"), "luna", projections=4).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    config["linearize"]["_data"]["method"] = "nosuch"
    path.write_text(json.dumps(config))
    expected = "block names method 'nosuch', which this code does not have .*upgrade linearize, or re-convert"
    with pytest.raises(LinearizeError, match=expected):
        linearize.load(tmp_path)
    with pytest.raises(LinearizeError, match=expected):
        summary(tmp_path)
    remote = WITHOUT_LINEARIZE + textwrap.dedent("""
        try:
            transformers.AutoModel.from_pretrained(sys.argv[1], trust_remote_code=True)
        except Exception as error:
            print(type(error).__name__, error)
    """)
    result = subprocess.run([sys.executable, "-c", remote, str(tmp_path)], capture_output=True, text=True, check=True)
    assert result.stdout.startswith("LinearizeError config.json's 'linearize' block names method 'nosuch'")
