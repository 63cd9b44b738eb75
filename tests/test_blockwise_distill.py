"""Stage 1's attention loss over blocks of query rows equals the one-shot loss (issue 19, item 4):
value, logged statistics, exact softmax output and gradients, alone and through ``distill``."""

import pytest
import torch
from torch.utils.data import DataLoader

import linearize
from linearize.attention import create_feature_map, linear_attention_weights
from linearize.attention.core import softmax_attention_weights
from linearize.convert import feature_maps_of
from linearize.distill import (DistillConfig, attention_cross_entropy, attention_entropy, blockwise_distillation_terms,
                               distill, negative_weight_mass, output_mse)
from tiny_models import build, inputs

B, H, N, D = 2, 2, 512, 16
# a learnable exponential map, LUNA, a map whose features depend on the position, a signed kernel
METHODS = [("hedgehog", {}), ("luna", {}), ("cosformer", {}), ("flexformer-s", {})]


def _qkv(n=N, seed=0, pad=77):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=g) for _ in range(3))
    mask = torch.ones(B, n)
    mask[1, n - pad:] = 0
    return q, k, v, mask


def _one_shot(q, k, v, fm, mask, query_mask):
    """Today's path (``DistillRecorder``): full N×N teacher and student rows."""
    with torch.no_grad():
        teacher = softmax_attention_weights(q, k, mask)
        out = teacher @ v
    student = linear_attention_weights(q, k, fm, mask)
    return {"ce": attention_cross_entropy(teacher, student, query_mask),
            "mse": output_mse(student @ v, out, query_mask), "negative": negative_weight_mass(student, query_mask),
            "teacher_entropy": attention_entropy(teacher, query_mask),
            "student_entropy": attention_entropy(student.detach().clamp_min(0), query_mask), "out": out}


def _grads(loss, tensors):
    return torch.autograd.grad(loss, tensors, allow_unused=True, retain_graph=True)


@pytest.mark.parametrize("block", [1000, 512, 128, 100, 37])
@pytest.mark.parametrize("name,opts", METHODS, ids=[name for name, _ in METHODS])
def test_blockwise_loss_and_gradients_equal_the_one_shot_ones(name, opts, block):
    torch.manual_seed(0)
    fm = create_feature_map(name, D, H, **opts)
    q, k, v, mask = _qkv()
    q.requires_grad_(True)
    k.requires_grad_(True)
    wrt = [q, k] + [p for p in fm.parameters() if p.requires_grad]
    ref = _one_shot(q, k, v, fm, mask, mask)
    got = blockwise_distillation_terms(q, k, v, fm, mask, block_size=block, with_mse=True, with_negative_grad=True)
    for key in ("ce", "mse", "negative", "teacher_entropy", "student_entropy"):
        torch.testing.assert_close(getattr(got, key), ref[key], atol=1e-5, rtol=1e-5, msg=key)
    torch.testing.assert_close(got.out, ref["out"], atol=1e-5, rtol=1e-5)
    assert len(wrt) > 2 or name == "cosformer"  # the learnable maps' parameters are compared too
    for term in ("ce", "mse", "negative"):
        expected, actual = _grads(ref[term], wrt), _grads(getattr(got, term), wrt)
        for index, (e, a) in enumerate(zip(expected, actual)):
            assert (e is None) == (a is None), (term, index)
            if e is not None:
                # to 1e-5 of the gradient's scale (Flexformer's near-cancelling normalisers give ~1e6)
                atol = 1e-5 * max(1.0, e.abs().max().item())
                torch.testing.assert_close(a, e, atol=atol, rtol=1e-4, msg=f"{term} gradient {index}")


def test_blockwise_without_padding_and_for_cross_attention():
    torch.manual_seed(0)
    fm = create_feature_map("hedgehog", D, H)
    q, k, v, _ = _qkv(n=300)
    ref = _one_shot(q, k, v, fm, None, None)
    got = blockwise_distillation_terms(q, k, v, fm, None, block_size=64)
    torch.testing.assert_close(got.ce, ref["ce"], atol=1e-5, rtol=1e-5)
    assert got.mse is None
    keys_mask = torch.ones(B, N)
    keys_mask[0, :50] = 0
    _, k_long, v_long, _ = _qkv(seed=1)  # 300 queries over 512 keys: every query row counts
    ref = _one_shot(q, k_long, v_long, fm, keys_mask, None)
    got = blockwise_distillation_terms(q, k_long, v_long, fm, keys_mask, block_size=64)
    torch.testing.assert_close(got.ce, ref["ce"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.out, ref["out"], atol=1e-5, rtol=1e-5)


def test_blocks_stay_under_the_element_budget_and_give_the_same_loss(monkeypatch):
    """``block_size`` is the most query rows a block takes; with many sequences, heads and keys a
    block takes fewer, so its ``B×H×b×N`` rows stay under ``BLOCK_ELEMENTS`` (one row at least),
    and the loss is unchanged."""
    from linearize.distill import blockwise

    assert blockwise.rows_per_block(1, 12, 4096, 512) == 341  # 2**24 // (12 × 4,096)
    assert blockwise.rows_per_block(16, 12, 2048, 512) == 42
    assert blockwise.rows_per_block(1, 2, 512, 64) == 64
    assert blockwise.rows_per_block(10**6, 12, 10**6, 512) == 1
    torch.manual_seed(0)
    fm = create_feature_map("hedgehog", D, H)
    q, k, v, mask = _qkv()
    sizes = []
    original = blockwise._block_sums
    monkeypatch.setattr(blockwise, "_block_sums", lambda phi_q, *a, **k: sizes.append(phi_q.shape[2]) or
                        original(phi_q, *a, **k))
    monkeypatch.setattr(blockwise, "BLOCK_ELEMENTS", B * H * N * 50)  # 50 rows of every sequence and head
    got = blockwise_distillation_terms(q, k, v, fm, mask, block_size=128)
    assert sizes == [50] * 10 + [12]
    torch.testing.assert_close(got.ce, _one_shot(q, k, v, fm, mask, mask)["ce"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("method,mse,penalty", [("hedgehog", 0.0, 0.0), ("hedgehog", 0.5, 0.0),
                                                ("flexformer-s", 0.0, 0.1)])
def test_a_blockwise_training_step_takes_memory_linear_in_n(method, mse, penalty):
    """Stage 1's step (loss and backward, as ``DistillRecorder`` trains) over blocks of 16 query rows:
    its peak extra memory doubles from N = 512 to 1,024 (linear; measured 2.00×), whichever terms
    the loss uses. A term computed with a graph that backward never reads (the negative mass when it
    is not penalised) kept every block's recomputed rows alive, N×N in all (measured 3.25×)."""
    from linearize.bench import peak_extra_memory
    from linearize.distill import DistillRecorder

    peaks = []
    for n in (512, 1024):
        torch.manual_seed(0)
        fm = create_feature_map(method, D, H)
        fm.layer_index = 0
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, H, n, D, generator=g) for _ in range(3))
        recorder = DistillRecorder(train=True, block_size=16, output_loss_weight=mse, negative_weight_penalty=penalty)
        peaks.append(peak_extra_memory(lambda: recorder(fm, q, k, v, torch.ones(1, n), None, False)[0]))
        assert all(p.grad is not None for p in fm.parameters() if p.requires_grad)
    assert peaks[1] <= 2.1 * peaks[0], f"peak {peaks[0] / 2**20:.2f} -> {peaks[1] / 2**20:.2f} MiB from N = 512 to 1,024"


def _student(method):
    model = build("bert", seed=0)
    torch.manual_seed(1)
    return linearize.convert(model, method, **({"projections": 4, "hidden": 8} if method == "luna" else {}))


def _long_loader(seq):
    examples = []
    for i in range(8):
        batch = inputs("bert", batch=2, seq=seq, pad=1 + 13 * (i % 3), seed=200 + i)
        examples.append({key: value[i % 2] for key, value in batch.items()})
    return DataLoader(examples, batch_size=4, shuffle=False)


@pytest.mark.parametrize("method,weight", [("hedgehog", 0.5), ("luna", 0.0)])
def test_distill_blockwise_equals_one_shot_on_a_long_sequence(method, weight, monkeypatch):
    """The real stage-1 path: 96-token sequences in blocks of 20 rows train the same maps (with
    and without the output-MSE term)."""
    from linearize.distill import stage1

    calls = []
    original = stage1.blockwise_distillation_terms
    monkeypatch.setattr(stage1, "blockwise_distillation_terms", lambda *a, **k: calls.append(1) or original(*a, **k))
    quiet = {"progress": False, "log": lambda *a, **k: None}
    results, students = [], []
    for block in (0, 20):
        student = _student(method)
        config = DistillConfig(lr=1e-2, epochs=2, block_size=block, output_loss_weight=weight)
        results.append(distill(student, _long_loader(96), config, **quiet))
        students.append(student)
        assert bool(calls) == bool(block)  # block_size 0: one shot; 20: block by block
    one_shot, blockwise = results
    assert blockwise.steps == one_shot.steps == 4
    for a, b in zip(one_shot.history, blockwise.history):
        assert b["ce"] == pytest.approx(a["ce"], abs=1e-5) and b["kl"] == pytest.approx(a["kl"], abs=1e-5)
    for when in ("per_layer_before", "per_layer_after"):
        for layer, row in getattr(one_shot, when).items():
            assert getattr(blockwise, when)[layer] == pytest.approx(row, abs=1e-5)
    maps = [feature_maps_of(s) for s in students]
    for index, fm in maps[0].items():
        for (name, a), (_, b) in zip(fm.named_parameters(), maps[1][index].named_parameters()):
            torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4, msg=f"layer {index} {name}")


def test_default_block_size_keeps_short_sequences_on_the_one_shot_path(monkeypatch):
    """At N ≤ block_size (the default recipe's N = 64 included) the blockwise code never runs, so
    every recorded result stays bit-identical."""
    from linearize.distill import stage1

    def refuse(*args, **kwargs):
        raise AssertionError("the blockwise path ran on a short sequence")

    monkeypatch.setattr(stage1, "blockwise_distillation_terms", refuse)
    assert DistillConfig().block_size >= 64
    distill(_student("hedgehog"), _long_loader(64), DistillConfig(max_steps=1), progress=False,
            log=lambda *a, **k: None)
