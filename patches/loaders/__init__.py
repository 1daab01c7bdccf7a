"""The DataLoader's patches, installed by :mod:`.dataloader` with the run's loader settings.

- :mod:`.dataloader`: ``DataLoader.__init__`` gets the profile's loader settings (start method, persistence,
  prefetch, pin memory, timeout; over Ultralytics' own, and as defaults only for any other loader: what a
  caller passes wins) and a ``worker_init_fn`` that registers faulthandler in every worker; what the
  workers cannot receive (a local dataset class, an unguarded script) is refused in one line;
- :mod:`.worker_deaths`: ``_MultiProcessingDataLoaderIter._try_get_data`` names a fork-server worker killed by
  a signal as torch names its own children, as fast (torch learns of those from SIGCHLD);
- :mod:`.threads`: ``DataLoader._get_iterator`` loads marked loaders in threads of the trainer (profile ``threads``);
- :mod:`.thread_rng`: per-thread generators behind the module-level ``random`` and ``numpy.random`` functions.
"""
