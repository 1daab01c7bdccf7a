"""The names of the Conv2d strategies: the one place they are spelled.

Torch-free on purpose: the CLI and the supervisor import it (``--conv`` choices, checks
of a saved run's settings) and must not pay for, or crash on, importing torch.
:mod:`rocm_yolo.conv.patch` implements the strategies, :mod:`rocm_yolo.conv.selftest`
tests and times them, ``benchmarks/bench_conv.py`` measures them; all take the names
from here.
"""

from __future__ import annotations

__all__ = ["PER_OP", "MIOPEN_OFF", "STRATEGIES", "AUTO", "CHOICES"]

#: Strategies that replace ``nn.Conv2d._conv_forward`` (one convolution at a time).
PER_OP = ("native", "aten", "fp32", "gemm")

#: ``torch.backends.cudnn.enabled = False`` for the whole process: convolutions AND
#: BatchNorm leave MIOpen (cuDNN on CUDA) for PyTorch's own kernels.
MIOPEN_OFF = "miopen-off"

#: Every strategy, in the order ``auto`` prefers when timings are too close to call:
#: the least intrusive first, the process-wide switch last.
STRATEGIES = PER_OP + (MIOPEN_OFF,)

AUTO = "auto"

#: What ``--conv`` accepts.
CHOICES = (AUTO,) + STRATEGIES
