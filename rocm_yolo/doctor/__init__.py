"""``rocm-yolo doctor``: find what makes a training run hang or crash, before it does.

Each check is one row: a status (✓ ok, ⚠ warning, ✗ blocks training, – skipped), what was
found, and the fix in words a user can act on; a verdict as a person would say it ends the
report. Torch-free: every check that needs torch runs in a subprocess under a timeout.

- :mod:`.cli`: the command line, and the request validated;
- :mod:`.options`: ``DoctorRequest`` (each option declared once: its flag, default and help) and the ``Options`` the
  checks read;
- :mod:`.checks`: the registry of checks: their names (``--skip``), their order, their functions;
- :mod:`.report`: rows, statuses, exit codes, the verdict and the output;
- :mod:`.system`: versions, shared memory and open files, the start method, the kernel log;
- :mod:`.gpu_checks`: architecture, device files and groups, torch's GPU code, the conv self-test;
- :mod:`.hsa_override`: ``HSA_OVERRIDE_GFX_VERSION`` against each GPU;
- :mod:`.multigpu`: for more than one GPU, each one's architecture and device, and RCCL's kernel options;
- :mod:`.data_checks`: every image and label of a data set, per task;
- :mod:`.loader_probe`: Ultralytics' dataset and a DataLoader, in a single process, then with workers.

The names below are its API for scripts: ``rocm_yolo.doctor.diagnose(Options(...))`` gives the rows.
"""

from rocm_yolo.doctor.checks import NAMES as CHECKS
from rocm_yolo.doctor.cli import add_arguments, diagnose, main, run
from rocm_yolo.doctor.options import Options
from rocm_yolo.doctor.report import (
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    FAIL,
    OK,
    SKIP,
    WARN,
    Row,
    conclusion,
    exit_code,
    format_report,
    report_dict,
)

__all__ = [
    "CHECKS",
    "EXIT_OK",
    "EXIT_PROBLEMS",
    "EXIT_USAGE",
    "FAIL",
    "OK",
    "SKIP",
    "WARN",
    "Options",
    "Row",
    "add_arguments",
    "conclusion",
    "diagnose",
    "exit_code",
    "format_report",
    "main",
    "report_dict",
    "run",
]
