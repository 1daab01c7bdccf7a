"""Processes, generally: how a child lives and dies, whole process trees, and tagged commands.

Torch-free and light (ctypes, psutil): the supervisor, the trainer, the fork server and every
DataLoader worker use it, and so do the doctor, the conv self-test, the tests and the benchmarks.

- :mod:`.lifecycle`: dying with the parent (``PR_SET_PDEATHSIG``), the stack-dump signal, liveness;
- :mod:`.tree`: process trees: start in a session, dump stacks, kill all of it (never what got a reaped child's pid),
  bounded helper commands, the command line of every interpreter rocm-yolo starts (``-P``);
- :mod:`.kernel_view`: what the kernel says of a tree in /proc: where each thread waits, whether the processes move;
- :mod:`.cgroup`: the run's memory cgroup: the OOM kills it counted, the memory it allows;
- :mod:`.tagged`: commands started with a tag in their environment, all their processes found and stopped;
- :mod:`.output`: what a process of the run shows and keeps (``RunLog``: the terminal, the run's log, its events),
  never blocking on a paused terminal (``FdSink``, a writer thread);
- :mod:`.terminal`: a terminal that went away (EIO) is no failure: its writes dropped or kept in the run's log;
- :mod:`.tee`: a child's stderr copied to the terminal as it comes, and kept (a bounded file, its tail in memory);
- :mod:`.background`: shell commands in the background with a few bytes on stdin, bounded in time (notifications).
"""
