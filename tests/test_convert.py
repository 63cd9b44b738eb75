"""Conversion of every supported architecture (small random configs), save and reload two ways."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import transformers as T

import linearize
from linearize.convert import ConversionRecord, attention_modules, conversion_record, feature_maps_of
from linearize.errors import LinearizeError
from tiny_models import VISION, WITHOUT_LINEARIZE, build, configs, first_output, heads, inputs

ARCHS = list(configs())
METHODS = linearize.methods()


@pytest.mark.parametrize("arch", ARCHS)
def test_softmax_conversion_and_revert_leave_outputs_unchanged(arch):
    model = build(arch)
    batch = inputs(arch)
    reference = first_output(model, batch)
    linearize.convert(model, "softmax")
    torch.testing.assert_close(first_output(model, batch), reference, atol=1e-5, rtol=1e-5)
    linearize.revert(model)
    assert type(model).__name__ == type(build(arch)).__name__
    torch.testing.assert_close(first_output(model, batch), reference, atol=1e-5, rtol=1e-5)
    linearize.convert(model, "luna")
    assert not torch.allclose(first_output(model, batch), reference, atol=1e-5)
    linearize.revert(model)
    torch.testing.assert_close(first_output(model, batch), reference, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_method_converts_and_keeps_pretrained_weights(arch):
    batch = inputs(arch)
    for method in METHODS:
        model = build(arch)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        reference = first_output(model, batch)
        linearize.convert(model, method)
        out = first_output(model, batch)
        assert out.shape == reference.shape and torch.isfinite(out).all(), method
        state = model.state_dict()
        for key, value in before.items():  # pretrained weights untouched
            assert torch.equal(state[key], value), (method, key)
        maps = feature_maps_of(model)
        assert len(maps) == len(attention_modules(model)) >= 1
        new_keys = set(state) - set(before)
        assert all(".linearize_map." in key for key in new_keys)
        learnable = sum(p.numel() for fm in maps.values() for p in fm.parameters())
        assert sum(p.numel() for n, p in model.named_parameters() if ".linearize_map." in n) == learnable
        assert conversion_record(model).parameters_added == learnable


@pytest.mark.parametrize("arch", ARCHS)
def test_every_head_converts_and_returns_student_attentions(arch):
    batch = inputs(arch)
    for head in heads(arch):
        model = build(arch, head)
        linearize.convert(model, "luna")
        with torch.no_grad():
            out = model(**batch, output_attentions=True)
        assert out.attentions is not None and len(out.attentions) == 2, head
        weights = out.attentions[0]
        assert weights.shape[1] == 4 and weights.shape[-1] == weights.shape[-2]
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5, rtol=0)
        if arch not in VISION:
            assert torch.all(weights[1, :, :, -2:] == 0)  # padded keys get no weight


def test_student_attentions_are_the_quadratic_form_of_the_linear_path():
    """output_attentions returns Â whose product with V is exactly what the layer computed."""
    model = build("bert")
    linearize.convert(model, "hedgehog")
    batch = inputs("bert")
    captured = {}
    module = attention_modules(model)[0][1]
    original = module.linearize_map.attend

    def spy(q, k, v, key_padding_mask=None, scale=None, output_attentions=False, dropout=0.0):
        out, weights = original(q, k, v, key_padding_mask, scale, True, dropout)
        captured.update(out=out, weights=weights, v=v)
        return out, weights

    module.linearize_map.attend = spy
    with torch.no_grad():
        model(**batch)
    torch.testing.assert_close(captured["weights"] @ captured["v"], captured["out"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_padding_invariance_through_the_whole_model(method):
    model = build("bert")
    linearize.convert(model, method)
    short = inputs("bert", batch=1, seq=6, pad=0)
    padded = {k: torch.cat([v, torch.zeros(1, 3, dtype=v.dtype)], dim=1) for k, v in short.items()}
    padded["input_ids"][0, 6:] = 7  # garbage ids behind the mask
    a, b = first_output(model, short), first_output(model, padded)
    torch.testing.assert_close(b[:, :6], a, atol=1e-5, rtol=1e-5)


def test_hybrid_layers_keep_the_others_softmax(tmp_path):
    model = build("bert")
    batch = inputs("bert")
    with torch.no_grad():
        teacher = model(**batch, output_hidden_states=True)
    linearize.convert(model, "t2r", layers=[1])
    assert list(feature_maps_of(model)) == [1]
    with torch.no_grad():
        student = model(**batch, output_hidden_states=True, output_attentions=True)
    torch.testing.assert_close(student.hidden_states[1], teacher.hidden_states[1], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(student.hidden_states[2], teacher.hidden_states[2], atol=1e-4)
    model.save_pretrained(tmp_path)
    reloaded = linearize.load(tmp_path)
    assert list(feature_maps_of(reloaded)) == [1]
    assert ConversionRecord.from_config(json.loads((tmp_path / "config.json").read_text())).layers == (1,)
    torch.testing.assert_close(first_output(reloaded, batch), student.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_save_and_linearize_load_give_identical_outputs(arch, tmp_path):
    model = build(arch)
    linearize.convert(model, "luna", projections=4)
    batch = inputs(arch)
    expected = first_output(model, batch)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == f"linearize_{model.config.model_type}"
    record = ConversionRecord.from_config(config)
    assert record.method == "luna" and record.options == {"projections": 4}
    assert list(record.layers) == list(range(len(attention_modules(model))))
    assert record.architecture == type(build(arch)).__name__
    assert "AutoConfig" in config["auto_map"]
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "modeling_linearize.py").is_file()
    reloaded = linearize.load(tmp_path)
    assert type(reloaded).__name__ == type(model).__name__
    torch.testing.assert_close(first_output(reloaded, batch), expected, atol=1e-5, rtol=1e-5)


REMOTE_CHECK = WITHOUT_LINEARIZE + textwrap.dedent("""
    results = {}
    for directory, auto, batch_file in json.loads(sys.argv[1]):
        model = getattr(transformers, auto).from_pretrained(directory, trust_remote_code=True).eval()
        batch, expected = torch.load(batch_file)
        with torch.no_grad():
            got = model(**batch)[0]
        results[directory] = [type(model).__name__, (got - expected).abs().max().item()]
    assert not any(name.split(".")[0] == "linearize" for name in sys.modules)
    print(json.dumps(results))
""")


def check_without_linearize(jobs, timeout=600):
    """Run REMOTE_CHECK in a fresh process (linearize blocked) over ``[folder, auto class, inputs
    file]`` jobs; ``{folder: (class name, max abs difference)}``."""
    done = subprocess.run([sys.executable, "-c", REMOTE_CHECK, json.dumps(jobs)], capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])



def test_trust_remote_code_loads_without_linearize_installed(tmp_path):
    """A fresh Python process, linearize blocked from import, plain transformers: same outputs."""
    jobs = []
    cases = [(arch, method, {}) for arch, method in zip(ARCHS, ["luna", "hedgehog", "performer", "darkformer",
                                                                "flexformer-n", "t2r", "cosformer", "flexformer-s",
                                                                "elu"])]
    cases.append((ARCHS[0], "luna", {"shared_projections": False}))
    for arch, method, options in cases:
        model = build(arch)
        linearize.convert(model, method, **options)
        batch = inputs(arch)
        name = f"{arch}-{method}-{len(options)}"
        directory = tmp_path / name
        model.save_pretrained(directory)
        torch.save((batch, first_output(model, batch)), tmp_path / f"{name}.pt")
        auto = "AutoModelForImageClassification" if arch in VISION else "AutoModelForSequenceClassification"
        jobs.append([str(directory), auto, str(tmp_path / f"{name}.pt")])
    results = check_without_linearize(jobs)
    for directory, _, _ in jobs:
        name, diff = results[directory]
        assert name.startswith("Linearize")
        assert diff <= 1e-5, (directory, diff)


def test_loading_without_remote_code_refuses_instead_of_giving_softmax(tmp_path):
    model = build("bert")
    linearize.convert(model, "luna")
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="trust_remote_code|custom code"):
        T.AutoModelForSequenceClassification.from_pretrained(tmp_path, trust_remote_code=False)


def test_shared_config_is_not_converted_with_the_model():
    config = configs()["bert"]
    first = T.BertModel(config)
    linearize.convert(first, "luna")
    second = T.BertModel(config)
    assert not hasattr(config, "linearize") and config._attn_implementation != "linearize"
    linearize.convert(second, "t2r")  # not "already converted"
    assert feature_maps_of(second)[0].name == "t2r"


def test_convert_errors_are_clear():
    with pytest.raises(LinearizeError, match="unsupported architecture 'gpt2'; supported: albert, bert"):
        linearize.convert(T.GPT2Model(T.GPT2Config(n_layer=1, n_embd=32, n_head=4)), "luna")
    with pytest.raises(LinearizeError, match="unsupported architecture 'Linear'"):
        linearize.convert(torch.nn.Linear(2, 2), "luna")
    model = build("bert")
    with pytest.raises(ValueError, match="unknown method 'lunar'; valid methods: luna, hedgehog"):
        linearize.convert(model, "lunar")
    with pytest.raises(ValueError, match="valid options: projections"):
        linearize.convert(model, "luna", projection=4)
    with pytest.raises(ValueError, match=r"layers \[0, 5\]: 5 is out of range; .* in 0\.\.1 \(the model has 2 attention"):
        linearize.convert(model, "luna", layers=[0, 5])
    linearize.convert(model, "luna")
    with pytest.raises(LinearizeError, match="already converted; call linearize.revert"):
        linearize.convert(model, "t2r")


def test_seeded_methods_draw_different_features_per_layer_and_reload_them(tmp_path):
    model = build("bert")
    linearize.convert(model, "performer", seed=5, num_features=16)
    maps = feature_maps_of(model)
    assert not torch.equal(maps[0].omega, maps[1].omega)
    model.save_pretrained(tmp_path)
    reloaded = feature_maps_of(linearize.load(tmp_path))
    assert torch.equal(reloaded[1].omega, maps[1].omega)


def test_bf16_converted_model_runs_finite():
    model = build("bert").to(torch.bfloat16)
    linearize.convert(model, "performer")
    out = first_output(model, inputs("bert"))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def test_a_converted_model_pickles_and_unpickles_in_a_fresh_process(tmp_path):
    """``torch.save(model)`` / ``pickle`` of a converted model: its classes (``Linearize<Class>``, made at
    conversion) are found by name, in a process that has converted nothing too, with the same outputs; the
    config (which takes ``output_attentions=True``) pickles on its own."""
    import pickle

    model = linearize.convert(build("bert"), "hedgehog")
    model.eval()
    batch = inputs("bert")
    with torch.no_grad():
        expected = model(**batch).logits
    assert type(pickle.loads(pickle.dumps(model.config))) is type(model.config)
    torch.save({"model": model, "batch": batch, "expected": expected}, tmp_path / "model.pt")
    script = textwrap.dedent(f"""
        import torch
        saved = torch.load({str(tmp_path / "model.pt")!r}, weights_only=False)
        with torch.no_grad():
            out = saved["model"](**saved["batch"]).logits
        print(type(saved["model"]).__name__, type(saved["model"].config).__name__,
              torch.allclose(out, saved["expected"], atol=1e-6))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["LinearizeBertForSequenceClassification", "LinearizeBertConfig", "True"]
