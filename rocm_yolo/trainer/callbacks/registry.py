"""The registry of rocm-yolo's Ultralytics callbacks: which events, and how an object's methods become callbacks.

Every part of the trainer that hooks into Ultralytics (the trainer's settings, the heartbeat,
mid-epoch save and resume, the test hooks) is an object whose methods are named after the
events in :data:`rocm_yolo.ultralytics_rules.compat.CALLBACK_EVENTS`; :func:`callbacks_of` turns one into the dict
``model.add_callback`` takes, and compat checks that Ultralytics still fires them all.
"""

from __future__ import annotations

from rocm_yolo.ultralytics_rules.compat import CALLBACK_EVENTS


def callbacks_of(owner) -> dict:
    """``{event: owner.event}`` for each of :data:`CALLBACK_EVENTS` that ``owner`` defines: its callbacks."""
    return {event: getattr(owner, event) for event in CALLBACK_EVENTS if hasattr(owner, event)}


def register(model, owners) -> None:
    """Add every owner's callbacks to ``model``, in order: for each event, the owners run in the order given."""
    for owner in owners:
        for event, fn in callbacks_of(owner).items():
            model.add_callback(event, fn)
