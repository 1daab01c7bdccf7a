"""Ultralytics' rules, read without importing it (importing Ultralytics imports torch).

- :mod:`.config`: the valid train arguments and their types (``cfg/default.yaml``, ``CFG_*_KEYS``);
- :mod:`.tasks`: which task a model trains, decided as Ultralytics decides it;
- :mod:`.datasets`, :mod:`.labels`, :mod:`.classify`: each task's data, found and checked as
  Ultralytics reads it; :mod:`.check`: the check the CLI runs before a run;
- :mod:`.versions`: the Ultralytics releases rocm-yolo is tested with.
"""
