"""The S3 backend's credentials: a frozen snapshot that calls sign with, refreshed only in the
background, never on the thread of a call.

botocore's refreshable credentials (``RefreshableCredentials``: a ``credential_process``, an
assumed role or web identity through STS, SSO, a container's or an instance's role) refresh
themselves inside ``get_frozen_credentials()``: from 15 minutes before they expire (botocore's
advisory window: the one thread that wins its lock runs the refresh, the others go on with the
old ones) and from 10 minutes before (mandatory: every thread waits for it). A refresh runs a
process, or asks STS (a client of botocore's own: 60 s timeouts, up to 5 attempts), SSO, a
container's endpoint or the metadata service; none of it on the tier's bounded sockets, so a
lookup that met it would wait for all of it, far past its deadline (review finding M2: 3 s for a
0.5 s deadline, and the tier then off for 30 s).

So: the credentials botocore's chain found at :meth:`.s3.S3Backend.open` (the process's start)
are taken as they are (never refreshed there), and from then on only :meth:`Credentials.refresh`
asks botocore for new ones, on the tier's writer thread (:meth:`.backend.Backend.upkeep`: the
thread exists only for credentials that expire), every :data:`POLL_S` while they are in
botocore's refresh window, which begins 15 minutes before they expire. A call signs with the
snapshot (:meth:`Credentials.current`); one that finds it expired (or, for credentials botocore
fetches only when first asked, not fetched yet) is :class:`~.backend.Unavailable`: a miss, never
a wait. ``kcache remote`` (a command: no program waits) fetches them on its own thread
(:meth:`Credentials.fetch`).

Every secret read here (the secret key, the session token) is remembered for
:func:`kcache.redact.redact`: no text kcache writes shows it.
"""

from __future__ import annotations

import threading
from typing import Any

from ...log import logger, warn_once
from ...redact import remember_secret
from .backend import Unavailable

#: How often the background looks whether botocore wants the credentials refreshed (its advisory
#: window is 15 minutes: a refresh is due long before they expire).
POLL_S = 30.0
#: A snapshot this close to its expiry is not used (a request signed with it may arrive late).
EXPIRY_MARGIN_S = 5.0


class Credentials:
    """The snapshot of botocore credentials ``creds`` (see the module)."""

    def __init__(self, creds: Any) -> None:
        from botocore.credentials import RefreshableCredentials

        self._creds = creds
        self._lock = threading.Lock()  # one refresh at a time (the background, kcache remote)
        #: Whether they expire (and a background refresh keeps them fresh).
        self.refreshable = isinstance(creds, RefreshableCredentials)
        self._frozen: Any = None
        if not self.refreshable or not creds.refresh_needed():
            self._take(creds.get_frozen_credentials())  # (not due: botocore does not refresh here)
        else:
            # Due already (credentials botocore fetches when first asked, or ones that expire
            # within 15 minutes): get_frozen_credentials() would refresh them here, on the
            # program's thread. What botocore holds is taken, if it is still good; botocore has
            # no public way to read it without the refresh (without the attribute, the
            # background's first refresh brings them).
            held = getattr(creds, "_frozen_credentials", None)
            if held is not None and not creds.refresh_needed(EXPIRY_MARGIN_S):
                self._take(held)

    def _take(self, frozen: Any) -> None:
        for secret in (frozen.secret_key, frozen.token):
            if secret:
                remember_secret(secret)
        self._frozen = frozen

    def current(self) -> Any:
        """The snapshot to sign with (botocore's ``ReadOnlyCredentials``), on any thread: never
        refreshes. Raises :class:`~.backend.Unavailable` when it has expired or is not there yet."""
        frozen = self._frozen
        if frozen is None or (self.refreshable and self._creds.refresh_needed(EXPIRY_MARGIN_S)):
            raise Unavailable("the AWS credentials have expired (refreshed in the background)")
        return frozen

    def refresh(self) -> float | None:
        """In the background (the tier's writer thread): new credentials from botocore when it
        wants them refreshed; the seconds until it should look again (None: they never expire).
        Never raises: a refresh that fails keeps the snapshot (one warning; tried again)."""
        if not self.refreshable:
            return None
        if self._frozen is None or self._creds.refresh_needed():
            self.fetch()
        return POLL_S

    def fetch(self) -> None:
        """Ask botocore for the credentials now (it refreshes them if due), on this thread: the
        background's, or a command's. Never raises."""
        with self._lock:
            try:
                frozen = self._creds.get_frozen_credentials()
            # broad: a refresh runs foreign code (a credential_process, STS, SSO, the metadata
            # service, through botocore), which raises what it raises: the snapshot stays
            except Exception as e:
                warn_once(
                    "remote-s3-credentials",
                    f"refreshing the AWS credentials failed ({type(e).__name__}: {e}); the shared tier "
                    "goes on with the ones it has while they last, and tries again",
                )
                return
            if frozen is None:
                logger.info("kcache: botocore gave no AWS credentials on refresh")
                return
            self._take(frozen)
