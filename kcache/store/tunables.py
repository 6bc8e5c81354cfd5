"""The store's timings and bounds, in one place (tests and the chaos tool change some of them)."""

GRACE_S = 120.0  # eviction leaves entries used this recently alone (by the filesystem's clock)
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
SIZE_CHECK_S = 30.0  # the store's total size is read from the index at most this often
MAX_RECORD = 1 << 20
MAX_PROTECT_S = 365 * 86400.0
