"""Benchmarks: speed and memory of linear attention against softmax, measured side by side.

- :mod:`.attention`: the attention layer at many lengths, and optionally a whole model at its own
  lengths (:func:`run_bench`, ``linearize bench attention``; writes ``bench.json``, ``bench.md``,
  ``bench.png``).
- :mod:`.long`: whole models at long lengths (:func:`run_long_bench`, ``linearize bench long``;
  writes ``bench-long.json``, ``bench-long.md``).
- :mod:`.folder`: a converted model folder against its softmax original (:func:`bench_folder`,
  ``linearize bench folder DIR``; writes ``DIR/bench.json``).
- :mod:`.models`: whole models timed side by side (inputs, memory cap, one row per length).
- :mod:`.timing`: where it runs (:class:`Placement`), the interleaved timer and peak memory.
- :mod:`.methods`, :mod:`.crossover`, :mod:`.tables`, :mod:`.plots`: the candidates' labels, the
  crossover length, the Markdown and the plot.
"""

from .attention import (ATTENTION_TARGET, DEFAULT_MODEL_SEQ_LENS, DEFAULT_SEQ_LENS, MODEL_TARGET, bench_attention,
                        eager_softmax_attention, run_bench)
from .crossover import CROSSOVER_RULE, crossover_point, crossover_text, crossovers
from .folder import (DEFAULT_FOLDER_SEQ_LENS, FOLDER_BENCH_JSON, bench_folder, folder_speed_lines,
                     is_converted_folder, machine_text, read_folder_bench)
from .long import (DEFAULT_GEOMETRIES, DEFAULT_LONG_SEQ_LENS, LONG_MEASURE, LONG_TARGETS, RECIPE_LUNA,
                   default_long_methods, geometry_model, long_targets, recipe_luna, run_long_bench)
from .methods import EAGER, SDPA, SDPA_EFFICIENT, SDPA_FLASH, SOFTMAX_LABELS, method_specs, parse_method_list
from .models import (accepted_length, bench_model, load_model, measure_lengths, model_inputs, softmax_bytes,
                     softmax_skip_reason)
from .tables import long_markdown, markdown_report, target_line
from .timing import CPU, Placement, interleaved_times, measure_candidates, measuring, peak_extra_memory

__all__ = ["ATTENTION_TARGET", "CPU", "CROSSOVER_RULE", "DEFAULT_FOLDER_SEQ_LENS", "DEFAULT_GEOMETRIES",
           "DEFAULT_LONG_SEQ_LENS", "DEFAULT_MODEL_SEQ_LENS", "DEFAULT_SEQ_LENS", "EAGER", "FOLDER_BENCH_JSON",
           "LONG_MEASURE", "LONG_TARGETS", "MODEL_TARGET", "Placement", "RECIPE_LUNA", "SDPA", "SDPA_EFFICIENT",
           "SDPA_FLASH", "SOFTMAX_LABELS", "accepted_length", "bench_attention", "bench_folder", "bench_model",
           "crossover_point", "crossover_text", "crossovers", "default_long_methods", "eager_softmax_attention",
           "folder_speed_lines", "geometry_model", "interleaved_times", "is_converted_folder", "load_model",
           "long_markdown", "long_targets", "machine_text", "markdown_report", "measure_candidates", "measure_lengths",
           "measuring", "method_specs", "model_inputs", "parse_method_list", "read_folder_bench", "recipe_luna",
           "run_bench", "run_long_bench", "softmax_bytes", "softmax_skip_reason", "target_line"]
