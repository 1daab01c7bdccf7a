"""The runtime patches of the training child, installed as ``rocm_yolo.patches``; each is idempotent and removable.

- :mod:`.dataloader`: ``DataLoader.__init__`` gets the profile's loader settings (start method, persistence,
  prefetch, pin memory, timeout; over Ultralytics' own, and as defaults only for any other loader: what a
  caller passes wins) and a ``worker_init_fn`` that registers faulthandler in every worker; what the
  workers cannot receive (a local dataset class, an unguarded script) is refused in one line;
- :mod:`.worker_deaths`: ``_MultiProcessingDataLoaderIter._try_get_data`` names a fork-server worker killed by
  a signal as torch names its own children, as fast (torch learns of those from SIGCHLD);
- :mod:`.threads`: ``DataLoader._get_iterator`` loads marked loaders in threads of the trainer (profile ``threads``);
- :mod:`.thread_rng`: per-thread generators behind the module-level ``random`` and ``numpy.random`` functions;
- :mod:`.trainloop`: Ultralytics' training loop continued inside an epoch (a module-global ``enumerate``);
- :mod:`.epoch_save`: each epoch's save of ``last.pt`` and ``best.pt``, written atomically (a stop waits for it);
- :mod:`.final_save`: the end of training's rewrite of ``last.pt`` and ``best.pt``, written atomically.

The Conv2d patch is :mod:`rocm_yolo.conv.patch`, beside the self-test that chooses its strategy.
"""
