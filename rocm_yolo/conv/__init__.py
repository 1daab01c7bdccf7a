"""Convolutions on cards whose MIOpen fails: the strategies, the patch that installs one, the self-test that picks one.

- :mod:`.strategies`: the names, torch-free (the CLI's ``--conv`` choices);
- :mod:`.patch`: ``nn.Conv2d._conv_forward`` replaced by a picklable strategy (imports torch);
- :mod:`.selftest`: runs the self-test in throwaway children, chooses and caches (torch-free);
- :mod:`.probe`: what the self-test child runs for each strategy (imports torch).
"""
