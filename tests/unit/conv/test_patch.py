"""Conv2d strategies: exact nn.Conv2d semantics, process-wide install, checkpoints stay clean."""

from __future__ import annotations

import copy
import io
import json
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from rocm_yolo.conv.patch import (
    PicklableConvForward,
    install,
    installed_strategy,
    uninstall,
)
from rocm_yolo.conv.strategies import PER_OP, STRATEGIES

TORCH_CONV_FORWARD = nn.Conv2d.__dict__["_conv_forward"]


@pytest.fixture(autouse=True)
def _clean_patch():
    uninstall()
    yield
    uninstall()
    assert nn.Conv2d.__dict__["_conv_forward"] is TORCH_CONV_FORWARD


class OpRecorder(TorchDispatchMode):
    """Records the ATen ops that run, to see which convolution path was taken."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []
        self.cudnn_during: dict[str, bool] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops.append(name)
        self.cudnn_during.setdefault(name, torch.backends.cudnn.enabled)
        return func(*args, **(kwargs or {}))


def _run(conv, x, strategy, grad):
    """Output and (input, weight, bias) gradients of ``conv(x)`` under ``strategy``."""
    x = x.detach().requires_grad_(True)
    y = PicklableConvForward(strategy)(conv, x, conv.weight, conv.bias)
    params = [x] + [p for p in (conv.weight, conv.bias) if p is not None]
    return [y] + list(torch.autograd.grad(y, params, grad))


GRID = [
    (4, 6, 3, 1, 1, 1, 1, True, "zeros"),
    (4, 8, 3, 2, 1, 1, 1, False, "zeros"),
    (4, 8, 1, 1, 0, 1, 1, True, "zeros"),
    (4, 8, (3, 5), (2, 1), (1, 2), 1, 2, True, "zeros"),
    (4, 4, 3, 1, 2, 2, 1, True, "zeros"),
    (6, 6, 3, 1, 1, 1, 6, False, "zeros"),  # depthwise
    (6, 12, 5, 2, 2, 1, 6, True, "zeros"),  # depthwise multiplier 2
    (4, 6, 3, 1, "same", 1, 1, True, "zeros"),
    (4, 6, 4, 1, "same", 1, 2, True, "zeros"),  # asymmetric 'same'
    (4, 6, 2, 1, "same", 3, 1, False, "zeros"),  # even kernel, odd dilation
    (4, 6, 3, 1, "valid", 1, 1, True, "zeros"),
    (4, 6, 3, 1, 2, 1, 1, True, "reflect"),
    (4, 6, 3, 2, 1, 1, 2, True, "replicate"),
    (4, 6, (3, 2), 1, (1, 1), (1, 2), 1, False, "circular"),
    (4, 6, 3, 1, "same", 1, 1, True, "reflect"),
]


@pytest.mark.parametrize("strategy", PER_OP)
@pytest.mark.parametrize("case", GRID, ids=[str(i) for i in range(len(GRID))])
def test_strategy_matches_native(strategy, case):
    cin, cout, k, s, p, d, g, bias, mode = case
    torch.manual_seed(0)
    conv = nn.Conv2d(cin, cout, k, s, p, d, g, bias=bias, padding_mode=mode)
    x = torch.randn(3, cin, 11, 9)
    y = conv(x)
    grad = torch.randn_like(y)
    expected = _run(conv, x, "native", grad)
    got = _run(conv, x, strategy, grad)
    assert got[0].shape == y.shape
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("strategy", PER_OP)
def test_unbatched_input(strategy):
    conv = nn.Conv2d(3, 5, 3, padding=1)
    x = torch.randn(3, 8, 8)
    torch.testing.assert_close(PicklableConvForward(strategy)(conv, x, conv.weight, conv.bias), conv(x))


def test_gemm_chunks_the_batch_in_both_passes(monkeypatch):
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)
    x = torch.randn(5, 4, 12, 12)
    y = conv(x)
    grad = torch.randn_like(y)
    expected = _run(conv, x, "native", grad)
    monkeypatch.setenv("ROCM_YOLO_GEMM_CHUNK_MB", str(1 / 2**20))  # 1 byte: one sample per chunk
    recorder = OpRecorder()
    with recorder:
        got = _run(conv, x, "gemm", grad)
    assert recorder.ops.count("im2col") >= 2 * 5  # forward and weight gradient, per sample
    assert "convolution" not in recorder.ops and "convolution_backward" not in recorder.ops
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_bad_chunk_setting_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("ROCM_YOLO_GEMM_CHUNK_MB", "lots")
    conv = nn.Conv2d(1, 1, 1)
    with pytest.raises(ValueError, match="ROCM_YOLO_GEMM_CHUNK_MB"):
        PicklableConvForward("gemm")(conv, torch.randn(1, 1, 2, 2), conv.weight, conv.bias)


def test_aten_keeps_cudnn_off_in_forward_and_backward():
    conv = nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    before = torch.backends.cudnn.enabled
    recorder = OpRecorder()
    with recorder:
        y = PicklableConvForward("aten")(conv, x, conv.weight, conv.bias)
        y.sum().backward()
    assert recorder.cudnn_during["convolution"] is False
    assert recorder.cudnn_during["convolution_backward"] is False
    assert torch.backends.cudnn.enabled == before  # and nothing else leaks out


def test_miopen_off_keeps_cudnn_off_for_conv_and_batchnorm(monkeypatch):
    """ATen picks MIOpen (cuDNN) for convolutions and BatchNorm only while the global flag is on:
    ``at::convolution``/``convolution_backward`` read it from the context, ``F.batch_norm`` passes
    it as ``cudnn_enabled``. Under miopen-off it is off for every one of them, in training and in
    (fused and unfused) evaluation, and the patch leaves Conv2d itself alone."""
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.SiLU(), nn.Conv2d(8, 8, 3, padding=1, groups=8)
    )
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    before = torch.backends.cudnn.enabled
    install("miopen-off")
    assert nn.Conv2d.__dict__["_conv_forward"] is TORCH_CONV_FORWARD
    bn_cudnn_enabled = []  # the last argument F.batch_norm hands to torch.batch_norm
    torch_batch_norm = torch.batch_norm

    def batch_norm(*args):
        bn_cudnn_enabled.append(args[-1])
        return torch_batch_norm(*args)

    monkeypatch.setattr(torch, "batch_norm", batch_norm)
    ops = OpRecorder()
    with ops:
        model.train()
        model(x).square().mean().backward()
        model.eval()
        with torch.inference_mode():
            model(x.detach())
    for op in ("convolution", "convolution_backward", "native_batch_norm", "native_batch_norm_backward"):
        assert ops.cudnn_during[op] is False, op
    assert bn_cudnn_enabled == [False, False]  # the training and the evaluation BatchNorm
    uninstall()
    assert torch.backends.cudnn.enabled == before


def test_miopen_off_restores_the_flag_it_found():
    install("miopen-off")
    install("miopen-off")  # idempotent: the flag it restores is still the user's
    install("gemm")
    assert torch.backends.cudnn.enabled is True and installed_strategy() == "gemm"
    install("miopen-off")
    assert torch.backends.cudnn.enabled is False
    uninstall()
    assert torch.backends.cudnn.enabled is True
    torch.backends.cudnn.enabled = False  # a user who had switched it off keeps it off
    try:
        install("miopen-off")
        uninstall()
        assert torch.backends.cudnn.enabled is False
    finally:
        torch.backends.cudnn.enabled = True
    with pytest.raises(ValueError, match="process-wide switch"):
        PicklableConvForward("miopen-off")


@pytest.mark.parametrize("strategy", PER_OP)
def test_autocast_dtypes_follow_native(strategy):
    """Under autocast (bf16 on CPU) every strategy returns what native returns; fp32 is closer to fp32."""
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 8, 3, padding=1)
    x = torch.randn(2, 8, 10, 10)
    exact = conv(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        native = conv(x)
        got = PicklableConvForward(strategy)(conv, x, conv.weight, conv.bias)
    assert got.dtype == native.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), exact, rtol=3e-2, atol=3e-2)
    got.float().sum().backward()
    assert conv.weight.grad.dtype == torch.float32


def test_fp32_computes_half_models_in_float32():
    conv = nn.Conv2d(4, 4, 3, padding=1).to(torch.bfloat16)
    x = torch.randn(1, 4, 6, 6, dtype=torch.bfloat16)
    recorder = OpRecorder()
    with recorder:
        y = PicklableConvForward("fp32")(conv, x, conv.weight, conv.bias)
    assert y.dtype == torch.bfloat16
    assert "_to_copy" in recorder.ops  # upcast before, downcast after the convolution


@pytest.fixture(scope="module")
def yolo_model():
    from ultralytics import YOLO

    return YOLO("yolo26n.yaml").model


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _flat(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _flat(v)]
    return []


def _model_pass(model, x):
    model.zero_grad(set_to_none=True)
    outs = _flat(model(x))
    sum(o.float().square().mean() for o in outs).backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return [o.detach() for o in outs], grads


def test_whole_yolo_model_forward_backward_matches(yolo_model):
    """In float64 every strategy is native to rounding; in float32 within float32 noise.

    (A per-element fp32 comparison is meaningless here: gradients that the BatchNorms
    cancel to ~1e-7 are pure rounding noise, so fp32 is judged on the whole-model scale.)
    """
    torch.manual_seed(0)
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-3)):
        model = copy.deepcopy(yolo_model).to(dtype).train()
        x = torch.randn(2, 3, 64, 64, dtype=dtype)
        ref_out, ref_grads = _model_pass(model, x)
        ref_g = torch.cat([g.flatten() for g in ref_grads])
        for strategy in PER_OP[1:]:  # miopen-off runs native's kernels on the CPU: it has its own dispatch test
            install(strategy)
            out, grads = _model_pass(model, x)
            assert len(grads) == len(ref_grads)
            for a, b in zip(out, ref_out):
                assert ((a - b).abs().max() / b.abs().max()).item() < tol, (strategy, dtype)
            g = torch.cat([t.flatten() for t in grads])
            assert ((g - ref_g).norm() / ref_g.norm()).item() < tol, (strategy, dtype)
            assert ((g - ref_g).abs().max() / ref_g.abs().max()).item() < tol, (strategy, dtype)
        uninstall()


def test_install_is_idempotent_switches_and_restores_exactly():
    assert installed_strategy() is None
    install("gemm")
    patched = nn.Conv2d.__dict__["_conv_forward"]
    install("gemm")
    assert nn.Conv2d.__dict__["_conv_forward"] == patched and installed_strategy() == "gemm"
    install("aten")
    assert installed_strategy() == "aten"
    assert nn.Conv2d.__dict__["_conv_forward"] == PicklableConvForward("aten")
    install("native")
    assert installed_strategy() == "native"
    assert nn.Conv2d.__dict__["_conv_forward"] is TORCH_CONV_FORWARD
    install("fp32")
    uninstall()
    uninstall()
    assert installed_strategy() is None
    assert nn.Conv2d.__dict__["_conv_forward"] is TORCH_CONV_FORWARD


def test_other_conv_classes_are_untouched():
    others = {cls: vars(cls)["_conv_forward"] for cls in (nn.Conv1d, nn.Conv3d)}
    install("gemm")
    assert all(vars(cls)["_conv_forward"] is fn for cls, fn in others.items())


def test_unknown_strategy_is_refused():
    with pytest.raises(ValueError, match="resolve 'auto' first"):
        install("auto")
    with pytest.raises(ValueError, match="native, aten, fp32, gemm"):
        install("fast")
    assert installed_strategy() is None


@pytest.mark.parametrize("strategy", ["aten", "gemm"])
def test_existing_and_new_convs_are_covered(strategy):
    before = nn.Conv2d(3, 4, 3)
    install(strategy)
    after = nn.Conv2d(3, 4, 3)
    backward_name = {"aten": "_AtenConvBackward", "gemm": "_GemmConvBackward"}[strategy]
    for conv in (before, after):
        y = conv(torch.randn(1, 3, 6, 6))
        assert type(y.grad_fn).__name__ == backward_name
        assert "_conv_forward" not in vars(conv)  # nothing stored on the instance


def test_fused_model_is_covered(yolo_model):
    """Ultralytics fuses Conv+BN for the final validation: the fused convs run the strategy too."""
    install("gemm")
    fused = copy.deepcopy(yolo_model).eval().fuse()
    recorder = OpRecorder()
    with torch.no_grad(), recorder:
        fused(torch.randn(1, 3, 64, 64))
    assert "im2col" in recorder.ops
    assert "convolution" not in recorder.ops


def test_callable_pickles_by_reference():
    for strategy in PER_OP:
        fn = PicklableConvForward(strategy)
        assert pickle.loads(pickle.dumps(fn)) == fn
        assert copy.deepcopy(fn) == fn


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_model_under_patch_deepcopies_and_saves_without_the_patch(yolo_model, strategy):
    install(strategy)
    model = copy.deepcopy(yolo_model)
    model(torch.randn(1, 3, 64, 64))
    buf = io.BytesIO()
    torch.save({"model": copy.deepcopy(model).half()}, buf)
    assert b"rocm_yolo" not in buf.getvalue()
    assert b"PicklableConvForward" not in buf.getvalue()


EPOCH_STRATEGIES = ("native", "miopen-off", "aten", "fp32", "gemm")


TRAIN_SCRIPT = """
import json, sys, torch
from rocm_yolo.request.demo import write_demo
from rocm_yolo.conv.patch import install, installed_strategy
from ultralytics import YOLO
order = sys.argv[2].split(",")
seen = []
def switch(trainer):
    install(order[trainer.epoch])
    seen.append((trainer.epoch, installed_strategy(), torch.backends.cudnn.enabled))
root = sys.argv[1]
data = write_demo(f"{root}/demo", train=8, val=4, size=64)
model = YOLO("yolo26n.yaml")
model.add_callback("on_train_epoch_start", switch)
model.train(data=str(data), epochs=len(order), imgsz=32, batch=4, device="cpu", workers=0, plots=False,
            save_period=1, project=f"{root}/runs", name="conv", exist_ok=True, verbose=False)
print(json.dumps({"strategy": installed_strategy(), "data": str(data), "seen": seen}))
"""


LOAD_SCRIPT = """
import sys
sys.modules["rocm_yolo"] = None
try:
    import rocm_yolo.conv.patch
except ImportError:
    pass
else:
    raise SystemExit("rocm_yolo should not be importable here")
from pathlib import Path
from ultralytics import YOLO
data, weights = sys.argv[1], sys.argv[2:]
image = sorted(Path(data).parent.glob("images/val/*.png"))[0]
for path in weights:
    results = YOLO(path).predict(str(image), imgsz=32, device="cpu", verbose=False)
    assert len(results) == 1, path
    print("PREDICTED", Path(path).name)
model = YOLO(weights[-1])
metrics = model.val(data=data, imgsz=32, batch=4, device="cpu", workers=0, plots=False, verbose=False,
                    project=str(Path(weights[-1]).parent.parent / "val"), name="plain", exist_ok=True)
assert metrics.box is not None
print("LOADED-OK")
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 5-epoch run in a subprocess, each epoch under another strategy, every epoch's checkpoint kept."""
    root = tmp_path_factory.mktemp("conv-train")
    proc = subprocess.run(
        [sys.executable, "-c", TRAIN_SCRIPT, str(root), ",".join(EPOCH_STRATEGIES)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["strategy"] == "gemm"
    assert [(e, s) for e, s, _ in info["seen"]] == list(enumerate(EPOCH_STRATEGIES))
    assert [cudnn for _, s, cudnn in info["seen"]] == [s != "miopen-off" for s in EPOCH_STRATEGIES]
    weights = root / "runs" / "conv" / "weights"
    return weights, info["data"]


def test_checkpoint_of_every_strategy_has_no_trace_of_the_patch(trained):
    weights, _ = trained
    names = ["last.pt", "best.pt"] + [f"epoch{e}.pt" for e in range(len(EPOCH_STRATEGIES))]
    for name in names:
        blob = (weights / name).read_bytes()
        assert b"rocm_yolo" not in blob and b"PicklableConvForward" not in blob, name


def test_checkpoint_of_every_strategy_loads_where_rocm_yolo_is_unimportable(trained, tmp_path):
    """epoch{N}.pt was saved under EPOCH_STRATEGIES[N]; each predicts in a clean interpreter, last.pt validates."""
    weights, data = trained
    paths = [str(weights / f"epoch{e}.pt") for e in range(len(EPOCH_STRATEGIES))] + [str(weights / "last.pt")]
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LOAD_SCRIPT), data, *paths],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("PREDICTED") == len(paths) and "LOADED-OK" in proc.stdout


def test_model_rebuilt_from_checkpoint_is_covered(trained):
    """Resume rebuilds the model from last.pt: its convs are new objects and run the strategy."""
    from ultralytics.nn.tasks import load_checkpoint

    weights, _ = trained
    install("gemm")
    model, _ = load_checkpoint(str(weights / "last.pt"), device="cpu")
    model = model.float().train()
    for p in model.parameters():
        p.requires_grad_(True)
    recorder = OpRecorder()
    with recorder:
        out = _flat(model(torch.randn(2, 3, 64, 64)))
        sum(o.sum() for o in out).backward()
    assert "im2col" in recorder.ops and "col2im" in recorder.ops
    assert "convolution" not in recorder.ops and "convolution_backward" not in recorder.ops
