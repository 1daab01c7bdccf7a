"""supervisor.json: a diagnosed failure and a verdict round-trip, and a file written before them still reads."""

from __future__ import annotations

import json

from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.supervisor_state import Failure, RunState, SupervisorState, read_state, write_state


def test_failures_and_a_verdict_round_trip_and_an_older_file_reads_with_defaults(tmp_path):
    failure = Failure(
        2, "crash", "gpu-fault", "GPU memory access fault", "gpu-fault: x", 2, 3, "train", 1.0, "r", ["l"]
    )
    record = SupervisorState(
        RunState.FAILED, 1, None, 2, "fast", 1, 3, 0.0, 0.0, 1.0, failures=[failure], verdict=["v"]
    )
    write_state(tmp_path, record)
    assert read_state(tmp_path) == record
    older = record.to_dict()
    for key in ("failures", "verdict"):
        del older[key]
    RunPaths(tmp_path).supervisor.write_text(json.dumps(older))
    back = read_state(tmp_path)
    assert back is not None and back.failures == [] and back.verdict is None
    damaged = dict(record.to_dict(), failures=[{"attempt": "x"}, failure.__dict__])
    RunPaths(tmp_path).supervisor.write_text(json.dumps(damaged))
    assert read_state(tmp_path).failures == [failure]  # a damaged entry costs only itself
