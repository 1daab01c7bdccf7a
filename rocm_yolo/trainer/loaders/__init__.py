"""DataLoader workers that start together: a fork server with torch and Ultralytics preloaded.

- :mod:`.forkserver`: forked by the trainer once it has imported torch and Ultralytics, before it touches the GPU
  (a new interpreter where the trainer has a thread), and waited for before the first batch (its imports are
  start-up);
- :mod:`.preload`: what the server imports once, and its record of itself.
"""
