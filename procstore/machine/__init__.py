"""Typed state machines: states as dataclasses in a tagged union, a persistent context
stored with the state, and a volatile context rebuilt after every load."""

from procstore import _public
from procstore.machine.codec import SKIP_IF_EMPTY, MachineDataError, to_builtins
from procstore.machine.duration import Duration
from procstore.machine.machine import MachineContext, State, StateMachine
from procstore.machine.registry import DuplicateStateName, StateRegistry

__all__ = [
    "SKIP_IF_EMPTY",
    "Duration",
    "DuplicateStateName",
    "MachineContext",
    "MachineDataError",
    "State",
    "StateMachine",
    "StateRegistry",
    "to_builtins",
]

_public.present_under(__name__, globals())
