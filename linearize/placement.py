"""Where a benchmark runs: device and dtype, and how to time and measure memory there.

On CPU a forward is done when the call returns and PyTorch's CPU allocator is read through
``torch.profiler``'s memory events (``linearize.bench.peak_extra_memory``). On CUDA kernels run
asynchronously, so every timed call is bracketed by ``torch.cuda.synchronize()``, and peak memory is
``torch.cuda.max_memory_allocated()`` during the call minus what was allocated before it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import LinearizeError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Placement:
    """A device (``cpu``, ``cuda``, ``cuda:1``) and a dtype name (``fp32``, ``bf16``, ``fp16``)."""

    device: str = "cpu"
    dtype: str = "fp32"

    @classmethod
    def parse(cls, device="cpu", dtype="fp32"):
        """A checked placement: a one-line error for a device this machine lacks or a dtype it cannot run."""
        device, dtype = str(device or "cpu").lower(), str(dtype or "fp32").lower()
        if dtype not in DTYPES:
            raise LinearizeError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        kind = device.split(":")[0]
        if kind not in ("cpu", "cuda"):
            raise LinearizeError(f"--device {device!r} is not cpu or cuda (cuda:N for another GPU)")
        if kind == "cuda" and not torch.cuda.is_available():
            raise LinearizeError("--device cuda: no CUDA GPU is visible here (torch.cuda.is_available() is False); "
                                 "use --device cpu")
        if kind == "cpu" and dtype == "fp16":
            raise LinearizeError("--dtype fp16 needs --device cuda (CPU kernels in fp16 are slow emulations); use "
                                 "bf16 or fp32 on CPU")
        return cls(device, dtype)

    @property
    def is_cuda(self):
        return self.device.startswith("cuda")

    @property
    def torch_dtype(self):
        return DTYPES[self.dtype]

    def synchronize(self):
        """Wait for the device's queued kernels (nothing to wait for on CPU)."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def tensor(self, tensor):
        """A float tensor on this device in this dtype."""
        return tensor.to(self.device, self.torch_dtype)

    def model(self, module):
        """``module`` moved to this device and cast to this dtype (in place, returned)."""
        return module.to(self.device, self.torch_dtype)

    def batch(self, batch):
        """Model inputs on this device (token ids and masks keep their integer dtype)."""
        return {key: value.to(self.device) for key, value in batch.items()}

    def peak_extra_bytes(self, fn):
        """CUDA: the peak bytes allocated on the device while ``fn()`` runs, above what was allocated
        before (its output included)."""
        self.synchronize()
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        out = fn()
        self.synchronize()
        peak = torch.cuda.max_memory_allocated(self.device) - before
        del out
        return int(peak)

    def memory_bytes(self):
        """The device's memory: the GPU's total, or None on CPU (the caller reads the machine's)."""
        if self.is_cuda:
            return int(torch.cuda.get_device_properties(self.device).total_memory)
        return None

    def record(self):
        """What a benchmark's ``config`` records of the placement."""
        return {"device": self.device, "dtype": str(self.torch_dtype).replace("torch.", ""),
                "placement": self.describe()}

    def describe(self):
        """``"cpu, float32"`` or ``"cuda (NVIDIA H100 80GB HBM3), bfloat16"``."""
        name = f"cuda ({torch.cuda.get_device_name(self.device)})" if self.is_cuda else self.device
        return f"{name}, {str(self.torch_dtype).replace('torch.', '')}"


CPU = Placement()
