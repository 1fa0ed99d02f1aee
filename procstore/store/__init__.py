"""The store layer: keys, messages, the key-value backends and the procedure store."""

from procstore.store.fsspec_store import FsspecStore
from procstore.store.gcs import GcsStore
from procstore.store.keys import PROC_PATH, KeyType, ParsedKey
from procstore.store.local import LocalDirStore
from procstore.store.memory import MemoryStore
from procstore.store.message import MessageDecodeError, ProcedureMessage
from procstore.store.open import open_state_store
from procstore.store.procedure_store import LoadProblem, ProcedureMessages, ProcedureStore
from procstore.store.s3 import S3Store
from procstore.store.state_store import StateStore

__all__ = [
    "PROC_PATH",
    "FsspecStore",
    "GcsStore",
    "KeyType",
    "LoadProblem",
    "LocalDirStore",
    "MemoryStore",
    "MessageDecodeError",
    "ParsedKey",
    "ProcedureMessage",
    "ProcedureMessages",
    "ProcedureStore",
    "S3Store",
    "StateStore",
    "open_state_store",
]
