"""What every peer program shares: its flags, and a flag set by SIGTERM."""

import argparse
import signal
import threading
from pathlib import Path

from confluent_kafka import Consumer, Producer

from processor.kafka.topics import TopicNames
from processor.trust.keyring import Keyring, load_keyring


def peer_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers.")
    parser.add_argument("--prefix", required=True, help="Topic prefix (as runstate's).")
    parser.add_argument("--group", required=True, help="Consumer group id.")
    parser.add_argument("--keyring", type=Path, required=True, help="Keyring JSON file.")
    parser.add_argument("--state-dir", type=Path, required=True, help="Where state lives.")
    return parser.parse_args()


def topics(args: argparse.Namespace) -> TopicNames:
    return TopicNames.with_prefix(args.prefix)


def keyring(args: argparse.Namespace) -> Keyring:
    return load_keyring(args.keyring, None)


def stop_on_sigterm() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def peer_consumer(args: argparse.Namespace) -> Consumer:
    """The proposals consumer every peer uses: the worker's settings, offsets by hand."""
    return Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )


def peer_producer(args: argparse.Namespace, **settings: object) -> Producer:
    """A producer with the worker's batching settings, plus `settings` (dots as _)."""
    extra = {k.replace("_", "."): v for k, v in settings.items()}
    return Producer(
        {"bootstrap.servers": args.bootstrap, "linger.ms": 5, "compression.type": "lz4", **extra}
    )
