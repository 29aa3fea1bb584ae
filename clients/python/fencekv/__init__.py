"""fencekv: the Python client of the fencekv key-value and lock server.

    import fencekv

    with fencekv.Client("127.0.0.1:7420") as client:
        with client.lock("inventory", ttl=10, wait=5) as lease:
            client.put("inventory/sku-1", b"41", lease=lease)

See README.md and wire/PROTOCOL.md.
"""

from .client import Client
from .errors import (BadRequest, ClientClosed, Compacted, CompareFailed, ConnectionLost, Error,
                     Internal, LeaseExpired, LeaseLost, LimitExceeded, LockHeld, NotHolder,
                     NotInteger, NotLeader, PermissionDenied, ProtocolError, StaleToken, TLSRequired,
                     Timeout, TooLarge, Unauthenticated, Unavailable, UnknownMethod)
from .lock import Lease
from .types import (BackupInfo, Entry, Event, Grant, LockInfo, Member, Refusal, Status,
                    TxnResult, WriteResult)
from .watch import Watcher
from .errors import LimitMismatch  # noqa: E402  (semaphores)
from .types import Holder  # noqa: E402  (semaphores)

__version__ = "0.1.0"

__all__ = [
    "Client", "Lease", "Watcher",
    "Entry", "WriteResult", "TxnResult", "Grant", "LockInfo", "Status", "Member", "Refusal",
    "Event", "BackupInfo",
    "Error", "StaleToken", "NotHolder", "LeaseExpired", "LockHeld", "CompareFailed",
    "NotInteger", "TooLarge", "BadRequest", "UnknownMethod", "Unavailable", "NotLeader",
    "LimitExceeded", "Internal", "Compacted", "Unauthenticated", "PermissionDenied", "TLSRequired",
    "ConnectionLost", "Timeout", "LeaseLost", "ClientClosed", "ProtocolError",
]
__all__ += ["LimitMismatch", "Holder"]  # semaphores
