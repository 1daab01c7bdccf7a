"""``python -m rocm_yolo.trainer SPEC.json``: the training child (see :mod:`rocm_yolo.trainer.child`)."""

import sys

from rocm_yolo.trainer.child import main

sys.exit(main())
