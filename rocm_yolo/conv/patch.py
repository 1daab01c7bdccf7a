"""Conv2d strategies for GPUs whose convolution library is broken (gfx1010 and friends).

On gfx101x cards MIOpen often has no working kernel for a convolution ("invalid device
function", memory access faults) and fp16 convolutions give garbage, while rocBLAS (GEMM)
works. The usual community fix replaces ``forward`` with a closure on every Conv2d
instance; Ultralytics deep-copies and pickles the whole EMA model every epoch, so the
closure breaks checkpoint saving ("Can't pickle local object") and, worse, would travel
inside the checkpoint if it did pickle.

This module patches at the narrowest point instead: the *class* attribute
``nn.Conv2d._conv_forward`` (the method ``Conv2d.forward`` calls with the weight and bias).
Nothing is stored on module instances, so models pickle exactly as without the patch,
checkpoints load where rocm_yolo is not installed, and convolutions created after
installation (fused Conv+BN, a model rebuilt on resume) are covered automatically.

Strategies (``STRATEGIES``):

* ``native`` - torch's own path, untouched (installing it restores the original method).
* ``aten``   - ATen's built-in convolution (im2col + GEMM on ROCm/CUDA) with MIOpen/cuDNN
  switched off for this convolution only, in the forward *and* the backward: the backward
  selects its backend again, so it runs inside a custom autograd function under the same
  switch.
* ``fp32``   - the native convolution, but always in float32: under autocast (AMP) or on a
  half-precision model the inputs are upcast and the result cast back, for cards whose
  fp16 convolutions are broken.
* ``gemm``   - explicit ``unfold`` + ``matmul`` (only GEMM and im2col/col2im run), batch
  chunked so the unfolded buffer stays under ``ROCM_YOLO_GEMM_CHUNK_MB`` (default 128 MiB),
  in the backward too (the unfold is recomputed per chunk instead of being kept).
* ``miopen-off`` - ``torch.backends.cudnn.enabled = False`` for the whole process, the
  users' bluntest workaround: convolutions run torch's own path (as ``native``), and they
  *and* BatchNorm leave MIOpen, because ATen picks MIOpen for both only while that global
  flag is on (``at::convolution`` and ``convolution_backward`` build their parameters from
  ``ctx.userEnabledCuDNN()``, ``_select_batch_norm_backend`` reads it too, and
  ``F.batch_norm`` passes the flag along). Nothing is patched on ``nn.Conv2d``, so
  nothing can reach a checkpoint either.

The names come from :mod:`rocm_yolo.conv.strategies` (``PER_OP`` are the ones a
:class:`PicklableConvForward` runs).
"""

from __future__ import annotations

import contextlib
import os
import threading
import types

import torch
import torch.nn.functional as F
from torch import nn

from rocm_yolo import environment
from rocm_yolo.conv.strategies import MIOPEN_OFF, PER_OP, STRATEGIES
from rocm_yolo.ultralytics_rules import compat

__all__ = [
    "STRATEGIES",
    "PER_OP",
    "PicklableConvForward",
    "install",
    "uninstall",
    "installed_strategy",
    "cudnn_disabled",
]

#: torch's own ``Conv2d._conv_forward``, captured once at import (what ``native`` runs).
_TORCH_CONV_FORWARD = nn.Conv2d.__dict__["_conv_forward"]
if type(_TORCH_CONV_FORWARD).__name__ == "PicklableConvForward":  # module reloaded while installed
    _TORCH_CONV_FORWARD = _TORCH_CONV_FORWARD._replaced  # type: ignore[attr-defined]

_DEFAULT_CHUNK_MB = 128
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _gemm_chunk_bytes() -> int:
    """The unfold buffer budget for ``gemm``: ``$ROCM_YOLO_GEMM_CHUNK_MB`` or 128 MiB."""
    raw = os.environ.get(environment.GEMM_CHUNK_MB, "")
    try:
        mb = float(raw) if raw else _DEFAULT_CHUNK_MB
    except ValueError:
        raise ValueError(f"{environment.GEMM_CHUNK_MB} must be a number of MiB, got {raw!r}") from None
    if mb <= 0:
        raise ValueError(f"{environment.GEMM_CHUNK_MB} must be positive, got {raw!r}")
    return int(mb * 2**20)


# --------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def cudnn_disabled():
    """Switch cuDNN/MIOpen off for the block, touching nothing else.

    ``torch.backends.cudnn.flags(enabled=False)`` also resets benchmark, deterministic,
    allow_tf32 and fp32_precision to its own defaults for the duration, which would change
    the user's settings for the rest of the work in the block; this flips only ``enabled``.
    """
    getter = getattr(torch._C, "_get_cudnn_enabled", None)
    setter = getattr(torch._C, "_set_cudnn_enabled", None)
    if getter is None or setter is None:  # very old or very new torch: use the public API
        with torch.backends.cudnn.flags(enabled=False):
            yield
        return
    previous = getter()
    setter(False)
    try:
        yield
    finally:
        setter(previous)


def _autocast_dtype(device_type: str):
    """The autocast dtype active for ``device_type``, or None when autocast is off there."""
    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
        return None
    except (TypeError, AttributeError):  # torch < 2.4: only the cuda/cpu spellings exist
        if device_type == "cpu":
            return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None


def _device_type(t: torch.Tensor) -> str:
    return t.device.type


def _autocast_cast(dtype, *tensors):
    """Cast like autocast does for conv2d: floating tensors except float64 go to ``dtype``."""
    return tuple(
        t.to(dtype) if t is not None and t.is_floating_point() and t.dtype != torch.float64 else t for t in tensors
    )


def _explicit_padding(conv: nn.Conv2d, input: torch.Tensor):
    """Turn the conv's padding into (input, (pad_h, pad_w)) with symmetric numeric padding.

    Handles padding_mode reflect/replicate/circular (padded with ``F.pad`` exactly as torch
    does), ``'valid'``, and ``'same'`` (asymmetric when kernel size x dilation is even:
    then the input is zero-padded explicitly, like torch's own ``_convolution_same``).
    """
    if conv.padding_mode != "zeros":
        return F.pad(input, conv._reversed_padding_repeated_twice, mode=conv.padding_mode), (0, 0)
    if isinstance(conv.padding, str):
        if conv.padding == "valid":
            return input, (0, 0)
        left_w, right_w, left_h, right_h = conv._reversed_padding_repeated_twice
        if left_w == right_w and left_h == right_h:
            return input, (left_h, left_w)
        return F.pad(input, conv._reversed_padding_repeated_twice), (0, 0)
    return input, tuple(conv.padding)


def _match_memory_format(out: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
    if input.dim() == 4 and input.is_contiguous(memory_format=torch.channels_last) and not input.is_contiguous():
        return out.contiguous(memory_format=torch.channels_last)
    return out


# --------------------------------------------------------------------------- aten


class _AtenConv(torch.autograd.Function):
    """ATen convolution with cuDNN/MIOpen off in both passes.

    The backward calls ``aten.convolution_backward`` directly, which picks its backend from
    the global cudnn flag *at backward time*; wrapping only the forward would let MIOpen
    back in for the gradients.
    """

    @staticmethod
    def forward(ctx, input, weight, bias, stride, padding, dilation, groups):
        ctx.save_for_backward(input, weight)
        ctx.conf = (stride, padding, dilation, groups, None if bias is None else list(bias.shape))
        with cudnn_disabled():
            return F.conv2d(input, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        input, weight = ctx.saved_tensors
        stride, padding, dilation, groups, bias_sizes = ctx.conf
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias_sizes is not None and ctx.needs_input_grad[2]]
        with cudnn_disabled():
            gi, gw, gb = torch.ops.aten.convolution_backward(
                grad_out.contiguous(memory_format=_suggest_format(input)),
                input,
                weight,
                bias_sizes,
                list(stride),
                list(padding),
                list(dilation),
                False,
                [0, 0],
                groups,
                mask,
            )
        return gi, gw, gb if mask[2] else None, None, None, None, None


def _suggest_format(t: torch.Tensor):
    return t.suggest_memory_format() if hasattr(t, "suggest_memory_format") else torch.contiguous_format


def _aten_forward(conv, input, weight, bias):
    if input.dim() == 3:  # unbatched (C, H, W) input, which nn.Conv2d accepts
        return _aten_forward(conv, input.unsqueeze(0), weight, bias).squeeze(0)
    input, padding = _explicit_padding(conv, input)
    dtype = _autocast_dtype(_device_type(input))
    if dtype is not None:
        input, weight, bias = _autocast_cast(dtype, input, weight, bias)
    with torch.autocast(_device_type(input), enabled=False):
        return _AtenConv.apply(input, weight, bias, tuple(conv.stride), padding, tuple(conv.dilation), conv.groups)


# --------------------------------------------------------------------------- fp32


def _fp32_forward(conv, input, weight, bias):
    autocast = _autocast_dtype(_device_type(input))
    result_dtype = autocast if autocast is not None and input.is_floating_point() else input.dtype
    if result_dtype not in _LOW_PRECISION:
        return _TORCH_CONV_FORWARD(conv, input, weight, bias)
    with torch.autocast(_device_type(input), enabled=False):
        out = _TORCH_CONV_FORWARD(conv, input.float(), weight.float(), None if bias is None else bias.float())
    return out.to(result_dtype)


# --------------------------------------------------------------------------- gemm


def _out_size(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


class _GemmConv(torch.autograd.Function):
    """Convolution as unfold + batched matmul, chunked over the batch in both passes.

    Only the input and weight are saved; the backward recomputes each chunk's unfold, so
    the im2col buffer never exceeds the chunk budget (autograd through a plain
    unfold+matmul would keep every chunk's buffer alive until the backward).
    """

    @staticmethod
    def forward(ctx, input, weight, bias, stride, padding, dilation, groups, chunk_bytes):
        n, c, h, w = input.shape
        o, cg, kh, kw = weight.shape
        ho = _out_size(h, kh, stride[0], padding[0], dilation[0])
        wo = _out_size(w, kw, stride[1], padding[1], dilation[1])
        if ho <= 0 or wo <= 0:
            raise RuntimeError(f"gemm conv: input {tuple(input.shape)} is too small for kernel {(kh, kw)}")
        geom = dict(kernel_size=(kh, kw), dilation=dilation, padding=padding, stride=stride)
        per_sample = c * kh * kw * ho * wo * input.element_size()
        chunk = max(1, chunk_bytes // max(per_sample, 1))
        wmat = weight.reshape(groups, o // groups, cg * kh * kw)
        out = input.new_empty((n, o, ho, wo))
        for s in range(0, n, chunk):
            cols = F.unfold(input[s : s + chunk], **geom)
            cols = cols.view(cols.shape[0], groups, cg * kh * kw, ho * wo)
            out[s : s + chunk] = torch.matmul(wmat, cols).view(-1, o, ho, wo)
            del cols
        if bias is not None:
            out += bias.view(1, -1, 1, 1)
        ctx.save_for_backward(input, weight)
        ctx.conf = (geom, groups, chunk, bias is not None, (ho, wo))
        return _match_memory_format(out, input)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        input, weight = ctx.saved_tensors
        geom, groups, chunk, has_bias, (ho, wo) = ctx.conf
        n, c, h, w = input.shape
        o, cg, kh, kw = weight.shape
        k = cg * kh * kw
        wmat = weight.reshape(groups, o // groups, k)
        need_in, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_in = torch.empty_like(input, memory_format=torch.contiguous_format) if need_in else None
        grad_w = torch.zeros_like(wmat) if need_w else None
        for s in range(0, n, chunk):
            g = grad_out[s : s + chunk].reshape(-1, groups, o // groups, ho * wo)
            if need_w:
                cols = F.unfold(input[s : s + chunk], **geom).view(-1, groups, k, ho * wo)
                grad_w += torch.matmul(g, cols.transpose(-1, -2)).sum(0)
                del cols
            if need_in:
                gcols = torch.matmul(wmat.transpose(-1, -2), g).view(-1, c * kh * kw, ho * wo)
                grad_in[s : s + chunk] = F.fold(gcols, output_size=(h, w), **geom)
                del gcols
        grad_b = grad_out.sum((0, 2, 3)) if has_bias and ctx.needs_input_grad[2] else None
        return grad_in, None if grad_w is None else grad_w.view_as(weight), grad_b, None, None, None, None, None


def _gemm_forward(conv, input, weight, bias, chunk_bytes=None):
    if input.dim() == 3:  # unbatched (C, H, W) input, which nn.Conv2d accepts
        return _gemm_forward(conv, input.unsqueeze(0), weight, bias, chunk_bytes).squeeze(0)
    input, padding = _explicit_padding(conv, input)
    dtype = _autocast_dtype(_device_type(input))
    if dtype is not None:
        input, weight, bias = _autocast_cast(dtype, input, weight, bias)
    with torch.autocast(_device_type(input), enabled=False):
        return _GemmConv.apply(
            input,
            weight,
            bias,
            tuple(conv.stride),
            padding,
            tuple(conv.dilation),
            conv.groups,
            chunk_bytes or _gemm_chunk_bytes(),
        )


# --------------------------------------------------------------------------- the callable

_IMPLEMENTATIONS = {
    "native": _TORCH_CONV_FORWARD,
    "aten": _aten_forward,
    "fp32": _fp32_forward,
    "gemm": _gemm_forward,
}


class PicklableConvForward:
    """``Conv2d._conv_forward`` with a chosen strategy: ``fn(conv, input, weight, bias)``.

    A module-level class with only a strategy name as state, so it pickles and deep-copies
    by reference (a closure would not). Set on the *class* ``nn.Conv2d`` by ``install``; as a
    descriptor it binds to each instance like a method, so ``Conv2d.forward`` calls it as
    ``self._conv_forward(input, self.weight, self.bias)``.
    """

    __slots__ = ("strategy", "_replaced")

    def __init__(self, strategy: str, _replaced=None):
        if strategy not in PER_OP:
            extra = f" ({MIOPEN_OFF} is a process-wide switch: use install)" if strategy == MIOPEN_OFF else ""
            raise ValueError(f"unknown conv strategy {strategy!r}; choose one of {', '.join(PER_OP)}{extra}")
        self.strategy = strategy
        self._replaced = _replaced if _replaced is not None else _TORCH_CONV_FORWARD

    def __call__(self, conv: nn.Conv2d, input: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
        return _IMPLEMENTATIONS[self.strategy](conv, input, weight, bias)

    def __get__(self, obj, objtype=None):
        return self if obj is None else types.MethodType(self, obj)

    def __reduce__(self):  # the replaced function is process state, not part of the value
        return (PicklableConvForward, (self.strategy,))

    def __eq__(self, other):
        return isinstance(other, PicklableConvForward) and other.strategy == self.strategy

    def __hash__(self):
        return hash((PicklableConvForward, self.strategy))

    def __repr__(self):
        return f"PicklableConvForward({self.strategy!r})"


# --------------------------------------------------------------------------- install

_lock = threading.Lock()
_state: dict = {"strategy": None, "original": None, "cudnn": None}


def _conv_forward_patchable() -> bool:
    return "_conv_forward" in nn.Conv2d.__dict__


# the torch internal this patch relies on (checked at start-up with Ultralytics' own: ultralytics_rules.compat)
REQUIREMENTS = (
    compat.Requirement(
        "nn.Conv2d._conv_forward",
        "Conv2d strategies other than native (--conv aten/fp32/gemm)",
        False,
        _conv_forward_patchable,
        owner="torch",
    ),
)


def install(strategy: str) -> None:
    """Make every ``nn.Conv2d`` (existing and future) run ``strategy``, process-wide.

    Idempotent: installing the same strategy again changes nothing; another strategy
    switches. ``native`` puts torch's own method back (zero overhead) but still counts as
    installed. ``miopen-off`` also puts torch's method back and sets
    ``torch.backends.cudnn.enabled = False``; switching away from it (or ``uninstall``)
    restores the flag it found. Subclasses that override ``_conv_forward`` themselves are
    not affected.
    """
    if strategy not in STRATEGIES:
        hint = " (resolve 'auto' first with rocm_yolo.conv.selftest.resolve_strategy)" if strategy == "auto" else ""
        raise ValueError(f"unknown conv strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}{hint}")
    with _lock:
        current = nn.Conv2d.__dict__["_conv_forward"]
        if _state["strategy"] is None:
            _state["original"] = current
        original = _state["original"]
        nn.Conv2d._conv_forward = (
            original if strategy in ("native", MIOPEN_OFF) else PicklableConvForward(strategy, original)
        )
        if strategy == MIOPEN_OFF and _state["cudnn"] is None:
            _state["cudnn"] = torch.backends.cudnn.enabled
            torch.backends.cudnn.enabled = False
        elif strategy != MIOPEN_OFF:
            _restore_cudnn()
        _state["strategy"] = strategy


def _restore_cudnn() -> None:
    if _state["cudnn"] is not None:
        torch.backends.cudnn.enabled = _state["cudnn"]
        _state["cudnn"] = None


def uninstall() -> None:
    """Put back exactly the ``_conv_forward`` (and cuDNN flag) there was before ``install``; no-op if none."""
    with _lock:
        if _state["strategy"] is None:
            return
        nn.Conv2d._conv_forward = _state["original"]
        _restore_cudnn()
        _state.update(strategy=None, original=None)


def installed_strategy() -> str | None:
    """The strategy installed in this process, or None."""
    return _state["strategy"]
