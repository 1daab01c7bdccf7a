"""``python -m rocm_yolo.trainer SPEC.json``: the training child (see :mod:`rocm_yolo.trainer.entry`)."""

from rocm_yolo.process.lifecycle import exit_uncollected
from rocm_yolo.trainer.entry import main

exit_uncollected(main)
