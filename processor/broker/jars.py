"""What a local Kafka server needs: Java 17+, and the jars of one pinned Kafka version,
fetched once with Maven from Maven Central into a user cache and reused."""

import os
import re
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

from rich.console import Console

KAFKA_VERSION = "4.1.1"
JAVA_MIN_MAJOR = 17


class BrokerError(RuntimeError):
    """Starting or stopping a broker failed; the message says what to do next."""


def cache_root() -> Path:
    """RUNSTATE_CACHE_DIR, else $XDG_CACHE_HOME/runstate, else ~/.cache/runstate."""
    explicit = os.environ.get("RUNSTATE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "runstate"


def jars_dir(version: str = KAFKA_VERSION) -> Path:
    return cache_root() / f"kafka-{version}" / "libs"


def resource(name: str) -> Path:
    path = resources.files(__package__).joinpath("resources", name)
    return Path(str(path))


def find_java() -> str:
    """The java binary (JAVA_HOME first), checked to be version 17 or newer."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise BrokerError(
            "Java is not installed: the local Kafka broker needs Java 17 or newer. Install "
            "OpenJDK 17 (Debian/Ubuntu: apt install openjdk-17-jre-headless; macOS: brew "
            "install openjdk@17) or set JAVA_HOME; or point RUNSTATE_BOOTSTRAP_SERVERS at "
            "an existing broker."
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):  # "1.8.0" style
        major = int(match.group(2))
    if major < JAVA_MIN_MAJOR:
        raise BrokerError(
            f"{java} is Java {major or 'of unknown version'}; Kafka {KAFKA_VERSION} needs "
            f"Java {JAVA_MIN_MAJOR} or newer. Install OpenJDK 17 and set JAVA_HOME to it."
        )
    return java


def find_maven() -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError(
            "Maven (mvn) is not installed: it fetches the Kafka broker jars from Maven "
            "Central once. Install Maven 3.6+ (Debian/Ubuntu: apt install maven; macOS: "
            "brew install maven), or use Docker (docker compose up), or set "
            "RUNSTATE_BOOTSTRAP_SERVERS to an existing broker."
        )
    return mvn


def ensure_jars(console: Console | None = None) -> Path:
    """The cached broker jars, fetched with Maven on first use only."""
    return _fetched("pom.xml", jars_dir(), "kafka_2.13-*.jar", "jars", console)


def tools_dir(version: str = KAFKA_VERSION) -> Path:
    return cache_root() / f"kafka-{version}" / "tools"


def ensure_tools(console: Console | None = None) -> Path:
    """The cached kafka-tools jar (kafka-metadata-quorum's and kafka-transactions'
    commands), beside the broker jars it runs with; fetched on first use only. Its
    own directory, so caches made before it was needed stay valid as they are."""
    ensure_jars(console)
    return _fetched("tools-pom.xml", tools_dir(), "kafka-tools-*.jar", "tools jar", console)


def _fetched(pom: str, libs: Path, expected: str, what: str, console: Console | None) -> Path:
    """`libs`, filled once by `mvn dependency:copy-dependencies` of the resource `pom`;
    a fetch counts when a jar matching `expected` came with it."""
    marker = libs / ".complete"
    if marker.exists():
        return libs
    mvn = find_maven()
    find_java()
    libs.parent.mkdir(parents=True, exist_ok=True)
    console = console or Console(stderr=True)
    with tempfile.TemporaryDirectory(dir=libs.parent, prefix="fetch-") as tmp:
        shutil.copy(resource(pom), Path(tmp) / "pom.xml")
        staged = Path(tmp) / "libs"
        with console.status(
            f"Fetching Apache Kafka {KAFKA_VERSION} {what} from Maven Central (once; cached "
            f"in {libs})"
        ):
            result = subprocess.run(
                [
                    mvn,
                    "-q",
                    "-B",
                    "dependency:copy-dependencies",
                    "-DincludeScope=runtime",
                    f"-DoutputDirectory={staged}",
                ],
                cwd=tmp,
                capture_output=True,
                text=True,
                check=False,
            )
        if result.returncode != 0 or not any(staged.glob(expected)):
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
            raise BrokerError(
                f"Maven could not fetch the Kafka {KAFKA_VERSION} {what} (exit "
                f"{result.returncode}). Check access to Maven Central "
                f"(https://repo.maven.apache.org) or a mirror in ~/.m2/settings.xml.\n{tail}"
            )
        if libs.exists():  # a half-finished earlier fetch
            shutil.rmtree(libs)
        staged.rename(libs)
    marker.write_text("\n".join(sorted(p.name for p in libs.glob("*.jar"))) + "\n")
    console.print(f"Fetched {len(list(libs.glob('*.jar')))} jars into {libs}")
    return libs
