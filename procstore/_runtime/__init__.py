"""The runtime: manager, runner, locks, watchers and retries."""

from procstore._runtime.locks import KeyRwLock
from procstore._runtime.manager import ProcedureManager
from procstore._runtime.retry import RetryPolicy
from procstore._runtime.watcher import Watcher

__all__ = ["KeyRwLock", "ProcedureManager", "RetryPolicy", "Watcher"]
