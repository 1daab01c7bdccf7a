"""The policies a request is held to (torch-free, pure), next to the request (:mod:`rocm_yolo.request`), which applies
them first; the supervisor (the ladder), the training child (a run on other GPUs), ``status`` and the doctor apply
them too. What they decide travels in the spec (:mod:`rocm_yolo.run`); the rules themselves do not.

- :mod:`.profiles`: the settings profiles, the fallback ladder, and the one place loader settings are validated
  (``resolve``);
- :mod:`.placement`: the devices a ``device`` argument may name, a batch over several GPUs, a run's layout on other
  GPUs than its own.
"""
