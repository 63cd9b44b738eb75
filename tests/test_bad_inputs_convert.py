"""Issue 36's conversion cases: layer lists, dimensions, option ranges, memory, `distill` on a
converted folder, heads and model kinds, and the attention core's input check.

Each case was silently wrong, a traceback, or refused only after the teacher had trained; each is
now one line (``error: ...``, exit 1) before any work, or a ``ValueError`` for an API call.
"""

import csv
import dataclasses
import gzip
import shlex
import struct
import typing
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

import linearize
from linearize.attention import create_feature_map, methods
from linearize.attention.core import (kernel_matrix, kernel_statistics, linear_attention, linear_attention_weights,
                                      quadratic_attention, softmax_attention_weights)
from linearize.attention.feature_maps import get_feature_map_class, method_settings
from linearize.cli import app
from linearize.cli.common import parse_layers
from linearize.convert import conversion_record, convert_checkpoint, is_converted
from linearize.convert.loading import load_source_model
from linearize.errors import LinearizeError
from linearize.pipeline.single_stage import check_same_conversion
from linearize.recipes import load_recipe
from tiny_models import build, save_tiny_text_classifier

runner = CliRunner()


def _write_idx(path, array):
    """A gzipped LeCun IDX file (Fashion-MNIST's format) of the uint8 ``array``."""
    array = np.asarray(array, dtype=np.uint8)
    with gzip.open(path, "wb") as handle:
        handle.write(bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes())


@pytest.fixture(scope="module")
def ws(tmp_path_factory, minilm_path):
    """A tiny BERT classifier (2 layers, 4 heads of 8), its LUNA conversion, text files and a
    miniature Fashion-MNIST."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("bad-convert")
    save_tiny_text_classifier(root / "tiny", minilm_path)
    convert_checkpoint(str(root / "tiny"), "luna", root / "luna", options={"projections": 4})
    rows = [(f"{word} {i}", label) for i in range(4) for word, label in (("good", "pos"), ("bad", "neg"))]
    for split in ("train", "dev"):
        with open(root / f"{split}.csv", "w", newline="") as handle:
            csv.writer(handle).writerows([("text", "label"), *rows])
    recipe = {"model": str(root / "tiny"), "task": "files", "method": "luna",
              "data": {"train_file": str(root / "train.csv"), "validation_file": str(root / "dev.csv"),
                       "max_length": 16},
              "teacher": {"epochs": 1, "batch_size": 8}, "stage1": {"epochs": 1, "batch_size": 8},
              "stage2": {"epochs": 1, "batch_size": 8}}
    (root / "tiny.yaml").write_text(yaml.safe_dump(recipe))
    fmnist = root / "fmnist"
    fmnist.mkdir()
    rng = np.random.default_rng(0)
    for prefix, count in (("train", 20), ("t10k", 10)):
        _write_idx(fmnist / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (count, 28, 28)))
        _write_idx(fmnist / f"{prefix}-labels-idx1-ubyte.gz", np.arange(count) % 10)
    (root / "outs").mkdir()
    return root


def _one_line_error(args, ws, fragment):
    """Run ``linearize ARGS``: exit 1 with one ``error:`` line (the last) holding ``fragment``, and
    nothing written under ``outs``."""
    result = runner.invoke(app, shlex.split(args.format(ws=ws)))
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], lines[-5:]
    assert fragment in errors[0], errors[0]
    assert not any(path.is_file() for path in (ws / "outs").rglob("*")), "a refused command wrote output"
    return errors[0]


# ---- 1. layer lists -------------------------------------------------------------------------------

@pytest.mark.parametrize("layers, problem", [
    ([], "names no layer"),
    ([0.5], "0.5 is not an integer"),  # was layer 0
    ([1.9], "1.9 is not an integer"),  # was layer 1
    ([True], "True is not an integer"),
    ([0, 0], "0 is named twice"),
    ([2], "2 is out of range"),
    ([-1], "-1 is out of range"),
    (1, "not a list"),
])
def test_convert_refuses_a_layer_list_that_is_not_distinct_integers_in_range(layers, problem):
    model = build("bert")
    with pytest.raises(LinearizeError, match=rf"{problem}; give a non-empty list of distinct integers in 0\.\.1 "
                                             r"\(the model has 2 attention layers\)"):
        linearize.convert(model, "luna", layers=layers)
    assert not is_converted(model)


def test_convert_takes_integer_layers_of_any_integer_type():
    model = linearize.convert(build("bert"), "luna", layers=(np.int64(1),))
    assert conversion_record(model).layers == (1,)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"convert_sliding_window": True}, "this model has none: drop it"),  # BERT: it would do nothing
    ({"convert_sliding_window": "yes"}, "must be True or False, got 'yes'"),
    ({"window": 256, "sinks": "first"}, "every input of up to 512 tokens"),  # exact softmax everywhere
    ({"window": 600, "max_length": 1024}, "every input of up to 1024 tokens"),
])
def test_convert_refuses_settings_that_cannot_take_effect(kwargs, fragment):
    with pytest.raises(LinearizeError, match=fragment):
        linearize.convert(build("bert"), "hedgehog", **kwargs)
    assert conversion_record(linearize.convert(build("bert"), "hedgehog", window=255)).window == 255


@pytest.mark.parametrize("text", ["", ",", " , "])
def test_layers_option_that_names_no_layer_is_an_error(text):
    with pytest.raises(LinearizeError, match="names no layer"):
        parse_layers(text)
    assert parse_layers(None) is None and parse_layers("0, 2,") == [0, 2]


def test_convert_cli_with_a_setting_that_cannot_take_effect_is_one_line(ws):
    _one_line_error("convert {ws}/tiny --out {ws}/outs/no-local --convert-sliding-window", ws, "this model has none")
    _one_line_error("convert {ws}/tiny --out {ws}/outs/wide --window 300", ws, "no linear attention left")


def test_convert_cli_with_empty_layers_is_one_line(ws):
    _one_line_error("convert {ws}/tiny --out {ws}/outs/empty-layers --layers ''", ws,
                    "--layers '' names no layer")


@pytest.mark.parametrize("layers, fragment", [
    ([], "layers must be a non-empty list of distinct layer indices"),
    ([0, 0], "layers must be a non-empty list of distinct layer indices"),
    ([-1], "layers must be a non-empty list of distinct layer indices (0 or more)"),
    ([0.5], "layers must be a list of an integer or null"),
])
def test_a_recipe_layer_list_is_checked_when_loaded(ws, layers, fragment):
    with pytest.raises(LinearizeError) as error:
        load_recipe(str(ws / "tiny.yaml"), overrides={"layers": layers})
    assert fragment in str(error.value)


def test_run_with_empty_layers_is_refused_before_anything_runs(ws):
    _one_line_error("run {ws}/tiny.yaml --out {ws}/outs/run-empty-layers --set layers=[]", ws,
                    "layers must be a non-empty list")


# ---- 2. dimensions are integers ---------------------------------------------------------------------

@pytest.mark.parametrize("geometry, fragment", [
    ({"head_dim": 32.5}, "head_dim must be a positive integer, got 32.5"),  # was 32
    ({"head_dim": True}, "head_dim must be a positive integer, got True"),
    ({"head_dim": 0}, "head_dim must be a positive integer, got 0"),
    ({"head_dim": 8, "num_heads": 2.0}, "num_heads must be a positive integer, got 2.0"),
    ({"head_dim": 8, "num_heads": -1}, "num_heads must be a positive integer, got -1"),
])
@pytest.mark.parametrize("method", ["luna", "elu"])
def test_create_feature_map_refuses_a_dimension_that_is_not_a_positive_integer(method, geometry, fragment):
    with pytest.raises(LinearizeError, match=f"{method}: {fragment}"):
        create_feature_map(method, **geometry)
    assert create_feature_map(method, np.int64(8), np.int32(2)).head_dim == 8


def _option_fields():
    """``(method, field, its type hint)`` of every option of every method."""
    for method in methods():
        options_class = get_feature_map_class(method).options_class
        hints = typing.get_type_hints(options_class)
        for item in dataclasses.fields(options_class):
            yield method, item, hints[item.name]


INT_OPTIONS = [(m, f.name) for m, f, hint in _option_fields() if int in (typing.get_args(hint) or (hint,))]
NUMBER_OPTIONS = [(m, f) for m, f, hint in _option_fields() if {int, float} & set(typing.get_args(hint) or (hint,))]


@pytest.mark.parametrize("method, option", INT_OPTIONS, ids=[f"{m}.{o}" for m, o in INT_OPTIONS])
def test_every_integer_option_refuses_a_float(method, option):
    with pytest.raises(LinearizeError, match=f"{method}: option {option} must be an integer"):
        create_feature_map(method, 8, 2, **{option: 2.5})


@pytest.mark.parametrize("method, item", NUMBER_OPTIONS, ids=[f"{m}.{f.name}" for m, f in NUMBER_OPTIONS])
def test_every_numeric_option_states_its_range_and_refuses_the_value_below_it(method, item):
    """A number option without a range could take 0 or -1 silently, or fail deep in a stage."""
    test, text = item.metadata["range"]
    low = 0.0 if text == "> 0" else int(text.removeprefix(">= ")) - 1
    assert text.startswith((">", ">=")) and not test(low)
    with pytest.raises(LinearizeError, match=f"{method}: option {item.name} must be {text}, got {low}"):
        method_settings(method, {item.name: low})


# ---- 3. option ranges are checked before any stage runs ----------------------------------------------

@pytest.mark.parametrize("args, fragment", [
    ("--set options.luna.channels=-1", "luna: option channels must be >= 1, got -1"),
    ("--method hedgehog -o feature_dim=0", "hedgehog: option feature_dim must be >= 1, got 0"),
    ("--method t2r --set options.feature_dim=0", "t2r: option feature_dim must be >= 1, got 0"),
    ("--method flexformer-n -o init_scale=0", "flexformer-n: option init_scale must be > 0, got 0"),
    ("--method darkformer -o init=pca", "darkformer: option init must be identity | whiten, got 'pca'"),
    ("--method performer -o num_features=0", "performer: option num_features must be >= 1, got 0"),
])
def test_run_refuses_an_option_out_of_range_before_the_teacher_trains(ws, args, fragment):
    _one_line_error("run {ws}/tiny.yaml --out {ws}/outs/run-range " + args, ws, fragment)


def test_run_refuses_an_option_that_does_not_fit_the_model_before_the_teacher_trains(ws):
    """darkformer's rank is at most the head dim (8): known only with the model, still before training."""
    _one_line_error("run {ws}/tiny.yaml --out {ws}/outs/run-rank --method darkformer -o rank=99", ws,
                    "darkformer: option rank must be at most the head dim (8), got 99")


def test_convert_refuses_an_option_out_of_range_before_loading(ws):
    _one_line_error("convert {ws}/tiny --out {ws}/outs/convert-range --method t2r -o feature_dim=0", ws,
                    "t2r: option feature_dim must be >= 1, got 0")


def test_run_refuses_an_unknown_tracker_before_the_teacher_trains(ws):
    """It failed once the data and the model were loaded and the teacher's stage began ([2/6])."""
    args = "run {ws}/tiny.yaml --out {ws}/outs/run-tracker --report-to foo"
    _one_line_error(args, ws, "--report-to 'foo' is not a tracker")
    assert "[1/6]" not in runner.invoke(app, shlex.split(args.format(ws=ws))).output


WHITEN = "darkformer: init=whiten needs calibration data, which conversion does not take"


def test_convert_refuses_an_option_it_cannot_give_effect_to(ws):
    """DARKFormer's init=whiten took no effect in conversion (M stayed the identity, the config said whiten): an
    error now, from the CLI, a recipe (before the teacher trains) and Python alike; the map itself still takes it."""
    _one_line_error("convert {ws}/tiny --out {ws}/outs/convert-whiten --method darkformer -o init=whiten", ws, WHITEN)
    _one_line_error("run {ws}/tiny.yaml --out {ws}/outs/run-whiten --method darkformer -o init=whiten", ws, WHITEN)
    with pytest.raises(LinearizeError, match=WHITEN):
        linearize.convert(load_source_model(f"{ws}/tiny"), "darkformer", init="whiten")
    assert create_feature_map("darkformer", 8, 2, init="whiten").settings.init == "whiten"


# ---- 4. memory is estimated before the feature maps are built ---------------------------------------

def test_convert_refuses_feature_maps_larger_than_the_machine(minilm_path, monkeypatch):
    """The issue's case: MiniLM with projections=100000000 allocated 12.8 GB per layer (a traceback)."""
    monkeypatch.setattr("linearize.machine.physical_memory", lambda: 16 * 2**30)
    model = load_source_model(minilm_path)
    with pytest.raises(LinearizeError, match=r"luna's feature maps would take 73\.8 GiB \(6 layers\), more than 50% "
                                             r"of this machine's 16\.0 GiB of memory: lower projections \(now "
                                             r"100,000,000\)"):
        linearize.convert(model, "luna", projections=100_000_000)
    assert not is_converted(model)


def test_run_with_a_huge_option_is_refused_before_the_teacher_trains(ws):
    _one_line_error("run {ws}/tiny.yaml --out {ws}/outs/run-huge -o projections=1000000000000", ws,
                    "luna's feature maps would take")


def test_methods_with_a_huge_option_is_one_line_before_any_map_is_allocated(monkeypatch):
    """`linearize methods -o projections=100000000` built every map of its table (24 GiB for one
    LUNA layer of 12 heads of 64): the maps are sized on the meta device now, and refused as convert
    refuses them. The machine says 1 GiB here, so 3,000,000 projections (0.7 GiB) pass half of it:
    a table that built its maps would have allocated them and listed them."""
    monkeypatch.setattr("linearize.machine.physical_memory", lambda: 2**30)
    result = runner.invoke(app, ["methods", "-o", "projections=3000000"])
    assert result.exit_code == 1, result.output
    assert result.output.splitlines() == ["error: luna's feature maps would take 0.7 GiB (1 layer), more than 50% of "
                                          "this machine's 1.0 GiB of memory: lower projections (now 3,000,000)"]


def test_convert_cli_with_a_huge_option_is_one_line(ws):
    _one_line_error("convert {ws}/tiny --out {ws}/outs/huge --method performer -o num_features=1000000000000", ws,
                    "performer's feature maps would take")


# ---- 5. distill on a converted folder keeps the folder's conversion -----------------------------------

DISTILL = "distill {ws}/luna --task files --out {ws}/outs/distill --train-file {ws}/train.csv " \
          "--validation-file {ws}/dev.csv --max-length 16 "


@pytest.mark.parametrize("args, fragment", [
    ("--method hedgehog", "so method 'hedgehog' cannot take effect"),  # distilled LUNA silently
    ("--layers 0", "so layers [0] cannot take effect"),
    ("-o projections=16", "so options projections=16 cannot take effect"),
    ("--method luna --layers 0,1 -o channels=2", "so options channels=2 cannot take effect"),
])
def test_distill_refuses_a_conversion_that_differs_from_the_folders(ws, args, fragment):
    line = _one_line_error(DISTILL + args, ws, fragment)
    assert "is already converted to luna (layers [0, 1], projections=4)" in line
    assert line.endswith(f"or convert its softmax source ({ws}/tiny) with {fragment[3:-len(' cannot take effect')]}")


def test_distill_with_an_option_the_folders_method_lacks_says_so(ws):
    """``-o feature_dim=8`` on a LUNA folder was refused as a difference to re-convert with, but that
    conversion fails too (feature_dim is Hedgehog's option, not LUNA's): the one line says so."""
    line = _one_line_error(DISTILL + "-o feature_dim=8", ws, "unknown option(s) 'feature_dim' for method 'luna'")
    assert "valid options: projections, channels" in line


def test_distill_accepts_the_folders_own_conversion(ws):
    check_same_conversion(str(ws / "luna"), "luna", [1, 0], {"projections": 4, "channels": 8})
    check_same_conversion(str(ws / "luna"))
    check_same_conversion(str(ws / "tiny"), "hedgehog", [0], {"feature_dim": 4})  # not converted: converts it


# ---- 6. unclear one-liners made clear ------------------------------------------------------------------

def test_a_head_that_does_not_fit_the_model_type_lists_those_that_do(ws):
    _one_line_error("convert {ws}/tiny --out {ws}/outs/head --head image-classification", ws,
                    f"head 'image-classification' does not fit {ws}/tiny, a bert model; heads that do: base, "
                    "sequence-classification, token-classification, masked-lm")


@pytest.mark.parametrize("model", ["luna", "tiny"])
def test_eval_image_on_a_text_model_says_it_is_a_text_model(ws, model):
    _one_line_error(f"eval image {{ws}}/{model} --dataset fashion-mnist --data-dir {{ws}}/fmnist", ws,
                    f"{ws}/{model} is a text model (bert), but task fashion-mnist is an image task: it needs an "
                    "image model (e.g. vit-base)")


def test_eval_image_takes_data_dir_as_an_image_folder_and_asks_for_one_or_the_other(ws):
    """--data-dir alone is an image folder (--dataset imagefolder); neither is one line naming both."""
    _one_line_error("eval image {ws}/luna --data-dir {ws}/fmnist", ws,  # Fashion-MNIST's files: no class folders
                    f"cannot read image folder {ws}/fmnist")
    _one_line_error("eval image {ws}/luna", ws, "name the images: --dataset fashion-mnist (or a Hub data set id), or "
                    "--data-dir with one folder of images per class")


def test_run_on_an_image_task_with_a_text_model_says_it_is_a_text_model(ws):
    _one_line_error("run --quick --task fashion-mnist --set data.data_dir={ws}/fmnist --model {ws}/tiny "
                    "--out {ws}/outs/run-image", ws, f"{ws}/tiny is a text model (bert), but task fashion-mnist is an "
                    "image task")


Q = torch.randn(2, 4, 7, 8)


@pytest.mark.parametrize("q, k, v, mask, fragment", [
    (Q, Q[:, :, :5], Q, None, "k and v differ in length"),
    (Q, Q[..., :4], Q, None, "q and k differ in head dim"),
    (Q, Q, Q[:, :2], None, "their batch sizes or head counts differ"),
    (Q, Q[:1], Q[:1], None, "their batch sizes or head counts differ"),
    (Q[0], Q, Q, None, "attention input q must be a [batch, heads, seq, head_dim] tensor, got (4, 7, 8)"),
    (Q, "k", Q, None, "attention input k must be a [batch, heads, seq, head_dim] tensor, got str"),
    (Q, Q, Q, torch.ones(2, 5), "key_padding_mask (2, 5) is not [batch, key length]"),
    (torch.randn(2, 4, 7, 16), torch.randn(2, 4, 7, 16), Q, None, "the feature map was built for head_dim 8"),
], ids=["kv-length", "qk-dim", "heads", "batch", "3d", "not-a-tensor", "mask", "map-dim"])
def test_linear_attention_says_which_inputs_do_not_fit(q, k, v, mask, fragment):
    feature_map = create_feature_map("hedgehog", 8, 4)
    with pytest.raises(ValueError) as error:
        linear_attention(q, k, v, feature_map, mask)
    assert fragment in str(error.value) and "[batch, heads, seq, head_dim]" in str(error.value)


@pytest.mark.parametrize("entry", [linear_attention_weights, kernel_matrix, kernel_statistics])
def test_every_public_attention_entry_point_checks_its_inputs(entry):
    feature_map = create_feature_map("relu", 8, 4)
    with pytest.raises(ValueError, match="q and k differ in head dim"):
        entry(Q, Q[..., :4], feature_map)
    with pytest.raises(ValueError, match="k and v differ in length"):
        quadratic_attention(Q, Q, Q[:, :, :3], feature_map)
    with pytest.raises(ValueError, match=r"key_padding_mask \(2, 3\) is not \[batch, key length\]"):
        softmax_attention_weights(Q, Q, torch.ones(2, 3))
    assert linear_attention(Q, Q, Q[..., :3], feature_map).shape == (2, 4, 7, 3)  # v's own dim is fine
