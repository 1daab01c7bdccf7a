"""What failed a training attempt, and what to do about it: the watchdog's diagnosis (policy, pure, torch-free).

- :mod:`.classes`: the failure classes, one record each (``FailureClass``: its title, its remedy, the exit code of its
  stops, whether the GPU itself failed), which everything else that names a class reads;
- :mod:`.vocabulary`: the runtimes' own words (HIP, HSA/ROCclr, MIOpen, rocBLAS, NCCL/RCCL, PyTorch, Linux), each
  with its source and the class it means (its record);
- :mod:`.record`: the ``Evidence`` of one failure and the ``Diagnosis`` read from it;
- :mod:`.diagnose`: ``diagnose``, the class from the failure's own evidence (context only weakly), its signature;
- :mod:`.hangs`: where a hung run is stuck, from its stacks and the kernel's view of its threads;
- :mod:`.beyond`: the rules that read the evidence beyond the failure's text (the run's cgroup's OOM kills, the labels
  against nc, the GPU override against the card);
- :mod:`.sources`: the mechanism that gathers that evidence, each piece from its source;
- :mod:`.evidence`: the mechanism that gathers the evidence (stderr, traceback, stacks, the kernel log's lines of the
  attempt's processes and cards, and :mod:`.sources`'), the failure's report, and the machine;
- :mod:`.remedies`: what to do about each class, and when to stop with a verdict.
"""
