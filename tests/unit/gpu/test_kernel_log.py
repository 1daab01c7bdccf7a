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


# amdgpu's page fault as 6.x kernels print it (the process on the next line), and as 5.x kernels (on the same line);
# the ring timeout with its "Process information" line; the OOM killer's victim
FAULT_6X = (
    "amdgpu 0000:03:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:9 pasid:32774)",
    "amdgpu 0000:03:00.0: amdgpu:  in process python3 pid 2406 thread python3 pid 2407",
    "amdgpu 0000:03:00.0: amdgpu:   in page starting at address 0x00007f0e4a000000 from client 10",
    "amdgpu 0000:03:00.0: amdgpu: GCVM_L2_PROTECTION_FAULT_STATUS:0x00801031",
)
FAULT_5X = (
    "amdgpu 0000:03:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:153 vmid:8 pasid:32771, for process Xorg "
    "pid 901 thread Xorg:cs0 pid 955)"
)
RING = (
    "[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx_0.0.0 timeout, signaled seq=1, emitted seq=3",
    "[drm:amdgpu_job_timedout [amdgpu]] *ERROR* Process information: process gnome-shell pid 1200 thread gnome-s:cs0 "
    "pid 1210",
)
RESET = "amdgpu 0000:0c:00.0: amdgpu: GPU reset begin!. Source:  1"


def test_events_keep_the_lines_that_follow_a_fault_and_the_process_they_name():
    found = kernel_log.events([*FAULT_6X, "usb 1-1: new device", FAULT_5X, *RING, RESET])
    assert [(e.kinds, e.pids, e.process, e.card) for e in found] == [
        (("page fault",), (2406,), "python3", "0000:03:00.0"),
        (("page fault",), (901,), "Xorg", "0000:03:00.0"),
        (("ring timeout",), (1200,), "gnome-shell", None),
        (("GPU reset",), (), "", "0000:0c:00.0"),
    ]
    assert found[0].lines == FAULT_6X  # the address and the status lines stay with the fault


def test_an_event_is_the_runs_by_its_process_else_by_its_card_and_never_another_processes():
    found = kernel_log.events([*FAULT_6X, FAULT_5X, *RING, RESET, "amdgpu: ring sdma0 timeout, signaled seq=7"])
    ours = kernel_log.attribute(found, pids={2406}, cards=["0000:0C:00.0"])
    assert [e.process or e.card for e in ours.run] == ["python3", "0000:0c:00.0"]  # its pid; its card's reset
    assert [e.process for e in ours.others] == ["Xorg", "gnome-shell"]  # another process, on the same card too
    assert [e.lines[0] for e in ours.unnamed] == ["amdgpu: ring sdma0 timeout, signaled seq=7"]  # no process, no card
    on_cpu = kernel_log.attribute(found, pids={4}, cards=[])  # a CPU run: no card of its own
    assert on_cpu.run == () and len(on_cpu.others) == 4
