"""The runtime: manager, runner, locks, watchers and retries."""

from procstore.runtime.locks import KeyRwLock
from procstore.runtime.manager import ProcedureManager
from procstore.runtime.retry import RetryPolicy
from procstore.runtime.watcher import Watcher

__all__ = ["KeyRwLock", "ProcedureManager", "RetryPolicy", "Watcher"]
