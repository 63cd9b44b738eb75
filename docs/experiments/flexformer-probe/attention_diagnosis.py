"""Per layer, on one batch of the default recipe's dev sentences: how much of a softmax teacher's
attention mass falls on student weights at or below the stage-1 cross-entropy's log clamp (where
the loss has no gradient), the fraction of negative student weights and of negative kernel values
(Flexformer's trigonometric features), and the mean/max of the scaled query's ‖q/d^¼‖²/2 (the log
of the exponential maps' envelope). BERT-family teachers (``model.bert.encoder.layer``).

usage: .venv/bin/python docs/experiments/flexformer-probe/attention_diagnosis.py TEACHER_DIR METHOD [STUDENT_DIR]
  STUDENT_DIR: a saved converted model (e.g. a run's stage1/); without it, METHOD's map at init.
"""
import sys

import torch
import transformers as T

import linearize
from linearize.attention.core import linear_attention_weights, softmax_attention_weights, kernel_statistics
from linearize.attention.feature_maps import create_feature_map
from linearize.convert.api import feature_maps_of
from linearize.distill.losses import LOG_FLOOR
from linearize.pipeline import load_data, load_processor, make_loaders
from linearize.recipes import load_recipe


def default_loaders(batch_size=32):
    """The default recipe's (minilm-moviereviews) loaders, seed 0."""
    recipe = load_recipe(None)
    data, spec = load_data(recipe)
    return make_loaders(recipe, data, spec, load_processor(recipe, spec), batch_size, 0)


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


def main(teacher_dir, method, student_dir=None):
    torch.manual_seed(0)
    batch = next(iter(default_loaders()["validation"]))
    teacher = T.AutoModelForSequenceClassification.from_pretrained(teacher_dir).eval()
    maps = feature_maps_of(linearize.load(student_dir)) if student_dir else None
    mask = batch["attention_mask"]
    H = teacher.config.num_attention_heads
    with torch.no_grad():
        for l, (q, k) in enumerate(queries_and_keys(teacher, batch)):
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
