"""DataLoader workers that start together: a fork server with torch and Ultralytics preloaded.

- :mod:`.forkserver`: started by the trainer before it imports torch (torch-free), and waited for before the
  first batch (its imports are start-up);
- :mod:`.preload`: what the server imports once, and its record of itself.
"""
