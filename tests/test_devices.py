"""Every method on every device and dtype the machine has, against the CPU float64 reference, and
both training stages under bf16 autocast on the machine's accelerator.

The same checks run on CPU (fp32, bf16) everywhere and on CUDA (fp32, bf16, fp16) where a GPU is
present; the CUDA cases skip cleanly without one. The reference is the naive quadratic form
(``quadratic_attention``) in float64 on the CPU.
"""

import pytest
import torch
from torch.utils.data import DataLoader

import linearize
from linearize.attention import create_feature_map, linear_attention, quadratic_attention
from linearize.distill import DistillConfig, distill
from linearize.finetune import FinetuneConfig, finetune
from test_feature_maps import CASE_IDS, METHOD_CASES
from tiny_models import build, inputs

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
#: (device, dtype, tolerance): the output is rounded to the dtype (fp16 keeps 10 mantissa bits,
#: bf16 7: 2^-8 ≈ 0.004 relative); features and sums are float32 on every device
SETTINGS = [
    pytest.param("cpu", torch.float32, 1e-4, id="cpu-fp32"),
    pytest.param("cpu", torch.bfloat16, 1e-2, id="cpu-bf16"),
    pytest.param("cuda", torch.float32, 1e-4, id="cuda-fp32", marks=CUDA),
    pytest.param("cuda", torch.bfloat16, 1e-2, id="cuda-bf16", marks=CUDA),
    pytest.param("cuda", torch.float16, 2e-3, id="cuda-fp16", marks=CUDA),
]
B, H, N, D = 2, 3, 33, 16


def _qkv_and_mask(seed=0):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, D, generator=generator) for _ in range(3))
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, N - 7:] = False
    return q, k, v, mask


@pytest.mark.parametrize("device, dtype, atol", SETTINGS)
@pytest.mark.parametrize("name, options", METHOD_CASES, ids=CASE_IDS)
def test_every_method_on_the_device_matches_the_cpu_reference(name, options, device, dtype, atol):
    torch.manual_seed(0)
    feature_map = create_feature_map(name, head_dim=D, num_heads=H, **options).eval()
    # the inputs as the dtype holds them: the reference sees the same numbers (a signed map's
    # output near a vanishing normaliser moves far with its inputs' rounding)
    q, k, v = (t.to(dtype) for t in _qkv_and_mask()[:3])
    mask = _qkv_and_mask()[3]
    with torch.no_grad():
        reference = quadratic_attention(q.double(), k.double(), v.double(), feature_map.double(), key_padding_mask=mask)
        feature_map.float().to(device)
        got = linear_attention(*(t.to(device) for t in (q, k, v)), feature_map, key_padding_mask=mask.to(device))
    assert got.device.type == device and got.dtype == dtype
    real = mask[:, None, :, None].expand_as(reference)  # padded query rows carry no meaning
    torch.testing.assert_close(got.cpu().double()[real], reference[real], atol=atol, rtol=atol)


#: (convert options, sequence length): a plain model, and a hybrid one long enough for its chunked
#: path (inference), whose sums stay float32 under autocast, sink terms included (autocast once ran
#: its sink products in bf16 beside float32 buffers: a dtype error on the GPU's stage-2 evaluation)
MODELS = [pytest.param({}, 12, id="linear"), pytest.param({"window": 4, "sinks": "first"}, 24, id="hybrid")]


@pytest.mark.parametrize("device, dtype, atol", SETTINGS)
@pytest.mark.parametrize("options, seq", MODELS)
def test_a_converted_model_on_the_device_matches_the_cpu_model(device, dtype, atol, options, seq):
    model = linearize.convert(build("bert"), "hedgehog", **options).eval()
    batch = inputs("bert", batch=2, seq=seq, pad=3)
    with torch.no_grad():
        expected = model(**batch).logits
        model.to(device)
        with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
            got = model(**{key: value.to(device) for key, value in batch.items()}).logits
    torch.testing.assert_close(got.float().cpu(), expected, atol=atol, rtol=atol)


def _loader(n=16, batch_size=4):
    examples = []
    for i in range(n):
        batch = inputs("bert", batch=2, seq=10, pad=1 + i % 3, seed=100 + i)
        examples.append({key: value[i % 2] for key, value in batch.items()} | {"labels": torch.tensor(i % 2)})
    return DataLoader(examples, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))


def test_both_stages_train_under_bf16_autocast_on_the_machines_device(tmp_path):
    """accelerate picks the device (a GPU where there is one) and autocasts to bf16: losses stay
    finite, the feature maps (stage 1) and the whole model (stage 2) move."""
    student = linearize.convert(build("bert"), "hedgehog")
    quiet = {"progress": False, "log": lambda *a, **k: None}
    maps_before = {name: p.detach().clone() for name, p in student.named_parameters() if "linearize_map" in name}
    result = distill(student, _loader(), DistillConfig(lr=1e-2, epochs=1, mixed_precision="bf16"),
                     checkpoint_dir=tmp_path / "s1", **quiet)
    assert all(torch.isfinite(torch.tensor(e["ce"])) for e in result.history)
    moved = [name for name, p in student.named_parameters() if name in maps_before
             and not torch.equal(p.detach().cpu(), maps_before[name])]
    assert maps_before and len(moved) == len(maps_before)
    result = finetune(student, _loader(), _loader(), "sst2", tmp_path / "s2",
                      config=FinetuneConfig(lr=1e-3, batch_size=4, epochs=1, patience=0, mixed_precision="bf16"), **quiet)
    assert all(torch.isfinite(torch.tensor(e["train_loss"])) for e in result.history)
    assert result.steps == 4


@CUDA
def test_the_users_processes_time_saved_folders_on_the_gpu(tmp_path):
    """``bench folder --processes N --device cuda --dtype bf16``: fresh processes load the folder with
    plain transformers onto the GPU in bf16 (the state a GPU user is in) and time it synchronised."""
    from linearize.bench.user_state import user_state_rows

    build("bert", head="AutoModel").save_pretrained(tmp_path / "softmax")
    linearize.save(linearize.convert(build("bert", head="AutoModel"), "hedgehog"), tmp_path / "hedgehog")
    folders = {"softmax": tmp_path / "softmax", "hedgehog": tmp_path / "hedgehog"}
    rows = user_state_rows(folders, "softmax", [16], processes=1, threads=1, repeats=2, warmup=1,
                           device="cuda", dtype="bfloat16")
    assert all(result["median_ms"] > 0 for result in rows[0]["results"].values())
