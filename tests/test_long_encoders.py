"""Long-context encoders (issue 19, deliverable 3): ModernBERT and UltraBERT (rotary positions,
sliding-window layers), GTE, NomicBERT, EuroBERT (grouped key/value heads), Jina-embeddings-v3, DINOv3
(ViT) and the CLIP, SigLIP and SigLIP2 vision towers, on small random configs: every head, softmax
conversion equal to the original, padding invariance, windowed layers never global, save → reload with
linearize and with plain transformers in a process where linearize cannot be imported."""

import copy

import pytest
import torch
import transformers as T
from typer.testing import CliRunner

import linearize
from linearize.attention import create_feature_map, kernel_matrix
from linearize.attention.windowed import (band_mask, windowed_attention_weights, windowed_linear_attention,
                                          windowed_quadratic_attention, windowed_softmax_attention)
from linearize.cli import app
from linearize.convert import attention_modules, conversion_record
from linearize.convert.backends.hf_attention import sliding_window_layers
from linearize.convert.api import SUPPORTED, is_converted
from linearize.convert.backends.hf_attention import linearize_attention_forward
from linearize.convert.backends.hf_remote_code import auto_classes
from linearize.errors import LinearizeError
from test_convert import check_without_linearize  # a fresh process without linearize

TEXT = dict(vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
            initializer_range=0.2)
VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
SEQ, PAD = 12, 3  # longer than ModernBERT's tiny window (local_attention 4: |i - j| ≤ 2)


def config_of(model_type):
    """A small random config of each added model type."""
    return {
        "modernbert": lambda: T.ModernBertConfig(local_attention=4, global_attn_every_n_layers=3, cls_token_id=1,
                                                 sep_token_id=2, **TOKENS, **TEXT),
        "ultrabert": lambda: T.UltrabertConfig(sliding_window=2, prediction_head_size=32, num_key_value_heads=2,
                                               **TEXT),
        "gte": lambda: T.GteConfig(**TEXT),
        "nomic_bert": lambda: T.NomicBertConfig(**TEXT),
        "eurobert": lambda: T.EuroBertConfig(num_key_value_heads=2, mask_token_id=3, **TOKENS, **TEXT),
        "jina_embeddings_v3": lambda: T.JinaEmbeddingsV3Config(**TEXT),
        "dinov3_vit": lambda: T.DINOv3ViTConfig(image_size=32, patch_size=8, num_register_tokens=2,
                                                initializer_range=0.2, **VISION),
        "clip_vision_model": lambda: T.CLIPVisionConfig(image_size=32, patch_size=8, initializer_range=0.2, **VISION),
        "siglip_vision_model": lambda: T.SiglipVisionConfig(image_size=32, patch_size=8, **VISION),
        "siglip2_vision_model": lambda: T.Siglip2VisionConfig(num_patches=16, patch_size=8, **VISION),
    }[model_type]()


TEXT_TYPES = ["modernbert", "ultrabert", "gte", "nomic_bert", "eurobert", "jina_embeddings_v3"]
VISION_TYPES = ["dinov3_vit", "clip_vision_model", "siglip_vision_model", "siglip2_vision_model"]
CASES = [(kind, auto) for kind in TEXT_TYPES + VISION_TYPES for auto in sorted(auto_classes(kind))]


def build(model_type, auto="AutoModel", seed=0):
    torch.manual_seed(seed)
    return getattr(T, auto).from_config(config_of(model_type)).eval()


def batch_for(model_type, auto="AutoModel", pad=PAD, seq=SEQ, seed=0):
    g = torch.Generator().manual_seed(seed)
    if model_type == "siglip2_vision_model":  # patches of a 4×4 and a 3×4 image
        mask = torch.ones(2, 16, dtype=torch.long)
        mask[1, 12:] = 0
        return {"pixel_values": torch.randn(2, 16, 3 * 8 * 8, generator=g), "pixel_attention_mask": mask,
                "spatial_shapes": torch.tensor([[4, 4], [3, 4]])}
    if model_type in VISION_TYPES:
        return {"pixel_values": torch.randn(2, 3, 32, 32, generator=g)}
    mask = torch.ones(2, seq, dtype=torch.long)
    if pad:
        mask[1, seq - pad:] = 0
    batch = {"input_ids": torch.randint(4, 100, (2, seq), generator=g), "attention_mask": mask}
    if auto == "AutoModelForMultipleChoice":  # two choices of one question
        batch = {key: value.unsqueeze(0) for key, value in batch.items()}
    return batch


def real_rows(model_type, batch, output):
    """The output rows of real tokens (what padding may not change)."""
    mask = batch.get("attention_mask", batch.get("pixel_attention_mask"))
    if mask is None or output.dim() < 3 or output.shape[:2] != mask.shape:
        return output
    return output[mask.bool()]


def first_output(model, batch):
    with torch.no_grad():
        return model(**batch)[0]


def test_the_added_types_are_supported_and_their_heads_found():
    for kind in TEXT_TYPES + VISION_TYPES:
        assert kind in SUPPORTED
    assert sorted(auto_classes("modernbert")) == ["AutoModel", "AutoModelForMaskedLM", "AutoModelForMultipleChoice",
                                                 "AutoModelForQuestionAnswering",
                                                 "AutoModelForSequenceClassification",
                                                 "AutoModelForTokenClassification"]
    assert len(CASES) == 6 + 5 + 4 + 4 + 4 + 5 + 4


@pytest.mark.parametrize("model_type,auto", CASES)
def test_softmax_conversion_equals_the_original_and_a_method_changes_it(model_type, auto):
    original = build(model_type, auto)
    batch = batch_for(model_type, auto)
    reference = first_output(original, batch)
    local = bool(sliding_window_layers(original))  # every layer, local ones too (a model without any: the default)
    softmax = linearize.convert(copy.deepcopy(original), "softmax", convert_sliding_window=local)
    assert len(conversion_record(softmax).layers) == len(attention_modules(original))
    torch.testing.assert_close(real_rows(model_type, batch, first_output(softmax, batch)),
                               real_rows(model_type, batch, reference), atol=1e-5, rtol=0)
    student = linearize.convert(copy.deepcopy(original), "hedgehog")
    out = first_output(student, batch)
    assert out.isfinite().all() and not torch.allclose(out, reference, atol=1e-4)


@pytest.mark.parametrize("model_type", TEXT_TYPES + ["modernbert-all-layers", "ultrabert-all-layers"])
def test_converted_text_models_are_padding_invariant(model_type):
    every_layer = model_type.endswith("-all-layers")
    model_type = model_type.removesuffix("-all-layers")
    model = linearize.convert(build(model_type), "hedgehog", convert_sliding_window=every_layer)
    padded = batch_for(model_type, pad=PAD)
    alone = {key: value[1:, :SEQ - PAD] for key, value in padded.items()}
    torch.testing.assert_close(first_output(model, padded)[1, :SEQ - PAD], first_output(model, alone)[0],
                               atol=1e-5, rtol=0)


# ---- ModernBERT's sliding-window layers -----------------------------------------------------------

def test_modernbert_converts_its_global_layers_by_default_and_sliding_ones_only_when_asked():
    model = linearize.convert(build("modernbert"), "hedgehog")
    record = conversion_record(model)
    assert record.layers == (0,) and record.sliding_window_layers == (1, 2)
    assert [hasattr(m, "linearize_map") for _, m in attention_modules(model)] == [True, False, False]
    every = linearize.convert(build("modernbert"), "hedgehog", convert_sliding_window=True)
    assert conversion_record(every).layers == (0, 1, 2)
    assert conversion_record(linearize.convert(build("modernbert"), "hedgehog", layers=[1],
                                               convert_sliding_window=True)).layers == (1,)
    model = build("modernbert")
    with pytest.raises(LinearizeError, match=r"^layers \[1\] attend through a sliding window: pass "
                                             r"convert_sliding_window=True \(--convert-sliding-window\)"):
        linearize.convert(model, "hedgehog", layers=[0, 1])
    assert not is_converted(model)


@pytest.mark.parametrize("seq_q, seq_k, radius", [(1, 1, 0), (9, 9, 2), (5, 9, 2), (9, 5, 3), (33, 33, 64)])
def test_the_band_mask_is_the_window_by_its_definition(seq_q, seq_k, radius):
    rows, cols = torch.arange(seq_q)[:, None], torch.arange(seq_k)[None, :]
    band = band_mask(seq_q, seq_k, radius)
    assert band.dtype == torch.bool and torch.equal(band, (rows - cols).abs() <= radius)


def test_sliding_window_layers_stay_local_softmax_or_linear():
    """Row i of a sliding-window layer's attention is zero beyond |i - j| > 2, softmax or converted; a
    global layer's is not; and a sliding layer whose window is removed gives another output."""
    batch = batch_for("modernbert")
    band = band_mask(SEQ, SEQ, 2)
    for convert_all in (False, True):
        model = linearize.convert(build("modernbert"), "hedgehog", convert_sliding_window=convert_all)
        with torch.no_grad():
            attentions = model(**batch, output_attentions=True).attentions
        assert (attentions[0][..., ~band] > 0).any()  # global
        for layer in (1, 2):
            assert torch.all(attentions[layer][..., ~band] == 0), (convert_all, layer)
            torch.testing.assert_close(attentions[layer][0].sum(-1), torch.ones(4, SEQ), atol=1e-5, rtol=0)
        reference = first_output(model, batch)
        for _, module in attention_modules(model):
            module.sliding_window = None  # what a silently global layer would compute
        assert not torch.allclose(first_output(model, batch), reference, atol=1e-3)


@pytest.mark.parametrize("method", linearize.methods())
def test_windowed_linear_attention_equals_its_quadratic_reference(method):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 37, 8, generator=g) for _ in range(3))
    mask = torch.ones(2, 37, dtype=torch.bool)
    mask[1, 30:] = False
    fm = create_feature_map(method, 8, 3)
    for radius in (0, 3, 40):
        if fm.exact_softmax:
            out, weights = windowed_softmax_attention(q, k, v, radius, mask, output_attentions=True)
            allowed = band_mask(37, 37, radius) & mask[:, None, None, :]
            scores = (q @ k.transpose(-1, -2) / 8**0.5).masked_fill(~allowed, float("-inf"))
            expected = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a window without a real key: zeros
            torch.testing.assert_close(weights, expected, atol=1e-6, rtol=0)
            torch.testing.assert_close(out, expected @ v, atol=1e-5, rtol=0)
            continue
        reference = windowed_quadratic_attention(q, k, v, fm, radius, mask)
        # Flexformer's kernel values can be negative: rows whose window normaliser nearly cancels
        # (|Σκ| < 1% of Σ|κ|) blow rounding up in both forms alike and are left out, as in test_fast_paths
        kappa = kernel_matrix(q, k, fm, mask) * band_mask(37, 37, radius)
        total = kappa.abs().sum(-1)
        ok = (kappa.sum(-1).abs() > 1e-2 * total) | (total == 0)  # an empty window: ε-uniform in both
        assert ok.float().mean() > 0.9
        for block in (1, 5, 256):
            torch.testing.assert_close(windowed_linear_attention(q, k, v, fm, radius, mask, block_size=block)[ok],
                                       reference[ok], atol=1e-5, rtol=1e-5)
        weights = windowed_attention_weights(q, k, fm, radius, mask)
        assert torch.all(weights[..., ~band_mask(37, 37, radius)] == 0) and torch.all(weights[1, ..., 30:] == 0)


def test_windowed_linear_attention_trains_like_its_reference():
    """Stage 2 fine-tunes through the blockwise path: its gradients (inputs and the map's parameters)
    equal the quadratic reference's."""
    fm = create_feature_map("hedgehog", 8, 3)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 20, 8, generator=g, requires_grad=True) for _ in range(3))
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, 15:] = False
    wrt = [q, k, v, *fm.parameters()]
    fast = torch.autograd.grad(windowed_linear_attention(q, k, v, fm, 3, mask, block_size=4).square().sum(), wrt)
    slow = torch.autograd.grad(windowed_quadratic_attention(q, k, v, fm, 3, mask).square().sum(), wrt)
    for got, want in zip(fast, slow):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("method", [m for m in linearize.methods() if m != "softmax"])
def test_every_method_runs_on_rotated_queries_and_keys(method):
    """ModernBERT hands the attention function q and k after its rotary embedding: every feature map
    takes them, in global and windowed layers, and stays padding invariant. Flexformer's kernel values
    can be negative: a 5-key window's normaliser can nearly cancel (measured: |Σκ| = Σ|κ| / 92), which
    turns float32 rounding of another summation order into ~1e-3, so signed maps get 1e-2."""
    model = linearize.convert(build("modernbert"), method, convert_sliding_window=True)
    padded = batch_for("modernbert")
    alone = {key: value[1:, :SEQ - PAD] for key, value in padded.items()}
    out = first_output(model, padded)
    assert out.isfinite().all()
    tolerance = 1e-4 if attention_modules(model)[0][1].linearize_map.nonnegative else 1e-2
    torch.testing.assert_close(out[1, :SEQ - PAD], first_output(model, alone)[0], atol=tolerance, rtol=0)


def test_a_causal_call_and_stage1_on_a_windowed_layer_are_refused():
    model = linearize.convert(build("modernbert"), "hedgehog", convert_sliding_window=True)
    module = attention_modules(model)[1][1]
    q = torch.randn(1, 4, 5, 8)
    with pytest.raises(LinearizeError, match="this layer is causal"):
        linearize_attention_forward(module, q, q, q, None, is_causal=True)
    module.linearize_map.attend_hook = lambda *args: None
    with pytest.raises(LinearizeError, match="^stage-1 attention distillation does not support sliding-window"):
        linearize_attention_forward(module, q, q, q, None, sliding_window=3)


# ---- lengths: rotary positions have nothing to extend ---------------------------------------------

def test_max_length_on_rotary_models_is_a_no_op_up_to_their_limit_and_an_error_beyond():
    original = build("modernbert")
    limit = original.config.max_position_embeddings
    model = linearize.convert(copy.deepcopy(original), "softmax", max_length=limit)
    assert model.config.max_position_embeddings == limit and conversion_record(model).max_length == limit
    torch.testing.assert_close(first_output(model, batch_for("modernbert")),
                               first_output(original, batch_for("modernbert")), atol=1e-5, rtol=0)
    for max_length, position_init, message in [
        (limit + 1, None, f"^'modernbert' has rotary positions trained up to {limit} tokens and nothing to extend: "
                          f"pass max_length ≤ {limit}"),
        (0, None, "^max_length must be a positive number of tokens"),
        (512, "interpolate", "^position_init='interpolate' applies to learned position tables"),
    ]:
        model = build("gte")
        with pytest.raises(LinearizeError, match=message.replace("modernbert", "gte").replace(str(limit), str(
                model.config.max_position_embeddings))):
            linearize.convert(model, "hedgehog", max_length=max_length, position_init=position_init)
        assert not is_converted(model)


# ---- save and reload -------------------------------------------------------------------------------

def test_every_head_reloads_with_linearize_and_without_it(tmp_path):
    jobs = []
    for index, (model_type, auto) in enumerate(CASES):
        every_layer = model_type == "modernbert" and auto == "AutoModel"  # windowed layers after reload too
        model = linearize.convert(build(model_type, auto), "hedgehog", convert_sliding_window=every_layer)
        batch = batch_for(model_type, auto)
        want = first_output(model, batch)
        out = tmp_path / f"{index}-{model_type}-{auto}"
        model.save_pretrained(out)
        reloaded = linearize.load(out)
        assert type(reloaded).__name__ == type(model).__name__ and conversion_record(reloaded) == conversion_record(model)
        torch.testing.assert_close(first_output(reloaded, batch), want, atol=1e-6, rtol=0)
        torch.save((batch, want), tmp_path / f"{index}.pt")
        jobs.append([str(out), auto, str(tmp_path / f"{index}.pt")])
    results = check_without_linearize(jobs)
    for directory, auto, _ in jobs:
        class_name, error = results[directory]
        assert class_name.startswith("Linearize") and error <= 1e-5, (directory, class_name, error)


def test_cli_converts_modernbert_with_and_without_its_sliding_window_layers(tmp_path):
    source = tmp_path / "tiny-modernbert"
    build("modernbert", "AutoModelForSequenceClassification").save_pretrained(source)
    runner = CliRunner()
    for flag, layers in (([], [0]), (["--convert-sliding-window"], [0, 1, 2])):
        out = tmp_path / f"out{len(flag)}"
        result = runner.invoke(app, ["convert", str(source), "--method", "hedgehog", "--out", str(out), *flag])
        assert result.exit_code == 0, result.output
        assert list(conversion_record(linearize.load(out)).layers) == layers
        info = runner.invoke(app, ["info", str(out)])
        assert ("[1, 2] stay windowed softmax" in info.output) == (not flag), info.output
    result = runner.invoke(app, ["convert", str(source), "--method", "hedgehog", "--out", str(tmp_path / "long"),
                                 "--max-length", "9000"])
    assert result.exit_code != 0 and "has rotary positions trained up to 8192 tokens" in result.output
