"""The method matrix: every registered feature map runs through the same checks."""

import math

import pytest
import torch
import torch.nn.functional as F

from linearize.attention.feature_maps import get_feature_map_class

from linearize.attention import (FeatureMap, create_feature_map, kernel_statistics, linear_attention,
                                 linear_attention_weights, method_options, methods, quadratic_attention,
                                 register_feature_map, softmax_attention_weights)

# The method matrix: one row per case, (name, options, learns parameters), in the order of
# `methods()`; options exercise non-default paths too. A new method is one new file in
# linearize/attention/feature_maps/ and its row here.
METHOD_MATRIX = [
    ("luna", {}, True),
    ("luna", {"shared_mlp": False, "envelope": True, "ch_rms": True}, True),
    ("luna", {"shared_projections": False}, True),
    ("hedgehog", {}, True),
    ("t2r", {}, True),
    ("performer", {}, False),
    ("performer", {"learnable": True}, True),
    ("darkformer", {}, True),
    ("flexformer-s", {}, True),
    ("flexformer-s", {"learnable_envelope": True, "init_scale": 0.1}, True),  # not in the paper
    ("flexformer-n", {}, True),
    ("flexformer-n", {"init_scale": 1.0}, True),  # the paper's implied start (the default is smaller)
    ("elu", {}, False),
    ("relu", {}, False),
    ("cosformer", {}, False),
]
METHOD_CASES = [(name, opts) for name, opts, _ in METHOD_MATRIX]
KERNEL_METHODS = [name for name in methods() if name != "softmax"]
CASE_IDS = [f"{name}-{'-'.join(opts) or 'default'}" for name, opts in METHOD_CASES]
B, H, N, D = 2, 3, 9, 16


def test_every_registered_method_has_a_case():
    assert set(KERNEL_METHODS) == {name for name, _ in METHOD_CASES}
    assert methods() == list(dict.fromkeys(name for name, _ in METHOD_CASES)) + ["softmax"]


def random_qkv(seed=0, scale=1.0, n=N):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=g) * s for s in (scale, scale, 1.0))
    mask = torch.ones(B, n)
    mask[1, n - 3:] = 0  # second sequence has 3 padded positions
    return q, k, v, mask


def make(name, opts, seed=0):
    torch.manual_seed(seed)
    return create_feature_map(name, D, H, **opts)


@pytest.mark.parametrize("name,opts", METHOD_CASES, ids=CASE_IDS)
def test_linear_equals_quadratic(name, opts):
    fm = make(name, opts)
    q, k, v, mask = random_qkv()
    out = linear_attention(q, k, v, fm, mask)
    ref = quadratic_attention(q, k, v, fm, mask)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    attended, weights = fm.attend(q, k, v, mask, output_attentions=True)
    torch.testing.assert_close(attended, out)
    torch.testing.assert_close(weights, linear_attention_weights(q, k, fm, mask))


@pytest.mark.parametrize("name,opts", METHOD_CASES, ids=CASE_IDS)
def test_rows_are_distributions_over_real_keys(name, opts):
    fm = make(name, opts)
    q, k, _, mask = random_qkv(1)
    weights = linear_attention_weights(q, k, fm, mask)
    assert weights.shape == (B, H, N, N)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, N), atol=1e-5, rtol=0)
    assert torch.all(weights[1, :, :, N - 3:] == 0)
    if not name.startswith("flexformer"):  # trigonometric features can give negative kernel values
        assert torch.all(weights >= 0)


@pytest.mark.parametrize("name,opts", METHOD_CASES, ids=CASE_IDS)
def test_appended_padding_does_not_change_real_outputs(name, opts):
    fm = make(name, opts)
    q, k, v, _ = random_qkv(2)
    mask = torch.ones(B, N)
    out = linear_attention(q, k, v, fm, mask)
    g = torch.Generator().manual_seed(99)
    pad = [torch.randn(B, H, 4, D, generator=g) * 5 for _ in range(3)]  # garbage in the pads
    q2, k2, v2 = (torch.cat([t, p], dim=2) for t, p in zip((q, k, v), pad))
    mask2 = torch.cat([mask, torch.zeros(B, 4)], dim=1)
    out2 = linear_attention(q2, k2, v2, fm, mask2)
    torch.testing.assert_close(out2[:, :, :N], out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name,opts,expected_learnable", METHOD_MATRIX, ids=CASE_IDS)
def test_gradients_reach_every_learnable_parameter(name, opts, expected_learnable):
    fm = make(name, opts)
    q, k, v, mask = random_qkv(3)
    q.requires_grad_(True)
    loss = linear_attention(q, k, v, fm, mask).pow(2).sum() + linear_attention_weights(q, k, fm, mask).pow(2).sum()
    loss.backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
    params = [(n, p) for n, p in fm.named_parameters() if p.requires_grad]
    for pname, p in params:
        assert p.grad is not None, f"{name}: no gradient for {pname}"
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, f"{name}: zero gradient for {pname}"
    assert (fm.num_learnable_parameters() > 0) == expected_learnable
    assert fm.num_learnable_parameters() == sum(p.numel() for _, p in params)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name,opts", METHOD_CASES + [("softmax", {})], ids=CASE_IDS + ["softmax"])
def test_low_precision_large_norms_stay_finite(name, opts, dtype):
    fm = create_feature_map(name, D, H, **opts)
    q, k, v, mask = random_qkv(4)
    q = F.normalize(q, dim=-1) * 30  # norm 30: scores up to 900/√16 = 225
    k = F.normalize(k, dim=-1) * 30
    out, weights = fm.attend(q.to(dtype), k.to(dtype), v.to(dtype), mask, output_attentions=True)
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    assert torch.isfinite(weights).all()


@pytest.mark.parametrize("name,opts", METHOD_CASES, ids=CASE_IDS)
def test_large_norms_fp32_linear_matches_quadratic(name, opts):
    fm = create_feature_map(name, D, H, **opts)
    q, k, v, mask = random_qkv(5)
    q, k = F.normalize(q, dim=-1) * 30, F.normalize(k, dim=-1) * 30
    out = linear_attention(q, k, v, fm, mask)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, quadratic_attention(q, k, v, fm, mask), atol=1e-3, rtol=1e-3)


def test_softmax_equals_sdpa_and_reference():
    fm = create_feature_map("softmax", D, H)
    q, k, v, mask = random_qkv(6)
    out, weights = fm.attend(q, k, v, mask, output_attentions=True)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.bool()[:, None, None, :])
    torch.testing.assert_close(out, sdpa, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights @ v, out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, softmax_attention_weights(q, k, mask))
    out_nomask, _ = fm.attend(q, k, v)
    torch.testing.assert_close(out_nomask, F.scaled_dot_product_attention(q, k, v), atol=1e-5, rtol=1e-5)


def kl_to_softmax(fm, q, k):
    teacher = softmax_attention_weights(q, k)
    student = linear_attention_weights(q, k, fm)
    return (teacher * (teacher.clamp_min(1e-12).log() - student.clamp_min(1e-12).log())).sum(-1).mean().item()


@pytest.mark.parametrize("name,option", [("performer", "num_features"), ("flexformer-s", "num_frequencies")])
def test_random_features_approach_softmax(name, option):
    """Small isotropic q, k: the random-feature estimate of softmax attention improves with m."""
    g = torch.Generator().manual_seed(7)
    q, k = (torch.randn(1, 2, 32, D, generator=g) * 0.5 for _ in range(2))
    kls = []
    for m in (4, 64, 2048):
        kls.append(sum(kl_to_softmax(create_feature_map(name, D, 2, **{option: m}), q, k) for _ in range(1)))
    assert kls[0] > kls[1] > kls[2]
    assert kls[2] < 0.01


def test_performer_features_match_direct_formula():
    """The log-space computation equals exp(ωᵀx − ‖x‖²/2)/√m evaluated directly."""
    fm = create_feature_map("performer", D, H, num_features=32, seed=3)
    q, k, v, mask = random_qkv(8, scale=0.5)
    x_q, x_k = q * D**-0.25, k * D**-0.25
    phi = lambda x: torch.exp(torch.einsum("bhnd,hmd->bhnm", x, fm.omega) - x.pow(2).sum(-1, keepdim=True) / 2) / math.sqrt(32)
    kappa = phi(x_q) @ phi(x_k).transpose(-1, -2) * mask[:, None, None, :]
    expected = kappa / kappa.sum(-1, keepdim=True)
    torch.testing.assert_close(linear_attention_weights(q, k, fm, mask), expected, atol=1e-5, rtol=1e-4)


def test_darkformer_features_match_direct_formula():
    """One product with [zM; M] equals DARKFormer eq. 3 evaluated step by step: x̃ = Mx, then
    exp(zᵀx̃ − ‖x̃‖²/2)/√m (a learned, non-identity M)."""
    fm = create_feature_map("darkformer", D, H, num_features=32, rank=D // 2, seed=3)
    with torch.no_grad():
        fm.metric.add_(0.3 * torch.randn_like(fm.metric))
    q, k, v, mask = random_qkv(8, scale=0.5)
    x_q, x_k = q * D**-0.25, k * D**-0.25

    def phi(x):
        embedded = torch.einsum("bhnd,hrd->bhnr", x, fm.metric)
        return torch.exp(torch.einsum("bhnr,hmr->bhnm", embedded, fm.z) - embedded.pow(2).sum(-1, keepdim=True) / 2) / math.sqrt(32)

    with torch.no_grad():
        kappa = phi(x_q) @ phi(x_k).transpose(-1, -2) * mask[:, None, None, :]
        expected = kappa / kappa.sum(-1, keepdim=True)
        torch.testing.assert_close(linear_attention_weights(q, k, fm, mask), expected, atol=1e-5, rtol=1e-4)


QUERY_CASES = [(name, opts, buffered) for name, opts in METHOD_CASES if get_feature_map_class(name).skips_log_scale
               for buffered in (False, True) if not buffered or get_feature_map_class(name).writes_out]


@pytest.mark.parametrize("name,opts,buffered", QUERY_CASES, ids=lambda case: str(case))
def test_a_query_without_its_log_scale_has_the_same_features(name, opts, buffered):
    """``log_scale=False`` (what queries are asked with) drops only the log-scale: the features are those of the
    full call, returned or written into a buffer (the inference path), a learned M included."""
    fm = make(name, opts).eval()
    with torch.no_grad():
        for p in fm.parameters():
            p.add_(0.2 * torch.randn_like(p))
        x = random_qkv(4, scale=0.5)[0] * D**-0.25
        buffers = [{"out": torch.empty(H, B, N, fm.feature_dim).transpose(0, 1)} if buffered else {} for _ in "ab"]
        full, log = fm(x, **buffers[0])
        query, none = fm(x, log_scale=False, **buffers[1])
    assert log is not None and none is None
    torch.testing.assert_close(query, full, rtol=0, atol=0)


def test_flexformer_features_match_direct_formula():
    for name in ("flexformer-s", "flexformer-n"):
        fm = make(name, {})
        q, k, _, mask = random_qkv(9, scale=0.5)
        x_q, x_k = q.double() * D**-0.25, k.double() * D**-0.25

        def phi(x):
            if name == "flexformer-s":
                p = torch.einsum("bhnd,hfd->bhnf", x, fm.omega.double())
                return torch.exp(x.pow(2).sum(-1, keepdim=True) / 2) * torch.cat([p.cos(), p.sin()], -1) / math.sqrt(D)
            w1, w2 = fm.omega1.double(), fm.omega2.double()
            a = torch.einsum("bhnd,hfd->bhnf", x, (w1 + w2) / 2)
            c = torch.einsum("bhnd,hfd->bhnf", x, (w1 - w2) / 2).cos()
            env = torch.exp(x.pow(2).sum(-1, keepdim=True) / torch.exp(fm.tau.double())[:, None, None])
            return env * torch.cat([a.cos() * c, a.sin() * c], -1) / (2 * math.sqrt(D))

        kappa = phi(x_q) @ phi(x_k).transpose(-1, -2) * mask[:, None, None, :]
        expected = kappa / kappa.sum(-1, keepdim=True)
        got = linear_attention_weights(q, k, fm, mask).double()
        # compare where the normaliser is not near zero (negative kernel values can cancel)
        ok = kappa.sum(-1).abs() > 1e-2 * kappa.abs().sum(-1)
        assert ok.float().mean() > 0.9
        torch.testing.assert_close(got[ok], expected[ok], atol=1e-4, rtol=1e-3)


def test_luna_matches_listing_1_reference():
    """Our batched ψ equals Listing 1's per-channel nn.Linear MLPs with the same weights."""
    for shared in (True, False):
        fm = make("luna", {"shared_mlp": shared, "projections": 4, "channels": 3, "hidden": 5})
        x = torch.randn(B, H, N, D)
        u = torch.einsum("md,bhnd->bhnm", fm.proj_weight, x) + fm.proj_bias  # TaskSpecificProjections
        c = 1 if shared else 3
        outs = []
        for i in range(c):  # ScalarMLP: fc1 (1 -> hidden), ReLU, fc2 (hidden -> o), ReLU
            fc1 = torch.nn.Linear(1, 5)
            fc2 = torch.nn.Linear(5, 3 if shared else 1)
            with torch.no_grad():
                fc1.weight.copy_(fm.mlp_w1[i][:, None]); fc1.bias.copy_(fm.mlp_b1[i])
                fc2.weight.copy_(fm.mlp_w2[i].T); fc2.bias.copy_(fm.mlp_b2[i])
            outs.append(F.relu(fc2(F.relu(fc1(u.reshape(-1, 1))))))
        y = torch.cat(outs, dim=1).view(B, H, N, 4, 3) / math.sqrt(4)
        features, log_scale = fm(x)
        assert log_scale is None
        torch.testing.assert_close(features, y.reshape(B, H, N, 12))


def test_luna_per_head_projections_give_each_head_its_own_map():
    """``shared_projections=False``: head h's features are those of a shared-projection map whose
    W, b are W_h, b_h (same ψ)."""
    fm = make("luna", {"shared_projections": False, "projections": 4, "channels": 3, "hidden": 5})
    assert fm.proj_weight.shape == (H, 4, D) and fm.proj_bias.shape == (H, 4)
    shared = make("luna", {"projections": 4, "channels": 3, "hidden": 5})
    shared.load_state_dict({k: v for k, v in fm.state_dict().items() if not k.startswith("proj_")}, strict=False)
    x = torch.randn(B, H, N, D)
    features = fm(x)[0]
    for h in range(H):
        with torch.no_grad():
            shared.proj_weight.copy_(fm.proj_weight[h]); shared.proj_bias.copy_(fm.proj_bias[h])
        torch.testing.assert_close(features[:, h], shared(x)[0][:, h])
    assert fm.num_learnable_parameters() == shared.num_learnable_parameters() + (H - 1) * (4 * D + 4)
    with pytest.raises(ValueError, match="heads"):
        fm(torch.randn(B, H + 1, N, D))


def test_cosformer_kernel_is_relu_times_cosine_of_position_gap():
    fm = make("cosformer", {})
    q, k, _, mask = random_qkv(10)
    kappa_ref = torch.relu(q * D**-0.25) @ torch.relu(k * D**-0.25).transpose(-1, -2)
    lengths = mask.sum(1)
    i = torch.arange(N, dtype=torch.float32)
    gap = (i[:, None] - i[None, :])[None] / lengths[:, None, None]
    kappa_ref = kappa_ref * torch.cos(math.pi / 2 * gap)[:, None] * mask[:, None, None, :]
    from linearize.attention import kernel_matrix
    got = kernel_matrix(q, k, fm, mask)
    torch.testing.assert_close(got[0], kappa_ref[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1, :, :N - 3], kappa_ref[1, :, :N - 3], atol=1e-5, rtol=1e-5)


def test_all_zero_features_give_uniform_attention_not_nan():
    fm = make("relu", {})
    q, k, v, mask = random_qkv(11)
    q = -q.abs()  # ReLU(q) = 0 everywhere
    weights = linear_attention_weights(q, k, fm, mask)
    torch.testing.assert_close(weights[0], torch.full_like(weights[0], 1 / N))
    out = linear_attention(q, k, v, fm, mask)
    torch.testing.assert_close(out[0], v[0].mean(dim=1, keepdim=True).expand_as(out[0]), atol=1e-5, rtol=1e-5)


def test_kernel_statistics_reports_negative_and_zero_entries():
    q, k, _, mask = random_qkv(12, scale=3.0)
    flex = kernel_statistics(q, k, make("flexformer-n", {"init_scale": 1.0}), mask)  # the paper's start
    assert 0 < flex["negative_kernel_fraction"] < 1
    positive_start = kernel_statistics(q, k, make("flexformer-n", {}), mask)  # the default init_scale
    assert positive_start["negative_kernel_fraction"] < flex["negative_kernel_fraction"]
    relu = kernel_statistics(q, k, make("relu", {}), mask)
    assert relu["negative_kernel_fraction"] == 0
    assert 0.3 < relu["zero_feature_fraction"] < 0.7  # ReLU of a Gaussian: about half


# ---- options -----------------------------------------------------------------------------------

def test_luna_options_change_shapes_and_parameters():
    base = create_feature_map("luna", D, H)
    assert base.feature_dim == 64 and base.proj_weight.shape == (8, D)
    assert base.mlp_w1.shape == (1, 64) and base.mlp_w2.shape == (1, 64, 8)
    fm = create_feature_map("luna", D, H, projections=4, channels=3, hidden=16)
    assert fm.feature_dim == 12 and fm.proj_weight.shape == (4, D) and fm.mlp_w2.shape == (1, 16, 3)
    per_channel = create_feature_map("luna", D, H, shared_mlp=False)
    assert per_channel.mlp_w1.shape == (8, 64) and per_channel.mlp_w2.shape == (8, 64, 1)
    assert per_channel.num_learnable_parameters() > base.num_learnable_parameters()
    gated = create_feature_map("luna", D, H, envelope=True)
    assert gated.envelope_weight.shape == (8, D)
    assert gated.num_learnable_parameters() == base.num_learnable_parameters() + 8 * D + 8
    rms = create_feature_map("luna", D, H, ch_rms=True, ch_rms_target=1e-3)
    rms.load_state_dict(base.state_dict())
    x = torch.randn(B, H, N, D) * 4
    assert rms(x)[0].pow(2).mean() < base(x)[0].pow(2).mean()  # channels scaled down to the target


@pytest.mark.parametrize("name", ["hedgehog", "t2r"])
def test_feature_dim_option(name):
    fm = create_feature_map(name, D, H, feature_dim=5)
    assert fm.weight.shape == (H, 5, D)
    assert fm.feature_dim == (10 if name == "hedgehog" else 5)
    assert fm(torch.randn(B, H, N, D))[0].shape == (B, H, N, fm.feature_dim)


def test_hedgehog_starts_at_identity():
    fm = create_feature_map("hedgehog", D, H)
    assert torch.equal(fm.weight, torch.eye(D).expand(H, D, D))


@pytest.mark.parametrize("name", ["performer", "darkformer"])
def test_random_features_are_seeded_buffers_saved_and_never_redrawn(name):
    attr = "omega" if name == "performer" else "z"
    a = create_feature_map(name, D, H, num_features=16, seed=1)
    b = create_feature_map(name, D, H, num_features=16, seed=1)
    c = create_feature_map(name, D, H, num_features=16, seed=2)
    assert getattr(a, attr).shape[:2] == (H, 16) and a.feature_dim == 16
    assert torch.equal(getattr(a, attr), getattr(b, attr))
    assert not torch.equal(getattr(a, attr), getattr(c, attr))
    assert attr in a.state_dict()
    assert attr not in dict(a.named_parameters())
    x = torch.randn(B, H, N, D)
    a.eval()
    torch.testing.assert_close(a(x)[0], a(x)[0])
    a.train()
    before = getattr(a, attr).clone()
    a(x)
    assert torch.equal(getattr(a, attr), before)


def test_performer_learnable_and_orthogonality():
    fm = create_feature_map("performer", D, H, learnable=True)
    assert "omega" in dict(fm.named_parameters())
    omega = create_feature_map("performer", D, 1, num_features=D).omega[0]
    directions = omega / omega.norm(dim=1, keepdim=True)
    torch.testing.assert_close(directions @ directions.T, torch.eye(D), atol=1e-5, rtol=0)


def test_darkformer_options_and_whitening():
    fm = create_feature_map("darkformer", D, H, rank=4, num_features=8)
    assert fm.metric.shape == (H, 4, D) and fm.z.shape == (H, 8, 4)
    full = create_feature_map("darkformer", D, H, init="whiten")
    g = torch.Generator().manual_seed(0)
    mixing = torch.randn(D, D, generator=g)
    x = torch.randn(1, H, 4000, D, generator=g) @ mixing  # anisotropic, correlated
    full.calibrate(x)
    white = torch.einsum("bhnd,hrd->bhnr", x - x.mean(2, keepdim=True), full.metric)
    cov = white[0].transpose(1, 2) @ white[0] / (4000 - 1)
    torch.testing.assert_close(cov, torch.eye(D).expand(H, D, D), atol=1e-3, rtol=1e-3)
    with pytest.raises(ValueError, match="init must be"):
        create_feature_map("darkformer", D, H, init="nope")


@pytest.mark.parametrize("name", ["flexformer-s", "flexformer-n"])
def test_flexformer_num_frequencies(name):
    fm = create_feature_map(name, D, H, num_frequencies=5)
    assert fm.feature_dim == 10
    shapes = [p.shape for n, p in fm.named_parameters() if n.startswith("omega")]
    assert all(s == (H, 5, D) for s in shapes) and len(shapes) == (1 if name == "flexformer-s" else 2)


@pytest.mark.parametrize("scale", [0.1, 0.35, 1.0])
def test_flexformer_n_init_scale_starts_at_the_stated_kernel(scale):
    """ω1, ω2 ~ N(0, s²I), τ₀ = log(2/s²): E[φ(q)ᵀφ(k)] = (exp(s²·qᵀk) + 1)/8 (flexformer.py's
    docstring), checked by Monte Carlo over 20,000 frequency pairs."""
    torch.manual_seed(0)
    fm = create_feature_map("flexformer-n", D, 1, init_scale=scale, num_frequencies=20000)
    assert fm.tau.item() == pytest.approx(math.log(2 / scale**2))
    assert fm.omega1.std().item() == pytest.approx(scale, rel=0.02)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 1, 6, D, generator=g) * 0.25
    features, log_scale = fm(x)
    kernel = (features * log_scale.exp()) @ (features * log_scale.exp()).transpose(-1, -2)
    expected = ((scale**2 * x @ x.transpose(-1, -2)).exp() + 1) / 8
    torch.testing.assert_close(kernel, expected, atol=0.01, rtol=0.02)


@pytest.mark.parametrize("scale", [0.1, 1.0])
def test_flexformer_s_learnable_envelope_starts_at_the_softmax_kernel(scale):
    """ω ~ N(0, s²I), envelope exp(‖x‖²/e^τ) with τ₀ = log(2/s²): E[φ(q)ᵀφ(k)] = exp(s²·qᵀk)."""
    torch.manual_seed(0)
    fm = create_feature_map("flexformer-s", D, 1, learnable_envelope=True, init_scale=scale, num_frequencies=20000)
    assert fm.tau.item() == pytest.approx(math.log(2 / scale**2))
    x = torch.randn(1, 1, 6, D, generator=torch.Generator().manual_seed(1)) * 0.25
    features, log_scale = fm(x)
    kernel = (features * log_scale.exp()) @ (features * log_scale.exp()).transpose(-1, -2)
    torch.testing.assert_close(kernel, (scale**2 * x @ x.transpose(-1, -2)).exp(), atol=0.03, rtol=0.03)
    paper = create_feature_map("flexformer-s", D, H)
    assert not hasattr(paper, "tau") and paper.options == {"num_frequencies": None, "learnable_envelope": False,
                                                            "init_scale": 1.0}


@pytest.mark.parametrize("name", ["flexformer-s", "flexformer-n"])
def test_flexformer_init_scale_must_be_positive(name):
    with pytest.raises(ValueError, match="init_scale must be > 0"):
        create_feature_map(name, D, H, init_scale=0.0)


def test_unknown_method_or_option_lists_valid_names():
    with pytest.raises(ValueError, match="valid methods: luna, hedgehog"):
        create_feature_map("lunar", D, H)
    with pytest.raises(ValueError, match="valid options: projections, channels, hidden"):
        create_feature_map("luna", D, H, projection=3)
    with pytest.raises(ValueError, match=r"valid options: \(none\)"):
        create_feature_map("elu", D, H, feature_dim=3)
    assert method_options("performer") == {"num_features": 64, "seed": 0, "learnable": False}


def test_registry_refuses_duplicates():
    with pytest.raises(ValueError, match="already registered"):
        @register_feature_map
        class Again(FeatureMap):
            name = "luna"


@pytest.mark.parametrize("given", ["x", object, 3])
def test_registry_refuses_what_is_not_a_feature_map_class(given):
    with pytest.raises(TypeError, match="decorates a FeatureMap subclass"):
        register_feature_map(given)


def test_options_are_recorded_for_the_config():
    fm = create_feature_map("luna", D, H, projections=4)
    assert fm.options["projections"] == 4 and fm.options["channels"] == 8


@pytest.mark.parametrize("name", methods())
def test_every_option_is_a_typed_field_with_help(name):
    import dataclasses

    from linearize.attention.feature_maps import get_feature_map_class

    cls = get_feature_map_class(name)
    fields = dataclasses.fields(cls.options_class)
    assert {f.name: f.default for f in fields} == method_options(name)
    assert all(f.metadata.get("help") for f in fields), name
    assert cls.card_note and cls.paper
    assert create_feature_map(name, D, H).options == method_options(name)  # every option recorded


@pytest.mark.parametrize("name,options,message", [
    ("luna", {"shared_mlp": "maybe"}, "luna: option shared_mlp must be true or false, got 'maybe'"),
    ("luna", {"projections": 2.5}, "luna: option projections must be an integer, got 2.5"),
    ("luna", {"hidden": True}, "luna: option hidden must be an integer, got True"),
    ("hedgehog", {"feature_dim": "8"}, "hedgehog: option feature_dim must be an integer or null, got '8'"),
    ("darkformer", {"init": 1}, "darkformer: option init must be a string, got 1"),
])
def test_an_option_of_the_wrong_type_is_one_line_and_never_coerced(name, options, message):
    from linearize.errors import LinearizeError

    with pytest.raises(LinearizeError) as caught:
        create_feature_map(name, D, H, **options)
    assert str(caught.value) == message and isinstance(caught.value, ValueError)
    assert create_feature_map("luna", D, H, ch_rms_target=1).ch_rms_target == 1.0  # an integer is a number


def test_option_values_from_the_command_line_are_typed_by_the_dataclass():
    from linearize.errors import LinearizeError
    from linearize.recipes import parse_options

    fm = create_feature_map("luna", D, H, **parse_options(["projections=4", "shared_mlp=false", "ch_rms_target=0.2"]))
    assert (fm.projections, fm.shared_mlp, fm.ch_rms_target) == (4, False, 0.2)
    for pair in ("shared_mlp=maybe", "projections=2.5"):
        with pytest.raises(LinearizeError, match="must be"):
            create_feature_map("luna", D, H, **parse_options([pair]))


def test_every_module_of_the_package_is_imported_and_bundled():
    import pkgutil

    import linearize.attention.feature_maps as package

    found = {info.name for info in pkgutil.iter_modules(package.__path__)}
    assert package.MAP_MODULES[0] == "base" and set(package.MAP_MODULES) == found
    assert {package.get_feature_map_class(name).__module__.rsplit(".", 1)[1] for name in methods()} <= found


def test_card_notes_default_comparison_and_methods_table_come_from_the_registry():
    from linearize.attention.feature_maps import default_comparison, method_notes, methods_table, option_help
    from linearize.attention.feature_maps import get_feature_map_class

    notes = method_notes()
    assert sorted(m for grouped, _ in notes.values() for m in grouped) == sorted(methods())
    assert notes["flexformer-s"][0] == ("flexformer-s", "flexformer-n") and notes["elu"][0] == ("elu", "relu")
    assert default_comparison() == ["luna", "hedgehog", "t2r", "performer", "darkformer", "flexformer-s",
                                    "flexformer-n", "elu", "cosformer"]
    table = methods_table()
    assert len(table.strip().splitlines()) == 2 + len(methods())
    for name in methods():
        row = next(line for line in table.splitlines() if line.startswith(f"| `{name}` |"))
        for option, default, help_text in option_help(get_feature_map_class(name).options_class):
            assert f"`{option}`" in row and help_text in row
    assert "`projections` (8)" in table and "`shared_mlp` (true)" in table and '`init` ("identity")' in table
