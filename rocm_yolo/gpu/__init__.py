"""The GPU, torch-free: which AMD architecture is present, which torch is installed, what each architecture needs.

- :mod:`.arch`: the GPUs of the KFD topology in sysfs, and gfx names;
- :mod:`.count`: how many GPUs this machine shows a run (the topology, else a bounded probe of torch);
- :mod:`.torch_build`: the installed torch's build, read without importing it;
- :mod:`.wheels`: which torch to install for the GPUs found (the Makefile, the doctor and the README use it);
- :mod:`.presets`: per-architecture presets (gfx101x) and the run header's lines about them;
- :mod:`.kernel_log`: the kernel log, read (bounded in time) and scanned for amdgpu's and the OOM killer's lines;
- :mod:`.release`: who holds the GPU (the KFD process list, VRAM use), and waiting until a killed run let it go;
- :mod:`.known_fixes`: the known fixes for GPU faults, GPU hangs and hung collectives, with their public sources.
"""
