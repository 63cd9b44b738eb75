"""The fast paths are exact: LUNA's knot lookup equals its MLP, and every method's fused linear
path equals the naive quadratic reference (with and without padding, in inference mode)."""

import ast
import json
import math
import sys

import pytest
import torch

from linearize.attention import create_feature_map, kernel_matrix, linear_attention, methods, quadratic_attention

B, H, N, D = 2, 3, 11, 16


def assert_matches_reference(fm, q, k, out, ref, mask=None, atol=1e-4):
    """Linear output against the quadratic reference. Flexformer's kernel values can be negative,
    so a row's normaliser can nearly cancel and blow rounding up in both forms alike: such
    ill-conditioned rows (|Σκ| < 1% of Σ|κ|) are left out, as in test_feature_maps."""
    if fm.name.startswith("flexformer"):
        kappa = kernel_matrix(q, k, fm, mask)
        ok = kappa.sum(-1).abs() > 1e-2 * kappa.abs().sum(-1)
        assert ok.float().mean() > 0.9
        out, ref = out[ok], ref[ok]
    torch.testing.assert_close(out, ref, atol=atol, rtol=atol)


def luna(shared, hidden=64, channels=8, seed=0, **options):
    torch.manual_seed(seed)
    return create_feature_map("luna", D, H, shared_mlp=shared, hidden=hidden, channels=channels, **options).eval()


def knots_of(fm):
    w1, b1 = fm.mlp_w1.detach(), fm.mlp_b1.detach()
    return (-b1 / w1)[w1 != 0]


def assert_lookup_equals_mlp(fm, u):
    with torch.no_grad():
        expected = fm.psi_mlp(u)
        got = fm.psi_lookup(u)
    assert got.shape == expected.shape == (*u.shape, fm.channels)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shared", [True, False])
def test_luna_lookup_equals_mlp_on_random_values(shared):
    fm = luna(shared)
    u = torch.randn(4, 3, 50, 8) * 3
    assert_lookup_equals_mlp(fm, u)


@pytest.mark.parametrize("shared", [True, False])
def test_luna_lookup_equals_mlp_exactly_at_and_next_to_knots(shared):
    fm = luna(shared)
    knots = knots_of(fm).float()
    nudged = torch.stack([knots, torch.nextafter(knots, torch.tensor(-math.inf)),
                          torch.nextafter(knots, torch.tensor(math.inf))])
    u = nudged.reshape(-1)
    assert_lookup_equals_mlp(fm, u)


@pytest.mark.parametrize("shared", [True, False])
def test_luna_lookup_equals_mlp_far_outside_the_knot_range(shared):
    fm = luna(shared)
    span = knots_of(fm).abs().max().item()
    u = torch.tensor([-1e4, -1e3, -10 * span, -span - 1, span + 1, 10 * span, 1e3, 1e4])
    with torch.no_grad():
        expected, got = fm.psi_mlp(u), fm.psi_lookup(u)
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-5)


@pytest.mark.parametrize("shared", [True, False])
def test_luna_lookup_handles_flat_units_and_duplicate_knots(shared):
    fm = luna(shared, hidden=6, channels=3)
    with torch.no_grad():
        fm.mlp_w1[:, 0] = 0.0  # a unit without a knot: constant relu(b1)
        fm.mlp_b1[:, 0] = 0.7
        fm.mlp_w1[:, 1] = 0.0
        fm.mlp_b1[:, 1] = -0.3  # constant 0
        fm.mlp_w1[:, 2], fm.mlp_b1[:, 2] = 2.0, -1.0  # knot 0.5 ...
        fm.mlp_w1[:, 3], fm.mlp_b1[:, 3] = -4.0, 2.0  # ... twice, with opposite slopes
    u = torch.cat([torch.linspace(-3, 3, 601), torch.tensor([0.5, 0.5 - 1e-7, 0.5 + 1e-7])])
    assert_lookup_equals_mlp(fm, u)
    with torch.no_grad():
        fm.mlp_w1.zero_()  # every unit flat: ψ is constant, a single interval
    assert_lookup_equals_mlp(fm, u)


def test_luna_lookup_table_follows_parameter_updates():
    fm = luna(True)
    u = torch.randn(200) * 2
    assert_lookup_equals_mlp(fm, u)
    with torch.no_grad():
        fm.mlp_b1.add_(0.5)  # in-place update (what an optimizer step does)
        fm.mlp_w2.mul_(-1.0)
    assert_lookup_equals_mlp(fm, u)
    other = luna(True, seed=5)
    fm.load_state_dict(other.state_dict())
    assert_lookup_equals_mlp(fm, u)


def test_luna_lookup_is_used_only_for_inputs_large_enough():
    fm = luna(True)
    u = torch.randn(100, 8)
    assert fm.lookup_applies(u)
    assert not fm.lookup_applies(u[:10])  # tiny inputs: the MLP is faster
    assert fm.lookup_applies()  # in training too: exact in value and gradient


@pytest.mark.parametrize("shared", [True, False])
def test_luna_lookup_gradients_equal_the_mlp(shared):
    """Training through the knot table: the gradients for u and every ψ parameter are the MLP's."""
    fm = luna(shared).train()
    u = torch.randn(4, 3, 50, 8) * 2
    weights = torch.randn(*u.shape, fm.channels)
    grads = []
    for psi in (fm.psi_mlp, fm.psi_lookup):
        x = u.clone().requires_grad_(True)
        params = [fm.mlp_w1, fm.mlp_b1, fm.mlp_w2, fm.mlp_b2]
        grads.append(torch.autograd.grad((psi(x) * weights).sum(), [x, *params]))
    for expected, got in zip(*grads):
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_luna_lookup_training_steps_track_the_mlp():
    """A few optimizer steps through the lookup follow the MLP's trajectory (the table is
    rebuilt after every parameter update)."""
    torch.manual_seed(0)
    x, target = torch.randn(2, H, 30, D), torch.rand(2, H, 30, 64)
    runs = []
    for use_lookup in (False, True):
        fm = luna(True, seed=1).train()
        fm.lookup_min_values = 0 if use_lookup else float("inf")
        optimizer = torch.optim.SGD(fm.parameters(), lr=0.1)
        for _ in range(5):
            optimizer.zero_grad()
            loss = (fm(x)[0] - target).pow(2).mean()
            loss.backward()
            optimizer.step()
        runs.append([p.detach().clone() for p in fm.parameters()])
    for mlp_param, lookup_param in zip(*runs):
        torch.testing.assert_close(lookup_param, mlp_param, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("options", [{}, {"shared_mlp": False}, {"envelope": True, "ch_rms": True},
                                     {"projections": 4, "channels": 3, "hidden": 5}])
def test_luna_features_fast_equal_the_mlp_path(options):
    torch.manual_seed(0)
    fm = create_feature_map("luna", D, H, **options)
    x = torch.randn(B, H, 40, D)
    mask = torch.ones(B, 40)
    mask[1, -3:] = 0
    fm.lookup_min_values = float("inf")  # the reference: Listing 1's MLP
    reference, _ = fm(x, mask)
    fm.lookup_min_values = 0
    with torch.no_grad():
        assert fm.lookup_applies(fm.project(x))
        fast, _ = fm(x, mask)  # the cached lookup (with 1/√M folded into the table on the plain path)
    trained, _ = fm(x, mask)  # the lookup built under autograd
    torch.testing.assert_close(fast, reference.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(trained, reference, atol=1e-5, rtol=1e-5)


RECIPE_LUNA = {"projections": 16, "shared_projections": False}  # the default recipe's (minilm-moviereviews)
CASES = [("luna", {}), ("luna", RECIPE_LUNA), ("luna", {"shared_mlp": False, "envelope": True, "ch_rms": True})] + [
    (name, {}) for name in methods() if name not in ("luna", "softmax")]


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("name,options", CASES, ids=[f"{n}-{'-'.join(o) or 'default'}" for n, o in CASES])
def test_fast_linear_path_equals_quadratic_reference_in_inference(name, options, padded):
    torch.manual_seed(1)
    fm = create_feature_map(name, D, H, **options).eval()
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(B, H, N, D, generator=g) for _ in range(3))
    mask = None
    if padded:
        mask = torch.ones(B, N)
        mask[0, -4:] = 0
    with torch.inference_mode():
        out, _ = fm.attend(q, k, v, mask)
        ref = quadratic_attention(q, k, v, fm, mask)
        assert_matches_reference(fm, q, k, out, ref, mask)
    if padded:  # padded queries still get finite outputs, and real queries ignore padded keys
        assert torch.isfinite(out).all()


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("name,options", CASES, ids=[f"{n}-{'-'.join(o) or 'default'}" for n, o in CASES])
def test_linear_path_gradients_equal_the_quadratic_reference(name, options, padded):
    """Training (autograd, one-shot path: separate numerator and normaliser products, in-place
    steps only where autograd does not need their input) gives the quadratic form's gradients."""
    torch.manual_seed(1)
    fm = create_feature_map(name, D, H, **options)
    if not fm.nonnegative:  # Flexformer: a nearly cancelling normaliser amplifies rounding in both forms
        pytest.skip("kernel values can be negative: gradients are ill-conditioned in both forms alike")
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(B, H, N, D, generator=g) for _ in range(3))
    mask = None
    if padded:
        mask = torch.ones(B, N)
        mask[0, -4:] = 0
    grads = []
    for attention in (linear_attention, quadratic_attention):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        fm.zero_grad()
        out = attention(*inputs, fm, mask)
        (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(3))).sum().backward()
        grads.append([t.grad for t in inputs] + [p.grad for p in fm.parameters() if p.requires_grad])
    for fast, reference in zip(*grads):
        torch.testing.assert_close(fast, reference, atol=1e-4, rtol=1e-3)


def map_and_cross_length_inputs(name, queries, keys, seed):
    """``(fm, q, k, v)``: an eval-mode feature map (seeded with ``seed``) and one sequence of
    ``queries`` queries against ``keys`` keys (seeded with ``seed + 1``)."""
    torch.manual_seed(seed)
    fm = create_feature_map(name, D, H).eval()
    g = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(1, H, queries, D, generator=g)
    k, v = (torch.randn(1, H, keys, D, generator=g) for _ in range(2))
    return fm, q, k, v


@pytest.mark.parametrize("name", ["luna", "performer", "flexformer-n", "elu"])
def test_fast_linear_path_long_sequence_and_cross_lengths(name):
    fm, q, k, v = map_and_cross_length_inputs(name, 300, 257, seed=3)
    with torch.no_grad():
        out = linear_attention(q, k, v, fm)
        ref = quadratic_attention(q, k, v, fm)
        assert out.shape == (1, H, 300, D)
        assert_matches_reference(fm, q, k, out, ref)


def test_fast_linear_path_keeps_low_precision_dtype():
    fm = create_feature_map("luna", D, H).eval()
    q, k, v = (torch.randn(B, H, N, D).to(torch.bfloat16) for _ in range(3))
    with torch.no_grad():
        out, _ = fm.attend(q, k, v)
        ref = quadratic_attention(q, k, v, fm)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_bundled_remote_code_compiles_with_unique_module_names():
    from linearize.convert.backends import hf_remote_code as remote_code

    source = remote_code.bundled_sources()
    tree = ast.parse(source)
    compile(tree, "modeling_linearize.py", "exec")
    defined = set()
    for node in tree.body:  # functions, classes and module constants: a second one would replace the first
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            names = [t.id for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                     if isinstance(t, ast.Name)]
        else:
            continue
        for name in names:
            assert name not in defined, f"{name} is defined twice in the bundled remote code"
            defined.add(name)
    # only torch, transformers (with numpy, which transformers itself requires) and the standard library
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            roots = {(node.module or "").split(".")[0]}
        else:
            continue
        assert roots <= {"torch", "transformers", "numpy", "math", "inspect", "dataclasses", "types", "typing",
                         "threading", "__future__"}, roots


@pytest.mark.parametrize("seed", range(4))
def test_luna_grid_index_equals_bucketize_everywhere(seed):
    """The grid's interval index is exactly bucketize's: at knots, next to them, at and next to
    every cell edge, far outside and at infinities."""
    fm = luna(True, seed=seed)
    lookup = fm._knot_structure(torch.float32, torch.device("cpu"))
    grid = lookup["grid"]
    assert grid is not None  # the default LUNA gets a grid
    knots = lookup["knots"]
    edges = ((torch.arange(grid["cells"] + 2, dtype=torch.float64) - grid["offset"]) / grid["inverse_width"]).float()
    points = torch.cat([knots, edges, torch.randn(20000) * 5, torch.randn(2000) * 1e3,
                        torch.tensor([0.0, -0.0, 1e30, -1e30, math.inf, -math.inf])])
    up, down = torch.nextafter(points, torch.tensor(math.inf)), torch.nextafter(points, torch.tensor(-math.inf))
    u = torch.cat([points, up, down])
    expected = torch.bucketize(u, knots, right=True)
    torch.testing.assert_close(fm.knot_index(u, lookup).long(), expected, rtol=0, atol=0)
    torch.testing.assert_close(fm.knot_index_into(u, lookup).long(), expected, rtol=0, atol=0)  # the buffered one
    nan = fm.knot_index(torch.tensor([math.nan]), lookup)  # NaN gives a valid index (and a NaN output)
    assert 0 <= int(nan) <= knots.numel()
    assert torch.isnan(fm.psi_lookup(torch.tensor([math.nan]))).all()


def test_luna_without_a_grid_falls_back_to_bucketize():
    fm = luna(False, seed=0)  # 8 MLPs x 64 knots: too dense for a uniform grid
    lookup = fm._knot_structure(torch.float32, torch.device("cpu"))
    assert lookup["grid"] is None
    assert_lookup_equals_mlp(fm, torch.randn(3000) * 4)
    u = torch.randn(3000) * 4
    assert torch.equal(fm.knot_index_into(u, lookup).long(), torch.bucketize(u, lookup["knots"], right=True))


# ---- the chunked inference path ------------------------------------------------------------------

CHUNKABLE = [("luna", {}), ("luna", RECIPE_LUNA), ("luna", {"shared_mlp": False, "envelope": True})] + [
    (name, {}) for name in methods() if name not in ("luna", "softmax")]


def test_chunkable_flags():
    assert not create_feature_map("luna", D, H, ch_rms=True).chunkable  # RMS over the whole sequence
    for name, options in CHUNKABLE:
        assert create_feature_map(name, D, H, **options).chunkable, name


def test_cosformer_chunk_features_equal_slices_of_the_whole():
    fm = create_feature_map("cosformer", D, H)
    x = torch.randn(B, H, N, D)
    mask = torch.ones(B, N)
    mask[1, :3] = 0
    whole, _ = fm(x, mask)
    for start in (0, 4, 9):
        part, _ = fm.chunk_features(x[:, :, start:start + 4], mask, start)
        torch.testing.assert_close(part, whole[:, :, start:start + 4])


@pytest.mark.parametrize("chunk", [1, 4, 7])
@pytest.mark.parametrize("name,options", CHUNKABLE, ids=[f"{n}-{'-'.join(o) or 'default'}" for n, o in CHUNKABLE])
def test_chunked_path_equals_quadratic_reference(name, options, chunk):
    torch.manual_seed(5)
    fm = create_feature_map(name, D, H, **options).eval()
    g = torch.Generator().manual_seed(6)
    # growing norms along the sequence: later key chunks raise the running max of log-scale maps
    growth = torch.linspace(0.3, 2.0, 23)[None, None, :, None]
    q, k, v = (torch.randn(B, H, 23, D, generator=g) * growth for _ in range(3))
    mask = torch.ones(B, 23)
    mask[1, :9] = 0  # leading padding: the first chunks of sequence 1 are all padded
    mask[1, -2:] = 0
    for key_mask in (None, mask):
        with torch.no_grad():
            ref = quadratic_attention(q, k, v, fm, key_mask)
            one_shot = linear_attention(q, k, v, fm, key_mask, chunk_size=10**9)
            chunked = linear_attention(q, k, v, fm, key_mask, chunk_size=chunk)
        assert chunked.shape == ref.shape and torch.isfinite(chunked).all()
        assert_matches_reference(fm, q, k, chunked, ref, key_mask)
        assert_matches_reference(fm, q, k, chunked, one_shot, key_mask)


@pytest.mark.parametrize("name", ["luna", "performer", "flexformer-s", "cosformer"])
def test_chunked_path_cross_lengths_and_low_precision(name):
    fm, q, k, v = map_and_cross_length_inputs(name, 13, 30, seed=7)
    with torch.inference_mode():
        ref = quadratic_attention(q, k, v, fm)
        chunked = linear_attention(q, k, v, fm, chunk_size=4)
        assert_matches_reference(fm, q, k, chunked, ref)
        q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
        low = linear_attention(q, k, v, fm, chunk_size=4)
        ref_low = quadratic_attention(q, k, v, fm)  # same bf16 inputs, fp32 inside, bf16 out
    assert low.dtype == torch.bfloat16
    assert_matches_reference(fm, q, k, low.float(), ref_low.float().bfloat16().float(), None, atol=1e-2)


def test_chunking_is_used_only_without_gradients():
    from linearize.attention import core

    fm = create_feature_map("relu", D, H)  # no parameters: only the inputs can ask for gradients
    q, k, v = (torch.randn(1, H, 9, D) for _ in range(3))
    calls = []
    original = core._chunked_attention
    core._chunked_attention = lambda *args: calls.append(1) or original(*args)
    try:
        linear_attention(q, k, v, fm, chunk_size=4)
        assert calls == [1]
        q.requires_grad_(True)
        out = linear_attention(q, k, v, fm, chunk_size=4)
        assert calls == [1] and out.requires_grad  # autograd keeps the one-shot graph
        with torch.no_grad():
            linear_attention(q, k, v, fm, chunk_size=4)
        assert calls == [1, 1]
        with torch.no_grad():
            linear_attention(q, k, v, create_feature_map("luna", D, H, ch_rms=True), chunk_size=4)
        assert calls == [1, 1]  # ch_rms needs the whole sequence: not chunkable
    finally:
        core._chunked_attention = original


@pytest.mark.parametrize("name,options", [("luna", {}), ("hedgehog", {})])
def test_a_map_made_under_inference_mode_reuses_its_tables_until_a_parameter_changes(name, options, monkeypatch):
    """Parameters made under ``torch.inference_mode`` (a model converted there) have no version counter: the
    tables built from them (LUNA's knot lookup, Hedgehog's stacked weight) are kept while their values are equal,
    rebuilt when one changes, and the outputs match a map made outside inference mode."""
    from linearize.attention.feature_maps import base

    torch.manual_seed(0)
    reference = create_feature_map(name, D, H, **options).eval()
    with torch.inference_mode():
        fm = create_feature_map(name, D, H, **options).eval()
        fm.load_state_dict(reference.state_dict())
    assert all(p.is_inference() for p in fm.parameters())
    builds = []
    original = base.kept_while_unchanged

    def counting(owner, key_name, key, build, params):
        return original(owner, key_name, key, lambda: builds.append(key_name) or build(), params)

    monkeypatch.setattr(base, "kept_while_unchanged", counting)
    if name == "luna":
        monkeypatch.setattr(sys.modules[type(fm).__module__], "kept_while_unchanged", counting)
    q, k, v = (torch.randn(1, H, 200, D) for _ in range(3))  # LUNA's lookup: >= 512 values a chunk
    with torch.inference_mode():
        first = linear_attention(q, k, v, fm, chunk_size=64)
        made = len(builds)
        again = linear_attention(q, k, v, fm, chunk_size=64)
        assert made > 0 and len(builds) == made and torch.equal(first, again)  # kept, not rebuilt
        torch.testing.assert_close(first, linear_attention(q, k, v, reference, chunk_size=64))
        next(fm.parameters()).mul_(1.5)  # a changed value: rebuilt, as a fresh map with the same weights computes
        changed = linear_attention(q, k, v, fm, chunk_size=64)
        assert len(builds) > made
        next(reference.parameters()).mul_(1.5)
        torch.testing.assert_close(changed, linear_attention(q, k, v, reference, chunk_size=64))


def test_small_calls_take_the_one_shot_form_unless_a_chunk_size_is_given(monkeypatch):
    """At most ``ONE_SHOT_MAX_TOKENS`` tokens (batch × length) in a call: the one-shot form (fewer operations),
    equal to the quadratic reference; one token more, or a ``chunk_size`` asked for, chunks."""
    from linearize.attention import core

    fm = create_feature_map("hedgehog", D, H).eval()
    calls = []
    original = core._chunked_attention
    monkeypatch.setattr(core, "_chunked_attention", lambda *args: calls.append(args[0].shape[2]) or original(*args))
    g = torch.Generator().manual_seed(3)
    half = core.ONE_SHOT_MAX_TOKENS // 2
    small, large = ([torch.randn(2, H, n, D, generator=g) for _ in range(3)] for n in (half, half + 1))
    with torch.inference_mode():
        out = linear_attention(*small, fm)
        assert calls == []
        assert_matches_reference(fm, small[0], small[1], out, quadratic_attention(*small, fm), None)
        chunked = linear_attention(*small, fm, chunk_size=16)
        assert calls == [half]
        assert_matches_reference(fm, small[0], small[1], chunked, out, None)
        linear_attention(*large, fm)
        assert calls == [half, half + 1]


# ---- the chunked path's memory: reused buffers, one new tensor per call -----------------------------

WRITES_OUT = [(name, options) for name, options in CHUNKABLE
              if create_feature_map(name, D, H, **options).writes_out and not options.get("envelope")]


def transposed_inputs(batch, seq, seed):
    """q, k, v as attention modules pass them: ``[B, H, N, d]`` views of ``[B, N, H, d]`` tensors."""
    g = torch.Generator().manual_seed(seed)
    return [t.transpose(1, 2) for t in torch.randn(3, batch, seq, H, D, generator=g)]


def large_allocations(fn, tmp_path, smallest=32 * 1024):
    """The sizes of the CPU allocations of at least ``smallest`` bytes that ``fn()`` makes."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    return [e["args"]["Bytes"] for e in events if e.get("name") == "[memory]" and e["args"]["Bytes"] >= smallest]


@pytest.mark.parametrize("batch", [4, 1])
@pytest.mark.parametrize("name,options", WRITES_OUT, ids=[f"{n}-{'-'.join(o) or 'default'}" for n, o in WRITES_OUT])
def test_chunked_path_allocates_only_its_output(name, options, batch, tmp_path):
    """After a first call, a call of the chunked path makes one large tensor, its output (in the
    [B, N, H, d] layout the output projection reads): features, scaled inputs, values and partial
    products go to reused buffers (one sequence's keys, values, and queries of a map that
    ``folds_input_scale``, are read in place as strided views); and it still equals the quadratic reference."""
    torch.manual_seed(0)
    fm = create_feature_map(name, D, H, **options).eval()
    # one sequence: 224 tokens (a last chunk of 32, which LUNA's knot lookup still takes at 3 heads)
    q, k, v = transposed_inputs(batch, 200 if batch > 1 else 224, seed=1)
    with torch.inference_mode():
        linear_attention(q, k, v, fm, chunk_size=64)
        sizes = large_allocations(lambda: linear_attention(q, k, v, fm, chunk_size=64), tmp_path)
        out = linear_attention(q, k, v, fm, chunk_size=64)
        ref = quadratic_attention(q, k, v, fm)
    assert sizes == [out.numel() * 4], sizes
    assert out.transpose(1, 2).is_contiguous()  # the caller's transpose back is free
    assert_matches_reference(fm, q, k, out, ref)


@pytest.mark.parametrize("name,options", WRITES_OUT, ids=[f"{n}-{'-'.join(o) or 'default'}" for n, o in WRITES_OUT])
def test_chunked_path_buffers_follow_changing_shapes(name, options):
    """One feature map, calls of other batch sizes, lengths and cross lengths in turn (the buffers
    grow and are read at other sizes), padded and not, under inference mode and no_grad."""
    torch.manual_seed(2)
    fm = create_feature_map(name, D, H, **options).eval()
    for index, (batch, seq_q, seq_k) in enumerate([(3, 40, 40), (1, 7, 7), (2, 23, 90), (4, 130, 130)]):
        g = torch.Generator().manual_seed(index)
        q = torch.randn(batch, H, seq_q, D, generator=g)
        k, v = (torch.randn(batch, H, seq_k, D, generator=g) for _ in range(2))
        mask = torch.ones(batch, seq_k)
        mask[0, -3:] = 0
        for key_mask in (None, mask):
            with torch.inference_mode() if index % 2 else torch.no_grad():
                out = linear_attention(q, k, v, fm, key_mask, chunk_size=16)
                ref = quadratic_attention(q, k, v, fm, key_mask)
            assert_matches_reference(fm, q, k, out, ref, key_mask)


@pytest.mark.parametrize("rows, feature_dim", [(12, 64), (12, 128), (12, 32), (96, 64), (96, 128), (384, 64), (1, 8)])
def test_default_chunk_is_a_power_of_two_within_both_caps(rows, feature_dim):
    from linearize.attention.core import CHUNK_ELEMENTS, CHUNK_ROWS, chunk_tokens

    tokens = chunk_tokens(rows, feature_dim, None)
    assert tokens & (tokens - 1) == 0 and tokens >= 64
    if tokens > 64:  # the floor of 64 tokens may pass the caps; above it neither is passed, and twice would
        assert rows * tokens * feature_dim <= CHUNK_ELEMENTS and rows * tokens <= CHUNK_ROWS
        assert rows * 2 * tokens * feature_dim > CHUNK_ELEMENTS or rows * 2 * tokens > CHUNK_ROWS
    assert chunk_tokens(rows, feature_dim, 100) == 100  # a given size is kept


@pytest.mark.parametrize("rows, feature_dim", [(12, 64), (96, 128), (1, 8)])
def test_a_gpu_chunk_is_the_largest_power_of_two_within_the_gpu_cap(rows, feature_dim):
    """On a GPU a chunk's operations are launches of fixed cost: only the feature-count cap applies
    (``GPU_CHUNK_ELEMENTS``, no row cap), and the CPU's sizes stay as they were."""
    from linearize.attention.core import GPU_CHUNK_ELEMENTS, chunk_tokens

    tokens = chunk_tokens(rows, feature_dim, None, "cuda")
    assert tokens & (tokens - 1) == 0
    assert rows * tokens * feature_dim <= GPU_CHUNK_ELEMENTS < rows * 2 * tokens * feature_dim
    assert chunk_tokens(rows, feature_dim, None, "cpu") == chunk_tokens(rows, feature_dim, None) < tokens


def test_scratch_buffers_are_kept_per_thread_and_grow():
    import threading

    from linearize.attention.core import release_scratch, scratch

    with torch.inference_mode():
        first = scratch("test.buffer", (4, 8), "cpu")
    with torch.no_grad():  # made in inference mode, still writable outside it
        again = scratch("test.buffer", (2, 3), "cpu").fill_(1.0)
    assert again.data_ptr() == first.data_ptr()
    bigger = scratch("test.buffer", (64, 8), "cpu")
    assert bigger.shape == (64, 8) and scratch("test.buffer", (4, 8), "cpu").data_ptr() == bigger.data_ptr()
    other = []
    thread = threading.Thread(target=lambda: other.append(scratch("test.buffer", (4, 8), "cpu").data_ptr()))
    thread.start()
    thread.join()
    assert other[0] != bigger.data_ptr()  # each thread its own
    release_scratch()  # forgotten: the next call makes a new buffer (the old one is still held here)
    assert scratch("test.buffer", (4, 8), "cpu").data_ptr() != bigger.data_ptr()


def test_chunked_path_is_right_in_concurrent_threads():
    """Two threads running the chunked path at once (as a threaded server does) each get their own
    buffers: both outputs equal the reference."""
    from concurrent.futures import ThreadPoolExecutor

    torch.manual_seed(3)
    fm = create_feature_map("hedgehog", D, H).eval()
    inputs = [transposed_inputs(2, 300, seed) for seed in range(4)]

    def attend(qkv):
        with torch.inference_mode():
            return [linear_attention(*qkv, fm, chunk_size=32) for _ in range(3)][-1]

    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(attend, inputs))
    for (q, k, v), out in zip(inputs, outs):
        with torch.no_grad():
            assert_matches_reference(fm, q, k, out, quadratic_attention(q, k, v, fm))


def test_hooks_on_a_map_never_see_the_reused_buffers():
    """A forward hook may keep the map's input (the report's LUNA figure does): what it kept must
    not be overwritten by later chunks and calls."""
    fm = create_feature_map("luna", D, H).eval()
    kept = []
    hook = fm.register_forward_pre_hook(lambda module, args: kept.append(args[0]))
    try:
        with torch.no_grad():
            linear_attention(*transposed_inputs(2, 40, 4), fm, chunk_size=16)
            copies = [t.clone() for t in kept]
            linear_attention(*transposed_inputs(2, 40, 5), fm, chunk_size=16)
    finally:
        hook.remove()
    assert len(copies) == 6 and all(torch.equal(t, c) for t, c in zip(kept, copies))


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("softmax_into", [True, False], ids=["aten-softmax", "five-ops"])
def test_hedgehog_in_place_softmax_equals_the_reference(batch, softmax_into, monkeypatch):
    """Hedgehog's features written into the chunked path's buffers: with ATen's softmax in place (one
    sequence's buffer and head-major ones) and with the five in-place operations a PyTorch without it gets."""
    from linearize.attention.feature_maps import hedgehog

    if not softmax_into:
        monkeypatch.setattr(hedgehog, "SOFTMAX_INTO", None)
    assert softmax_into is (hedgehog.SOFTMAX_INTO is not None)
    torch.manual_seed(8)
    fm = create_feature_map("hedgehog", D, H).eval()
    with torch.no_grad():
        fm.weight.add_(torch.randn_like(fm.weight) * 0.3)
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(batch, 40, H, D, generator=g).transpose(1, 2) * 2 for _ in range(3))  # BERT's views
    with torch.inference_mode():
        ref = quadratic_attention(q, k, v, fm)
        for chunk in (None, 16):
            assert_matches_reference(fm, q, k, linear_attention(q, k, v, fm, chunk_size=chunk), ref)
