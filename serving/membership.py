"""Which replicas run: Serve's request router (serving/affinity.py) reports, the front end listens.

A module of its own because Ray Serve pickles the router's module by value: state kept there would
be a copy in the process that runs the router. This module is imported by reference, so the router
and the front end share its one registry (both live in the front end's process).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

ReplicaListener = Callable[[frozenset[str]], None]
_listeners: dict[str, ReplicaListener] = {}  # application name -> the front end's callback
_lock = threading.Lock()  # Serve runs the router on its own event loop thread


def listen(app_name: str, listener: ReplicaListener) -> None:
    """Call `listener(replica ids)` from Serve's router thread whenever the application's replicas change."""
    with _lock:
        _listeners[app_name] = listener


def stop_listening(app_name: str) -> None:
    with _lock:
        _listeners.pop(app_name, None)


def report(app_name: str, replicas: frozenset[str]) -> None:
    with _lock:
        listener = _listeners.get(app_name)
    if listener is not None:
        listener(replicas)
