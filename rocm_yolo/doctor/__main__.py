"""``python -m rocm_yolo.doctor``: the same as ``rocm-yolo doctor``."""

import sys

from rocm_yolo.doctor.cli import main

sys.exit(main())
