"""DataLoader workers that start together: a fork server with torch and Ultralytics preloaded.

The fifth process role (CONTRIBUTING.md draws them): a fork of the trainer after its imports, before the GPU, whose
own code is all in this folder; the DataLoader patch (:mod:`rocm_yolo.patches.loaders.dataloader`) has its
workers forked from it.

- :mod:`.server`: forked by the trainer once it has imported torch and Ultralytics, before it touches the GPU
  (a new interpreter where the trainer has a thread), and waited for before the first batch (its imports are
  start-up);
- :mod:`.preload`: what the server imports once, and its record of itself;
- :mod:`.preimport`: the modules the server imports once before each fork (a data set's module), instead of in every
  worker (torch-free: the DataLoader patch names them from the trainer).
"""
