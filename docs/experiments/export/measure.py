"""Forward latency of all-MiniLM-L6-v2 converted with METHOD: eager PyTorch, torch.compile (inductor,
fullgraph) and onnxruntime on the `linearize export` graph, one thread, BATCH x N tokens (the last
sequence half padded). Medians of 5 calls after 2 warm-up calls.

Usage: OMP_NUM_THREADS=1 python docs/experiments/export/measure.py METHOD BATCH N
"""

import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import onnxruntime
import torch
import transformers

import linearize
from linearize.convert.loading import minilm_path
from linearize.export import export_model


def median_ms(call, repeats=5, warmup=2):
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main(method, batch, n):
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    model = linearize.convert(transformers.AutoModel.from_pretrained(minilm_path()).eval(), method)
    generator = torch.Generator().manual_seed(0)
    inputs = {"input_ids": torch.randint(1000, 30000, (batch, n), generator=generator),
              "attention_mask": torch.ones(batch, n, dtype=torch.long),
              "token_type_ids": torch.zeros(batch, n, dtype=torch.long)}
    inputs["attention_mask"][-1, n // 2:] = 0
    with torch.no_grad():
        eager = median_ms(lambda: model(**inputs))
        start = time.time()
        compiled_model = torch.compile(model, fullgraph=True)
        compiled_model(**inputs)
        compile_s = time.time() - start
        compiled = median_ms(lambda: compiled_model(**inputs))
        expected = model(**inputs)[0]
        compiled_diff = (compiled_model(**inputs)[0] - expected).abs().max().item()
    path = Path(tempfile.mkdtemp()) / f"{method}.onnx"
    export_model(model, path, check=False)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = {name: value.numpy() for name, value in inputs.items()}
    ort = median_ms(lambda: session.run(None, feed))
    ort_diff = abs(session.run(None, feed)[0] - expected.numpy()).max()
    print(f"| {method} | {batch} x {n} | {eager:.0f} | {compiled:.0f} ({compile_s:.0f} s to compile) | {ort:.0f} | "
          f"{compiled_diff:.1e} / {ort_diff:.1e} |")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
