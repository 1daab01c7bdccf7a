"""What the conv self-test runs for each strategy: a training step, YOLO's validation, a timed run.

Imported only in the throwaway self-test child (``python -m rocm_yolo.conv.selftest --child``),
where a MIOpen fault may kill the process: this is the torch side, :mod:`rocm_yolo.conv.selftest`
the torch-free side that starts children, chooses and caches.

The workload is one block per kind of convolution a YOLO detection model runs
(:data:`LAYERS`: stem, stride-2 downsampling, 3x3 bottleneck, 1x1 projections, depthwise,
the biased 1x1 head convolution), each ``Conv -> BatchNorm -> SiLU`` like Ultralytics'
``Conv`` (the head one a plain ``Conv2d`` with a bias, as in the Detect head). Every result is compared with
a float64 CPU reference computed with torch's own kernels before any strategy is installed.

1. **Training step**: train mode (BatchNorm on batch statistics), forward and backward,
   under autocast when AMP is on; outputs and the gradients of the input, the convolution
   and the BatchNorm parameters are checked.
2. **Validation**, as Ultralytics runs it, with the shapes and dtypes the training step
   never uses: an EMA-style copy in eval mode (BatchNorm on running statistics, another
   MIOpen kernel), under ``torch.inference_mode()``, at the validation batch size (twice
   the training batch) and a non-square letterboxed ("rect") shape:

   - ``EMA``: float32 weights, under autocast with half inputs when AMP is on (how
     Ultralytics 8.4 validates during training);
   - ``EMA fp16``: the copy in half precision (8.3 and earlier validate during AMP
     training this way);
   - ``fused fp16``: Conv+BN folded into one biased convolution, in half precision, at
     batch 1 square (AutoBackend's warm-up) and at the validation batch (the final
     validation of ``best.pt`` after AMP training; ``yolo val/predict half=True``).

   The half-precision variants run even when training is float32: a checkpoint is
   validated and used for prediction on the same card, and a strategy whose fp16
   inference is broken is passed over (``fp32`` then costs nothing in a float32 run).
   Then, without a reference, the same validation at YOLO scale (twice the timing batch,
   a letterboxed image of the timing size): outputs must come out, and finite.
3. **Timed run**: the training step at YOLO scale (``imgsz``/``batch`` of the timing), two
   warm-up steps (MIOpen finds and compiles its kernels on first use), then the median of
   at least three steps (wall time on a GPU; CPU time on the CPU, see :func:`time_training`).
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import time

import torch
from torch import nn

from rocm_yolo.conv import patch as conv_patch
from rocm_yolo.run import hooks

__all__ = [
    "LAYERS",
    "ProbeError",
    "Reference",
    "build_reference",
    "prepare",
    "check_training",
    "check_validation",
    "check_validation_at_scale",
    "time_training",
]

#: (label, in, out, kernel, stride, groups, head, downscale): the input of each block is
#: ``imgsz / downscale`` pixels square. The kinds of convolution yolo26n runs, each with
#: channels and a resolution of one of its layers (the heaviest ones where there is a choice).
LAYERS = (
    ("stem 3x3/2", 3, 16, 3, 2, 1, False, 1),
    ("down 3x3/2", 16, 32, 3, 2, 1, False, 2),
    ("down 3x3/2 wide", 64, 64, 3, 2, 1, False, 4),
    ("bottleneck 3x3", 32, 32, 3, 1, 1, False, 16),
    ("pointwise 1x1", 192, 128, 1, 1, 1, False, 16),
    ("pointwise 1x1 P3", 256, 64, 1, 1, 1, False, 8),
    ("depthwise 3x3", 64, 64, 3, 1, 64, False, 8),
    ("depthwise 3x3 P4", 128, 128, 3, 1, 128, False, 16),
    ("head 1x1+bias", 80, 80, 1, 1, 1, True, 8),
)

CHECK_IMGSZ, CHECK_BATCH = 64, 2  # the checks are about kernels, not scale: small and quick
VAL_HW = (CHECK_IMGSZ, CHECK_IMGSZ * 3 // 4)  # a letterboxed 4:3 image, as rect validation makes
TOLERANCE = {"fp32": 5e-3, "low": 5e-2}  # relative to the reference's largest magnitude


class ProbeError(RuntimeError):
    """A check failed; the message says where (stage, variant, layer) and why."""


@contextlib.contextmanager
def stage(name: str, device: str):
    """Prefix any failure inside with ``name``; surface asynchronous GPU errors here."""
    try:
        yield
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    except ProbeError as exc:
        raise ProbeError(f"{name}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - a kernel failure is a result
        text = str(exc).strip().splitlines()
        raise ProbeError(f"{name}: {type(exc).__name__}: {text[0] if text else ''}") from exc


class Block(nn.Module):
    """Ultralytics' ``Conv`` (conv, BatchNorm with its eps/momentum, SiLU), or a biased head conv."""

    def __init__(self, cin, cout, k, s, groups, head):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=head)
        self.bn = None if head else nn.BatchNorm2d(cout, eps=1e-3, momentum=0.03)
        self.act = nn.Identity() if head else nn.SiLU()

    def forward(self, x):
        y = self.conv(x)
        return self.act(self.bn(y)) if self.bn is not None else y


def fuse(block: Block) -> Block:
    """Fold the BatchNorm into a new biased convolution, as Ultralytics' ``fuse_conv_and_bn`` does."""
    out = copy.deepcopy(block)
    if block.bn is None:
        return out
    conv, bn = block.conv, block.bn
    fused = nn.Conv2d(
        conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, groups=conv.groups, bias=True
    ).to(conv.weight.device, conv.weight.dtype)
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    with torch.no_grad():
        fused.weight.copy_(conv.weight * scale.view(-1, 1, 1, 1))
        fused.bias.copy_(bn.bias - bn.running_mean * scale)
    out.conv, out.bn = fused, None
    return out


def _blocks(dtype=torch.float64, device="cpu", seed=0) -> nn.ModuleList:
    torch.manual_seed(seed)
    blocks = nn.ModuleList(Block(*layer[1:7]) for layer in LAYERS)
    for block in blocks:  # non-trivial running statistics and affine parameters for eval mode
        if block.bn is not None:
            c = block.bn.num_features
            with torch.no_grad():
                block.bn.running_mean.copy_(torch.randn(c) * 0.1)
                block.bn.running_var.copy_(torch.rand(c) + 0.5)
                block.bn.weight.copy_(torch.rand(c) + 0.5)
                block.bn.bias.copy_(torch.randn(c) * 0.1)
    return blocks.to(device, dtype)


def _inputs(batch: int, hw: tuple, dtype, device, seed: int) -> list:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _label, cin, *_rest, down in LAYERS:
        shape = (batch, cin, max(1, hw[0] // down), max(1, hw[1] // down))
        out.append(torch.randn(shape, generator=generator, dtype=torch.float64).to(device, dtype))
    return out


class Reference:
    """The float64 CPU answers every strategy is compared with (computed once per child)."""

    def __init__(self):
        self.blocks = _blocks()  # the weights every device copy starts from
        ema = copy.deepcopy(self.blocks).eval()
        fused = nn.ModuleList(fuse(b) for b in ema)
        self.train_x = _inputs(CHECK_BATCH, (CHECK_IMGSZ, CHECK_IMGSZ), torch.float64, "cpu", seed=1)
        self.val_x = _inputs(2 * CHECK_BATCH, VAL_HW, torch.float64, "cpu", seed=2)
        self.warm_x = _inputs(1, (CHECK_IMGSZ, CHECK_IMGSZ), torch.float64, "cpu", seed=3)
        train_blocks = copy.deepcopy(self.blocks).train()
        self.grad_out, self.train = [], []
        generator = torch.Generator().manual_seed(4)
        for block, x in zip(train_blocks, self.train_x):
            x = x.clone().requires_grad_(True)
            y = block(x)
            g = torch.randn(y.shape, generator=generator, dtype=torch.float64)
            wanted = [x] + _params(block)
            self.grad_out.append(g)
            self.train.append([y.detach()] + list(torch.autograd.grad(y, wanted, g)))
        with torch.no_grad():
            self.val = [b(x) for b, x in zip(ema, self.val_x)]
            self.fused_val = [b(x) for b, x in zip(fused, self.val_x)]
            self.fused_warm = [b(x) for b, x in zip(fused, self.warm_x)]


def build_reference(device: str = "cpu") -> Reference:
    """The reference, computed with torch's own kernels: call before installing any strategy.

    When the strategies are tested on the CPU too (tests, by-hand checks), torch gets one
    thread: on a shared machine, OpenMP threads that spin while waiting for a descheduled
    sibling would inflate the CPU time the timed run measures many times over.
    """
    if conv_patch.installed_strategy() not in (None, "native"):
        raise RuntimeError("the reference must be computed before a strategy is installed")
    if torch.device(device).type == "cpu":
        torch.set_num_threads(1)
    return Reference()


def _params(block: Block) -> list:
    params = [block.conv.weight] + ([block.conv.bias] if block.conv.bias is not None else [])
    if block.bn is not None:
        params += [block.bn.weight, block.bn.bias]
    return params


def _low_dtype(device_type: str):
    return torch.bfloat16 if device_type == "cpu" else torch.float16


def _compare(label: str, names, got, expected, tol: float) -> float:
    worst = 0.0
    for name, a, b in zip(names, got, expected):
        a = a.detach().double().cpu()
        if not torch.isfinite(a).all():
            raise ProbeError(f"{label}: non-finite {name}")
        err = ((a - b).abs().max() / (b.abs().max() + 1e-6)).item()
        if err > tol:
            raise ProbeError(f"{label}: {name} differs from the CPU reference (rel err {err:.2e} > {tol:.0e})")
        worst = max(worst, err)
    return worst


# --------------------------------------------------------------------------- install


def prepare(strategy: str) -> None:
    """Install ``strategy`` in this (throwaway) process, plus the test faults asked for it (run.hooks)."""
    conv_patch.install(strategy)
    hooks.conv_installed(strategy)


# --------------------------------------------------------------------------- checks


def check_training(ref: Reference, device: str, amp: bool) -> float:
    """The training step on ``device``; the worst relative error (raises ProbeError)."""
    device_type = torch.device(device).type
    tol = TOLERANCE["low" if amp else "fp32"]
    blocks = copy.deepcopy(ref.blocks).to(device, torch.float32).train()
    worst = 0.0
    with stage(
        f"training step{' under autocast' if amp else ''} (batch {CHECK_BATCH}, {CHECK_IMGSZ}x{CHECK_IMGSZ})", device
    ):
        for (label, *_), block, x, g, expected in zip(LAYERS, blocks, ref.train_x, ref.grad_out, ref.train):
            with stage(label, device):
                x = x.to(device, torch.float32).requires_grad_(True)
                with torch.autocast(device_type, dtype=_low_dtype(device_type), enabled=amp):
                    y = block(x)
                got = [y] + list(torch.autograd.grad(y, [x] + _params(block), g.to(device, y.dtype)))
            names = (
                ["output", "grad input", "grad conv weight"]
                + (["grad conv bias"] if block.conv.bias is not None else [])
                + (["grad bn weight", "grad bn bias"] if block.bn is not None else [])
            )
            worst = max(worst, _compare(label, names, got, expected, tol))
    return worst


def check_validation(ref: Reference, device: str, amp: bool) -> float:
    """Validation as Ultralytics runs it (see the module docstring); the worst relative error."""
    device_type = torch.device(device).type
    half = torch.float16
    ema = copy.deepcopy(ref.blocks).to(device, torch.float32).eval()
    fused = nn.ModuleList(fuse(b) for b in ema).half()
    batch, (h, w) = 2 * CHECK_BATCH, VAL_HW
    # Ultralytics feeds half images only on a GPU (quantize=16 is never set on the CPU).
    ema_input = half if amp and device_type != "cpu" else torch.float32
    variants = [
        (
            f"validation, EMA{' under autocast' if amp else ''} (batch {batch}, {h}x{w})",
            ema,
            ref.val_x,
            ref.val,
            ema_input,
            amp,
        ),
        (f"validation, EMA fp16 (batch {batch}, {h}x{w})", copy.deepcopy(ema).half(), ref.val_x, ref.val, half, False),
        (
            f"validation, fused fp16 warm-up (batch 1, {CHECK_IMGSZ}x{CHECK_IMGSZ})",
            fused,
            ref.warm_x,
            ref.fused_warm,
            half,
            False,
        ),
        (f"validation, fused fp16 (batch {batch}, {h}x{w})", fused, ref.val_x, ref.fused_val, half, False),
    ]
    worst = 0.0
    for name, model, inputs, expected, dtype, autocast in variants:
        tol = TOLERANCE["low" if dtype != torch.float32 or autocast else "fp32"]
        with stage(name, device):
            outs = []
            with torch.inference_mode(), torch.autocast(device_type, dtype=_low_dtype(device_type), enabled=autocast):
                for (label, *_), block, x in zip(LAYERS, model, inputs):
                    with stage(label, device):
                        outs.append(block(x.to(device, dtype)))
            for (label, *_), y, e in zip(LAYERS, outs, expected):
                worst = max(worst, _compare(label, ["output"], [y], [e], tol))
    return worst


def check_validation_at_scale(device: str, amp: bool, imgsz: int, batch: int) -> None:
    """The validation variants again at YOLO scale (``2 * batch``, a letterboxed ``imgsz`` image).

    MIOpen picks kernels per problem size, and a kernel missing for one size is enough to
    crash a validation (ROCm/MIOpen#3077 failed 119 batches into one). No reference at this
    size: the outputs must come out, finite.
    """
    device_type = torch.device(device).type
    ema = _blocks(torch.float32, device, seed=5).eval()
    fused = nn.ModuleList(fuse(b) for b in ema).half()
    hw = (imgsz, max(32, imgsz * 3 // 4 // 32 * 32))
    name = f"validation at scale (batch {2 * batch}, {hw[0]}x{hw[1]})"
    ema_input = torch.float16 if amp and device_type != "cpu" else torch.float32
    for variant, model, dtype, autocast in (("EMA", ema, ema_input, amp), ("fused fp16", fused, torch.float16, False)):
        inputs = _inputs(2 * batch, hw, dtype, device, seed=7)
        with (
            stage(f"{name}, {variant}", device),
            torch.inference_mode(),
            torch.autocast(device_type, dtype=_low_dtype(device_type), enabled=autocast),
        ):
            for (label, *_), block, x in zip(LAYERS, model, inputs):
                with stage(label, device):
                    if not torch.isfinite(block(x)).all():
                        raise ProbeError("non-finite output")


def time_training(
    device: str, amp: bool, imgsz: int, batch: int, *, min_reps: int = 3, max_reps: int = 10, budget_s: float = 2.0
) -> float:
    """Median seconds of one training step of the blocks at ``imgsz`` x ``batch`` on ``device``.

    Wall time on a GPU (synchronized); on the CPU, CPU time of the process, so that a machine
    shared with other work measures this work and not its neighbours'.
    """
    device_type = torch.device(device).type
    clock = time.process_time if device_type == "cpu" else time.perf_counter
    blocks = _blocks(torch.float32, device, seed=5).train()
    inputs = _inputs(batch, (imgsz, imgsz), torch.float32, device, seed=6)
    for x in inputs[1:]:  # every layer but the stem gets its input from a layer that trains
        x.requires_grad_(True)

    def sync():
        if device_type == "cuda":
            torch.cuda.synchronize()

    def step():
        for p in blocks.parameters():
            p.grad = None
        with torch.autocast(device_type, dtype=_low_dtype(device_type), enabled=amp):
            loss = sum(block(x).float().mean() for block, x in zip(blocks, inputs))
        loss.backward()
        sync()

    with stage("timed run", device):
        for _ in range(2):  # warm-up: MIOpen's find and kernel compilation happen here
            step()
        times: list[float] = []
        started = time.perf_counter()
        while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() - started < budget_s):
            t0 = clock()
            step()
            times.append(clock() - t0)
    return statistics.median(times)
