"""Stage 2: task fine-tuning (also how a softmax teacher is made)."""

from .stage2 import RECIPES, FinetuneConfig, finetune, recipe

__all__ = ["RECIPES", "FinetuneConfig", "finetune", "recipe"]
