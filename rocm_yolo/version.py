"""rocm-yolo's version, in a module that imports nothing: pyproject.toml reads it, and so do the CLI and the trainer's
run header, without pulling in the package's API (and with it the request and the supervisor)."""

__version__ = "0.1.0"
