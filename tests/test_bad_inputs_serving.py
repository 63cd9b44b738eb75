"""Issue 36's serving cases, one row each so none comes back.

- No silent softmax: a converted model refuses every attention implementation that would bypass its
  linear attention (``sdpa``, ``eager``, flash, flex, a serving engine's own), at load and in
  ``set_attn_implementation``, with linearize (``linearize.load``, ``convert``) and without it (plain
  transformers and the folder's remote code, in a process where linearize cannot be imported); it
  takes ``output_attentions=True`` at load, which its attention honours.
- A converted folder given to an explicit softmax class (``BertForSequenceClassification``) fails.
- ``linearize export`` of a sentence-transformers folder writes ``onnx/model.onnx``, and
  docs/usage.md's onnxruntime example (its pooling and normalisation) gives sentence-transformers'
  embeddings; the export prints what it is doing.
"""

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import transformers as T
from typer.testing import CliRunner

import linearize
from linearize.cli import app
from linearize.errors import LinearizeError
from tiny_models import WITHOUT_LINEARIZE, build, first_output, inputs

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()
#: what would run the original softmax instead of the feature maps
BYPASSING = ["sdpa", "eager", "flash_attention_2", "flex_attention"]


def refusal(implementation, method="luna"):
    """The one-line error for ``implementation`` on a model converted with ``method``."""
    return (f"attn_implementation={implementation!r} would replace this converted model's {method} attention by the "
            "original softmax; keep 'linearize' (the default). For softmax attention, load the source model, or call "
            "linearize.revert(model) (pip install linearize)")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A hybrid tiny BERT classifier (layer 1 LUNA, layer 0 kept softmax) saved as a folder, with a
    batch, its converted output and the softmax source's output saved beside it."""
    root = tmp_path_factory.mktemp("serving")
    model = build("bert")
    batch = inputs("bert")
    softmax = first_output(model, batch)
    linearize.convert(model, "luna", layers=[1])
    folder = root / "bert-luna"
    model.save_pretrained(folder)
    torch.save((batch, first_output(model, batch), softmax), root / "batch.pt")
    return {"folder": folder, "batch": root / "batch.pt", "root": root}


# ---- no silent softmax, without linearize -----------------------------------------------------------

REMOTE_SCRIPT = WITHOUT_LINEARIZE + textwrap.dedent("""
    folder, batch_file, resaved = sys.argv[1:4]
    batch, expected, softmax = torch.load(batch_file)
    bypassing = json.loads(sys.argv[4])
    results = {}

    def outcome(action):
        try:
            action()
            return "ok"
        except ValueError as error:
            return str(error)

    def load(**kwargs):
        return transformers.AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True,
                                                                               **kwargs).eval()

    def difference(model):
        with torch.no_grad():
            return (model(**batch)[0] - expected).abs().max().item()

    model = load()
    results["loaded"] = [type(model).__name__, difference(model)]
    for name in bypassing:
        results[f"set {name}"] = outcome(lambda: model.set_attn_implementation(name))
        results[f"load {name}"] = outcome(lambda: load(attn_implementation=name))
    results["set {'': 'sdpa'}"] = outcome(lambda: model.set_attn_implementation({"": "sdpa"}))
    results["after the refusals"] = [model.config._attn_implementation, difference(model)]
    results["set linearize"] = outcome(lambda: model.set_attn_implementation("linearize"))
    results["load linearize"] = difference(load(attn_implementation="linearize"))
    attending = load(output_attentions=True)
    with torch.no_grad():
        at_load, at_call = attending(**batch).attentions, model(**batch, output_attentions=True).attentions
    results["output_attentions at load"] = [attending.config.output_attentions, difference(attending),
                                            [list(a.shape) for a in at_load],
                                            max((a - b).abs().max().item() for a, b in zip(at_load, at_call))]
    results["output_attentions with sdpa"] = outcome(lambda: load(output_attentions=True, attn_implementation="sdpa"))
    attending.save_pretrained(resaved + "-attending")
    results["resaved attending"] = json.loads((__import__("pathlib").Path(resaved + "-attending") /
                                               "config.json").read_text()).get("output_attentions", False)
    config = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=True)
    config._attn_implementation = "vllm"  # an engine sets its own before building the model
    results["engine's own"] = outcome(lambda: type(model)(config))
    model.save_pretrained(resaved)  # plain transformers, no linearize
    results["resaved"] = json.loads((__import__("pathlib").Path(resaved) / "config.json").read_text()).get(
        "attn_implementation")
    explicit = transformers.BertForSequenceClassification.from_pretrained(folder).eval()
    results["explicit, attention registered"] = outcome(lambda: explicit(**batch))
    results["linearize imported"] = any(name.split(".")[0] == "linearize" for name in sys.modules)
    print(json.dumps(results))
""")

EXPLICIT_SCRIPT = WITHOUT_LINEARIZE + textwrap.dedent("""
    results = {}
    for folder in sys.argv[1:]:
        try:
            transformers.BertForSequenceClassification.from_pretrained(folder)
            results[folder] = "ok"
        except ValueError as error:
            results[folder] = str(error)
    print(json.dumps(results))
""")


def run_without_linearize(script, *args):
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def remote(converted):
    """REMOTE_SCRIPT's results: the folder through plain transformers and its remote code."""
    return run_without_linearize(REMOTE_SCRIPT, converted["folder"], converted["batch"],
                                 converted["root"] / "resaved", json.dumps(BYPASSING))


def test_remote_code_loads_the_hybrid_model_without_linearize(remote):
    assert remote["loaded"][0] == "LinearizeBertForSequenceClassification" and remote["loaded"][1] <= 1e-5
    assert remote["linearize imported"] is False


@pytest.mark.parametrize("name", BYPASSING + ["{'': 'sdpa'}"])
def test_remote_code_refuses_set_attn_implementation(remote, name):
    assert remote[f"set {name}"] == refusal("sdpa" if name.startswith("{") else name)


def test_remote_code_model_is_unchanged_after_the_refusals(remote):
    implementation, difference = remote["after the refusals"]
    assert implementation == "linearize" and difference <= 1e-5


@pytest.mark.parametrize("name", BYPASSING)
def test_remote_code_refuses_attn_implementation_at_load(remote, name):
    assert remote[f"load {name}"] == refusal(name)


def test_remote_code_accepts_its_own_attention_implementation(remote):
    assert remote["set linearize"] == "ok"
    assert remote["load linearize"] <= 1e-5


def test_remote_code_takes_output_attentions_at_load(remote):
    """``from_pretrained(..., output_attentions=True)`` was refused (transformers allows the flag with
    eager only); linearize's attention returns the weights it gives at call time, one [batch, heads,
    N, N] per layer, the linear layer's included, and the outputs stay the converted model's."""
    flag, difference, shapes, gap = remote["output_attentions at load"]
    assert flag is True and difference <= 1e-5
    assert len(shapes) == 2 and all(len(shape) == 4 and shape[-1] == shape[-2] > 1 for shape in shapes), shapes
    assert gap == 0.0


def test_remote_code_with_output_attentions_still_refuses_a_bypassing_implementation(remote):
    assert remote["output_attentions with sdpa"] == refusal("sdpa")


def test_output_attentions_is_not_saved_so_linearize_load_reads_the_folder(converted, remote):
    """A saved flag would make ``linearize.load`` (transformers' BertConfig) refuse the folder."""
    assert remote["resaved attending"] is False
    batch, expected, _ = torch.load(converted["batch"])
    model = linearize.load(str(converted["root"] / "resaved") + "-attending")
    torch.testing.assert_close(first_output(model, batch), expected, atol=1e-5, rtol=1e-5)


def test_linearize_load_takes_config_flags_output_attentions_too(converted):
    """``linearize.load(dir, output_hidden_states=True)`` sets the flag on the model's config (it was a
    TypeError from the model's constructor); ``output_attentions=True`` at load gives the attention rows of
    every layer (it was refused: transformers' config takes it with eager attention only), and the
    outputs stay the converted model's."""
    batch, expected, _ = torch.load(converted["batch"])
    model = linearize.load(converted["folder"], output_hidden_states=True)
    with torch.no_grad():
        out = model(**batch)
        assert len(out.hidden_states) == model.config.num_hidden_layers + 1
        rows = model(**batch, output_attentions=True).attentions
    assert len(rows) == model.config.num_hidden_layers and rows[0].shape[-1] == rows[0].shape[-2]
    attending = linearize.load(converted["folder"], output_attentions=True)
    with torch.no_grad():
        out = attending(**batch)
    assert len(out.attentions) == model.config.num_hidden_layers
    torch.testing.assert_close(out.attentions[0], rows[0])
    torch.testing.assert_close(first_output(attending, batch), expected, atol=1e-5, rtol=1e-5)


def test_output_attentions_set_on_an_in_memory_converted_models_config(converted):
    """``model.config.output_attentions = True`` on the model ``linearize.convert`` returns raised
    transformers' "set it to 'eager'" error; it now gives the rows, and the flag is not saved."""
    batch, _, _ = torch.load(converted["batch"])
    model = linearize.convert(build("bert"), "hedgehog")
    model.eval()
    model.config.output_attentions = True
    with torch.no_grad():
        rows = model(**batch).attentions
    assert len(rows) == model.config.num_hidden_layers and rows[0].shape[-1] == rows[0].shape[-2]
    assert model.config.to_dict()["output_attentions"] is False
    with pytest.raises(LinearizeError, match="would replace this converted model's"):
        model.set_attn_implementation("eager")
    reverted = linearize.revert(model)
    assert type(reverted.config).__name__ == "BertConfig"


def test_remote_code_refuses_an_engines_own_implementation_set_on_the_config(remote):
    assert remote["engine's own"] == refusal("vllm")


def test_a_plain_transformers_resave_keeps_the_folder_refused_by_softmax_classes(remote):
    assert remote["resaved"] == "linearize"


def test_explicit_softmax_class_fails_at_forward_where_linearize_attention_is_registered(remote):
    assert remote["explicit, attention registered"].startswith(
        "BertSelfAttention runs linearize's attention without a feature map")


def test_explicit_softmax_class_refuses_a_converted_folder_without_linearize(converted, remote):
    """``BertForSequenceClassification.from_pretrained(folder)``, no remote code, no linearize: fails
    (the config names an attention plain transformers does not know) instead of building softmax BERT.
    The folder re-saved by plain transformers too."""
    folders = [str(converted["folder"]), str(converted["root"] / "resaved")]
    results = run_without_linearize(EXPLICIT_SCRIPT, *folders)
    for folder in folders:
        assert 'attn_implementation="linearize"' in results[folder] and "not supported" in results[folder], results


# ---- no silent softmax, with linearize ---------------------------------------------------------------

@pytest.mark.parametrize("name", BYPASSING)
def test_linearize_load_refuses_set_attn_implementation(converted, name):
    model = linearize.load(converted["folder"])
    batch, expected, _ = torch.load(converted["batch"])
    with pytest.raises(LinearizeError) as error:
        model.set_attn_implementation(name)
    assert str(error.value) == refusal(name)
    torch.testing.assert_close(first_output(model, batch), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", BYPASSING)
def test_linearize_load_refuses_attn_implementation(converted, name):
    with pytest.raises(LinearizeError) as error:
        linearize.load(converted["folder"], attn_implementation=name)
    assert str(error.value) == refusal(name)


def test_linearize_load_accepts_its_own_attention_implementation(converted):
    batch, expected, _ = torch.load(converted["batch"])
    model = linearize.load(converted["folder"], attn_implementation="linearize")
    torch.testing.assert_close(first_output(model, batch), expected, atol=1e-5, rtol=1e-5)


def test_a_converted_model_in_memory_refuses_sdpa_and_reverts_to_softmax():
    """The issue's case: ``set_attn_implementation("sdpa")`` gave the original model's output (diff 0.0)."""
    model = build("bert")
    batch = inputs("bert")
    softmax = first_output(model, batch)
    linearize.convert(model, "hedgehog")
    converted_output = first_output(model, batch)
    with pytest.raises(LinearizeError, match=re.escape(refusal("sdpa", "hedgehog"))):
        model.set_attn_implementation("sdpa")
    torch.testing.assert_close(first_output(model, batch), converted_output)
    linearize.revert(model)
    torch.testing.assert_close(first_output(model, batch), softmax, atol=1e-5, rtol=1e-5)
    model.set_attn_implementation("eager")  # a reverted model is plain transformers again
    torch.testing.assert_close(first_output(model, batch), softmax, atol=1e-5, rtol=1e-5)


def test_saved_config_names_linearize_attention(converted):
    assert json.loads((converted["folder"] / "config.json").read_text())["attn_implementation"] == "linearize"


# ---- the sentence-transformers ONNX layout and the export's progress -----------------------------------

@pytest.fixture(scope="module")
def exported_st(tmp_path_factory, minilm_path):
    """A converted tiny sentence-transformers folder, exported with ``linearize export FOLDER``."""
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    pytest.importorskip("sentence_transformers")
    from linearize.convert.api import convert_checkpoint
    from test_embeddings import save_tiny_sentence_transformer

    root = tmp_path_factory.mktemp("st-onnx")
    source = save_tiny_sentence_transformer(root / "source", minilm_path)
    folder = root / "converted"
    convert_checkpoint(str(source), "hedgehog", folder)
    torch._dynamo.reset()
    result = runner.invoke(app, ["export", str(folder)])
    torch._dynamo.reset()
    assert result.exit_code == 0, result.output
    return folder, result.output


def test_export_of_a_sentence_transformers_folder_writes_onnx_model_onnx(exported_st):
    folder, output = exported_st
    assert (folder / "onnx" / "model.onnx").is_file() and not (folder / "model.onnx").exists()
    assert (folder / "1_Pooling" / "config.json").is_file()
    assert f"wrote {folder / 'onnx' / 'model.onnx'}: inputs input_ids, attention_mask, token_type_ids -> " \
           "last_hidden_state" in output.replace("\n", "")


def docs_onnx_example():
    """docs/usage.md's onnxruntime-plus-pooling code block."""
    text = (ROOT / "docs" / "usage.md").read_text()
    blocks = [block for block in re.findall(r"^```python\n(.*?)^```$", text, re.S | re.M)
              if "onnxruntime.InferenceSession" in block]
    assert len(blocks) == 1, "docs/usage.md should show one onnxruntime serving example"
    return blocks[0]


def test_docs_onnxruntime_example_gives_the_sentence_transformers_embeddings(exported_st):
    import numpy as np
    import sentence_transformers

    folder, _ = exported_st
    code = docs_onnx_example()
    assert 'Path("runs/minilm-luna")' in code
    namespace = {}
    exec(code.replace('Path("runs/minilm-luna")', f"Path({str(folder)!r})"), namespace)  # noqa: S102
    texts = ["A warm, funny and moving film.", "The plot is dull", "linear attention and long documents " * 8,
             "short"]  # the third is cut at max_seq_length (24)
    expected = sentence_transformers.SentenceTransformer(str(folder), trust_remote_code=True,
                                                         device="cpu").encode(texts)
    got = namespace["encode"](texts)
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= 1e-5
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # the folder's Normalize module


def test_export_prints_progress_before_the_long_steps(exported_st):
    folder, output = exported_st
    lines = output.replace("\n ", " ").splitlines()
    steps = ["loading ", "tracing the model and exporting", "writing ", "checking the graph in onnxruntime", "wrote "]
    found = [next((i for i, line in enumerate(lines) if line.startswith(step)), None) for step in steps]
    assert None not in found and found == sorted(found), output
    assert lines[found[0]] == f"loading {folder}"
