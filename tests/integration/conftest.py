"""Every integration test gets a real broker: from KAFKA_BOOTSTRAP_SERVERS, else a
Docker container, else the local launcher (processor.broker.provide; RUNSTATE_BROKER_SOURCE
insists on one). The session's first line under the test it starts says which. A test that asks
for `kafka_cluster` gets a local cluster of three nodes besides."""

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from processor.broker.cluster import Cluster, running_cluster
from processor.broker.provide import broker_source, provide_broker
from processor.kafka.topic_creation import create_topics
from processor.kafka.topic_plans import plan_topics
from processor.kafka.topics import TopicNames


@pytest.fixture(scope="session")
def kafka_bootstrap(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[str]:
    data_dir: Path = tmp_path_factory.mktemp("broker")
    source = broker_source()
    with provide_broker(data_dir, source=source) as bootstrap:
        _say(pytestconfig, f"broker: {source.kind}, {source.why}, at {bootstrap}")
        yield bootstrap


def _say(config: pytest.Config, line: str) -> None:
    """A line on the terminal, past the capture of the test that is being set up."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"\n{line}")


@pytest.fixture(scope="session")
def admin(kafka_bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_bootstrap, "log_level": 4})


@pytest.fixture
def topic_names(admin: AdminClient) -> TopicNames:
    """This test's own set of runstate topics (3 partitions), created fresh."""
    names = TopicNames.with_prefix(f"t-{uuid.uuid4().hex[:10]}.")
    create_topics(admin, plan_topics(names, partitions=3, replication=1))
    return names


@pytest.fixture
def launcher() -> None:
    """Tests of the local launcher itself need Java 17 and Maven (or cached jars)."""
    from processor.broker.launcher import BrokerError, ensure_jars, find_java

    try:
        find_java()
        ensure_jars()
    except BrokerError as exc:
        pytest.skip(f"local launcher unavailable here: {exc}")


#: The last test that asks for kafka_cluster, and the cluster once made.
_LAST_CLUSTER_TEST: list[pytest.Item] = []
_CLUSTERS: list[Cluster] = []


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests of the three-node cluster run in one process (pytest-xdist's group), one
    after the other: one cluster at a time shares the machine with the other tests."""
    for item in items:
        if "kafka_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("cluster"))


def pytest_collection_finish(session: pytest.Session) -> None:
    """The last test to use the cluster among those that run (`-m` has deselected the
    rest by now)."""
    users = [i for i in session.items if "kafka_cluster" in getattr(i, "fixturenames", ())]
    _LAST_CLUSTER_TEST[:] = users[-1:]


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fails a grouped test that pytest-xdist's loadgroup did not group: tests that share
    a module's costly fixture, or the one cluster, would silently run in every process."""
    grouping = getattr(item.config.option, "loadgroup", False)  # set in xdist processes
    if grouping and item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
        pytest.fail(
            "pytest-xdist did not group this test: this pytest and pytest-xdist do not work "
            "together; install the versions pyproject.toml names (make install)",
            pytrace=False,
        )


def pytest_runtest_teardown(item: pytest.Item) -> None:
    """The cluster goes once its last test is done, not at the session's end: three idle
    JVMs would otherwise share the CI machine with every test after it."""
    if _CLUSTERS and _LAST_CLUSTER_TEST and item is _LAST_CLUSTER_TEST[0]:
        _CLUSTERS.pop().stop_all(timeout=0)


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three combined broker+controller nodes (processor.broker.cluster), started when a
    test first asks for them and shared by the session: a test that kills, stops,
    pauses or wipes a node leaves every node running and in sync again. Needs the
    local launcher's Java and Maven (or cached jars) whatever KAFKA_BOOTSTRAP_SERVERS
    says: the tests drive the nodes' processes."""
    from processor.broker.jars import ensure_tools
    from processor.broker.launcher import BrokerError, ensure_jars, find_java

    try:
        find_java()
        ensure_jars()
        ensure_tools()
    except BrokerError as exc:
        pytest.skip(f"local launcher unavailable here: {exc}")
    # Killed at the end, not shut down: its data goes with the session's tmp_path.
    with running_cluster(tmp_path_factory.mktemp("cluster"), 3, stop_timeout=0) as cluster:
        _CLUSTERS.append(cluster)
        yield cluster
