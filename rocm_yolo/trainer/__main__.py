"""``python -m rocm_yolo.trainer SPEC.json``: the training child (see :mod:`rocm_yolo.trainer.entry`)."""

import sys

from rocm_yolo.trainer.entry import main

sys.exit(main())
