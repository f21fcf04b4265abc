"""The native runtime: confluent-kafka consumer and transactional producer, rocksdict stores."""
