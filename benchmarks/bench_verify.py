"""What checking a checkpoint the way torch.load reads it costs, and what the per-batch position line costs.

(a) A checkpoint of ``--mb`` megabytes (a dict of float tensors, written with torch.save): the
time of ``verify()`` (zip structure, every record the pickle names present, CRCs) against the
CRC-only check it replaced, and against ``torch.load`` itself; median of ``--rounds``, with
the file in the page cache (what the trainer sees right after writing it).
(b) ``HeartbeatWriter.on_train_batch_end`` with the pipe and the file, once a second as records
and every other batch as a position line, per call; against the same without the position line.
(c) The verified copy of ``last.pt`` after each save (``keep_good_copy``), the two ways the trainer keeps it:
a hard link to the saved file (the saves replace ``last.pt`` whole) against a durable copy (read, write,
fsync, rename: where a save patch is off), each with its check, median of ``--rounds``, interleaved; and
the bytes each writes. ``--mb 25`` is yolo26n's ``last.pt`` with its optimizer.

    python benchmarks/bench_verify.py --mb 200 --rounds 5
    python benchmarks/bench_verify.py --mb 25 --rounds 7 --only copy
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


def good_copy(path: Path, rounds: int) -> dict[str, float]:
    """Median seconds of keeping ``path`` as its verified copy, by a hard link and by a durable copy, interleaved."""
    from rocm_yolo.run.weights import keep_good_copy

    good = path.with_name("last_good.pt")
    times: dict[str, list[float]] = {"link": [], "copy": []}
    for _ in range(rounds):
        for way in times:
            good.unlink(missing_ok=True)
            t0 = time.perf_counter()
            kept = keep_good_copy(path, link=way == "link")
            times[way].append(time.perf_counter() - t0)
            assert kept == good and os.path.samefile(path, good) == (way == "link")
    good.unlink(missing_ok=True)
    return {way: statistics.median(t) for way, t in times.items()}


def main() -> None:
    import torch

    from rocm_yolo.run.weights import verify

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--only", choices=("copy",), help="copy: (c) alone, the verified copy")
    parser.add_argument("--dir", help="where the checkpoint goes (default: a temporary directory): the disk measured")
    a = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-verify-", dir=a.dir) as tmp:
        root = Path(tmp)
        path = root / "last.pt"
        n = a.mb * 2**20 // 4 // 400
        torch.save({"epoch": 0, "model": {f"layer{i}": torch.randn(n) for i in range(400)}}, path)
        size = path.stat().st_size / 2**20
        assert verify(path) is None
        if a.only == "copy":
            report_copy(path, size, a.rounds)
            return
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
        report_copy(path, size, a.rounds)


def report_copy(path: Path, size: float, rounds: int) -> None:
    kept = good_copy(path, rounds)
    print(f"(c) the verified copy of a {size:.0f} MB last.pt (check included), median of {rounds}, interleaved:")
    print(
        f"    hard link {kept['link']:.3f} s, 0 MB written | durable copy {kept['copy']:.3f} s, {size:.0f} MB "
        f"written | the check alone is (a)'s verify"
    )


if __name__ == "__main__":
    main()
