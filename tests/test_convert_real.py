"""End-to-end conversion checks on the real pretrained all-MiniLM-L6-v2 and on timm's ViT."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import transformers as T

import linearize
from linearize.convert import conversion_record, feature_maps_of, is_converted

SENTENCES = ["a gripping, beautifully acted film.", "the plot is thin and the jokes fall flat, sadly."]


@pytest.fixture(scope="module")
def minilm(minilm_path):
    tokenizer = T.AutoTokenizer.from_pretrained(minilm_path)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    assert batch["attention_mask"].min() == 0  # the short sentence is padded
    return minilm_path, tokenizer, batch


def load_classifier(path):
    torch.manual_seed(0)  # the new classifier head
    return T.AutoModelForSequenceClassification.from_pretrained(path, num_labels=2).eval()


@pytest.mark.slow
def test_minilm_every_method(minilm):
    path, _, batch = minilm
    model = load_classifier(path)
    with torch.no_grad():
        reference = model(**batch).logits
    for method in linearize.methods():
        linearize.convert(model, method)
        with torch.no_grad():
            out = model(**batch, output_attentions=True)
        assert torch.isfinite(out.logits).all(), method
        assert len(out.attentions) == 6 and out.attentions[0].shape[1] == 12
        if method == "softmax":
            torch.testing.assert_close(out.logits, reference, atol=1e-5, rtol=1e-5)
        if method == "luna":
            record = conversion_record(model)
            assert 0 < record.parameters_added < 0.01 * record.parameters_base  # well under 1%
        linearize.revert(model)
        with torch.no_grad():
            torch.testing.assert_close(model(**batch).logits, reference, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_minilm_padding_invariance(minilm):
    path, tokenizer, _ = minilm
    model = linearize.convert(load_classifier(path), "luna")
    single = tokenizer(SENTENCES[:1], return_tensors="pt")
    padded = tokenizer(SENTENCES[:1], padding="max_length", max_length=40, return_tensors="pt")
    with torch.no_grad():
        a = model(**single).logits
        b = model(**padded).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


PIPELINE_CHECK = textwrap.dedent("""
    import json, sys
    class BlockLinearize:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "linearize":
                raise ImportError("blocked")
    sys.meta_path.insert(0, BlockLinearize())
    import torch, transformers
    directory, sentences = sys.argv[1], json.loads(sys.argv[2])
    model = transformers.AutoModelForSequenceClassification.from_pretrained(directory, trust_remote_code=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, trust_remote_code=True)
    with torch.no_grad():
        logits = model(**tokenizer(sentences, padding=True, return_tensors="pt")).logits
    classify = transformers.pipeline("text-classification", model=directory, trust_remote_code=True)
    print(json.dumps({"logits": logits.tolist(), "pipeline": classify(sentences), "class": type(model).__name__}))
""")


@pytest.mark.slow
def test_minilm_save_load_remote_code_and_pipeline(minilm, tmp_path):
    path, tokenizer, batch = minilm
    model = linearize.convert(load_classifier(path), "luna")
    with torch.no_grad():
        expected = model(**batch).logits
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(linearize.load(tmp_path)(**batch).logits, expected, atol=1e-5, rtol=1e-5)
    done = subprocess.run([sys.executable, "-c", PIPELINE_CHECK, str(tmp_path), json.dumps(SENTENCES)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["class"] == "LinearizeBertForSequenceClassification"
    torch.testing.assert_close(torch.tensor(result["logits"]), expected, atol=1e-5, rtol=1e-5)
    probs = expected.softmax(-1)
    for row, prediction in zip(probs, result["pipeline"]):
        label = int(row.argmax())
        assert prediction["label"] == model.config.id2label[label]
        assert abs(prediction["score"] - row[label].item()) < 1e-5


@pytest.fixture(scope="module")
def timm_vit():
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10).eval()
    return model, torch.randn(2, 3, 224, 224)


def test_timm_vit_every_method(timm_vit):
    model, images = timm_vit
    with torch.no_grad():
        reference = model(images)
    for method in linearize.methods():
        linearize.convert(model, method)
        assert len(feature_maps_of(model)) == 12
        with torch.no_grad():
            out = model(images)
        assert out.shape == reference.shape and torch.isfinite(out).all(), method
        if method == "softmax":
            torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-5)
        linearize.revert(model)
    with torch.no_grad():
        torch.testing.assert_close(model(images), reference, atol=1e-5, rtol=1e-5)


def test_timm_vit_save_and_load(timm_vit, tmp_path):
    from linearize.convert.backends.timm import save_timm

    model, images = timm_vit
    linearize.convert(model, "hedgehog", layers=[0, 5, 11])
    try:
        with torch.no_grad():
            expected = model(images)
        save_timm(model, tmp_path, "vit_tiny_patch16_224", num_classes=10)
        reloaded = linearize.load(tmp_path)
        assert sorted(feature_maps_of(reloaded)) == [0, 5, 11]
        with torch.no_grad():
            torch.testing.assert_close(reloaded(images), expected, atol=1e-5, rtol=1e-5)
    finally:
        linearize.revert(model)


def test_timm_vit_save_pretrained_like_hf_models_and_strict_reload(tmp_path):
    """A converted timm model saves itself (name and geometry read off the model) and reloads
    bit-identically; weights under other names are an error, not a re-initialisation."""
    timm = pytest.importorskip("timm")
    from safetensors.torch import load_file, save_file

    from linearize.errors import LinearizeError

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2,
                              num_classes=3).eval()
    images = torch.randn(2, 3, 32, 32)
    linearize.convert(model, "luna", layers=[1])
    model.save_pretrained(tmp_path / "a")
    reloaded = linearize.load(tmp_path / "a")
    assert type(reloaded).__name__ == type(model).__name__ == "LinearizeVisionTransformer"
    assert sorted(feature_maps_of(reloaded)) == [1]
    with torch.no_grad():
        assert torch.equal(reloaded(images), model(images))
    linearize.revert(reloaded)
    assert type(reloaded).__name__ == "VisionTransformer" and not is_converted(reloaded)
    state = load_file(str(tmp_path / "a" / "model.safetensors"))
    state = {key.replace("blocks.1.attn.qkv.", "blocks.1.attn.in_proj."): value for key, value in state.items()}
    save_file(state, str(tmp_path / "a" / "model.safetensors"))
    with pytest.raises(LinearizeError, match=r"2 missing \(blocks.1.attn.qkv.bias, blocks.1.attn.qkv.weight\); "
                                             r"2 unexpected \(blocks.1.attn.in_proj"):
        linearize.load(tmp_path / "a")
