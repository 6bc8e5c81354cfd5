"""The store's timings and bounds, in one place (tests and the chaos tool change some of them)."""

GRACE_S = 0.0  # eviction leaves entries used this recently alone (0: none; what a hit handed out
# is a private link, which eviction cannot change, see served.py)
EVICT_TO = 0.9  # eviction brings the store down to this share of its bound
HELP_OVER = 1.1  # past this share of its bound, a put frees about its own size itself
BRAKE_OVER = 1.25  # past this share (the flush threads far behind: a loaded box), such a put
# deletes its victims' files itself
BRAKE_SWEEP_S = 0.02  # a put past HELP_OVER sweeps trash/ for at most this long (what nobody holds)
REMEASURE_S = 0.1  # a put walks what is beside the entries again if the last walk (the flush
# thread's, every second when it gets the CPU) is older than this; past HELP_OVER, it lets go of
# what nobody needs (see Evictor.after_put) at most this often
REMEASURE_SHARE = 0.05  # ... and no oftener than keeps a put's walks to this share of the time,
# in the CPU they cost (a trash/ of thousands of folders after a clear takes tens of ms to walk)
SOON_MAX = 16  # entries a process's puts evicted whose files still wait for the flush thread's
# turn: past it (the thread is behind), a put that evicts deletes the files itself
SOON_SHARE = 0.02  # ... and past this share of the bound in their bytes (they are still on disk)
EXIT_EVICT_S = 2.0  # a process ending with the store past its bound evicts for at most this long
FIRST_USE_S = 2.0  # a protected entry whose record's mtime is this close to its creation is unused
RECOUNT_EVERY_S = 60.0  # at most this often, a recount when eviction finds nothing left to remove
HELD_SWEEP_S = 30.0  # folders in trash/ that a process held are tried again this often
TOUCH_EVERY_S = 60.0  # a hit refreshes the record's mtime at most this often
FLUSH_EVERY_S = 1.0  # batched index writes (last use, counters, misses, new rows) at most this often
INDEX_BACKOFF_S = 5.0  # after an index failure, leave the index alone this long
INDEX_BUSY_BACKOFF_S = 0.5  # after finding it locked by other writers (doubling, up to INDEX_BACKOFF_S)
INDEX_BUSY_WARN_AFTER = 1  # found locked this many times in a row (past the busy timeout): one warning
MAX_PENDING = 10_000  # index rows kept for a later flush while the index is busy
STALE_TMP_S = 3600.0  # files in tmp/ older than this go; folders as soon as nobody holds them
# (older than this where locks cannot tell: a network filesystem, no flock)
RECONCILE_EVERY_S = 3600.0  # entries on disk without a row are added this often, store-wide
RECONCILE_CHECK_S = 300.0  # each process asks the index whether that is due this often
MAX_RECORD = 1 << 20
MAX_PROTECT_S = 365 * 86400.0
