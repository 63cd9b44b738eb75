"""Stage 1 on one attention layer in isolation: fit METHOD's feature map to a softmax teacher's
attention rows on the teacher's own queries and keys (10 batches of 32 training sentences of the
default recipe, cycled), and print the mean attention KL on 4 dev batches before and after, with
the training cross-entropy along the way. A seconds-long probe of why a map does or does not
learn (docs/experiments/flexformer-probe), not part of the pipeline. BERT-family teachers.

usage: .venv/bin/python docs/experiments/flexformer-probe/fit_one_layer.py TEACHER_DIR METHOD [--layer 1] [--steps 100]
       [--lr 1e-2] [--init-scale 1] [--log-floor 0] [--option key=value ...]
  --init-scale: multiplies the map's initial frequencies (parameters named omega*; Flexformer's).
  --log-floor F > 0: the cross-entropy's log continued linearly below F (log F + (Â − F)/F), so
    weights at or below zero get a gradient, instead of the pipeline's clamp at 1e-12.
  --step-check: first, on the first training batch, the loss change of a step of length η
    (1e-6 ... 1e-2, in parameter norm) against the gradient, beside the change the gradient
    predicts (−η‖g‖): where the two part, the loss is not smooth at that scale. The attention
    core computes in float32, so changes below ~1e-6 are rounding.
"""
import argparse
import math
import sys
from pathlib import Path

import torch
import transformers as T

sys.path.insert(0, str(Path(__file__).parent))
from attention_diagnosis import default_loaders, queries_and_keys  # noqa: E402

from linearize.attention.core import linear_attention_weights, softmax_attention_weights  # noqa: E402
from linearize.attention.feature_maps import create_feature_map  # noqa: E402
from linearize.distill.losses import _row_mean, attention_cross_entropy, attention_entropy, attention_kl  # noqa: E402
from linearize.recipes import parse_options  # noqa: E402


def cross_entropy(A, Ah, mask, floor):
    if not floor:
        return attention_cross_entropy(A, Ah, mask)
    log = torch.where(Ah > floor, Ah.clamp_min(floor).log(), math.log(floor) + (Ah - floor) / floor)
    return _row_mean(-(A * log).sum(-1), mask)  # averaged as the pipeline's cross-entropy


def step_check(fm, mask, qk, floor):
    q, k = qk
    A = softmax_attention_weights(q, k, mask)
    params = [p for p in fm.parameters() if p.requires_grad]

    def loss():
        return cross_entropy(A, linear_attention_weights(q, k, fm, mask), mask, floor)

    grads = torch.autograd.grad(loss(), params)
    norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
    with torch.no_grad():
        start = loss().item()
        for eta in (1e-6, 1e-5, 1e-4, 1e-3, 1e-2):
            for p, g in zip(params, grads):
                p.sub_(eta * g / norm)
            changed = loss().item() - start
            for p, g in zip(params, grads):
                p.add_(eta * g / norm)
            print(f"  step check, length {eta:g}: loss change {changed:+.2e} (the gradient predicts "
                  f"{-eta * norm.item():+.2e})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("teacher"), parser.add_argument("method")
    parser.add_argument("--layer", type=int, default=1)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--init-scale", type=float, default=1.0)
    parser.add_argument("--log-floor", type=float, default=0.0)
    parser.add_argument("--option", action="append", default=[])
    parser.add_argument("--step-check", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    loaders = default_loaders()
    teacher = T.AutoModelForSequenceClassification.from_pretrained(args.teacher).eval()

    def cache(split, count):
        return [(b["attention_mask"], queries_and_keys(teacher, b)[args.layer]) for _, b in zip(range(count),
                                                                                              loaders[split])]

    train, dev = cache("train", 10), cache("validation", 4)
    q0 = train[0][1][0]
    fm = create_feature_map(args.method, q0.shape[-1], q0.shape[1], **parse_options(args.option))
    with torch.no_grad():
        for name, p in fm.named_parameters():
            if name.startswith("omega"):
                p.mul_(args.init_scale)

    def dev_kl():
        with torch.no_grad():
            return sum(float(attention_kl(softmax_attention_weights(q, k, m), linear_attention_weights(q, k, fm, m), m))
                       for m, (q, k) in dev) / len(dev)

    if args.step_check:
        step_check(fm, *train[0], args.log_floor)
    optimizer = torch.optim.AdamW(fm.parameters(), lr=args.lr, weight_decay=0.0)
    before = dev_kl()
    for step in range(args.steps):
        mask, (q, k) = train[step % len(train)]
        A = softmax_attention_weights(q, k, mask)
        loss = cross_entropy(A, linear_attention_weights(q, k, fm, mask), mask, args.log_floor)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            entropy = attention_entropy(A, mask).item()
            print(f"  step {step}: train CE {loss.item():.3f} (teacher entropy {entropy:.3f})")
    print(f"{args.method} layer {args.layer}, init x{args.init_scale}, lr {args.lr}, {args.steps} steps, "
          f"log floor {args.log_floor or 'clamp 1e-12'}, options {args.option or '-'}: "
          f"dev KL {before:.3f} -> {dev_kl():.3f}")


if __name__ == "__main__":
    main()
