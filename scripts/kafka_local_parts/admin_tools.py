"""Kafka's own admin tool for the local broker. The jars ship no ``bin/`` scripts:
``kafka-acls.sh`` is written for the broker in a state dir (``env`` prints the PATH line
that finds it), with ``admin.properties``, the super user's client config for its
``--command-config``. May import: constants, credentials, jars, jvm, state_dir, tls.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import zipfile
from pathlib import Path

from .constants import _TOOL_JVM_OPTS, ADMIN_USER, SASL_MECHANISM, SECRETS, BrokerError, _major
from .credentials import _jaas, listener_name, read_password
from .jars import ensure_jars
from .jvm import _java, _logging_config
from .state_dir import _write_private
from .tls import tls_files

BIN = "bin"
ADMIN_PROPERTIES = "admin.properties"
ACL_COMMAND = {3: "kafka.admin.AclCommand", 4: "org.apache.kafka.tools.AclCommand"}
"""kafka-acls' main class: in the core jar up to 3.x, in ``kafka-tools`` (not fetched here)
from 4.0."""


def admin_properties(state_dir: Path, security: str) -> dict[str, str]:
    """The Java client settings of the super user (``--command-config`` of Kafka's tools)."""
    state = Path(state_dir)
    tls = tls_files(state)
    settings = {
        "security.protocol": listener_name(security),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls.ca),
    }
    if security == "ssl":
        settings["ssl.keystore.type"] = "PEM"
        settings["ssl.keystore.location"] = str(tls.directory / f"{ADMIN_USER}.keystore.pem")
        return settings
    password = read_password(state, ADMIN_USER)
    if password is None:
        raise BrokerError(f"no password for {ADMIN_USER} in {state / SECRETS}")
    settings["sasl.mechanism"] = SASL_MECHANISM
    settings["sasl.jaas.config"] = _jaas(ADMIN_USER, password)
    return settings


def _has_class(libs: Path, main_class: str) -> bool:
    entry = main_class.replace(".", "/") + ".class"
    for jar in sorted(libs.glob("kafka*.jar")):
        with contextlib.suppress(OSError, zipfile.BadZipFile), zipfile.ZipFile(jar) as archive:
            if entry in archive.namelist():
                return True
    return False


def write_admin_tools(state_dir: Path | str, security: str, version: str) -> Path:
    """Write ``bin/kafka-acls.sh`` and ``admin.properties`` (secured brokers: mode 0600) in
    ``state_dir``; return the ``bin`` folder.  On a version whose jars here lack the
    command (4.x: ``kafka-tools``), the script says so and exits 1."""
    state = Path(state_dir)
    if security != "plaintext":
        if security == "ssl":
            tls = tls_files(state)
            pieces = [tls.key(ADMIN_USER), tls.cert(ADMIN_USER), tls.ca]
            _write_private(
                tls.directory / f"{ADMIN_USER}.keystore.pem",
                "".join(path.read_text() for path in pieces),
            )
        lines = [f"{k}={v}" for k, v in admin_properties(state, security).items()]
        _write_private(state / ADMIN_PROPERTIES, "\n".join(lines) + "\n")
    libs = ensure_jars(version)
    main_class = ACL_COMMAND[min(max(_major(version), 3), 4)]
    bin_dir = state / BIN
    bin_dir.mkdir(exist_ok=True)
    if _has_class(libs, main_class):
        _, log_prop = _logging_config(state, version, tool=True)
        argv = [_java(), *_TOOL_JVM_OPTS, log_prop, "-cp", str(libs / "*"), main_class]
        body = f'exec {shlex.join(argv)} "$@"'
    else:
        said = (
            f"kafka-acls.sh: Apache Kafka {version}'s {main_class} is in the kafka-tools jar, "
            f"which kafka-local does not fetch ({libs}): use Kafka 3.9 "
            "(TICKWHEEL_KAFKA_VERSION) or a Kafka distribution's bin/kafka-acls.sh"
        )
        body = f"echo {shlex.quote(said)} >&2\nexit 1"
    script = bin_dir / "kafka-acls.sh"
    temporary = script.with_name(script.name + ".tmp")
    temporary.write_text(
        "#!/bin/sh\n# Apache Kafka's kafka-acls from the jars the local broker runs "
        f"(written by scripts/kafka-local for {state}).\n{body}\n"
    )
    temporary.chmod(0o755)
    os.replace(temporary, script)
    return bin_dir


def tool_env_lines(state_dir: Path, security: str, version: str) -> list[str]:
    """``env``'s lines for Kafka's tools: ``kafka-acls.sh`` on PATH and, secured, the super
    user's ``KAFKA_ADMIN_PROPERTIES`` for its ``--command-config``."""
    bin_dir = write_admin_tools(state_dir, security, version)
    lines = [f'export PATH={shlex.quote(str(bin_dir))}:"$PATH"']
    if security != "plaintext":
        admin = shlex.quote(str(Path(state_dir) / ADMIN_PROPERTIES))
        lines.append(f"export KAFKA_ADMIN_PROPERTIES={admin}")
    return lines
