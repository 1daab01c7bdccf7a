"""The kernel log as the doctor and the watchdog read it: its formats, a failure's window, the lines that matter."""

from __future__ import annotations

from rocm_yolo.gpu import kernel_log
from rocm_yolo.gpu.kernel_log import KernelLine, parse, scan, victims, within

BOOT = 1_764_000_000.0


def test_each_formats_time_becomes_the_wall_clock():
    text = (
        "[  120.500000] amdgpu 0000:03:00.0: amdgpu: GPU reset begin!\n"
        "6,1234,121000000,-;amdgpu: ring gfx_0.0.0 timeout\n"
        " SUBSYSTEM=pci\n"  # a /dev/kmsg record's continuation: not a line of its own
        "1764000200.250000 host kernel: Out of memory: Killed process 4251 (python3) total-vm:1kB\n"
        "no time at all\n"
    )
    lines = parse(text, boot=BOOT)
    assert [line.time for line in lines] == [BOOT + 120.5, BOOT + 121.0, 1764000200.25, None]
    assert lines[1].text == "amdgpu: ring gfx_0.0.0 timeout" and lines[2].text.startswith("Out of memory")
    assert [line.time for line in parse(text, boot=0.0)][:2] == [None, None]  # no boot time: no wall clock
    window = within(lines, BOOT + 120.6, BOOT + 300)
    assert [line.text for line in window] == [lines[1].text, lines[2].text]  # the timeless line is left out


def test_what_matters_in_it():
    lines = [
        "amdgpu 0000:c5:00.0: amdgpu: MES failed to respond to msg=REMOVE_QUEUE",
        "[drm:mes_v11_0_submit_pkt_and_poll_completion [amdgpu]] *ERROR* MES failed to response msg=14",
        "amdgpu 0000:03:00.0: amdgpu: GCVM_L2_PROTECTION_FAULT_STATUS:0x00000000",
        "usb 1-1: new device",
        "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),task=pt_main_thread,pid=4242,uid=1000",
        "Out of memory: Killed process 4251 (python3) total-vm:9000kB",
    ]
    counts, matched = scan(lines)
    assert counts == {"MES": 2, "page fault": 1, kernel_log.OOM: 2} and "usb 1-1: new device" not in matched
    assert victims([KernelLine(None, x) for x in lines]) == [(4242, "pt_main_thread"), (4251, "python3")]


def test_a_file_named_is_read_and_a_missing_one_is_said(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("1764000200.0 host kernel: amdgpu: ring gfx timeout\n")
    found = kernel_log.read(log)
    assert found.readable and found.source == str(log) and found.lines[0].time == 1764000200.0
    missing = kernel_log.read(tmp_path / "nope")
    assert not missing.readable and "nope" in missing.source
