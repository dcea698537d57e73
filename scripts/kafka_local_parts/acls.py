"""ACLs of a secured broker: :class:`Acl`, CreateAcls and DescribeAcls over the wire, and
:func:`grant` (as the super user, until every running node applies them). May import:
constants, credentials, state_dir, status, wire.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .constants import BrokerError, default_state_dir
from .credentials import client_auth, read_credentials
from .state_dir import read_remembered
from .status import cluster_status, status
from .wire import ClientAuth, _connection, _first, _read_string, _request, _string, _version

RESOURCE_TYPES = {"topic": 2, "group": 3, "cluster": 4, "transactional_id": 5}
OPERATIONS = {
    "all": 2,
    "read": 3,
    "write": 4,
    "create": 5,
    "delete": 6,
    "alter": 7,
    "describe": 8,
    "cluster_action": 9,
    "describe_configs": 10,
    "alter_configs": 11,
    "idempotent_write": 12,
}
PATTERNS = {"literal": 3, "prefixed": 4}
_ALLOW, _ANY = 3, 1
CLUSTER_RESOURCE = "kafka-cluster"


@dataclass(frozen=True)
class Acl:
    """One ALLOW rule: ``principal`` may ``operation`` on a resource (from any host)."""

    principal: str
    resource_type: str
    name: str
    operation: str
    pattern: str = "literal"

    def __post_init__(self) -> None:
        if self.resource_type not in RESOURCE_TYPES:
            raise BrokerError(f"resource type must be one of {sorted(RESOURCE_TYPES)}")
        if self.operation not in OPERATIONS:
            raise BrokerError(f"operation must be one of {sorted(OPERATIONS)}")
        if self.pattern not in PATTERNS:
            raise BrokerError(f"pattern must be one of {sorted(PATTERNS)}")

    def encode(self) -> bytes:
        return (
            struct.pack(">b", RESOURCE_TYPES[self.resource_type])
            + _string(self.name)
            + struct.pack(">b", PATTERNS[self.pattern])
            + _string(self.principal)
            + _string("*")
            + struct.pack(">bb", OPERATIONS[self.operation], _ALLOW)
        )


def encode_create_acls(acls: Sequence[Acl]) -> bytes:
    """The body of CreateAcls v1 (non-flexible)."""
    return struct.pack(">i", len(acls)) + b"".join(acl.encode() for acl in acls)


def create_acls(bootstrap: str, auth: ClientAuth | None, acls: Sequence[Acl]) -> None:
    """Create ``acls`` (CreateAcls v1) through the broker at ``bootstrap``; BrokerError if not."""
    try:
        with _connection(_first(bootstrap), 10.0, auth) as (sock, versions):
            response = _request(sock, 30, _version(versions, 30, (1,)), 9, encode_create_acls(acls))
    except (OSError, ValueError, struct.error) as exc:
        raise BrokerError(f"CreateAcls at {bootstrap}: {exc}") from exc
    (count,) = struct.unpack_from(">i", response, 4)
    offset = 8
    errors: list[str] = []
    for acl in acls[:count]:
        (code,) = struct.unpack_from(">h", response, offset)
        text, offset = _read_string(response, offset + 2)
        if code != 0:
            errors.append(f"{acl}: {text or 'error'} ({code})")
    if errors:
        raise BrokerError("CreateAcls refused: " + "; ".join(errors))


def describe_acls(bootstrap: str, auth: ClientAuth | None) -> list[Acl]:
    """Every ALLOW ACL that the broker at ``bootstrap`` applies now (DescribeAcls v1)."""
    body = (
        struct.pack(">b", _ANY)
        + _string(None)
        + struct.pack(">b", _ANY)
        + _string(None)
        + _string(None)
        + struct.pack(">bb", _ANY, _ANY)
    )
    with _connection(_first(bootstrap), 10.0, auth) as (sock, versions):
        response = _request(sock, 29, _version(versions, 29, (1,)), 9, body)
    return parse_describe_acls(response)


def parse_describe_acls(response: bytes) -> list[Acl]:
    """The ALLOW ACLs of a DescribeAcls v1 response body (after the correlation id)."""
    (code,) = struct.unpack_from(">h", response, 4)
    text, offset = _read_string(response, 6)
    if code != 0:
        raise BrokerError(f"DescribeAcls: {text} ({code})")
    names = {v: k for k, v in RESOURCE_TYPES.items()}
    operations = {v: k for k, v in OPERATIONS.items()}
    patterns = {v: k for k, v in PATTERNS.items()}
    found: list[Acl] = []
    (resources,) = struct.unpack_from(">i", response, offset)
    offset += 4
    for _ in range(resources):
        (kind,) = struct.unpack_from(">b", response, offset)
        name, offset = _read_string(response, offset + 1)
        pattern, count = struct.unpack_from(">bi", response, offset)
        offset += 5
        for _ in range(count):
            principal, offset = _read_string(response, offset)
            _host, offset = _read_string(response, offset)
            operation, permission = struct.unpack_from(">bb", response, offset)
            offset += 2
            known = kind in names and operation in operations and pattern in patterns
            if permission == _ALLOW and known:
                found.append(
                    Acl(
                        principal or "",
                        names[kind],
                        name or "",
                        operations[operation],
                        patterns[pattern],
                    )
                )
    return found


def grant(
    state_dir: Path | str | None,
    user: str,
    resource_type: str,
    name: str,
    operations: Sequence[str],
    *,
    pattern: str = "literal",
    timeout: float = 15.0,
) -> list[Acl]:
    """Allow ``user`` ``operations`` on a resource of the secured broker in ``state_dir``.

    As the super user, through the first running node; returns once every running node
    applies the new ACLs (DescribeAcls lists them).  ``resource_type``: ``topic``,
    ``group``, ``transactional_id`` or ``cluster`` (whose ``name`` is ignored);
    ``pattern``: ``literal`` or ``prefixed``.
    """
    state = Path(state_dir or default_state_dir()).absolute()
    remembered = read_remembered(state)
    if remembered.security == "plaintext":
        raise BrokerError(f"the broker in {state} is PLAINTEXT: it has no ACLs (--security)")
    principal = user if ":" in user else f"User:{user}"
    resource = CLUSTER_RESOURCE if resource_type == "cluster" else name
    acls = [Acl(principal, resource_type, resource, op.lower(), pattern) for op in operations]
    if not acls:
        raise BrokerError("grant needs at least one operation")
    auth = client_auth(read_credentials(state, remembered.security))
    if remembered.nodes > 1:
        addresses = [s.bootstrap for s in cluster_status(state) if s.answering]
    else:
        current = status(state)
        addresses = [current.bootstrap] if current.answering and current.bootstrap else []
    if not addresses:
        raise BrokerError(f"no broker answers in {state}")
    create_acls(addresses[0], auth, acls)
    deadline = time.monotonic() + timeout
    for address in addresses:
        while not set(acls) <= set(describe_acls(address, auth)):
            if time.monotonic() >= deadline:
                raise BrokerError(f"{address} does not apply the new ACLs after {timeout:g} s")
            time.sleep(0.05)
    return acls
