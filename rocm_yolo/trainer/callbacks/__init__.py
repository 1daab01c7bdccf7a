"""rocm-yolo's Ultralytics callbacks: objects whose methods are named after Ultralytics' events.

- :mod:`.registry`: how an object's methods become callbacks (the events: ``compat.CALLBACK_EVENTS``);
- :mod:`.trainer_settings`: the run's settings held on the trainer (workers, val, presets, loader roles, fresh workers);
- :mod:`.heartbeat_writer`: the heartbeat, down the supervisor's pipe and into ``heartbeat.json``;
- :mod:`.good_copy`: the verified copy of ``last.pt``, kept off the training thread;
- :mod:`.trackers`: one MLflow and one W&B run for all attempts of a run (Ultralytics' tracker callbacks, continued);
- :mod:`.tracker_record`: the run's tracker ids (``tracker.json``), its attempts as tags, MLflow's parameters.
"""
