"""What checking a checkpoint the way torch.load reads it costs, and what the per-batch position line costs.

(a) A checkpoint of ``--mb`` megabytes (a dict of float tensors, written with torch.save): the
time of ``verify()`` (zip structure, every record the pickle names present, CRCs) against the
CRC-only check it replaced, and against ``torch.load`` itself; median of ``--rounds``, with
the file in the page cache (what the trainer sees right after writing it).
(b) ``HeartbeatWriter.on_train_batch_end`` with the pipe and the file, once a second as records
and every other batch as a position line, per call; against the same without the position line.

    python benchmarks/bench_verify.py --mb 200 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import zipfile
from pathlib import Path


def crc_only(path: Path) -> None:
    with zipfile.ZipFile(path) as z:
        z.testzip()


def timed(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def per_batch(calls: int, positions: bool, root: Path) -> float:
    from rocm_yolo.trainer.callbacks.heartbeat_writer import HeartbeatWriter

    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    writer = HeartbeatWriter(root / "heartbeat.json", pipe_fd=write_end)
    trainer = type("T", (), {"epoch": 0, "epochs": 1, "train_loader": [None] * (calls + 1)})()
    writer.on_train_epoch_start(trainer)
    if not positions:
        writer._send = lambda text: None if text.startswith("P ") else os.write(write_end, text.encode() + b"\n")
    t0 = time.perf_counter()
    for i in range(calls):
        writer.on_train_batch_end(trainer)
        if i % 1000 == 0:  # the supervisor reads the pipe twice a second
            try:
                while os.read(read_end, 1 << 16):
                    pass
            except BlockingIOError:
                pass
    seconds = (time.perf_counter() - t0) / calls
    os.close(read_end)
    os.close(write_end)
    return seconds


def main() -> None:
    import torch

    from rocm_yolo.run.checkpoints import verify

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=100_000)
    a = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        root = Path(tmp)
        path = root / "last.pt"
        n = a.mb * 2**20 // 4 // 400
        torch.save({"epoch": 0, "model": {f"layer{i}": torch.randn(n) for i in range(400)}}, path)
        size = path.stat().st_size / 2**20
        assert verify(path) is None
        full = timed(lambda: verify(path), a.rounds)
        crc = timed(lambda: crc_only(path), a.rounds)
        load = timed(lambda: torch.load(path, map_location="cpu", weights_only=False), a.rounds)
        print(f"(a) {size:.0f} MB checkpoint, 400 tensors, median of {a.rounds}:")
        print(f"    verify (records + CRCs) {full:.3f} s | CRC only (before) {crc:.3f} s | torch.load {load:.3f} s")
        with_positions = per_batch(a.calls, True, root)
        without = per_batch(a.calls, False, root)
        print(
            f"(b) heartbeat per batch: {with_positions * 1e6:.2f} us with the position line, "
            f"{without * 1e6:.2f} us without ({(with_positions - without) * 1e6:.2f} us for the line)"
        )


if __name__ == "__main__":
    main()
