"""The supervisor process: never imports torch.

It starts the training child, listens to its heartbeat, and makes one decision per tick:
healthy, finished, a user or environment error, or stalled/crashed, which spends a restart
(dump the stacks, kill the whole tree, resume the newest checkpoint on the next profile).

- :mod:`.config`: ``WatchdogConfig``, every watchdog default in one place;
- :mod:`.states`: how an attempt ends a run, and ``RunResult``;
- :mod:`.loop`: ``Supervisor``, the monitor loop (policy);
- :mod:`.stall`: ``StallDetector``, "no progress for too long", knowing nothing of processes;
- :mod:`.trainer_process`: the ``Child`` protocol and ``TrainerProcess``, the real one with its pipe (mechanism);
- :mod:`.restart`: what the next attempt starts from, and tidying a finished run;
- :mod:`.worklost`: where each failed attempt was and what the next one trained again.
"""
