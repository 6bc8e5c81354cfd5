"""What keeps the disk tier within its bound and tidy, off its callers' path.

Every removal (a lookup's quarantine, ``kcache clear``, eviction) takes its bytes off the
store's count at once and tells the served files and the catalogue (:meth:`Upkeep._removed`);
an eviction by a put only renames into ``trash/`` (:meth:`~Upkeep._remove_for_put`). The flush
thread's turn (:meth:`~Upkeep._flush_turn`, every second, or at once when a put passes the bound)
then grows the descriptor table the holds asked for, lets go of what nothing needs, sets the
clock, removes dead processes' private folders, sweeps ``trash/`` and evicts (:mod:`.eviction`).
:class:`~.disk.DiskTier` takes these from here; they use its parts, never its reading or writing.
"""

from __future__ import annotations

from ..log import logger
from . import tunables as T
from .catalogue import Catalogue
from .clock import Clock
from .entries import Entries
from .eviction import Evictor
from .footprint import report
from .opening import Folders
from .private import clean_dead
from .served import Served
from .trash import Trash, folder_bytes


class Upkeep:
    """The disk tier's upkeep (see the module doc), over the parts the tier made."""

    folders: Folders
    clock: Clock
    served: Served
    entries: Entries
    catalogue: Catalogue
    evictor: Evictor
    trash_state: Trash
    max_size: int
    _dead_cleaned: bool

    def _removed(self, ident: str, freed: int, left: bool, mark: int | None) -> None:
        """Every removal: its bytes are off the store's count at once (what live processes were
        handed is theirs, gone when they are; unless a recount set the count since the rename,
        see :meth:`.usage.Usage.add`), its row is not written, and trash/ is swept later if a
        holder kept its folder."""
        self.evictor.usage.add(-freed, mark)
        self.served.removed(ident)  # an idle hold of it now costs disk: let go
        if left:
            self.trash_state.left = True
        self.catalogue.forget(ident)

    def _let_go(self) -> bool:
        """A put found the store far past its bound (see :meth:`.eviction.Evictor.after_put`):
        the idle holds of entries other processes removed are let go now, and ``trash/`` is
        swept for a moment (what they held, files puts left to delete), rather than at a flush
        turn that may be seconds away on a loaded box. Whether anything went."""
        self._let_go_removed_holds()
        return self.trash_state.sweep(T.BRAKE_SWEEP_S) > 0

    def _let_go_removed_holds(self) -> None:
        """Let go of the idle holds of entries other processes removed; a folder of theirs in
        trash/ can go at the next sweep then."""
        self.served.removed()
        if self.served.let_go_removed:
            self.served.let_go_removed = False
            self.trash_state.retry_held()

    def _remove_for_eviction(self, ident: str) -> int | None:
        return self.entries.remove(ident, later=True)

    def _remove_for_put(self, ident: str) -> int | None:
        """An eviction by a put: the folder is renamed into ``trash/`` (its bytes leave the count)
        and its files are deleted at the flush thread's next turn; unless that thread is behind
        (:data:`~.tunables.SOON_MAX` entries, or :data:`~.tunables.SOON_SHARE` of the bound in
        bytes still on disk), then here, as by the thread."""
        if self.trash_state.behind(self.max_size):
            return self.entries.remove(ident, later=True)
        got = self.entries.remove(ident, later=True, empty=False)
        if got is not None:
            self.trash_state.note_soon(got)
        return got

    def clean_dead_folders(self) -> int:
        """Remove the private folders (served files, scratch) that dead processes left in
        ``tmp/`` (killed, or ended by ``os._exit``): nobody holds them any more (see
        :mod:`.served`); a live process's are held, and never taken. Once per process (and store),
        off its first hit's path: at the flush thread's first turn, or at :meth:`close` when that
        never came. Not on a network filesystem (its locks may be per node: another node's live
        folders look unheld there). Returns how many went."""
        if self._dead_cleaned:
            return 0
        self._dead_cleaned = True
        tfd = self.folders.fd("tmp")
        if tfd is None or self.folders.readonly or self.folders.network_fs:
            return 0
        try:
            return clean_dead(tfd, ("served.", "scratch."))
        except OSError as e:  # best effort: the next process tries again
            logger.debug("clean-up of dead processes' folders: %s", e)
            return 0

    def _flush_turn(self) -> None:
        """The flush thread's turn, before it writes the index: the process's table of
        descriptors grown if the holds asked (see :mod:`.served`); holds whose paths have all
        gone let go; (at the first) the clock and dead processes' folders; trash/ swept; then
        eviction when past the bound (the put that passed it woke this), and trash/ again."""
        self.served.grow_table()
        self.served.drain()  # holds whose paths have all gone (see .leases)
        self._let_go_removed_holds()
        self.clock.synced()
        self.clean_dead_folders()
        if self.trash_state.left:
            self.sweep_trash()  # first: what it frees is not evicted for
        if self.evictor.due():
            self.evictor.run()
            if self.trash_state.left:
                self.sweep_trash()

    def sweep_trash(self, budget_s: float | None = None, *, closing: bool = False) -> None:
        """What removals left in ``trash/`` (see :meth:`.trash.Trash.sweep`). Never raises."""
        self.trash_state.sweep(budget_s, closing=closing)

    def footprint(self) -> dict[str, int]:
        """The store's folder on disk as ``du`` counts it, in bytes (see :func:`.footprint.report`;
        the entries as their shared count says, walked when there is none yet)."""
        count = self.evictor.usage.peek()
        if count is None:
            count = sum(folder_bytes(sfd, name) for sfd, name in self.evictor._folders())
        return report(self.folders, count)

    def evict(self, target: int | None = None) -> tuple[int, int]:
        """Remove least recently used entries until the store's folder takes at most 90% of the
        bound on disk, or (given ``target``) until its committed entries take at most ``target``
        bytes on disk; then write the index (see :mod:`.eviction`). One process evicts at a
        time; this returns at once when another one does. Returns (entries, bytes on disk).

        The store also evicts on its own: its flush thread as soon as a put passes the bound,
        and a put itself when the store is far past it."""
        if self.folders.readonly or self.folders.closed:
            return 0, 0
        out = self.evictor.run(target)
        if out[0]:
            self.sweep_trash()  # the empty folders it left (the caller's time, not a put's)
        self.catalogue.flush(force=True)
        return out
