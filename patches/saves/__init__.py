"""The checkpoints' patches of Ultralytics' trainer: its saves written atomically, its loop continued mid-epoch.

- :mod:`.loop_position`: Ultralytics' training loop continued inside an epoch (a module-global ``enumerate``);
- :mod:`.epoch_save`: each epoch's save of ``last.pt`` and ``best.pt``, written atomically (a stop waits for it);
- :mod:`.final_save`: the end of training's rewrite of ``last.pt`` and ``best.pt``, written atomically.
"""
