"""What may leave this machine, and how what comes back shows who made it: one rule for the
shared tier (:mod:`.tiers.entry`, its leases in :mod:`.tiers.lease`) and for bundles
(:mod:`kcache.bundle`).

The rule, from each kind's traits in :mod:`kcache.kinds`:

- a machine-local kind (answers about this machine: tool versions, CPU probes) never crosses;
- a kind whose bytes run on the host (launchers, C++ kernels), are unpickled (torch's
  entries) or steer a compile unchecked (Dynamo's restart records) crosses only signed with
  ``KCACHE_SECRET``;
- any other kind crosses signed or not (its bytes are checked against its record either way).

Signatures are HMAC-SHA256 under the secret, over a domain (what the bytes are: a tier's entry,
a lock, a bundle) and the bytes, so that a signature made for one purpose never verifies for
another.
"""

from __future__ import annotations

import hashlib
import hmac

from .. import kinds as _kinds

#: Why an entry was refused: a machine-local kind, anywhere.
MACHINE_LOCAL = "machine-local"
#: Why an entry was refused: host code or a pickle without a signature.
UNSIGNED = "host code, pickled or compile-steering entry, unsigned"


def refusal(kind: str, signed: bool) -> str | None:
    """None when an entry of ``kind`` may cross machines (signed or not, as ``signed`` says);
    else why not (:data:`MACHINE_LOCAL` or :data:`UNSIGNED`)."""
    k = _kinds.get(kind)
    if k.machine_local:
        return MACHINE_LOCAL
    if k.needs_signature and not signed:
        return UNSIGNED
    return None


def may_cross(kind: str, signed: bool) -> bool:
    """Whether an entry of ``kind`` may cross machines (see :func:`refusal`)."""
    return refusal(kind, signed) is None


def sign(secret: bytes, domain: bytes, body: bytes) -> bytes:
    """The HMAC-SHA256 of ``domain + body`` under ``secret``."""
    return hmac.new(secret, domain + body, hashlib.sha256).digest()


def verify(secret: bytes, domain: bytes, body: bytes, sig: object) -> bool:
    """Whether ``sig`` (bytes, or their hex as a string) is :func:`sign`'s for these bytes; a
    signature of any other type or shape is not."""
    if isinstance(sig, str):
        try:
            sig = bytes.fromhex(sig)
        except ValueError:
            return False
    if not isinstance(sig, bytes):
        return False
    return hmac.compare_digest(sig, sign(secret, domain, body))
