"""Convolutions on cards whose MIOpen fails: the strategies' names, the self-test that picks one.

- :mod:`.strategies`: the names, torch-free (the CLI's ``--conv`` choices);
- :mod:`.selftest`: runs the self-test in throwaway children, chooses and caches (torch-free);
- :mod:`.probe`: what the self-test child runs for each strategy (imports torch).

The strategies themselves are :mod:`rocm_yolo.conv.patch`.
"""
