"""What rocm-yolo assumes of Ultralytics' training loop, ``BaseTrainer._do_train``.

It keeps its position in locals: ``i`` from ``enumerate(self.train_loader)``, ``ni = i + nb * epoch``
(the warm-up counter), ``nb`` (batches per epoch), ``epoch`` and ``last_opt_step`` (the optimizer
steps when ``ni - last_opt_step >= self.accumulate``). Mid-epoch checkpoints read them and a
resume inside an epoch sets them (:mod:`rocm_yolo.patches.saves.loop_position`); :mod:`.compat` checks at
start-up that the loop still has them.
"""

LOOP_FUNCTION = "_do_train"
LOOP_LOCALS = ("i", "ni", "nb", "epoch", "last_opt_step")  # the locals rocm-yolo reads or sets
LOOP_SOURCE = "enumerate(self.train_loader)"  # how the loop numbers its batches
