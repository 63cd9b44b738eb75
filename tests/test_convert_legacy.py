"""Checkpoints in the layout the Hub stores them (legacy parameter names) survive convert → save → reload.

transformers 5.x renames the legacy keys of some architectures when it loads them (its checkpoint
conversion mapping: ViT/DeiT ``encoder.layer.N.attention.attention.query`` → ``layers.N.attention.q_proj``,
Dinov2's fused SwiGLU ``weights_in`` → ``gate_proj``/``up_proj``) and writes them back under the legacy
names on save. A converted model must reload bit-identically anyway: through ``linearize.load``, plain
transformers with ``trust_remote_code=True`` in a process where linearize cannot be imported,
``pipeline()``, and the folder ``linearize push`` uploads.

Tiny legacy checkpoints come from ``save_pretrained`` of a native model, which transformers writes in the
legacy layout through the reverse of that same mapping; the test asserts the layout is the legacy one.
"""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import transformers as T
from safetensors import safe_open
from transformers.conversion_mapping import get_model_conversion_mapping

import linearize
from linearize.convert.api import check_loading_info, save_processors
from linearize.errors import LinearizeError
from tiny_models import VISION, WITHOUT_LINEARIZE, build, configs, first_output, inputs

ARCHS = list(configs())


def _head(arch):
    if arch == "deit":
        return "DeiTForImageClassification"
    return "AutoModelForImageClassification" if arch in VISION else "AutoModelForSequenceClassification"


def _cls(name):
    return getattr(T, name)


def _saved_keys(directory):
    with safe_open(str(directory / "model.safetensors"), "pt") as handle:
        return set(handle.keys())


def _has_conversion_mapping(model):
    """The installed transformers renames this model's keys on load (add_legacy=False: the LayerNorm
    gamma/beta renaming every model has does not count)."""
    return bool(get_model_conversion_mapping(model, add_legacy=False))


def _legacy_checkpoint(arch, head, directory):
    """A tiny native model saved the way transformers stores it on the Hub; returns whether it is renamed."""
    native = build(arch, head)
    renamed = _has_conversion_mapping(native)
    native.save_pretrained(directory)
    if renamed:  # the file holds the legacy names, not the model's own
        saved = _saved_keys(directory)
        assert saved != set(native.state_dict()), arch
        assert any(".attention.attention.query." in key for key in saved), sorted(saved)[:5]
    if arch in VISION:
        T.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(directory)
    return renamed


CASES = [(arch, head) for arch in ARCHS for head in ("AutoModel", _head(arch))]


def _convert_legacy(arch, head, tmp_path):
    """load (renaming) → convert → save; returns (converted model, its folder, whether renamed)."""
    legacy = tmp_path / f"{arch}-{head}-legacy"
    renamed = _legacy_checkpoint(arch, head, legacy)
    model = _cls(head).from_pretrained(legacy).eval()
    linearize.convert(model, "hedgehog")
    out = tmp_path / f"{arch}-{head}-converted"
    model.save_pretrained(out)
    save_processors(legacy, out)
    return model, out, renamed


@pytest.mark.parametrize("arch,head", CASES)
def test_legacy_checkpoint_reloads_bit_identically_with_linearize_load(arch, head, tmp_path):
    model, out, _ = _convert_legacy(arch, head, tmp_path)
    assert _saved_keys(out) == set(model.state_dict())  # the model's own names, never the legacy ones
    batch = inputs(arch)
    reloaded, info = linearize.load(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert torch.equal(first_output(reloaded, batch), first_output(model, batch))


def test_which_supported_architectures_transformers_renames():
    renamed = sorted({arch for arch, head in CASES if _has_conversion_mapping(build(arch, head))})
    # ViT, DeiT and Dinov2 checkpoints on the Hub use the legacy names (issue 17); the text encoders do not.
    assert {"vit", "deit", "dinov2"} <= set(renamed)


REMOTE_CHECK = WITHOUT_LINEARIZE + textwrap.dedent("""
    from PIL import Image
    results = {}
    for directory, auto, batch_file, image_file in json.loads(sys.argv[1]):
        model, info = getattr(transformers, auto).from_pretrained(directory, trust_remote_code=True,
                                                                  output_loading_info=True)
        batch, expected = torch.load(batch_file)
        with torch.no_grad():
            got = model.eval()(**batch)[0]
        result = {"class": type(model).__name__, "equal": bool(torch.equal(got, expected)),
                  "problems": {k: sorted(map(str, v)) for k, v in info.items() if k != "error_msgs" and v}}
        if image_file:
            classify = transformers.pipeline("image-classification", model=directory, trust_remote_code=True)
            result["pipeline"] = classify(Image.open(image_file), top_k=1)[0]["score"]
        results[directory] = result
    assert not any(name.split(".")[0] == "linearize" for name in sys.modules)
    print(json.dumps(results))
""")


def _expected_pipeline_score(model, directory, image):
    processor = T.AutoImageProcessor.from_pretrained(directory)
    with torch.no_grad():
        logits = model(**processor(image, return_tensors="pt")).logits
    return logits.softmax(-1).max().item()


def _push_folder(out, tmp_path):
    """The folder ``linearize push`` would upload (its staged files)."""
    from linearize import push

    staged = tmp_path / (out.name + "-staged")
    staged.mkdir()
    return push.stage(push.plan(out, "user/model", no_report=True), staged)


def test_legacy_checkpoints_reload_without_linearize_in_transformers_pipeline_and_push_folder(tmp_path):
    """Fresh process, linearize blocked: the converted and the pushed folders load with no missing or
    unexpected keys and give exactly the converted model's outputs; pipeline() gives its scores."""
    from PIL import Image

    image = Image.fromarray((torch.rand(40, 48, 3) * 255).to(torch.uint8).numpy())
    image.save(tmp_path / "image.png")
    jobs, expected_scores = [], {}
    for arch, head in CASES:
        model, out, _ = _convert_legacy(arch, head, tmp_path)
        batch = inputs(arch)
        torch.save((batch, first_output(model, batch)), tmp_path / f"{out.name}.pt")
        auto = "AutoModel" if head == "AutoModel" else (
            "AutoModelForImageClassification" if arch in VISION else "AutoModelForSequenceClassification")
        folders = [out, _push_folder(out, tmp_path)] if head == _head(arch) else [out]
        for folder in folders:
            image_file = str(tmp_path / "image.png") if arch in VISION and auto != "AutoModel" else None
            jobs.append([str(folder), auto, str(tmp_path / f"{out.name}.pt"), image_file])
            if image_file:
                expected_scores[str(folder)] = _expected_pipeline_score(model, out, image)
    done = subprocess.run([sys.executable, "-c", REMOTE_CHECK, json.dumps(jobs)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for directory, *_ in jobs:
        result = results[directory]
        assert result["class"].startswith("Linearize"), result
        assert result["problems"] == {}, (directory, result["problems"])
        assert result["equal"], directory
        if directory in expected_scores:
            assert result["pipeline"] == pytest.approx(expected_scores[directory], abs=1e-6), directory


def test_a_load_with_missing_or_unexpected_weights_is_an_error(tmp_path):
    """A folder whose attention weights are under other names must not load with random projections."""
    from safetensors.torch import load_file, save_file

    model = build("vit", "AutoModel")
    linearize.convert(model, "luna")
    model.save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    renamed = {key.replace("attention.q_proj", "attention.attention.query"): value for key, value in state.items()}
    save_file(renamed, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(LinearizeError, match=r"missing \(.*q_proj.*unexpected \(.*attention\.attention\.query"):
        linearize.load(tmp_path)


def test_check_loading_info_names_the_keys():
    check_loading_info("d", {"missing_keys": [], "unexpected_keys": set(), "mismatched_keys": []})
    info = {"missing_keys": ["a.linearize_map.w", "b", "c", "d"], "unexpected_keys": [], "mismatched_keys": []}
    with pytest.raises(LinearizeError, match=r"^d does not match its model: 4 missing \(a.linearize_map.w, b, c, \.\.\.\)"):
        check_loading_info("d", info)
