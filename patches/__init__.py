"""The runtime patches of the training child, as ``rocm_yolo.patches``; each is idempotent and removable.

Their home is ``patches/`` at the top of the repository: pyproject.toml's ``package-dir`` maps it into the
package (a wheel holds it as ``rocm_yolo/patches/``; an editable install finds it where it is), and
:mod:`rocm_yolo` finds it beside itself in a checkout without an install.

- :mod:`.swap`: what every patch repeats: an attribute replaced by a wrapper of the original, once, and the
  original put back exactly;
- :mod:`.loaders`: the DataLoader's: the profile's loader settings, worker deaths, loader threads and the
  random generators they draw from;
- :mod:`.saves`: the checkpoints': Ultralytics' saves written atomically, its training loop continued inside
  an epoch.

The Conv2d patch is :mod:`rocm_yolo.conv.patch`, beside the self-test that chooses its strategy.
"""
