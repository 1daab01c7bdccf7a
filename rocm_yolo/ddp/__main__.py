"""``python -m rocm_yolo.ddp SPEC.json``: the DDP launcher (see :mod:`rocm_yolo.ddp.launcher`)."""

from rocm_yolo.ddp.launcher import main
from rocm_yolo.process.lifecycle import exit_uncollected

exit_uncollected(main)
