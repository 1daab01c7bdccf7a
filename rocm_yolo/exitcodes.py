"""Exit codes of ``rocm-yolo``, named (shown in ``--help`` and the README)."""

OK = 0  # training done
FAILED = 1  # failed after the allowed restarts, or a training error
USAGE = 2  # bad arguments, data or checkpoint: nothing was retried
HANGUP = 129  # SIGHUP: the terminal went away
INTERRUPTED = 130  # Ctrl-C (SIGINT)
TERMINATED = 143  # SIGTERM

# Between the supervisor and its child only:
CHILD_FINISHED = 3  # the checkpoint to resume belongs to a run that has already finished
CHILD_SETUP_FAILED = 4  # an error before training started (e.g. a download while offline): a restart won't help

HELP = (
    "exit codes: 0 done; 1 failed after retries or a training error; 2 usage error; "
    "129/130/143 stopped by SIGHUP/Ctrl-C/SIGTERM"
)
