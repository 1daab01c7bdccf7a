"""Exit codes of ``rocm-yolo``, named (shown in ``--help`` and the README)."""

OK = 0  # training done
FAILED = 1  # failed after the allowed restarts, or a training error
USAGE = 2  # bad arguments, data or checkpoint: nothing was retried
INTERRUPTED = 130  # Ctrl-C (SIGINT)
TERMINATED = 143  # SIGTERM

# Between the supervisor and its child only:
CHILD_FINISHED = 3  # the checkpoint to resume belongs to a run that has already finished

HELP = (
    "exit codes: 0 done; 1 failed after retries or a training error; 2 usage error; "
    "130 interrupted (Ctrl-C); 143 terminated (SIGTERM)"
)
