"""The RocksDB options of the partition stores: the block cache and the write buffers
every store of the process shares, each store's table and memtable settings, the write
options of restore, and the properties a store reports its memory by."""

from rocksdict import BlockBasedOptions, Cache, Options, WriteBufferManager, WriteOptions

# Memory RocksDB may take as runs grow: one block cache shared by every partition store
# of the process, and small memtables per store (RocksDB's defaults: 64 MB, two of them,
# per store). Index and filter blocks stay outside the cache: charged to a cache this
# small they were evicted and re-read on every lookup.
# Both are small so that a worker's memory is flat soon after it starts: a worker fed
# 300 proposals/s (a soak worker's share) filled a 32 MB block cache over 6 minutes, and
# its three stores' memtables, 8 MB each, filled and flushed together, RSS swinging by
# 19 MB. With 8 MB and 4 MB the cache was full in 90 s and RSS stayed within 109-112 MB
# from then on. What the cache no longer holds, the OS's page cache still does (a read
# of it costs a system call). Restore's speed did not change; the native drain moved
# within its noise.
BLOCK_CACHE_BYTES = 8 << 20
_BLOCK_CACHE = Cache(BLOCK_CACHE_BYTES)
_WRITE_BUFFER_BYTES = 4 << 20
# And all memtables of the process together: past about 90 % of this RocksDB flushes the
# largest one, so the stores' memtables flush one at a time, not all at once, and the
# process holds about the same memtable memory throughout (24 partitions would otherwise
# hold up to 24 x 2 x 4 MB; with this many, each one's flushes are smaller).
_WRITE_BUFFERS = WriteBufferManager(8 << 20, False)
#: What `PartitionStore.memory` reports, by kind: RocksDB's own properties.
MEMORY = {
    "memtables": "rocksdb.cur-size-all-mem-tables",
    "table_readers": "rocksdb.estimate-table-readers-mem",
    "block_cache": "rocksdb.block-cache-usage",
}


#: Restore's writes skip the write-ahead log (`PartitionStore.restore` says why it is
#: safe). Live commits keep it: skipping it there too (about 4 us a proposal) was
#: followed by a CI run with mismatched outcomes after a broker restart, not yet
#: explained. The log is probably not the cause: 22 runs of that scenario without it
#: passed, and a restart in place closes (flushes) the stores before its exec, so the
#: log plays no part there; only a process killed outright reads it back.
UNLOGGED = WriteOptions()
UNLOGGED.disable_wal = True  # type: ignore[method-assign,assignment]  # a property, not as stubbed


def store_options() -> Options:
    """The options a partition store's database is opened with."""
    table = BlockBasedOptions()
    table.set_block_cache(_BLOCK_CACHE)
    # Most lookups of a new run miss (its snapshot, its timer index): a bloom filter
    # answers those without reading every level's blocks (1M runs: 5x slower without).
    table.set_bloom_filter(10, False)
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_block_based_table_factory(table)
    options.set_write_buffer_size(_WRITE_BUFFER_BYTES)
    options.set_max_write_buffer_number(2)
    options.set_write_buffer_manager(_WRITE_BUFFERS)
    return options
