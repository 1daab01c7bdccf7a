"""The Ultralytics fence: everything rocm-yolo knows about Ultralytics' internals, in one folder.

Supporting a new Ultralytics version means this folder (and CI's lower-bound run). Read without
importing Ultralytics (importing it imports torch), except :mod:`.compat`, which checks the
installed one in the training child.

- :mod:`.versions`: the Ultralytics releases rocm-yolo is tested with;
- :mod:`.compat`: every internal rocm-yolo relies on (callbacks, loop, loaders, resume, ...), checked at start-up;
- :mod:`.config`: the valid train arguments, their types and defaults (``cfg/default.yaml``, ``CFG_*_KEYS``);
- :mod:`.tasks`: which task a model trains, decided as Ultralytics decides it;
- :mod:`.checkpoint`: the keys ``save_model`` writes, and the fields of a checkpoint a resume decides on;
- :mod:`.resume`: what ``check_resume`` lets a resume change;
- :mod:`.loop_locals`: what rocm-yolo assumes of ``BaseTrainer._do_train``'s locals;
- :mod:`.user_checks`: Ultralytics' checks of the user's input (an error inside one is the user's);
- :mod:`.data`: each task's data, found and checked as Ultralytics reads it.
"""
