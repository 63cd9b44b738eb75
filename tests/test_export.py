"""ONNX export and torch.compile of converted models: every method, at lengths other than the traced one,
with padding; and the one-line errors of `linearize export`."""

import sys

import pytest
import torch
import transformers
from typer.testing import CliRunner

import linearize
from linearize.cli import app
from linearize.errors import LinearizeError
from linearize.export import FirstOutput, example_inputs, export, export_model
from test_feature_maps import CASE_IDS, METHOD_CASES
from tiny_models import SMALL, VOCAB, assert_onnx_matches_pytorch, build, inputs

runner = CliRunner()
#: the first case of each method runs by default; the option variants are marked slow (~6 s per export)
FIRST_CASES = [pytest.param(name, opts, id=case_id, marks=() if (name, opts) == next(
    case for case in METHOD_CASES if case[0] == name) else pytest.mark.slow)
    for (name, opts), case_id in zip(METHOD_CASES, CASE_IDS)]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # every test compiles a new model: keep dynamo's recompile limit out of the way
    yield
    torch._dynamo.reset()


def converted_bert(name, opts, seed=0):
    """A one-layer tiny BERT classifier converted with ``name`` (one layer: export time grows with the graph)."""
    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=VOCAB, **{**SMALL, "num_hidden_layers": 1}))
    return linearize.convert(model, name, **opts).eval()


def onnx_session(path):
    onnxruntime = pytest.importorskip("onnxruntime")
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("name,opts", FIRST_CASES)
def test_onnx_matches_pytorch_at_other_lengths_with_padding(name, opts, tmp_path):
    pytest.importorskip("onnxscript")
    model = converted_bert(name, opts)
    result = export_model(model, tmp_path / "model.onnx", check=False)
    assert result["inputs"] == ["input_ids", "attention_mask", "token_type_ids"] and result["output"] == "logits"
    assert_onnx_matches_pytorch(model, result, [(3, 5, 2), (2, 41, 17), (1, 9, 0)])


@pytest.mark.parametrize("name,opts", METHOD_CASES, ids=CASE_IDS)
def test_fullgraph_compile_matches_eager(name, opts):
    model = converted_bert(name, opts)
    compiled = torch.compile(model, fullgraph=True, backend="eager", dynamic=True)
    with torch.no_grad():
        for length, pad in [(9, 3), (14, 0)]:
            batch = inputs("bert", seq=length, pad=pad, seed=length)
            torch.testing.assert_close(compiled(**batch)[0], model(**batch)[0], atol=1e-5, rtol=1e-5)


def test_fullgraph_compile_through_aot_autograd_trains():
    """aot_eager traces the backward too: a training step of a learnable map compiles as one graph."""
    model = converted_bert("luna", {}).train()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0  # eager and compiled draw different dropout masks
    batch = inputs("bert", seq=11, pad=2)
    grads = {}
    for label, runner_ in (("eager", model), ("compiled", torch.compile(model, fullgraph=True, backend="aot_eager"))):
        model.zero_grad()
        runner_(**batch, labels=torch.tensor([0, 1])).loss.backward()
        grads[label] = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    assert len(grads["eager"]) == len(grads["compiled"]) > 0
    for eager, compiled in zip(grads["eager"], grads["compiled"]):
        torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_fullgraph_compile_with_inductor():
    model = converted_bert("hedgehog", {})
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    with torch.no_grad():
        for length in (9, 13):
            batch = inputs("bert", seq=length, seed=length)
            torch.testing.assert_close(compiled(**batch)[0], model(**batch)[0], atol=1e-5, rtol=1e-5)


def tiny_timm_vit():
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1, num_classes=3)


@pytest.mark.parametrize("family", ["hf", pytest.param("timm", marks=pytest.mark.slow)])
def test_vision_model_exports_with_a_dynamic_batch(family, tmp_path):
    pytest.importorskip("onnxscript")
    model = build("vit", head="AutoModelForImageClassification") if family == "hf" else tiny_timm_vit()
    linearize.convert(model, "hedgehog")
    result = export_model(model, tmp_path / "vit.onnx", check=False)
    assert result["inputs"] == ["pixel_values"] and result["output"] == "logits"
    session = onnx_session(result["path"])
    pixels = example_inputs(model, batch=3, seed=1)["pixel_values"]
    with torch.no_grad():
        expected = FirstOutput(model, ["pixel_values"])(pixels)
    assert abs(session.run(None, {"pixel_values": pixels.numpy()})[0] - expected.numpy()).max() <= 1e-4


def test_cli_export_writes_and_checks(tmp_path):
    pytest.importorskip("onnxruntime")
    folder = tmp_path / "run" / "model"
    converted_bert("t2r", {}).save_pretrained(folder)
    code, text = invoke(tmp_path / "run")  # a run folder: its model/
    assert code == 0, text
    assert (folder / "model.onnx").is_file() and "max |difference|" in text
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary file left
    before = (folder / "model.onnx").stat().st_mtime_ns
    code, text = invoke(folder)
    assert code == 1 and text == f"error: {folder / 'model.onnx'} exists; pass --overwrite to replace it"
    code, text = invoke(folder, "--no-check", "--overwrite")
    assert code == 0 and "max |difference|" not in text and (folder / "model.onnx").stat().st_mtime_ns != before


def invoke(*args):
    result = runner.invoke(app, ["export", *map(str, args)])
    return result.exit_code, result.output.strip()


def test_not_a_converted_folder(tmp_path):
    build("bert").save_pretrained(tmp_path / "plain")
    code, text = invoke(tmp_path / "plain")
    assert code == 1 and "is not a linearize-converted model" in text and "linearize convert" in text
    assert len(text.splitlines()) == 1
    code, text = invoke(tmp_path / "missing")
    assert code == 1 and "missing does not exist" in text


def test_unknown_format_and_a_folder_as_out(tmp_path):
    converted_bert("elu", {}).save_pretrained(tmp_path / "m")
    code, text = invoke(tmp_path / "m", "--format", "tflite")
    assert code == 1 and text == "error: unknown export format 'tflite'; supported: onnx"
    code, text = invoke(tmp_path / "m", "--out", tmp_path)
    assert code == 1 and "is a folder; give a file name" in text
    # a new folder named with a trailing slash, or a name without .onnx: refused in one line, nothing written
    # (both were written as a model file of that name, exit 0)
    code, text = invoke(tmp_path / "m", "--out", f"{tmp_path / 'new'}/")
    assert code == 1 and f"e.g. --out {tmp_path / 'new' / 'model.onnx'}" in text and len(text.splitlines()) == 1
    with pytest.raises(LinearizeError, match=r"new/ is a folder; give a file name, e\.g\. --out .*new/model\.onnx"):
        export(str(tmp_path / "m"), f"{tmp_path / 'new'}/")  # the Python API sees the slash
    code, text = invoke(tmp_path / "m", "--out", tmp_path / "onnxdir")
    assert code == 1 and "is not an .onnx file name; give one, e.g. --out" in text and len(text.splitlines()) == 1
    assert not (tmp_path / "new").exists() and not (tmp_path / "onnxdir").exists()


@pytest.mark.parametrize("missing", ["onnxscript", "onnxruntime"])
def test_missing_onnx_packages(missing, tmp_path, monkeypatch):
    converted_bert("elu", {}).save_pretrained(tmp_path / "m")
    monkeypatch.setitem(sys.modules, missing, None)  # import fails as if not installed
    code, text = invoke(tmp_path / "m")
    assert code == 1 and f"ONNX export needs {missing}: pip install 'linearize[export]'" in text
    assert len(text.splitlines()) == 1
    with pytest.raises(LinearizeError, match=missing):
        export(tmp_path / "m", check=True)


@pytest.mark.slow
def test_real_minilm_with_luna_through_the_cli(minilm_path, tmp_path):
    """all-MiniLM-L6-v2 converted with LUNA: `linearize convert` then `linearize export`, and onnxruntime on
    real sentences of two lengths (padded) equals PyTorch."""
    session_packages = pytest.importorskip("onnxruntime")
    folder, out = tmp_path / "minilm-luna", tmp_path / "minilm-luna.onnx"
    assert runner.invoke(app, ["convert", minilm_path, "--method", "luna", "--out", str(folder)]).exit_code == 0
    code, text = invoke(folder, "--out", out)
    assert code == 0, text
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_path)
    model = linearize.load(folder)
    session = session_packages.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for sentences in (["A short one.", "A somewhat longer sentence about a film that was rather good."],
                      ["word " * 60, "and " * 200, "Three sentences, padded to the longest."]):
        batch = tokenizer(sentences, padding=True, return_tensors="pt")
        with torch.no_grad():
            expected = model(**batch).last_hidden_state
        got = session.run(None, {key: value.numpy() for key, value in batch.items()})[0]
        assert abs(got - expected.numpy()).max() <= 1e-4
