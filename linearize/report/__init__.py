"""A run's results and their renderings.

- :mod:`.results`: the typed results — :class:`StageResult` (what a training stage returns) and
  :class:`Report` (``report.json``, versioned ``to_json``/``from_json``), recovery computed once
  (:func:`recovery`), the schema constants;
- :mod:`.markdown`: ``report.md``; :mod:`.figures`: ``figures/*.png`` (matplotlib);
- :mod:`.files`: writing them atomically, and re-rendering a run (``linearize report RUN_DIR``);
- :mod:`.card`: the Hub model card (``huggingface_hub.ModelCard``).
"""

from .figures import make_figures
from .files import copy_report, render_report, save_report, write_report
from .markdown import CAPTIONS, render_markdown
from .results import (FIGURE_NAMES, FIGURES_DIR, REPORT_JSON, REPORT_MD, REQUIRED_SECTIONS, SCHEMA, SCHEMA_VERSION,
                      AttentionInfo, LayerDistance, Latency, ModelInfo, Recovery, Report, Selection, StageResult,
                      TaskInfo, Timing, as_report, load_report, recovery, validate_report)

__all__ = ["AttentionInfo", "CAPTIONS", "FIGURE_NAMES", "FIGURES_DIR", "LayerDistance", "Latency", "ModelInfo",
           "REPORT_JSON", "REPORT_MD", "REQUIRED_SECTIONS", "Recovery", "Report", "SCHEMA", "SCHEMA_VERSION",
           "Selection", "StageResult", "TaskInfo", "Timing", "as_report", "copy_report", "load_report", "make_figures",
           "recovery", "render_markdown", "render_report", "save_report", "validate_report", "write_report"]
