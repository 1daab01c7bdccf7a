"""Atomic writes: a reader sees the old file or the new one, never half; a killed writer leaves only a temporary."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from rocm_yolo.run.atomic import Temporary, copy_atomic, remove_temporaries, temporaries, temporary, write_atomic


def test_text_bytes_and_a_writer_function(tmp_path):
    path = tmp_path / "f.json"
    write_atomic(path, "héllo")
    assert path.read_bytes() == "héllo".encode()
    write_atomic(path, b"\x00\x01", durable=True)
    assert path.read_bytes() == b"\x00\x01"
    write_atomic(path, lambda f: f.write(b"streamed"))
    assert path.read_bytes() == b"streamed" and list(tmp_path.iterdir()) == [path]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "last.pt"
    path.write_bytes(b"old")

    def half_then_fail(f):
        f.write(b"new, half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        write_atomic(path, half_then_fail, durable=True)
    assert path.read_bytes() == b"old" and list(tmp_path.iterdir()) == [path]


def test_a_writer_killed_mid_write_leaves_the_old_file_and_a_temporary_that_is_removed(tmp_path):
    path = tmp_path / "ep1-ba4.pt"
    path.write_bytes(b"old")
    code = (
        "import os, signal, sys\n"
        "from rocm_yolo.run.atomic import write_atomic\n"
        "def die(f):\n"
        "    f.write(b'half'); f.flush(); os.kill(os.getpid(), signal.SIGKILL)\n"
        "write_atomic(sys.argv[1], die, durable=True)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(path)], timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert path.read_bytes() == b"old"
    [left] = [p for p in tmp_path.iterdir() if p != path]
    assert left.name.startswith(".ep1-ba4.pt.") and left.read_bytes() == b"half"
    assert remove_temporaries(tmp_path) == [left] and list(tmp_path.iterdir()) == [path]


def test_a_temporary_file_says_whose_write_it_is(tmp_path, monkeypatch):
    """The pid of its writer, and on more than one machine the node: two machines can have the same pid."""
    monkeypatch.delenv("ROCM_YOLO_NODE", raising=False)
    mine = temporary(tmp_path / "last.pt")
    assert mine.name == f".last.pt.{os.getpid()}.tmp"
    monkeypatch.setenv("ROCM_YOLO_NODE", "1")
    node = temporary(tmp_path / "ep2-ba12.pt")
    assert node.name == f".ep2-ba12.pt.n1-{os.getpid()}.tmp"
    for path in (mine, node, tmp_path / ".last_good.pt.12.tmp", tmp_path / "last.pt", tmp_path / ".x.tmp"):
        path.write_bytes(b"")
    assert temporaries(tmp_path) == [
        Temporary(node, "ep2-ba12.pt", os.getpid(), 1),
        Temporary(mine, "last.pt", os.getpid(), None),
        Temporary(tmp_path / ".last_good.pt.12.tmp", "last_good.pt", 12, None),
    ]
    assert temporaries(tmp_path / "missing") == []


def test_copy_is_atomic_too(tmp_path):
    src, dst = tmp_path / "last.pt", tmp_path / "last_good.pt"
    src.write_bytes(os.urandom(3 << 20))
    copy_atomic(src, dst, durable=True)
    assert dst.read_bytes() == src.read_bytes()
    with pytest.raises(FileNotFoundError):
        copy_atomic(tmp_path / "missing.pt", dst)
    assert dst.read_bytes() == src.read_bytes() and not temporary(dst).exists()


def test_a_copy_replaces_the_target_only_when_the_copy_itself_is_accepted(tmp_path):
    """keep_good_copy checks the copy, not the source: the source may change while it is copied."""
    src, dst = tmp_path / "last.pt", tmp_path / "last_good.pt"
    dst.write_bytes(b"previous good copy")
    src.write_bytes(b"new")
    seen = []
    assert not copy_atomic(src, dst, accept=lambda tmp: seen.append(tmp.read_bytes()) or False)
    assert seen == [b"new"] and dst.read_bytes() == b"previous good copy" and not temporary(dst).exists()
    assert copy_atomic(src, dst, durable=True, accept=lambda tmp: tmp.read_bytes() == b"new")
    assert dst.read_bytes() == b"new"
