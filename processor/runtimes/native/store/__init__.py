"""The native worker's partition store: one RocksDB database per assigned input
partition, one job per module. `partition.py` the store (`PartitionStore`: reads,
queries, writes, restore); `changes.py` one Kafka transaction's staged changes to it
(`PartitionTransaction`, `PreparedWrite`); `changelog.py` changelog records turned into
its rows on restore; `indexes.py` its by-state and due-time indexes; `keys.py` the
layout of its keys, the layout's version (`STORE_FORMAT`) and its check when a store
opens; `options.py` RocksDB's options, block cache and write buffers."""
