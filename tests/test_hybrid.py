"""Hybrid attention (``linearize.attention.hybrid``): exact softmax over a window of nearby keys and a few
sink tokens, linear attention over the rest, in one normalisation. The blocked fast path against the
naive N×N reference for every method, its exactness properties and gradients, the feature map's
settings, conversion (HF and timm), save/load and remote code, stage 1, compile / ONNX and the CLI."""

import json
import shlex
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
import transformers
from torch.utils.data import DataLoader
from typer.testing import CliRunner

import linearize
from linearize.attention import create_feature_map
from linearize.attention import hybrid
from linearize.attention.core import feature_maps, kernel_matrix, softmax_attention_weights
from linearize.attention.hybrid import (hybrid_attention, hybrid_attention_weights, hybrid_quadratic_attention,
                                        parse_sinks, sink_positions)
from linearize.cli import app
from linearize.convert import conversion_record, feature_maps_of, is_converted
from linearize.distill import DistillConfig, attention_cross_entropy, blockwise_distillation_terms, distill
from linearize.errors import LinearizeError, OptionError
from test_feature_maps import CASE_IDS, METHOD_CASES
from tiny_models import SMALL, VOCAB, WITHOUT_LINEARIZE, assert_onnx_matches_pytorch, build, inputs

try:  # what onnxruntime raises for an input the exported graph does not take
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument as OnnxInvalidArgument
except ImportError:  # the ONNX test skips then
    OnnxInvalidArgument = Exception

B, H, N, D = 3, 2, 40, 16
SINK_CASES = [(), ("first",), ("first", "last")]
runner = CliRunner()


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: one thread (two OpenMP threads beside another busy process wait on their barrier
    for milliseconds per op, as conftest.py explains for xdist workers)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def qkv(n=N, seed=0, batch=B, heads=H, dim=D, scale=1.5):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, heads, n, dim, generator=g) * s for s in (scale, scale, 1.0))


def padding(kind, n=N, batch=B):
    """None, or a [batch, n] float mask: sequence 0 all real, sequence 1 with 7 pads on the right (or the
    left), sequence 2 a one-token sequence (its token at the start, or at the end for left padding)."""
    if kind == "none":
        return None
    mask = torch.ones(batch, n)
    if kind == "right":
        mask[1, n - 7:] = 0
        mask[2, 1:] = 0
    else:
        mask[1, :7] = 0
        mask[2, :n - 1] = 0
    return mask


def real_rows(mask, n=N, batch=B, heads=H):
    """[batch, heads, n] bool: the query rows of real tokens."""
    real = torch.ones(batch, n, dtype=torch.bool) if mask is None else mask.bool()
    return real[:, None, :].expand(batch, heads, n)


def make(name, opts=None, seed=0, heads=H, dim=D):
    torch.manual_seed(seed)
    return create_feature_map(name, dim, heads, **(opts or {}))


def relative_error(out, ref, rows):
    """Max |out − ref| over ``rows``, relative to the reference's largest value there (at least 1)."""
    return (out - ref)[rows].abs().max().item() / max(1.0, ref[rows].abs().max().item())


def well_conditioned(fm, q, k, mask):
    """[B, H, N] bool: the rows whose kernel normaliser does not nearly cancel. Flexformer's kernel values
    can be negative: where |Σκ| < 1% of Σ|κ| rounding blows up in every form alike, so such rows are
    left out, as in test_fast_paths (at least 90% of the rows stay)."""
    kappa = kernel_matrix(q, k, fm, mask)
    ok = kappa.sum(-1).abs() > 1e-2 * kappa.abs().sum(-1)
    assert ok.float().mean() > 0.9
    return ok


def exact_set_by_hand(mask, n, radius, sinks):
    """[B, 1, n, n] bool, E_i built from the docstring's definition with plain Python loops: the query's
    block of `radius` tokens and the two neighbouring blocks (BigBird's blocked window), and the sinks
    (radius 0: no window, the sinks only)."""
    batch = 1 if mask is None else mask.shape[0]
    mask = torch.ones(batch, n) if mask is None else mask
    exact = torch.zeros(batch, 1, n, n, dtype=torch.bool)
    for b in range(batch):
        real = [j for j in range(n) if mask[b, j] > 0]
        marked = set()
        if real and "first" in sinks:
            marked.add(real[0])
        if real and "last" in sinks:
            marked.add(real[-1])
        for i in range(n):
            for j in real:
                exact[b, 0, i, j] = (radius > 0 and abs(i // radius - j // radius) <= 1) or j in marked
    return exact


def test_the_blocked_window_holds_the_band_and_no_key_farther_than_two_blocks():
    """Every key within R positions is exact, none 2R or more away (module docstring)."""
    from linearize.attention.hybrid import exact_set

    for radius in (1, 3, 8):
        n = 40
        inside = exact_set(torch.arange(n), n, radius, (), torch.ones(1, n))[0, 0]
        distance = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs()
        assert inside[distance <= radius].all() and not inside[distance >= 2 * radius].any()


# ---- 1. the blocked fast path equals the naive reference, for every method --------------------------------

def test_the_method_matrix_covers_every_registered_method():
    assert {name for name, _ in METHOD_CASES} == set(linearize.methods()) - {"softmax"}


def one_shot(fm, monkeypatch):
    """``fm`` made to take the one-shot fast path (training's and the traced graph's) also without autograd:
    the chunked inference path only serves chunkable maps."""
    monkeypatch.setattr(fm, "chunkable", False)
    return fm


@pytest.mark.parametrize("path", ["one-shot", "chunked"])
@pytest.mark.parametrize("name,opts", METHOD_CASES, ids=CASE_IDS)
def test_fast_path_equals_the_quadratic_reference_for_every_method(name, opts, path, monkeypatch):
    fm = make(name, opts)
    if path == "chunked" and not fm.chunkable:
        pytest.skip(f"{name} is not chunkable: inference takes the one-shot path")
    if path == "one-shot":
        one_shot(fm, monkeypatch)
    calls = count_chunked_calls(monkeypatch)
    q, k, v = qkv()
    # 0: no window (the sinks alone, or no exact key); 1, 5: several blocks of 16 rows; N − 1, N + 3: every
    # window covers the whole sequence
    for radius in (0, 1, 5, N - 1, N + 3):
        for sinks in SINK_CASES:
            gamma = torch.tensor([0.5, 2.0]) if sinks else None  # γ per head, or the default 1
            for kind in ("none", "right", "left"):
                mask = padding(kind)
                with torch.no_grad():
                    out = hybrid_attention(q, k, v, fm, radius, sinks, gamma, mask)
                    ref = hybrid_quadratic_attention(q, k, v, fm, radius, sinks, gamma, mask)
                assert out.shape == v.shape and out.dtype == v.dtype
                assert torch.isfinite(out).all(), (radius, sinks, kind)  # padded rows too
                rows = real_rows(mask)
                if not radius and not sinks:  # nothing exact: a pure kernel normaliser, maybe near-cancelling
                    rows = rows & well_conditioned(fm, q, k, mask)
                error = relative_error(out, ref, rows)
                assert error <= 1e-4, (radius, sinks, kind, error)
    assert calls == ([] if path == "one-shot" else [1] * 2 * len(SINK_CASES) * 3)  # R = 1 and 5: blocks


def count_chunked_calls(monkeypatch):
    """A list that gains an item for every call of the chunked inference path."""
    calls = []
    chunked = hybrid.chunked_hybrid_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return chunked(*args, **kwargs)

    monkeypatch.setattr(hybrid, "chunked_hybrid_attention", counted)
    return calls


CHUNKABLE = [(name, opts) for name, opts in METHOD_CASES if make(name, opts).chunkable]


@pytest.fixture(params=["all-rows", "per-row", "a-few-rows"])
def exact_part_groups(request, monkeypatch):
    """The exact part in each grouping of its rows (``hybrid_chunked.SCORES_BYTES``): every row at once (the windows centred on
    the padding between rows computed and not used), row by row in a reused buffer, skipping them, or in groups of a
    few rows (a last group smaller than the others)."""
    from linearize.attention import hybrid_chunked
    budget = {"all-rows": 2**40, "per-row": 0, "a-few-rows": 16_000}[request.param]  # groups of 2-4 of the 6 rows
    monkeypatch.setattr(hybrid_chunked, "SCORES_BYTES", budget)
    return request.param


@pytest.mark.parametrize("name,opts", CHUNKABLE, ids=[f"{name}{opts or ''}" for name, opts in CHUNKABLE])
def test_chunked_path_over_several_chunks_equals_the_reference(name, opts, exact_part_groups):
    """The inference path in chunks of whole blocks (``hybrid_chunked``): chunk boundaries inside the
    sequence, a last chunk with a partial block, sinks in any chunk, padding on either side; keys that grow
    along the sequence, so a log-scaled map's running max rises from chunk to chunk (the sums so far are
    rescaled); lengths in decreasing order, so the reused buffers are larger than a call needs; the exact
    part's rows in every grouping."""
    fm = make(name, opts)
    gamma = torch.tensor([0.5, 2.0])
    for n, radius, chunk in [(70, 4, 8), (70, 7, 21), (45, 5, 5), (30, 4, 100)]:
        q, k, v = qkv(n=n, seed=21)
        k = k * torch.linspace(0.5, 2.0, n)[:, None]  # later keys larger
        for sinks in SINK_CASES:
            for kind in ("none", "right", "left"):
                mask = padding(kind, n=n)
                found = sink_positions(mask, B, n, sinks, "cpu") if sinks else None
                with torch.no_grad():
                    out = hybrid.chunked_hybrid_attention(q, k, v, fm, radius, found, gamma, mask, None, 1e-6, chunk)
                    ref = hybrid_quadratic_attention(q, k, v, fm, radius, sinks, gamma, mask)
                assert out.shape == v.shape and torch.isfinite(out).all()
                error = relative_error(out, ref, real_rows(mask, n=n))
                assert error <= 1e-4, (n, radius, chunk, sinks, kind, error)


@pytest.mark.parametrize("name,opts", [("hedgehog", {}), ("performer", {})], ids=["hedgehog", "performer"])
def test_chunked_path_without_padding_at_every_edge_length(name, opts, exact_part_groups):
    """Without padding the chunked path finds the keys and sinks each window leaves out from the length alone
    (slices, not masks) and, for a sequence of one chunk, reads the keys' halo for both passes: lengths of one
    token, shorter than a block, a block and one more, whole blocks, one short of a block; sinks in and out of
    every window; one chunk, and chunks of one and two blocks; a log-scaled map too (Performer); the exact
    part's rows in every grouping."""
    fm = make(name, opts)
    gamma = torch.tensor([0.5, 2.0])
    radius = 4
    for n in (1, 3, 4, 5, 8, 9, 12, 15, 17, 31):
        q, k, v = qkv(n=n, seed=n)
        for sinks in SINK_CASES:
            found = sink_positions(None, B, n, sinks, "cpu") if sinks else None
            ref = hybrid_quadratic_attention(q, k, v, fm, radius, sinks, gamma)
            for chunk in (None, 4, 8):
                with torch.no_grad():
                    out = hybrid.chunked_hybrid_attention(q, k, v, fm, radius, found, gamma, None, None, 1e-6, chunk)
                error = relative_error(out, ref, real_rows(None, n=n))
                assert error <= 1e-4, (name, n, sinks, chunk, error)


def test_block_sums_too_large_to_keep_are_allocated_per_call(monkeypatch):
    """Above ``BLOCK_SUMS_KEPT_BYTES`` the per-block sums are a tensor of the call, not a kept buffer:
    the same result."""
    from linearize.attention import hybrid_chunked

    fm = make("hedgehog")
    q, k, v = qkv(n=50, seed=23)
    mask = padding("right", n=50)
    found, gamma = sink_positions(mask, B, 50, ("first",), "cpu"), torch.tensor([0.5, 2.0])
    with torch.no_grad():
        kept = hybrid.chunked_hybrid_attention(q, k, v, fm, 4, found, gamma, mask, None, 1e-6, 16)
        monkeypatch.setattr(hybrid_chunked, "BLOCK_SUMS_KEPT_BYTES", 0)
        fresh = hybrid.chunked_hybrid_attention(q, k, v, fm, 4, found, gamma, mask, None, 1e-6, 16)
    ref = hybrid_quadratic_attention(q, k, v, fm, 4, ("first",), gamma, mask)
    rows = real_rows(mask, n=50)
    assert relative_error(fresh, ref, rows) <= 1e-5 and torch.equal(fresh, kept)


def test_inference_takes_the_chunked_path_and_training_the_one_shot_one(monkeypatch):
    """Without autograd a chunkable map runs chunk by chunk; where a gradient is wanted (the map's
    parameters or the inputs need one) the one-shot path runs, and their outputs agree."""
    fm = make("hedgehog")
    calls = count_chunked_calls(monkeypatch)
    q, k, v = qkv(seed=22)
    with torch.inference_mode():
        inference = hybrid_attention(q, k, v, fm, 5, ("first",), None, padding("right"))
    assert calls == [1]
    trained = hybrid_attention(q, k, v, fm, 5, ("first",), None, padding("right"))
    assert calls == [1] and trained.requires_grad
    rows = real_rows(padding("right"))
    assert relative_error(inference, trained.detach(), rows) <= 1e-5


@pytest.mark.parametrize("name", ["hedgehog", "luna", "performer", "cosformer"])
def test_fast_path_with_blocks_wider_than_16_and_several_groups(name, monkeypatch):
    """The one-shot path with R = 20: blocks of 20 rows (the window reaches into both neighbouring blocks);
    GROUP_ROWS 40: groups of two blocks, so a 70-token sequence runs in two groups (the second one short)."""
    fm = one_shot(make(name), monkeypatch)
    n = 70
    q, k, v = qkv(n=n, seed=3)
    gamma = torch.tensor([0.5, 2.0])
    for groups in (hybrid.GROUP_ROWS, 40):
        monkeypatch.setattr(hybrid, "GROUP_ROWS", groups)
        for radius in (17, 20):
            for kind in ("none", "right", "left"):
                mask = padding(kind, n=n)
                with torch.no_grad():
                    out = hybrid_attention(q, k, v, fm, radius, ("first", "last"), gamma, mask)
                    ref = hybrid_quadratic_attention(q, k, v, fm, radius, ("first", "last"), gamma, mask)
                assert relative_error(out, ref, real_rows(mask, n=n)) <= 1e-5, (groups, radius, kind)


@pytest.mark.parametrize("name", ["hedgehog", "luna", "elu"])
def test_no_window_and_no_sinks_is_plain_linear_attention(name):
    """Nothing exact: the linear part alone, whatever γ (it cancels in the normalisation)."""
    fm = make(name)
    q, k, v = qkv(seed=15)
    mask = padding("right")
    with torch.no_grad():
        out = hybrid_attention(q, k, v, fm, 0, (), torch.tensor([0.2, 5.0]), mask)
    rows = real_rows(mask)
    torch.testing.assert_close(out[rows], linearize.linear_attention(q, k, v, fm, mask)[rows], atol=1e-5, rtol=1e-4)
    weights = hybrid_attention_weights(q, k, fm, 0, (), torch.tensor([0.2, 5.0]), mask)
    torch.testing.assert_close(weights, linearize.linear_attention_weights(q, k, fm, mask), atol=1e-6, rtol=1e-5)


def test_fast_path_in_low_precision_matches_the_reference_in_its_dtype():
    fm = make("hedgehog")
    q, k, v = qkv(seed=4)
    mask = padding("right")
    for dtype in (torch.bfloat16, torch.float16):
        with torch.no_grad():
            out = hybrid_attention(q.to(dtype), k.to(dtype), v.to(dtype), fm, 5, ("first",), None, mask)
        ref = hybrid_quadratic_attention(q, k, v, fm, 5, ("first",), None, mask)
        assert out.dtype == dtype and torch.isfinite(out).all()
        assert relative_error(out.float(), ref, real_rows(mask)) <= 5e-2, dtype


def test_sink_positions_are_each_sequences_first_and_last_real_token():
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 0]])
    positions, valid = sink_positions(mask, 4, 5, ("first", "last"), "cpu")
    assert positions.tolist() == [[0, 4], [2, 3], [3, 3], [4, 0]]
    # the one-token sequence keeps one sink, the empty sequence none
    assert valid.tolist() == [[True, True], [True, True], [True, False], [False, False]]
    positions, valid = sink_positions(None, 2, 6, ("last",), "cpu")
    assert positions.tolist() == [[5], [5]] and valid.all()


def test_a_sequence_without_real_tokens_gives_zeros_not_nan():
    fm = make("hedgehog")
    q, k, v = qkv(n=30, seed=14, batch=2)
    mask = torch.ones(2, 30)
    mask[1] = 0
    for radius in (3, 40):  # the blocked path and the exact-softmax path
        with torch.no_grad():
            out = hybrid_attention(q, k, v, fm, radius, ("first", "last"), None, mask)
        ref = hybrid_quadratic_attention(q, k, v, fm, radius, ("first", "last"), None, mask)
        assert torch.all(out[1] == 0) and torch.all(ref[1] == 0)
        torch.testing.assert_close(out[0], ref[0], atol=1e-5, rtol=1e-5)
    weights = hybrid_attention_weights(q, k, fm, 3, ("first", "last"), None, mask)
    assert torch.isfinite(weights).all() and torch.all(weights[1] == 0)


def test_parse_sinks():
    assert parse_sinks(None) == parse_sinks("none") == parse_sinks("") == parse_sinks([]) == ()
    assert parse_sinks("last,first") == parse_sinks("first+last") == parse_sinks(["last", "first"]) == \
        ("first", "last")
    assert parse_sinks(" first ") == ("first",)
    with pytest.raises(ValueError, match="unknown sink 'middle'"):
        parse_sinks("middle")
    with pytest.raises(ValueError, match="unknown sink 'middle'"):
        parse_sinks("first,middle")


def test_cross_attention_is_refused():
    fm = make("hedgehog")
    q, k, v = qkv()
    with pytest.raises(ValueError, match="self-attention"):
        hybrid_attention(q[:, :, :10], k, v, fm, 3)
    with pytest.raises(ValueError, match="self-attention"):
        hybrid_attention_weights(q[:, :, :10], k, fm, 3)


# ---- 2. exactness properties ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["hedgehog", "elu", "flexformer-s", "luna"])
def test_a_window_covering_the_sequence_is_exact_softmax(name):
    fm = make(name)
    q, k, v = qkv(seed=5)
    for kind in ("none", "right", "left"):
        mask = padding(kind)
        sdpa_mask = None if mask is None else mask.bool()[:, None, None, :]
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask)
        for radius in (N - 1, 2 * N):
            with torch.no_grad():
                out = hybrid_attention(q, k, v, fm, radius, ("first", "last"), None, mask)
            torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
            # the reference too: every real key is exact, the linear part is empty
            ref = hybrid_quadratic_attention(q, k, v, fm, radius, (), None, mask)
            rows = real_rows(mask)
            torch.testing.assert_close(ref[rows], expected[rows], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name,opts", METHOD_CASES, ids=CASE_IDS)
def test_rows_are_distributions_over_real_keys(name, opts):
    fm = make(name, opts)
    q, k, _ = qkv(n=20, seed=6)
    for kind in ("right", "left"):
        mask = padding(kind, n=20)
        weights = hybrid_attention_weights(q, k, fm, 3, ("first", "last"), torch.tensor([0.3, 3.0]), mask)
        assert weights.shape == (B, H, 20, 20) and weights.dtype == torch.float32
        torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, 20), atol=1e-5, rtol=0)
        assert torch.all(weights.masked_select(~mask.bool()[:, None, None, :].expand_as(weights)) == 0)
        if not name.startswith("flexformer"):  # trigonometric features: kernel values can be negative
            assert torch.all(weights >= 0)


@pytest.mark.parametrize("name", ["hedgehog", "elu", "luna", "cosformer"])
def test_a_tiny_gamma_leaves_softmax_over_the_exact_set(name):
    """γ → 0 removes the linear part: each row is the softmax of the scores restricted to E_i (built
    here by hand from the docstring's definition)."""
    fm = make(name)
    q, k, _ = qkv(n=24, seed=7)
    for radius in (0, 1, 4):
        for sinks in SINK_CASES if radius else SINK_CASES[1:]:  # radius 0 and no sinks: nothing exact
            for kind in ("none", "right", "left"):
                mask = padding(kind, n=24)
                exact = exact_set_by_hand(mask, 24, radius, sinks).expand(B, 1, 24, 24)
                scores = (q @ k.transpose(-1, -2)) * D**-0.5
                expected = torch.softmax(scores.masked_fill(~exact, float("-inf")), dim=-1)
                weights = hybrid_attention_weights(q, k, fm, radius, sinks, torch.full((H,), 1e-8), mask)
                rows = real_rows(mask, n=24)  # a padded query far from every real key has no exact key
                torch.testing.assert_close(weights[rows], expected[rows], atol=2e-5, rtol=1e-4,
                                           msg=f"{radius} {sinks} {kind}")
                assert torch.isfinite(weights).all()


@pytest.mark.parametrize("name", ["hedgehog", "t2r", "flexformer-n"])
def test_rows_follow_the_docstring_formula(name):
    """With γ per head, A_ij = w_ij / Σ_l w_il, w_ij = exp(s_ij − c_i) on E_i (c_i the max over E_i),
    γ_h κ_ij off it, plus ε/n on every real key: recomputed here from the scores, the kernel matrix
    and a hand-built E_i."""
    fm = make(name)
    n, radius, sinks, eps = 24, 3, ("first", "last"), 1e-6
    q, k, _ = qkv(n=n, seed=8)
    gamma = torch.tensor([0.25, 4.0])
    mask = padding("left", n=n)
    exact = exact_set_by_hand(mask, n, radius, sinks).expand(B, H, n, n)
    scores = (q @ k.transpose(-1, -2)) * D**-0.5
    top = scores.masked_fill(~exact, float("-inf")).amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    kappa = kernel_matrix(q, k, fm, mask)
    w = torch.where(exact, torch.exp(scores - top), gamma[None, :, None, None] * kappa)
    w = w * mask[:, None, None, :] + eps / mask.sum(1)[:, None, None, None] * mask[:, None, None, :]
    expected = w / w.sum(-1, keepdim=True)
    weights = hybrid_attention_weights(q, k, fm, radius, sinks, gamma, mask)
    torch.testing.assert_close(weights, expected, atol=1e-5, rtol=1e-4)
    # inside the window the weight is exp(s − c)/den: ratios of two exact keys are softmax ratios
    i, j1, j2 = 10, 9, 11
    ratio = weights[0, :, i, j1] / weights[0, :, i, j2]
    torch.testing.assert_close(ratio, torch.exp(scores[0, :, i, j1] - scores[0, :, i, j2]), atol=1e-4, rtol=1e-4)


# ---- 3. gradients -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("groups", [None, 10], ids=["one-group", "groups-of-10-rows"])
@pytest.mark.parametrize("name", ["hedgehog", "luna"])
def test_gradients_of_the_fast_path_equal_the_references(name, groups, monkeypatch):
    """Gradients of every input, γ and the map's parameters; also with the query rows in several groups
    (their windows and rows taken as pieces of one split)."""
    if groups:
        monkeypatch.setattr(hybrid, "GROUP_ROWS", groups)
    fm = make(name)
    params = [p for p in fm.parameters() if p.requires_grad]
    assert params
    for radius, sinks, kind in [(1, ("first", "last"), "right"), (5, ("first",), "left"), (5, (), "none"),
                                (15, ("last",), "right"), (0, ("first", "last"), "left")]:
        q, k, v = (t.requires_grad_(True) for t in qkv(seed=9))
        gamma = torch.tensor([0.7, 1.3], requires_grad=True)
        mask = padding(kind)
        rows = real_rows(mask).float()[..., None]
        g = torch.Generator().manual_seed(1)
        weight = torch.randn(B, H, N, D, generator=g) * rows  # padded query rows left out of the loss
        wrt = [q, k, v, gamma, *params]
        fast = torch.autograd.grad((hybrid_attention(q, k, v, fm, radius, sinks, gamma, mask) * weight).sum(), wrt)
        ref = torch.autograd.grad((hybrid_quadratic_attention(q, k, v, fm, radius, sinks, gamma, mask) * weight).sum(),
                                  wrt)
        for index, (a, e) in enumerate(zip(fast, ref)):
            assert torch.isfinite(a).all()
            assert e.abs().sum() > 0, (radius, index)  # every input matters, gamma and the map included
            atol = 1e-5 * max(1.0, e.abs().max().item())
            torch.testing.assert_close(a, e, atol=atol, rtol=1e-4,
                                       msg=f"{name} R={radius} {sinks} {kind} input {index}")


def test_attend_trains_the_hybrid_gamma():
    fm = make("hedgehog").make_hybrid(5, "first,last", gamma=0.5)
    torch.testing.assert_close(fm.hybrid_log_gamma.detach(), torch.full((H,), 0.5).log())
    torch.testing.assert_close(fm.hybrid_gamma(), torch.full((H,), 0.5))
    q, k, v = qkv(seed=10)
    mask = padding("right")
    out, weights = fm.attend(q, k, v, mask, output_attentions=True)
    torch.testing.assert_close(out, hybrid_attention(q, k, v, fm, 5, ("first", "last"), fm.hybrid_gamma(), mask))
    torch.testing.assert_close(weights, hybrid_attention_weights(q, k, fm, 5, ("first", "last"), fm.hybrid_gamma(),
                                                                 mask))
    (out * real_rows(mask)[..., None]).pow(2).sum().backward()
    assert fm.hybrid_log_gamma.grad is not None and fm.hybrid_log_gamma.grad.abs().min() > 0


# ---- 4. FeatureMap.make_hybrid's checks --------------------------------------------------------------------

def test_make_hybrid_settings_and_errors():
    fm = make("hedgehog").make_hybrid(8, "last,first", gamma=2.0)
    assert fm.window == 8 and fm.sinks == ("first", "last") and fm.hybrid_log_gamma.shape == (H,)
    assert "hybrid_log_gamma" in dict(fm.named_parameters())
    plain = make("hedgehog").make_hybrid(0)
    assert plain.window == 0 and plain.sinks == () and not hasattr(plain, "hybrid_log_gamma")
    q, k, v = qkv(seed=11)
    torch.testing.assert_close(plain.attend(q, k, v)[0], linearize.linear_attention(q, k, v, plain))
    with pytest.raises(OptionError, match="window must be >= 0"):
        make("hedgehog").make_hybrid(-1)
    for gamma in (0.0, -1.0):
        with pytest.raises(OptionError, match="gamma > 0"):
            make("hedgehog").make_hybrid(4, gamma=gamma)
    sinks_only = make("hedgehog").make_hybrid(0, "first")  # no window: the sinks alone are exact
    assert sinks_only.is_hybrid and sinks_only.window == 0 and sinks_only.sinks == ("first",)
    assert sinks_only.hybrid_log_gamma.shape == (H,)
    assert not plain.is_hybrid
    torch.testing.assert_close(sinks_only.attend(q, k, v)[0],
                               hybrid_attention(q, k, v, sinks_only, 0, ("first",), sinks_only.hybrid_gamma()))
    for window, sinks in ((4, ()), (0, "first"), (4, "first,last")):
        with pytest.raises(OptionError, match="softmax is exact already"):
            make("softmax").make_hybrid(window, sinks)
    with pytest.raises(ValueError, match="unknown sink 'middle'"):
        make("hedgehog").make_hybrid(4, "middle")


def test_gamma_starts_at_the_methods_measured_value_unless_given():
    """γ's start defaults to the method's ``initial_gamma`` (measured before training: Hedgehog 0.1, T2R 0.03,
    DARKFormer 10, Performer 10, Flexformer-n 0.03, Flexformer-s 3; docs/experiments/hybrid), in the feature
    map and through ``convert``; a given γ wins."""
    from linearize.convert.api import hybrid_settings

    for name, start in (("hedgehog", 0.1), ("t2r", 0.03), ("darkformer", 10.0), ("performer", 10.0),
                        ("flexformer-n", 0.03), ("flexformer-s", 3.0), ("luna", 0.1), ("elu", 0.1)):
        torch.testing.assert_close(make(name).make_hybrid(4).hybrid_gamma(), torch.full((H,), start))
        assert hybrid_settings(4, "first", None, name)["gamma"] == pytest.approx(start)
    assert hybrid_settings(4, "first", 0.5, "t2r")["gamma"] == 0.5
    record = conversion_record(hybrid_bert(method="t2r"))
    assert record.gamma == pytest.approx(0.03)


# ---- 5. conversion of a Hugging Face model -----------------------------------------------------------------

def hybrid_bert(window=4, sinks="first,last", method="hedgehog", **kwargs):
    return linearize.convert(build("bert"), method, window=window, sinks=sinks, **kwargs)


def layer0_qk(model, batch):
    """Layer 0's queries and keys ``[B,H,N,d]`` (recomputed from the embeddings) and its scale."""
    with torch.no_grad():
        hidden = model(**batch, output_hidden_states=True).hidden_states[0]
        attention = model.bert.encoder.layer[0].attention.self
        shape = (*hidden.shape[:2], -1, attention.attention_head_size)
        q = attention.query(hidden).view(shape).transpose(1, 2)
        k = attention.key(hidden).view(shape).transpose(1, 2)
    return q, k, attention.scaling


def test_converted_bert_records_the_settings_and_returns_hybrid_rows():
    model = hybrid_bert(gamma=0.5)
    record = conversion_record(model)
    assert (record.window, record.sinks, record.gamma) == (4, ("first", "last"), 0.5)
    assert record.hybrid == {"window": 4, "sinks": ("first", "last"), "gamma": 0.5, "hybrid_layers": None}
    maps = feature_maps_of(model)
    assert sorted(maps) == [0, 1]
    assert all(fm.window == 4 and fm.sinks == ("first", "last") for fm in maps.values())
    torch.testing.assert_close(maps[0].hybrid_gamma(), torch.full((4,), 0.5))
    batch = inputs("bert", seq=12, pad=3)
    with torch.no_grad():
        attentions = model(**batch, output_attentions=True).attentions
    assert len(attentions) == 2 and attentions[0].shape == (2, 4, 12, 12)
    q, k, scale = layer0_qk(model, batch)
    expected = hybrid_attention_weights(q, k, maps[0], 4, ("first", "last"), maps[0].hybrid_gamma(),
                                        batch["attention_mask"], scale)
    torch.testing.assert_close(attentions[0].float(), expected, atol=1e-5, rtol=1e-4)
    for rows in attentions:
        torch.testing.assert_close(rows.sum(-1), torch.ones(2, 4, 12), atol=1e-5, rtol=0)
        assert torch.all(rows[1, :, :, 9:] == 0)  # the padded keys
    linear = linearize.convert(build("bert"), "hedgehog")
    assert conversion_record(linear).hybrid is None and conversion_record(linear).window == 0
    with torch.no_grad():
        linear_rows = linear(**batch, output_attentions=True).attentions
        assert not torch.allclose(linear_rows[0], attentions[0], atol=1e-3)
        assert not torch.allclose(linear(**batch).logits, model(**batch).logits, atol=1e-4)


def test_an_input_within_the_window_gives_the_softmax_models_output():
    reference = build("bert")
    model = hybrid_bert(window=4)
    for seq, pad in [(8, 2), (8, 0), (5, 0), (3, 1), (1, 0)]:  # at most 2R tokens: every window covers them
        batch = inputs("bert", seq=seq, pad=pad, seed=seq)
        with torch.no_grad():
            torch.testing.assert_close(model(**batch).logits, reference(**batch).logits, atol=1e-5, rtol=1e-5)
    # 12 tokens, blocks 0-3, 4-7, 8-11: blocks 0 and 2 are out of each other's windows, and only the first
    # and last tokens are sinks, so queries 0-3 see keys 9 and 10 through the linear part
    batch = inputs("bert", seq=12, pad=0)
    with torch.no_grad():
        assert not torch.allclose(model(**batch).logits, reference(**batch).logits, atol=1e-5)


def test_sliding_window_layers_are_never_hybrid():
    config = transformers.ModernBertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                           intermediate_size=64, global_attn_every_n_layers=3, local_attention=8,
                                           initializer_range=0.2, max_position_embeddings=64, pad_token_id=0,
                                           bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
    torch.manual_seed(0)
    source = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    for hybrid_options in ({"window": 4}, {"sinks": "first"}):
        with pytest.raises(LinearizeError, match="sliding window already"):
            linearize.convert(source, "hedgehog", convert_sliding_window=True, **hybrid_options)
        assert not is_converted(source)
    model = linearize.convert(source, "hedgehog", window=4, sinks="first")
    record = conversion_record(model)
    assert record.sliding_window_layers == (1, 2) and record.layers == (0,)
    assert sorted(feature_maps_of(model)) == [0] and feature_maps_of(model)[0].window == 4
    with torch.no_grad():
        out = model(**inputs("bert", seq=20, pad=5)).logits
    assert torch.isfinite(out).all()


def test_convert_refuses_bad_hybrid_settings():
    for kwargs, message in [({"window": 4, "sinks": "middle"}, "middle"), ({"sinks": "first,middle"}, "middle"),
                            ({"window": -2}, "window"), ({"window": 4, "gamma": 0.0}, "gamma"),
                            ({"sinks": "first", "gamma": -1.0}, "gamma")]:
        model = build("bert")
        with pytest.raises(LinearizeError, match=message):
            linearize.convert(model, "hedgehog", **kwargs)
        assert not is_converted(model), kwargs
    for kwargs in ({"window": 4}, {"sinks": "first"}):
        model = build("bert")
        with pytest.raises(LinearizeError, match="softmax is exact already"):
            linearize.convert(model, "softmax", **kwargs)
        assert not is_converted(model)


def test_sinks_without_a_window():
    """window 0 with sinks: only each sequence's first/last real token is exact for every query."""
    model = hybrid_bert(window=0, sinks="first,last")
    record = conversion_record(model)
    assert (record.window, record.sinks) == (0, ("first", "last"))
    assert record.hybrid == {"window": 0, "sinks": ("first", "last"), "gamma": 0.1, "hybrid_layers": None}
    assert all(fm.is_hybrid and fm.window == 0 for fm in feature_maps_of(model).values())
    batch = inputs("bert", seq=12, pad=3)
    with torch.no_grad():
        attentions = model(**batch, output_attentions=True).attentions
    q, k, scale = layer0_qk(model, batch)
    fm = feature_maps_of(model)[0]
    expected = hybrid_attention_weights(q, k, fm, 0, ("first", "last"), fm.hybrid_gamma(), batch["attention_mask"],
                                        scale)
    torch.testing.assert_close(attentions[0].float(), expected, atol=1e-5, rtol=1e-4)
    with torch.no_grad():
        linear = linearize.convert(build("bert"), "hedgehog")
        assert not torch.allclose(linear(**batch).logits, model(**batch).logits, atol=1e-4)
        # two tokens (or one): both are sinks, every key is exact: the softmax model's output
        reference = build("bert")
        for seq, pad in [(2, 0), (2, 1), (1, 0)]:
            short = inputs("bert", seq=seq, pad=pad, seed=seq)
            torch.testing.assert_close(model(**short).logits, reference(**short).logits, atol=1e-5, rtol=1e-5)


REMOTE_HYBRID = WITHOUT_LINEARIZE + textwrap.dedent("""
    batch, expected = torch.load(sys.argv[1])
    results = {}
    for directory in sys.argv[2:]:
        model = transformers.AutoModelForSequenceClassification.from_pretrained(directory, trust_remote_code=True)
        with torch.no_grad():
            got = model.eval()(**batch).logits
        maps = [m.linearize_map for m in model.modules() if hasattr(m, "linearize_map")]
        difference = (got - expected[directory]).abs().max().item()
        results[directory] = {"class": type(model).__name__, "difference": difference,
                              "record": model.config.linearize["_data"], "windows": [m.window for m in maps],
                              "sinks": [list(m.sinks) for m in maps],
                              "log_gamma": [m.hybrid_log_gamma.tolist() if m.is_hybrid else None for m in maps]}
    assert not any(name.split(".")[0] == "linearize" for name in sys.modules)
    print(json.dumps(results))
""")


@pytest.mark.parametrize("window,sinks", [(4, ("first", "last")), (0, ("last",))], ids=["window", "sinks-only"])
def test_save_pretrained_and_linearize_load_keep_the_hybrid_layers(tmp_path, window, sinks):
    model = hybrid_bert(window=window, sinks=",".join(sinks))
    trained = set_trained_gamma(model)
    batch = inputs("bert", seq=12, pad=3)
    with torch.no_grad():
        expected = model(**batch).logits
    model.save_pretrained(tmp_path / "model")
    data = json.loads((tmp_path / "model" / "config.json").read_text())["linearize"]["_data"]
    assert (data["window"], data["sinks"]) == (window, list(sinks))
    loaded = linearize.load(tmp_path / "model")
    record = conversion_record(loaded)
    assert (record.window, record.sinks, record.gamma) == (window, sinks, 0.1)  # Hedgehog's start
    for index, fm in feature_maps_of(loaded).items():
        assert fm.window == window and fm.sinks == sinks
        torch.testing.assert_close(fm.hybrid_log_gamma.detach(), trained[index])
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, expected, atol=1e-6, rtol=1e-6)


def set_trained_gamma(model):
    """Give every layer a γ of its own (not the initial one: it must be what comes back); ``{layer: log γ}``."""
    trained = {}
    with torch.no_grad():
        for index, fm in feature_maps_of(model).items():
            trained[index] = torch.tensor([0.1, -0.3, 0.5, 0.0]) + index
            fm.hybrid_log_gamma.copy_(trained[index])
    return trained


def test_remote_code_without_linearize_keeps_the_hybrid_layers(tmp_path):
    """A fresh process where linearize cannot be imported: plain transformers and the saved remote code."""
    batch = inputs("bert", seq=12, pad=3)
    cases = {"window": (4, ("first", "last")), "sinks-only": (0, ("first",))}
    expected = {}
    for name, (window, sinks) in cases.items():
        model = hybrid_bert(window=window, sinks=",".join(sinks))
        set_trained_gamma(model)
        model.save_pretrained(tmp_path / name)
        with torch.no_grad():
            expected[str(tmp_path / name)] = model(**batch).logits
    torch.save((batch, expected), tmp_path / "batch.pt")
    done = subprocess.run([sys.executable, "-c", REMOTE_HYBRID, str(tmp_path / "batch.pt"), *expected],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for name, (window, sinks) in cases.items():
        result = results[str(tmp_path / name)]
        assert result["class"].startswith("Linearize")
        assert result["difference"] <= 1e-6, (name, result["difference"])
        assert result["record"]["window"] == window and result["record"]["sinks"] == list(sinks)
        assert result["windows"] == [window] * 2 and result["sinks"] == [list(sinks)] * 2
        for index, values in enumerate(result["log_gamma"]):
            assert values == pytest.approx([0.1 + index, -0.3 + index, 0.5 + index, 0.0 + index], abs=1e-6)


def test_remote_code_without_linearize_keeps_hybrid_layers_apart(tmp_path):
    """``hybrid_layers`` through the saved remote code: layer 1 hybrid with its trained γ, layer 0 pure."""
    batch = inputs("bert", seq=12, pad=3)
    model = hybrid_bert(window=4, sinks="first", hybrid_layers=[1])
    with torch.no_grad():
        feature_maps_of(model)[1].hybrid_log_gamma.copy_(torch.tensor([0.2, -0.1, 0.4, 0.3]))
        expected = {str(tmp_path / "model"): model(**batch).logits}
    model.save_pretrained(tmp_path / "model")
    torch.save((batch, expected), tmp_path / "batch.pt")
    done = subprocess.run([sys.executable, "-c", REMOTE_HYBRID, str(tmp_path / "batch.pt"), *expected],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])[str(tmp_path / "model")]
    assert result["difference"] <= 1e-6 and result["record"]["hybrid_layers"] == [1]
    assert result["windows"] == [0, 4] and result["log_gamma"][0] is None
    assert result["log_gamma"][1] == pytest.approx([0.2, -0.1, 0.4, 0.3], abs=1e-6)


# ---- 6. the timm backend -------------------------------------------------------------------------------------

def tiny_timm_vit():
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    # 32×32 images in 8×8 patches: 16 patches and the class token, 17 tokens
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2,
                             num_classes=3).eval()


def test_timm_vit_with_a_window_converts_saves_and_loads(tmp_path):
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    source = tiny_timm_vit()
    with torch.no_grad():
        reference = source(images)
    wide = linearize.convert(tiny_timm_vit(), "hedgehog", window=16)  # every window covers the 17 tokens
    with torch.no_grad():
        torch.testing.assert_close(wide(images), reference, atol=1e-5, rtol=1e-5)
    model = linearize.convert(tiny_timm_vit(), "hedgehog", window=3, sinks="first")
    linear = linearize.convert(tiny_timm_vit(), "hedgehog")
    maps = feature_maps_of(model)
    assert sorted(maps) == [0, 1] and all(fm.window == 3 and fm.sinks == ("first",) for fm in maps.values())
    with torch.no_grad():
        maps[1].hybrid_log_gamma.fill_(-1.0)
        out = model(images)
        assert out.shape == reference.shape and torch.isfinite(out).all()
        assert not torch.allclose(out, linear(images), atol=1e-4)
        assert not torch.allclose(out, reference, atol=1e-4)
    linearize.save(model, tmp_path / "vit")
    loaded = linearize.load(tmp_path / "vit")
    record = conversion_record(loaded)
    assert (record.window, record.sinks) == (3, ("first",))
    loaded_maps = feature_maps_of(loaded)
    assert all(fm.window == 3 and fm.sinks == ("first",) for fm in loaded_maps.values())
    torch.testing.assert_close(loaded_maps[1].hybrid_log_gamma.detach(), torch.full((3,), -1.0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), out, atol=1e-6, rtol=1e-6)


# ---- 7. stage 1 -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, opts", METHOD_CASES, ids=CASE_IDS)
def test_block_rows_equal_the_references_rows_and_gradients(name, opts):
    """Stage 1's rows (exact part formed on the window's columns and the sinks only) against the naive
    N×N reference, for row blocks at every offset, every window and sink choice, with padding."""
    q, k, _ = qkv(n=37, seed=21)
    q.requires_grad_(True)
    for radius, sinks, pad in [(4, ("first", "last"), "right"), (5, ("first",), "left"), (0, ("last",), "right"),
                               (3, (), "none"), (16, ("first", "last"), "left")]:
        fm = make(name, opts).make_hybrid(radius, ",".join(sinks) or "none", gamma=0.6)
        mask = padding(pad, n=37)
        expected = fm.attention_weights(q, k, mask)
        phi_q, phi_k, key_mask = feature_maps(q, k, fm, mask)
        for start, stop in [(0, 9), (9, 21), (21, 37), (6, 7)]:
            got = fm.block_rows(q[:, :, start:stop], k, phi_q[:, :, start:stop], phi_k, key_mask, start)
            torch.testing.assert_close(got, expected[:, :, start:stop], atol=1e-6, rtol=1e-5)
            weight = torch.randn_like(got)
            e_grad, = torch.autograd.grad((expected[:, :, start:stop] * weight).sum(), q, retain_graph=True)
            g_grad, = torch.autograd.grad((got * weight).sum(), q, retain_graph=True)
            torch.testing.assert_close(g_grad, e_grad, atol=1e-5 * max(1.0, e_grad.abs().max().item()), rtol=1e-4)


@pytest.mark.parametrize("name", ["hedgehog", "luna"])
def test_blockwise_stage1_loss_and_gradients_equal_the_one_shot_ones(name):
    fm = make(name).make_hybrid(5, "first,last", gamma=0.7)
    q, k, v = qkv(n=50, seed=12)
    q.requires_grad_(True)
    k.requires_grad_(True)
    mask = padding("right", n=50)
    wrt = [q, k] + [p for p in fm.parameters() if p.requires_grad]
    assert any(p is fm.hybrid_log_gamma for p in wrt)
    with torch.no_grad():
        teacher = softmax_attention_weights(q, k, mask)
    expected = attention_cross_entropy(teacher, fm.attention_weights(q, k, mask), mask)
    for block in (16, 7):
        got = blockwise_distillation_terms(q, k, v, fm, mask, block_size=block)
        torch.testing.assert_close(got.ce, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.out, teacher @ v, atol=1e-5, rtol=1e-5)
        e_grads = torch.autograd.grad(expected, wrt, retain_graph=True)
        g_grads = torch.autograd.grad(got.ce, wrt)
        for index, (e, a) in enumerate(zip(e_grads, g_grads)):
            atol = 1e-5 * max(1.0, e.abs().max().item())
            torch.testing.assert_close(a, e, atol=atol, rtol=1e-4, msg=f"block {block} gradient {index}")
        gamma_index = next(i for i, t in enumerate(wrt) if t is fm.hybrid_log_gamma)
        assert g_grads[gamma_index].abs().min() > 0  # stage 1 trains γ, every head
    # the hybrid rows are not the plain kernel rows: the loss differs from a pure linear map's
    plain = make(name)
    assert not torch.allclose(attention_cross_entropy(teacher, plain.attention_weights(q, k, mask), mask), expected)


def _loader(seq):
    examples = []
    for i in range(4):
        batch = inputs("bert", batch=2, seq=seq, pad=1 + 5 * (i % 2), seed=300 + i)
        examples.append({key: value[i % 2] for key, value in batch.items()})
    return DataLoader(examples, batch_size=2, shuffle=False)


def test_distill_trains_the_hybrid_gamma_one_shot_and_blockwise():
    quiet = {"progress": False, "log": lambda *a, **k: None}
    students = []
    for block in (0, 8):  # 24-token inputs: one shot, then blocks of 8 query rows
        student = hybrid_bert(window=3)
        before = {i: fm.hybrid_log_gamma.detach().clone() for i, fm in feature_maps_of(student).items()}
        result = distill(student, _loader(24), DistillConfig(lr=1e-2, max_steps=1, block_size=block), **quiet)
        assert result.steps == 1
        for index, fm in feature_maps_of(student).items():
            assert not torch.allclose(fm.hybrid_log_gamma.detach(), before[index]), (block, index)
        students.append(student)
    for (index, a), b in zip(feature_maps_of(students[0]).items(), feature_maps_of(students[1]).values()):
        for (pname, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
            torch.testing.assert_close(pb, pa, atol=1e-5, rtol=1e-4, msg=f"layer {index} {pname}")


# ---- 8. torch.compile and ONNX ----------------------------------------------------------------------------

@pytest.fixture()
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_fullgraph_compile_of_hybrid_attention_matches_eager(fresh_dynamo):
    fm = make("hedgehog")
    gamma = torch.tensor([0.5, 2.0])
    q, k, v = qkv(seed=13)
    mask = padding("right")

    def attend(q, k, v, mask):
        return hybrid_attention(q, k, v, fm, 5, ("first", "last"), gamma, mask)

    compiled = torch.compile(attend, fullgraph=True, backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(q, k, v, mask), attend(q, k, v, mask), atol=1e-5, rtol=1e-5)
        reference = hybrid_quadratic_attention(q, k, v, fm, 5, ("first", "last"), gamma, mask)
        torch.testing.assert_close(compiled(q, k, v, mask), reference, atol=1e-5, rtol=1e-5)


def test_one_compiled_graph_serves_every_length(fresh_dynamo):
    from torch._dynamo.utils import counters

    fm = make("hedgehog")
    compiled = torch.compile(lambda q, k, v: hybrid_attention(q, k, v, fm, 4, ("first",)), fullgraph=True,
                             backend="eager", dynamic=True)
    before = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        for n in (20, 30):
            q, k, v = qkv(n=n, seed=n)
            # after the first length, a recompilation is an error (no second, slow compile to wait for)
            with torch.compiler.set_stance("fail_on_recompile" if n == 30 else "default"):
                got = compiled(q, k, v)
            torch.testing.assert_close(got, hybrid_attention(q, k, v, fm, 4, ("first",)), atol=1e-5, rtol=1e-5)
    assert counters["stats"]["unique_graphs"] - before == 1


def one_layer_hybrid_bert(window=4):
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=VOCAB, **{**SMALL, "num_hidden_layers": 1}))
    return linearize.convert(model, "hedgehog", window=window, sinks="first,last").eval()


def test_fullgraph_compile_of_a_converted_bert_matches_eager(fresh_dynamo):
    model = one_layer_hybrid_bert()
    compiled = torch.compile(model, fullgraph=True, backend="eager", dynamic=True)
    with torch.no_grad():
        for length, pad in [(40, 11), (4, 1)]:  # 40 tokens: several blocks; 4: within the window, exact softmax
            batch = inputs("bert", seq=length, pad=pad, seed=length)
            torch.testing.assert_close(compiled(**batch)[0], model(**batch)[0], atol=1e-5, rtol=1e-5)


def test_onnx_export_of_a_converted_bert_matches_pytorch(tmp_path):
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    from linearize.export import export_model

    model = one_layer_hybrid_bert()
    result = export_model(model, tmp_path / "model.onnx", check=False)
    assert_onnx_matches_pytorch(model, result, [(3, 9, 2), (2, 41, 17), (1, 23, 0)])


# ---- 9. the command line -------------------------------------------------------------------------------------

def test_cli_convert_with_a_window_and_with_sinks_only(tmp_path):
    build("bert").save_pretrained(tmp_path / "tiny")
    out = tmp_path / "out"
    result = runner.invoke(app, ["convert", str(tmp_path / "tiny"), "--out", str(out), "--method", "hedgehog",
                                 "--window", "4", "--sinks", "first,last", "--gamma", "0.5"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # the summary table may wrap its cells
    assert "hybrid" in text and "4" in text and "first" in text and "last" in text
    data = json.loads((out / "config.json").read_text())["linearize"]["_data"]
    assert (data["window"], data["sinks"], data["gamma"]) == (4, ["first", "last"], 0.5)
    loaded = linearize.load(out)
    assert all(fm.window == 4 and fm.sinks == ("first", "last") for fm in feature_maps_of(loaded).values())
    sinks_only = runner.invoke(app, ["convert", str(tmp_path / "tiny"), "--out", str(tmp_path / "sinks"),
                                     "--method", "hedgehog", "--sinks", "first"])
    assert sinks_only.exit_code == 0, sinks_only.output
    assert "hybrid" in sinks_only.output
    data = json.loads((tmp_path / "sinks" / "config.json").read_text())["linearize"]["_data"]
    assert (data["window"], data["sinks"]) == (0, ["first"])
    plain = runner.invoke(app, ["convert", str(tmp_path / "tiny"), "--out", str(tmp_path / "plain"),
                                "--method", "hedgehog"])
    assert plain.exit_code == 0 and "hybrid" not in plain.output and "linear attention" in plain.output


def test_cli_hybrid_layers_comma_separated_or_repeated(tmp_path):
    """``--hybrid-layers 0,1`` as ``--layers`` takes it, or the option repeated; a non-integer is one line."""
    build("bert").save_pretrained(tmp_path / "tiny")
    repeated = ["--hybrid-layers", "1", "--hybrid-layers", "0"]
    for name, layers in (("comma", ["--hybrid-layers", "1,0"]), ("repeated", repeated)):
        out = tmp_path / name
        result = runner.invoke(app, ["convert", str(tmp_path / "tiny"), "--out", str(out), "--method", "hedgehog",
                                     "--window", "4", *layers])
        assert result.exit_code == 0, result.output
        assert json.loads((out / "config.json").read_text())["linearize"]["_data"]["hybrid_layers"] == [0, 1]
    wrong = runner.invoke(app, ["convert", str(tmp_path / "tiny"), "--out", str(tmp_path / "x"), "--method",
                                "hedgehog", "--window", "4", "--hybrid-layers", "1,x"])
    assert wrong.exit_code == 1 and wrong.output.count("\n") == 1, wrong.output
    assert "--hybrid-layers '1,x' is not a comma-separated list of integers (example: 1,2)" in wrong.output
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("args,fragment", [
    ("--window 4 --sinks middle", "middle"),
    ("--sinks first,middle", "middle"),
    ("--sinks first,first", "each once"),
    ("--window -1", "window"),
    ("--window 4 --gamma 0", "gamma"),
])
def test_cli_convert_refuses_bad_hybrid_settings_in_one_line(tmp_path, args, fragment):
    build("bert").save_pretrained(tmp_path / "tiny")
    out = tmp_path / "out"
    result = runner.invoke(app, ["convert", str(tmp_path / "tiny"), "--out", str(out), "--method", "hedgehog",
                                 *shlex.split(args)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], lines[-5:]
    assert fragment in errors[0], errors[0]
    assert not out.exists()


def test_recipe_hybrid_section_reaches_the_conversion_checks():
    from linearize.convert.api import check_convertible
    from linearize.recipes import load_recipe, parse_set

    config = load_recipe(None, quick=True, overrides=parse_set(["hybrid.window=32", "hybrid.sinks=first,last",
                                                                "hybrid.gamma=0.5", "hybrid.hybrid_layers=[1]"]))
    assert config.hybrid.to_dict() == {"window": 32, "sinks": "first,last", "gamma": 0.5, "hybrid_layers": [1]}
    check_convertible(build("bert"), "hedgehog", **config.hybrid.to_dict())
    with pytest.raises(LinearizeError, match=r"--hybrid-layers \[1\]: not converted"):
        check_convertible(build("bert"), "hedgehog", layers=[0], **config.hybrid.to_dict())
    assert load_recipe(None, quick=True).hybrid.to_dict() == {"window": 0, "sinks": "none", "gamma": None,
                                                               "hybrid_layers": None}
    for pair in ("hybrid.sinks=middle", "hybrid.window=-1", "hybrid.gamma=0", "hybrid.hybrid_layers=[]"):
        with pytest.raises(LinearizeError, match=pair.split(".")[1].split("=")[0]):
            load_recipe(None, quick=True, overrides=parse_set([pair]))
    config = load_recipe(None, quick=True, overrides=parse_set(["hybrid.sinks=first"]))  # sinks, no window
    check_convertible(build("bert"), "hedgehog", **config.hybrid.to_dict())


@pytest.mark.parametrize("hybrid_options", [{"window": 4}, {"sinks": "first"}], ids=["window", "sinks"])
def test_check_convertible_refuses_what_convert_refuses(hybrid_options):
    from linearize.convert.api import check_convertible

    with pytest.raises(LinearizeError, match="softmax is exact already"):
        linearize.convert(build("bert"), "softmax", **hybrid_options)
    with pytest.raises(LinearizeError, match="softmax is exact already"):
        check_convertible(build("bert"), "softmax", **hybrid_options)


# ---- hybrid in some layers only ----------------------------------------------------------------------

def test_hybrid_layers_make_only_those_layers_hybrid_and_survive_save_and_load(tmp_path):
    """``hybrid_layers``: the named converted layers get the window and sinks, the others stay pure linear
    attention; the record keeps the choice, so linearize.load and the report describe it, and the output is the
    layers' own (a hybrid layer against its quadratic reference, a pure one against pure linear attention)."""
    model = hybrid_bert(window=4, sinks="first", hybrid_layers=[1])
    record = conversion_record(model)
    assert record.hybrid_layers == (1,) and record.hybrid["hybrid_layers"] == (1,)
    maps = feature_maps_of(model)
    assert not maps[0].is_hybrid and maps[1].is_hybrid and maps[1].window == 4
    assert not hasattr(maps[0], "hybrid_log_gamma")  # a pure layer has no γ to train
    batch = inputs("bert", seq=12, pad=3)
    model.save_pretrained(tmp_path / "saved")
    loaded = linearize.load(tmp_path / "saved")
    assert conversion_record(loaded).hybrid_layers == (1,)
    assert [fm.is_hybrid for _, fm in sorted(feature_maps_of(loaded).items())] == [False, True]
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, model(**batch).logits)
    from linearize.attention.hybrid import describe

    assert describe("hedgehog", 4, ("first",), (1,)).startswith("hybrid in layers 1 (the other converted layers: ")
    assert "linear" not in describe("softmax") and describe("hedgehog") == "hedgehog linear attention"


def test_hybrid_layers_are_refused_where_they_cannot_take_effect():
    for kwargs, message in (({"window": 4, "hybrid_layers": [2]}, r"--hybrid-layers \[2\]: not converted"),
                            ({"window": 4, "layers": [0], "hybrid_layers": [1]}, "not converted"),
                            ({"hybrid_layers": [0]}, "without --window or --sinks"),
                            ({"window": 4, "hybrid_layers": "0+x"}, "give layer indices"),
                            ({"window": 4, "hybrid_layers": [0, 0]}, "distinct")):
        with pytest.raises(LinearizeError, match=message):
            linearize.convert(build("bert"), "hedgehog", **kwargs)


def test_bench_spec_and_revert_layers_keep_the_hybrid_layers():
    """A bench spec names them with ``+`` (``hybrid_layers=0+1``); ``revert_layers`` keeps the hybrid layers still
    converted, and a model left with no hybrid layer is pure linear attention."""
    from linearize.bench import method_specs
    from linearize.convert.api import revert_layers

    [(label, name, options)] = method_specs("hedgehog(window=4,sinks=first,hybrid_layers=0+1)")
    assert options["hybrid_layers"] == "0+1"
    model = linearize.convert(build("bert"), name, **options)
    assert conversion_record(model).hybrid_layers == (0, 1)
    revert_layers(model, [1])
    assert conversion_record(model).hybrid_layers == (0,) and feature_maps_of(model)[0].is_hybrid
    model = hybrid_bert(window=4, sinks="first", hybrid_layers=[1])
    revert_layers(model, [1])
    record = conversion_record(model)
    assert record.hybrid is None and not feature_maps_of(model)[0].is_hybrid
