"""The GPU without torch: architecture detection from a fake KFD tree, and the installed torch's build."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocm_yolo.gpu.arch import (
    GpuNode,
    arch_from_target_version,
    detect_arch,
    detect_gpus,
)
from rocm_yolo.gpu.torch_build import torch_build, torch_view

CPU_NODE = "cpu_cores_count 16\nsimd_count 0\ngfx_target_version 0\nvendor_id 0\ndevice_id 0\n"


def gpu_node(version: int, device_id: int = 0x731F, minor: int = 128) -> str:
    return (
        f"cpu_cores_count 0\nsimd_count 72\nsimd_per_cu 2\nmax_waves_per_simd 20\n"
        f"gfx_target_version {version}\nvendor_id 4098\ndevice_id {device_id}\n"
        f"location_id 768\ndrm_render_minor {minor}\nnum_xcc 1\n"
    )


def make_tree(root: Path, nodes: dict[int, tuple[str, str | None]]) -> Path:
    """Write a fake ``topology/nodes`` tree: {index: (properties text, name or None)}."""
    base = root / "nodes"
    for index, (props, name) in nodes.items():
        node = base / str(index)
        node.mkdir(parents=True)
        (node / "properties").write_text(props)
        if name is not None:
            (node / "name").write_text(name + "\n")
    return base


@pytest.mark.parametrize(
    "version, arch",
    [
        (100100, "gfx1010"),
        (100102, "gfx1012"),
        (100300, "gfx1030"),
        (110000, "gfx1100"),
        (90010, "gfx90a"),
        (90008, "gfx908"),
        (90402, "gfx942"),
        (120001, "gfx1201"),
        (90006, "gfx906"),
    ],
)
def test_arch_from_target_version(version, arch):
    assert arch_from_target_version(version) == arch


def test_cpu_target_version_is_not_an_arch():
    with pytest.raises(ValueError, match="CPU"):
        arch_from_target_version(0)


def test_detect_gpus_skips_cpu_nodes_and_reads_properties(tmp_path):
    base = make_tree(
        tmp_path, {0: (CPU_NODE, ""), 1: (gpu_node(100100), "gfx1010"), 2: (gpu_node(90010, 0x740F, 129), None)}
    )
    gpus = detect_gpus(base)
    assert [g.arch for g in gpus] == ["gfx1010", "gfx90a"]
    first = gpus[0]
    assert first == GpuNode(
        node=1,
        gfx_target_version=100100,
        arch="gfx1010",
        name="gfx1010",
        vendor_id=0x1002,
        device_id=0x731F,
        simd_count=72,
        compute_units=36,
        drm_render_minor=128,
        location_id=768,
    )
    assert first.render_device == "/dev/dri/renderD128" and first.family == "gfx101x"
    assert gpus[1].name is None and gpus[1].node == 2
    assert detect_arch(base) == "gfx1010"


def test_nodes_are_ordered_numerically_and_bad_ones_skipped(tmp_path):
    base = make_tree(
        tmp_path,
        {10: (gpu_node(110000), "gfx1100"), 2: (gpu_node(100100), "gfx1010"), 3: ("garbage without numbers\n", None)},
    )
    (base / "4").mkdir()  # no properties file
    (base / "notanode").mkdir()
    assert [g.node for g in detect_gpus(base)] == [2, 10]


def test_no_driver_or_only_cpus_means_no_arch(tmp_path):
    assert detect_gpus(tmp_path / "missing") == []
    assert detect_arch(tmp_path / "missing") is None
    assert detect_arch(make_tree(tmp_path, {0: (CPU_NODE, "")})) is None


def test_root_from_environment(tmp_path, monkeypatch):
    base = make_tree(tmp_path, {0: (CPU_NODE, ""), 1: (gpu_node(100102), "gfx1012")})
    monkeypatch.setenv("ROCM_YOLO_KFD_ROOT", str(base))
    assert detect_arch() == "gfx1012"


def test_torch_build_reads_versions_without_import():
    import torch

    build = torch_build()
    assert build == {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "path": str(Path(torch.__file__).parent),
    }


def test_torch_view_is_safe_on_cpu():
    import torch

    view = torch_view()
    assert view["torch"] == torch.__version__ and view["hip"] == torch.version.hip
    if not torch.cuda.is_available():
        assert view["available"] is False and view["devices"] == []


def test_the_pci_address_of_a_card_as_the_kernel_log_names_it(tmp_path):
    props = gpu_node(100100).replace("location_id 768", "location_id 3080\ndomain 1")  # bus 0x0c, device 1, fn 0
    [gpu] = detect_gpus(make_tree(tmp_path, {0: (CPU_NODE, None), 1: (props, None)}))
    assert gpu.pci_address == "0001:0c:01.0"
    [plain] = detect_gpus(make_tree(tmp_path / "b", {1: (gpu_node(100100), None)}))  # location 768: bus 3, no domain
    assert plain.pci_address == "0000:03:00.0"


def test_the_cards_a_device_list_uses_through_the_visibility_variables():
    from rocm_yolo.gpu.count import used_gpus

    cards = [GpuNode(node=n, gfx_target_version=110000, arch="gfx1100", location_id=n << 8) for n in (1, 2, 3)]
    assert used_gpus(cards, None) == []  # the CPU
    assert used_gpus(cards, [], env={}) == [cards[0]]  # Ultralytics' default: GPU 0
    assert used_gpus(cards, ["1"], env={"ROCR_VISIBLE_DEVICES": "2,0"}) == [cards[0]]  # the second one shown
    assert used_gpus(cards, ["0"], env={"ROCR_VISIBLE_DEVICES": "1,2", "HIP_VISIBLE_DEVICES": "1"}) == [cards[2]]
    assert used_gpus(cards, ["0"], env={"ROCR_VISIBLE_DEVICES": "GPU-abc"}) == cards  # a UUID: any of them
