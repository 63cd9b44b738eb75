"""Per layer, on one batch of the default recipe's dev sentences: how much of a softmax teacher's
attention mass falls on student weights at or below the stage-1 cross-entropy's log clamp (where
the loss has no gradient), the fraction of negative student weights and of negative kernel values
(Flexformer's trigonometric features), and the mean/max of the scaled query's ‖q/d^¼‖²/2 (the log
of the exponential maps' envelope). BERT-family teachers (``model.bert.encoder.layer``).

usage: .venv/bin/python docs/experiments/flexformer-probe/attention_diagnosis.py TEACHER_DIR METHOD [STUDENT_DIR]
  STUDENT_DIR: a saved converted model (e.g. a run's stage1/); without it, METHOD's map at init.
  METHOD ``scales``: no map; per layer, the Gaussian factor exp(−‖q̃−k̃‖²/2) of each query's top
  teacher key (what Flexformer's trigonometric features estimate, with noise ~1/√(2n)), the key
  envelope ‖k̃‖²/2, and the KL from the teacher to attention set by key norms alone
  (Â_ij ∝ exp(‖k̃_j‖²/2): flexformer-s's kernel as ω → 0). TEACHER_DIR may be ``minilm``.
"""
import sys

import torch
import transformers as T

import linearize
from linearize.attention.core import linear_attention_weights, softmax_attention_weights, kernel_statistics
from linearize.attention.feature_maps import create_feature_map
from linearize.convert.api import feature_maps_of
from linearize.convert.loading import resolve_model_name
from linearize.distill.losses import LOG_FLOOR
from linearize.pipeline import TaskData
from linearize.recipes import load_recipe


def default_loaders(batch_size=32):
    """The default recipe's (minilm-moviereviews) loaders, seed 0."""
    return TaskData.load(load_recipe(None)).loaders(batch_size, 0)


def queries_and_keys(teacher, batch):
    """``[(q, k)]`` per layer, each ``[B,H,N,d]``, of a BERT-family teacher on one batch."""
    H = teacher.config.num_attention_heads
    d = teacher.config.hidden_size // H
    with torch.no_grad():
        hidden = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         output_hidden_states=True).hidden_states
        out = []
        for l, layer in enumerate(teacher.bert.encoder.layer):
            att = layer.attention.self
            B, N, _ = hidden[l].shape
            out.append((att.query(hidden[l]).view(B, N, H, d).transpose(1, 2),
                        att.key(hidden[l]).view(B, N, H, d).transpose(1, 2)))
    return out


def kernel_scales(q, k, mask):
    """``(median top-key Gaussian factor, median and max key envelope, KL to key-norm attention)``
    of one layer's ``q, k`` ``[B,H,N,d]`` (see the usage)."""
    d = q.shape[-1]
    qs, ks = q * d**-0.25, k * d**-0.25
    A = softmax_attention_weights(q, k, mask)
    top = torch.gather(ks, 2, A.argmax(-1)[..., None].expand(-1, -1, -1, d))
    real = mask.float()[:, None, :].expand(A.shape[:3]) > 0
    gauss = torch.exp(-(qs - top).pow(2).sum(-1) / 2)[real]
    envelope = ks.pow(2).sum(-1) / 2
    logits = envelope[:, :, None, :].expand_as(A).masked_fill(mask[:, None, None, :] == 0, float("-inf"))
    key_norm = torch.softmax(logits, -1)
    kl = (A * (A.clamp_min(LOG_FLOOR).log() - key_norm.clamp_min(LOG_FLOOR).log())).sum(-1)[real].mean()
    return float(gauss.median()), float(envelope[real].median()), float(envelope[real].max()), float(kl)


def main(teacher_dir, method, student_dir=None):
    torch.manual_seed(0)
    batch = next(iter(default_loaders()["validation"]))
    teacher = T.AutoModelForSequenceClassification.from_pretrained(resolve_model_name(teacher_dir)).eval()
    maps = feature_maps_of(linearize.load(student_dir)) if student_dir else None
    mask = batch["attention_mask"]
    H = teacher.config.num_attention_heads
    with torch.no_grad():
        for l, (q, k) in enumerate(queries_and_keys(teacher, batch)):
            if method == "scales":
                gauss, env_median, env_max, kl = kernel_scales(q, k, mask)
                print(f"layer {l}: top-key Gaussian factor median {gauss:.1e}; key envelope |k~|^2/2 median "
                      f"{env_median:.1f} max {env_max:.1f}; KL to key-norm attention {kl:.2f}")
                continue
            d = q.shape[-1]
            fm = maps[l] if maps else create_feature_map(method, d, H).eval()
            A = softmax_attention_weights(q, k, mask)
            Ah = linear_attention_weights(q, k, fm, mask)
            rows = mask.float()[:, None, :, None]
            floor_mass = ((A * (Ah <= LOG_FLOOR)).sum(-1, keepdim=True) * rows).sum() / (rows.sum() * H)
            neg = (((Ah < 0).float() * mask[:, None, None, :] * rows).sum()
                   / ((mask[:, None, None, :] * rows).sum() * H))
            stats = kernel_statistics(q, k, fm, mask)
            qn = (q * d ** -0.25).pow(2).sum(-1).mul(0.5)
            print(f"layer {l}: teacher mass on weights <= clamp {float(floor_mass):.3f}; negative weights "
                  f"{float(neg):.3f}; negative kernel values {stats['negative_kernel_fraction']:.3f}; "
                  f"|q~|^2/2 mean {float(qn.mean()):.1f} max {float(qn.max()):.1f}")


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: docs/experiments/flexformer-probe/attention_diagnosis.py TEACHER_DIR METHOD [STUDENT_DIR]")
    main(*sys.argv[1:])
