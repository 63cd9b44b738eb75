"""Stage 1: attention-weight distillation of the feature maps."""

from .blockwise import BlockwiseTerms, blockwise_distillation_terms
from .losses import attention_cross_entropy, attention_entropy, attention_kl, negative_weight_mass, output_mse
from .stage1 import DistillConfig, DistillRecorder, attention_distances, distill, distillation_mode

__all__ = ["BlockwiseTerms", "DistillConfig", "DistillRecorder", "attention_cross_entropy", "attention_distances",
           "attention_entropy", "attention_kl", "blockwise_distillation_terms", "distill", "distillation_mode",
           "negative_weight_mass", "output_mse"]
