"""For tests and benchmarks only: real faults on request, and a record of the samples each batch trained.

Production code never imports this package directly: it goes through
:mod:`rocm_yolo.run.hooks`, which imports it only when ``ROCM_YOLO_FAULT`` or
``ROCM_YOLO_RECORD_BATCHES`` is set. CONTRIBUTING.md describes both variables.
"""
