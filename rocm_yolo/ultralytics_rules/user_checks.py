"""Ultralytics' checks of what the user passed: an error raised inside one of them is the user's (exit 2).

:func:`rocm_yolo.triage.classify` reads this list; :mod:`.compat` checks at start-up that each one
is still defined where it says (functions, or methods of the module's classes).
"""

from __future__ import annotations

USER_CHECKS = {
    "ultralytics.data.utils": ("check_det_dataset", "check_cls_dataset"),
    "ultralytics.utils.checks": ("check_file", "check_yaml", "check_imgsz", "check_model_file_from_stem"),
    "ultralytics.cfg": ("check_cfg", "check_dict_alignment", "get_cfg", "cfg2dict", "smart_value"),
    # check_resume; _build_train_pipeline: a final batch of 1 image at a tiny imgsz (BatchNorm gets one value)
    "ultralytics.engine.trainer": ("check_resume", "_build_train_pipeline"),
    "ultralytics.data.build": ("check_source",),
    # a --device torch cannot see (no GPU, not a ROCm build of torch, an id past the last GPU)
    "ultralytics.utils.torch_utils": ("select_device",),
    "ultralytics.nn.tasks": ("yaml_model_load", "guess_model_scale", "load_checkpoint", "torch_safe_load"),
    # YOLODataset: no labels, no valid images, boxes for a segment task
    "ultralytics.data.dataset": ("cache_labels", "get_labels", "verify_labels"),
    # BaseDataset: a split's folder or list that exists but names no image ("Error loading data from ...")
    "ultralytics.data.base": ("get_img_files",),
}
CHECK_NAMES = frozenset(name for names in USER_CHECKS.values() for name in names)
