"""Each task's data, found and checked as Ultralytics reads it, without importing it.

- :mod:`.datasets`: dataset YAMLs (detect, segment, pose, obb) and their splits, as ``check_det_dataset`` reads them;
- :mod:`.labels`: one image and one label file, checked as ``verify_image_label`` would for each task;
- :mod:`.classify`: class-per-folder data, as ``check_cls_dataset`` reads it;
- :mod:`.check`: the check the CLI runs on DATA before anything starts;
- :mod:`.cache`: how big ``cache=ram`` gets, and whether the workers can share it through ``/dev/shm``.
"""
