"""Stage 2: task fine-tuning (also how a softmax teacher is made)."""

from .stage2 import RECIPES, FinetuneConfig, evaluate, finetune, predict, recipe

__all__ = ["RECIPES", "FinetuneConfig", "evaluate", "finetune", "predict", "recipe"]
