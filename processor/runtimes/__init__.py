"""The runtimes that run the engine on Kafka: native (confluent-kafka, RocksDB) and Faust."""
