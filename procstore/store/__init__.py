"""The store layer, for those who write a store backend or a wrapper around one.

Public here: `StateStore` (what a backend implements), `WrappingStore` (a backend that
passes each operation to another through one hook), `open_state_store` and
`ProcedureMessage` (what a procedure's key holds). Everything else of the store layer is
internal: import it from its module (`procstore.store.procedure_store`, ...) knowing that it
may change.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from procstore import _deprecated_names, _public
from procstore.store.message import ProcedureMessage
from procstore.store.open import open_state_store
from procstore.store.state_store import StateStore
from procstore.store.wrapping import WrappingStore

__all__ = [
    "ProcedureMessage",
    "StateStore",
    "WrappingStore",
    "open_state_store",
]

_public.present_under(__name__, globals())

if _TYPE_CHECKING:
    # The names below still import from here for one release (with a warning): type
    # checkers see them as what they are, so code written to the earlier docs still checks.
    from procstore.store.fsspec_store import FsspecStore as FsspecStore
    from procstore.store.gcs import GcsStore as GcsStore
    from procstore.store.keys import PROC_PATH as PROC_PATH
    from procstore.store.keys import KeyType as KeyType
    from procstore.store.keys import ParsedKey as ParsedKey
    from procstore.store.local import LocalDirStore as LocalDirStore
    from procstore.store.memory import MemoryStore as MemoryStore
    from procstore.store.message import MessageDecodeError as MessageDecodeError
    from procstore.store.procedure_store import LoadProblem as LoadProblem
    from procstore.store.procedure_store import ProcedureMessages as ProcedureMessages
    from procstore.store.procedure_store import ProcedureStore as ProcedureStore
    from procstore.store.s3 import S3Store as S3Store

# Exported here before this package's surface was cut to what docs/api.md promises.
__getattr__ = _deprecated_names.moved_names(
    __name__,
    {
        "PROC_PATH": "procstore.store.keys",
        "KeyType": "procstore.store.keys",
        "ParsedKey": "procstore.store.keys",
        "FsspecStore": "procstore.store.fsspec_store",
        "GcsStore": "procstore.store.gcs",
        "S3Store": "procstore.store.s3",
        "LocalDirStore": "procstore.store.local",
        "MemoryStore": "procstore.testing",
        "MessageDecodeError": "procstore.store.message",
        "LoadProblem": "procstore",
        "ProcedureMessages": "procstore.store.procedure_store",
        "ProcedureStore": "procstore.store.procedure_store",
    },
)
