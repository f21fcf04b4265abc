#!/bin/bash
# The official image's health probe, at the same path: asks a broker for its API versions.
exec java -Dlog4j2.configurationFile=/opt/kafka/log4j2.properties \
  -cp '/opt/kafka/libs/*:/opt/kafka/tools/*' org.apache.kafka.tools.BrokerApiVersionsCommand "$@"
