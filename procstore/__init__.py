"""procstore: multi-step procedures whose state survives crashes, on any fsspec store.

The public surface is re-exported here; see `api.md` for the contract.
"""

from procstore import _public
from procstore._client.client import Client
from procstore._client.status import ProcedureStatus
from procstore._runtime.lease import Lease
from procstore._runtime.lease_clock import LeaseClock
from procstore._runtime.manager import ProcedureManager
from procstore._runtime.retry import RetryBudget
from procstore._runtime.telemetry import TelemetrySettings
from procstore._runtime.watcher import Watcher
from procstore.errors import (
    DuplicateProcedure,
    EndNotRecorded,
    Fenced,
    InvalidProcedureId,
    LeaseExpired,
    LeaseHeld,
    ListingIncomplete,
    LoaderConflict,
    LockConflict,
    LockCycle,
    ManagerNotStarted,
    ManagerStopped,
    NotLeader,
    OperationRefused,
    ProcedureError,
    ProcedureFailed,
    ProcedureNotEnded,
    ProcedureNotFound,
    ResultNotKept,
    RetryLater,
    SettingFrozen,
    StoreError,
    StoreUnavailable,
    SubmissionsPaused,
    TooManyRunningProcedures,
)
from procstore.flow import Concurrency, RateLimit
from procstore.ids import ProcedureId
from procstore.lock_key import LockKey, LockMode, StringKey
from procstore.procedure import Context, ContextProvider, Procedure, ProcedureWithId, Status, StatusKind
from procstore.state import ProcedureInfo, ProcedureState, ProcedureStateKind
from procstore.store.history import Action, History, HistoryRecord
from procstore.store.procedure_store import LoadProblem
from procstore.store.settings import StoreSettings

__version__ = "0.1.0"

__all__ = [
    "Action",
    "Client",
    "Concurrency",
    "Context",
    "ContextProvider",
    "DuplicateProcedure",
    "EndNotRecorded",
    "Fenced",
    "History",
    "HistoryRecord",
    "InvalidProcedureId",
    "Lease",
    "LeaseClock",
    "LeaseExpired",
    "LeaseHeld",
    "ListingIncomplete",
    "LoadProblem",
    "LoaderConflict",
    "LockConflict",
    "LockCycle",
    "LockKey",
    "LockMode",
    "ManagerNotStarted",
    "ManagerStopped",
    "NotLeader",
    "OperationRefused",
    "Procedure",
    "ProcedureError",
    "ProcedureFailed",
    "ProcedureId",
    "ProcedureInfo",
    "ProcedureManager",
    "ProcedureNotEnded",
    "ProcedureNotFound",
    "ProcedureState",
    "ProcedureStateKind",
    "ProcedureStatus",
    "ProcedureWithId",
    "RateLimit",
    "ResultNotKept",
    "RetryBudget",
    "RetryLater",
    "Status",
    "StatusKind",
    "StringKey",
    "StoreError",
    "StoreSettings",
    "StoreUnavailable",
    "SettingFrozen",
    "SubmissionsPaused",
    "TelemetrySettings",
    "TooManyRunningProcedures",
    "Watcher",
    "__version__",
]

_public.present_under(__name__, globals())
