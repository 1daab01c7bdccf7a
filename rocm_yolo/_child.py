"""The training child: ``python -m rocm_yolo._child SPEC.json``.

Started fresh by the supervisor (never forked from a process that imported torch), it
orders the steps that make DataLoader workers safe:

1. ``multiprocessing.set_start_method("spawn", force=True)``, before torch is imported;
2. the environment: the profile's variables and the GPU architecture's presets;
3. the patches (DataLoader, Conv2d);
4. ``YOLO(model).train(**args)`` with rocm-yolo's callbacks (heartbeat, hooks).

Spawned DataLoader workers import this module as ``__mp_main__``: everything runs under
``if __name__ == "__main__"`` and the module imports nothing heavy at the top.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys

from rocm_yolo.exitcodes import CHILD_SETUP_FAILED
from rocm_yolo.spec import RunSpec


def _on_sigterm(signum, frame):
    # Runs between bytecodes: a checkpoint write in progress (one C call) completes first.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    import multiprocessing

    multiprocessing.set_start_method("spawn", force=True)  # 1. before torch is imported
    torch_was_imported = "torch" in sys.modules

    spec = RunSpec.load(argv[0])
    from rocm_yolo import runtime
    from rocm_yolo.log import RunLog

    log = RunLog(spec.log_path, spec.state_dir / "events.jsonl")
    log.event("start_method", method=multiprocessing.get_start_method(), torch_imported=torch_was_imported)

    env = runtime.prepare_environment(spec)  # 2. profile variables and architecture presets

    signal.signal(signal.SIGTERM, _on_sigterm)
    from rocm_yolo import proctree

    proctree.die_with_parent(int(os.environ.get("ROCM_YOLO_SUPERVISOR_PID", "0")))  # no orphan if killed -9
    stacks = spec.state_dir / "stacks"
    stacks.mkdir(parents=True, exist_ok=True)
    stack_file = open(stacks / f"trainer-{os.getpid()}.txt", "a")  # open for the life of the process
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True, chain=False)

    from rocm_yolo.patches import dataloader as loader_patch  # 3. patches (this imports torch)

    loader_patch.install(env.loader, spec.run_dir)
    try:
        conv_line = runtime.install_conv(spec, env)
    except Exception as e:  # the self-test found no working strategy: a restart would find none either
        log.event("setup_error", f"no working Conv2d strategy: {e}", error=str(e))
        return CHILD_SETUP_FAILED
    try:
        return runtime.train(spec, env, conv_line, log)  # 4.
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
