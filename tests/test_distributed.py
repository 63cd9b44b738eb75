"""Stage 1 over two CPU processes (torchrun + accelerate, gloo) equals one process with the same global batch."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from linearize.distill import distill

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="this torch build has no torch.distributed with the gloo backend")

SCRIPT = Path(__file__).with_name("distributed_distill.py")


def test_two_process_distillation_equals_one_process_with_the_same_global_batch(tmp_path):
    import distributed_distill as job

    out = tmp_path / "two_processes.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error"}
    # the script asserts accelerate's MULTI_CPU over gloo with 2 processes
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
                           str(SCRIPT), str(out)], env=env, cwd=SCRIPT.parent.parent, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    two = torch.load(out)

    # One process, batches of 2 × the per-process batch. Both runs shuffle with accelerate's
    # seedable sampler (seed + epoch, same permutation); with 2 processes each global step's
    # batches are consecutive batches 2t and 2t+1 of that permutation (BatchSamplerShard), whose
    # union is batch t of the single-process loader. So both runs see the same examples per step.
    model = job.student()
    result = distill(model, job.loader(2 * job.PER_PROCESS_BATCH), job.CONFIG, eval_batches=1, progress=False,
                         log=lambda *a, **k: None)
    assert two["steps"] == result.steps == 2 * job.EXAMPLES // (2 * job.PER_PROCESS_BATCH)
    # Equal to float tolerance, not bitwise: with 2 processes each computes the mean gradient of
    # its half batch and the all-reduce sums the two and halves them, where one process sums
    # all examples in one reduction (and its matmuls have another batch shape): the same
    # numbers added in another order, which differs in the last bits (float addition is not
    # associative). Measured here: at most ~1e-7.
    assert two["ce"] == pytest.approx([entry["ce"] for entry in result.history], abs=1e-6)
    untrained = job.feature_map_weights(job.student())
    for name, weight in job.feature_map_weights(model).items():
        torch.testing.assert_close(two["weights"][name], weight, atol=1e-6, rtol=1e-5, msg=name)
        assert not torch.equal(weight, untrained[name])  # it trained


def test_finishing_without_teardown_keeps_what_was_printed_and_exits_0():
    """The launched process's end (``os._exit``) flushes what the streams still hold."""
    code = ("import sys; from linearize.cli import finish_without_teardown; "
            "print('scores', end=''); sys.stderr.write('done'); finish_without_teardown(); print('never')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout, result.stderr) == (0, "scores", "done")


def test_the_cli_meets_the_others_and_leaves_its_process_group_before_exiting(tmp_path, monkeypatch):
    """``linearize.cli.main`` destroys the process group a command joined (a gloo group left to
    the interpreter's shutdown can abort a finished rank), after a barrier on success only; a
    success then ends the process without the interpreter's teardown (``os._exit(0)``, stubbed
    here: it would end the test's own process)."""
    import linearize.cli as cli

    calls = []
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: calls.append("barrier"))
    monkeypatch.setattr(cli, "finish_without_teardown", lambda: calls.append("exit"))
    for code, expected in ((0, ["barrier", "exit"]), (1, [])):
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / f'store{code}'}", rank=0, world_size=1)
        monkeypatch.setattr(cli, "app", lambda **kwargs: sys.exit(code))
        calls.clear()
        with pytest.raises(SystemExit):
            cli.main()
        assert calls == expected and not dist.is_initialized()
    cli.leave_process_group(True)  # no group: nothing to do
