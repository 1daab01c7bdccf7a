"""The registry of rocm-yolo's Ultralytics callbacks: which events, and how an object's methods become callbacks.

Every part of the trainer that hooks into Ultralytics (the run hooks, the heartbeat,
mid-epoch save and resume, the test hooks) is an object whose methods are named after the
events in :data:`CALLBACK_EVENTS`; :func:`callbacks_of` turns one into the dict
``model.add_callback`` takes, and :mod:`.compat` checks that Ultralytics still fires them all.
Torch-free: compat imports it.
"""

from __future__ import annotations

# The Ultralytics events rocm-yolo's callbacks use.
CALLBACK_EVENTS = (
    "on_pretrain_routine_start",
    "on_pretrain_routine_end",
    "on_train_start",
    "on_train_epoch_start",
    "on_train_batch_start",
    "on_train_batch_end",
    "on_train_epoch_end",
    "on_val_start",
    "on_val_batch_end",
    "on_model_save",
    "on_train_end",
)


def callbacks_of(owner) -> dict:
    """``{event: owner.event}`` for each of :data:`CALLBACK_EVENTS` that ``owner`` defines: its callbacks."""
    return {event: getattr(owner, event) for event in CALLBACK_EVENTS if hasattr(owner, event)}


def register(model, owners) -> None:
    """Add every owner's callbacks to ``model``, in order: for each event, the owners run in the order given."""
    for owner in owners:
        for event, fn in callbacks_of(owner).items():
            model.add_callback(event, fn)
