"""More than one GPU: the training child as an agent, as torch elastic calls it, over one rank per GPU.

- :mod:`.launcher`: starts ``torch.distributed.run`` and relays the ranks' heartbeats (torch-free);
- :mod:`.torchrun`: ``torch.distributed.run`` with its own reports in the run's ``torchrun.log``;
- :mod:`.ranks`: what differs in a rank: its heartbeat FIFO, its start and exit lines, ``on_pretrain_routine_start``,
  and on more than one machine the global world size, one labels cache and one checkpoint for every node;
- :mod:`.rendezvous`: more than one machine: torch's c10d rendezvous, its rounds, the wait and the nodes missing.
"""
