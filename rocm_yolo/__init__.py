"""rocm-yolo: dependable Ultralytics YOLO training on AMD GPUs with ROCm."""
__version__ = "0.1.0"
