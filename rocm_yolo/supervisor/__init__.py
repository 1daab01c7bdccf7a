"""The supervisor process: never imports torch.

It starts the training child, listens to its heartbeat, and makes one decision per tick:
healthy, finished, a user or environment error, or stalled/crashed: dump the stacks, kill the
whole tree, find out what failed (:mod:`rocm_yolo.diagnosis`) and act on the cause (the next profile, the
same one once the GPU is released, RCCL's peer-to-peer off, or a stop with a verdict), and tell
the user (the terminal, events.jsonl, a notify command, metrics.prom).

- :mod:`.config`: ``WatchdogConfig``, every watchdog default in one place;
- :mod:`.states`: ``AttemptState``, an attempt's states, how an attempt ends a run, and ``RunResult``;
- :mod:`.loop`: ``Supervisor``, the monitor loop (policy): one attempt after another, each failure's remedy;
- :mod:`.watch`: one attempt watched to its end (finished, crashed, stalled), as a typed ``AttemptEnd``;
- :mod:`.postmortem`: a stalled or crashed attempt's end, its evidence diagnosed, its report written, its remedy
  decided;
- :mod:`.signals`: the signals a terminal and a scheduler send (a stop, Ctrl-Z), acted on for the whole tree;
- :mod:`.stall`: ``StallDetector``, "no progress for too long", knowing nothing of processes;
- :mod:`.trainer_process`: the ``Child`` protocol and ``TrainerProcess``, the real one with its pipe (mechanism):
  the trainer, or on several GPUs or machines the DDP launcher;
- :mod:`.restart`: what the next attempt starts from, tidying a finished run, and what a stopped one says;
- :mod:`.peers`: more than one machine: the other nodes (gone, stopped for good, the next round), this one's stop told;
- :mod:`.recovery`: ``RecoveryTracker``, where each failed attempt was and what the next one trained again, kept in
  the run's record (``Recoveries``: the time hangs cost);
- :mod:`.reporting`: each event to the terminal, events.jsonl, the notify command, and metrics.prom.
"""
