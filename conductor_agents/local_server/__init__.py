"""Run a real Conductor server on this machine: the server jar, a Java runtime, the process.

``LocalServer`` starts the published ``conductor-server`` boot jar on loopback with a
SQLite data directory (or its own Redis); ``LocalCluster`` starts several nodes on one
Redis behind HAProxy; ``resolve_server_jar`` fetches and caches the jar;
``find_java`` finds a Java 21+ runtime.
"""

from .._common.public import publish as _publish
from ._cluster import LocalCluster
from ._command import DEFAULT_JVM_OPTIONS
from ._jar import (
    DEFAULT_SERVER_VERSION,
    MAVEN_REPOSITORY_ENV,
    SERVER_JAR_ENV,
    SERVER_VERSION_ENV,
    resolve_server_jar,
    server_version,
)
from ._java import DEFAULT_JVM_DIRS, MIN_JAVA_VERSION, JavaRuntime, find_java
from ._server import BACKENDS, LocalServer

__all__ = [
    # The server
    "LocalServer",
    "LocalCluster",
    "BACKENDS",
    "DEFAULT_JVM_OPTIONS",
    # The jar
    "resolve_server_jar",
    "server_version",
    "DEFAULT_SERVER_VERSION",
    "SERVER_VERSION_ENV",
    "SERVER_JAR_ENV",
    "MAVEN_REPOSITORY_ENV",
    # Java
    "find_java",
    "JavaRuntime",
    "MIN_JAVA_VERSION",
    "DEFAULT_JVM_DIRS",
]

# Reprs, tracebacks and pickles name the public home. LocalServer is conductor_agents.LocalServer and
# LocalCluster conductor_agents.testing.LocalCluster: those packages import them lazily, on first use.
_publish(globals(), __name__, elsewhere={"LocalServer": "conductor_agents", "LocalCluster": "conductor_agents.testing"})
