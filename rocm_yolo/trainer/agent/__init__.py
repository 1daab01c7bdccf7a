"""More than one GPU: the training child as an agent, as torch elastic calls it, over one rank per GPU.

- :mod:`.launcher`: starts ``torch.distributed.run`` and relays the ranks' heartbeats (torch-free);
- :mod:`.torchrun`: ``torch.distributed.run`` with its own reports in the run's ``torchrun.log``;
- :mod:`.ranks`: what differs in a rank: its heartbeat FIFO, its exit line, ``on_pretrain_routine_start``.
"""
