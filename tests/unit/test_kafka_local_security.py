"""The local broker's security (``start --security ssl|sasl_ssl``) without a JVM.

Its server.properties, the certificates it makes (a real TLS handshake between them, in
this process), the generated passwords, the ``env`` variables, and the SCRAM and ACL
parts of the script's own Kafka client.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import stat
import struct
import threading
from pathlib import Path
from typing import Any

import kafka_broker  # registered by tests/conftest.py
import pytest

script = kafka_broker.load_kafka_local()


@pytest.fixture(scope="module")
def secured_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state dir with the certificates and passwords of a SASL_SSL broker (made once)."""
    state: Path = tmp_path_factory.mktemp("secured")
    script.ensure_credentials(state, "sasl_ssl", keep=False)
    return state


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --------------------------------------------------------------------------- server.properties


def test_plaintext_is_unchanged_by_the_security_settings(tmp_path: Path) -> None:
    props = script.server_properties(tmp_path, 9092, 9093, "3.9.2")
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9092"
    assert props["listener.security.protocol.map"] == "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert not [key for key in props if key.startswith(("ssl.", "sasl.", "authorizer"))]
    assert "super.users" not in props


def test_sasl_ssl_properties(secured_dir: Path) -> None:
    credentials = script.read_credentials(secured_dir, "sasl_ssl")
    props = script.server_properties(secured_dir, 9092, 9093, "3.9.2", credentials=credentials)
    assert props["listeners"] == "SASL_SSL://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert props["advertised.listeners"] == "SASL_SSL://127.0.0.1:9092"
    assert props["inter.broker.listener.name"] == "SASL_SSL"
    assert props["listener.security.protocol.map"] == "CONTROLLER:SSL,SASL_SSL:SASL_SSL"
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512,SCRAM-SHA-256"
    assert props["sasl.mechanism.inter.broker.protocol"] == "SCRAM-SHA-512"
    password = (secured_dir / "secrets" / "admin.password").read_text()
    for mechanism in ("scram-sha-512", "scram-sha-256"):
        jaas = props[f"listener.name.sasl_ssl.{mechanism}.sasl.jaas.config"]
        assert jaas == (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="admin" password="{password}";'
        )
    # PEM key store and trust store; clients need no certificate, the controllers do.
    assert props["ssl.keystore.type"] == props["ssl.truststore.type"] == "PEM"
    assert props["ssl.keystore.location"] == str(secured_dir / "tls" / "broker.pem")
    assert props["ssl.truststore.location"] == str(secured_dir / "tls" / "ca.pem")
    assert props["ssl.client.auth"] == "none"
    assert props["listener.name.controller.ssl.client.auth"] == "required"
    assert props["ssl.principal.mapping.rules"] == "RULE:^CN=([^,]+)$/$1/,DEFAULT"
    # ACLs enforced: only admin and the brokers' own certificate are super users.
    assert props["authorizer.class.name"] == (
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    )
    assert props["super.users"] == "User:admin;User:kafka-broker"
    assert props["allow.everyone.if.no.acl.found"] == "false"


def test_ssl_properties_require_client_certificates(secured_dir: Path) -> None:
    credentials = script.read_credentials(secured_dir, "ssl")
    props = script.server_properties(secured_dir, 9092, 9093, "3.9.2", credentials=credentials)
    assert props["listeners"] == "SSL://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert props["inter.broker.listener.name"] == "SSL"
    assert props["listener.security.protocol.map"] == "CONTROLLER:SSL,SSL:SSL"
    assert props["ssl.client.auth"] == "required"
    assert props["super.users"] == "User:admin;User:kafka-broker"
    assert not [key for key in props if "sasl" in key]


def test_overrides_win_over_the_security_settings(secured_dir: Path) -> None:
    credentials = script.read_credentials(secured_dir, "ssl")
    props = script.server_properties(
        secured_dir,
        9092,
        9093,
        "3.9.2",
        {"allow.everyone.if.no.acl.found": "true"},
        credentials=credentials,
    )
    assert props["allow.everyone.if.no.acl.found"] == "true"


def test_the_scram_users_are_made_at_format_time(secured_dir: Path) -> None:
    credentials = script.read_credentials(secured_dir, "sasl_ssl")
    arguments = script.scram_arguments(credentials)
    admin = (secured_dir / "secrets" / "admin.password").read_text()
    app = (secured_dir / "secrets" / "tickwheel.password").read_text()
    assert arguments == [
        "--add-scram",
        f"SCRAM-SHA-512=[name=admin,password={admin}]",
        "--add-scram",
        f"SCRAM-SHA-512=[name=tickwheel,password={app}]",
        "--add-scram",
        f"SCRAM-SHA-256=[name=admin,password={admin}]",
        "--add-scram",
        f"SCRAM-SHA-256=[name=tickwheel,password={app}]",
    ]
    assert script.scram_arguments(script.read_credentials(secured_dir, "ssl")) == []
    assert script.scram_arguments(None) == []
    command = script._format_command(
        "java", Path("/libs"), secured_dir, secured_dir / "p", "3.9.2", "cid", credentials
    )
    assert command[-8:] == arguments
    assert command[command.index("-t") + 1] == "cid"


def test_properties_holding_a_password_are_private(secured_dir: Path, tmp_path: Path) -> None:
    credentials = script.read_credentials(secured_dir, "sasl_ssl")
    props = tmp_path / "server.properties"
    script._write_properties(
        props, script.server_properties(tmp_path, 1, 2, "3.9.2", credentials=credentials)
    )
    assert _mode(props) == 0o600


# --------------------------------------------------------------------------- credentials


def test_certificates_and_passwords_are_made_once_and_private(secured_dir: Path) -> None:
    tls = script.tls_files(secured_dir)
    assert tls.complete()
    for private in (tls.ca_key, tls.broker_keystore, tls.key("admin"), tls.key("tickwheel")):
        assert _mode(private) == 0o600, private
    assert _mode(tls.directory) == 0o700
    for user in ("admin", "tickwheel"):
        path = secured_dir / "secrets" / f"{user}.password"
        assert _mode(path) == 0o600
        assert len(path.read_text()) >= 20 and "\n" not in path.read_text()
    assert _mode(secured_dir / "secrets") == 0o700
    before = {p.name: p.read_bytes() for p in tls.directory.iterdir()}
    passwords = script.read_credentials(secured_dir, "sasl_ssl").passwords
    again = script.ensure_credentials(secured_dir, "sasl_ssl", keep=True)
    assert again.passwords == passwords  # kept: the SCRAM users were formatted with them
    assert {p.name: p.read_bytes() for p in tls.directory.iterdir()} == before
    assert passwords["admin"] != passwords["tickwheel"]
    assert script.ensure_credentials(secured_dir, "plaintext", keep=True) is None


def test_a_kept_sasl_broker_without_its_passwords_is_an_error(
    secured_dir: Path, tmp_path: Path
) -> None:
    shutil.copytree(secured_dir / "tls", tmp_path / "tls")  # no new keys: they take a while
    script.ensure_credentials(tmp_path, "sasl_ssl", keep=False)
    (tmp_path / "secrets" / "tickwheel.password").unlink()
    with pytest.raises(script.BrokerError, match=r"tickwheel\.password is missing.*--fresh"):
        script.ensure_credentials(tmp_path, "sasl_ssl", keep=True)
    made = script.ensure_credentials(tmp_path, "sasl_ssl", keep=False)  # --fresh: new one
    assert (tmp_path / "secrets" / "tickwheel.password").read_text() == made.passwords["tickwheel"]


def test_unknown_security_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(script.BrokerError, match="plaintext, ssl, sasl_ssl"):
        script.ensure_credentials(tmp_path, "sasl_plaintext", keep=False)


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, host: str) -> dict[str, Any]:
    """A TLS handshake on loopback; the client certificate as the server saw it."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: dict[str, Any] = {}

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with server.wrap_socket(conn, server_side=True) as tls:
                seen.update(tls.getpeercert() or {})
                tls.sendall(b"ok")
        except (ssl.SSLError, OSError) as exc:
            seen["error"] = exc

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        port = listener.getsockname()[1]
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        with raw, client.wrap_socket(raw, server_hostname=host) as tls:
            assert tls.recv(2) == b"ok"
            seen["server"] = tls.getpeercert()
    finally:
        thread.join(10)
        listener.close()
    return seen


def _server_context(tls: Any) -> ssl.SSLContext:
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(str(tls.broker_keystore))  # key + certificate + CA, as Kafka's PEM
    server.load_verify_locations(str(tls.ca))
    server.verify_mode = ssl.CERT_REQUIRED
    return server


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_the_certificates_make_a_mutual_tls_handshake(secured_dir: Path, host: str) -> None:
    tls = script.tls_files(secured_dir)
    auth = script.client_auth(script.read_credentials(secured_dir, "ssl"), "tickwheel")
    assert auth.protocol == "SSL" and auth.certfile == tls.cert("tickwheel")
    seen = _handshake(_server_context(tls), auth.ssl_context(), host)
    assert "error" not in seen
    assert dict(entry[0] for entry in seen["subject"]) == {"commonName": "tickwheel"}
    assert dict(entry[0] for entry in seen["server"]["subject"]) == {"commonName": "kafka-broker"}
    assert ("IP Address", "127.0.0.1") in seen["server"]["subjectAltName"]
    assert ("DNS", "localhost") in seen["server"]["subjectAltName"]


def test_the_broker_certificate_is_for_loopback_only(secured_dir: Path) -> None:
    tls = script.tls_files(secured_dir)
    client = ssl.create_default_context(cafile=str(tls.ca))
    client.load_cert_chain(str(tls.cert("admin")), str(tls.key("admin")))
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        _handshake(_server_context(tls), client, "kafka.example.com")


# --------------------------------------------------------------------------- env


def test_sasl_ssl_env_has_every_variable_a_client_needs(secured_dir: Path) -> None:
    settings = script.client_settings(secured_dir, "sasl_ssl", "127.0.0.1:9092")
    assert settings == {
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
        "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "KAFKA_SASL_USERNAME": "admin",
        "KAFKA_SASL_PASSWORD_FILE": str(secured_dir / "secrets" / "admin.password"),
        "KAFKA_SSL_CAFILE": str(secured_dir / "tls" / "ca.pem"),
    }
    app = script.client_settings(secured_dir, "sasl_ssl", "127.0.0.1:9092", "tickwheel")
    assert app["KAFKA_SASL_USERNAME"] == "tickwheel"
    assert app["KAFKA_SASL_PASSWORD_FILE"] == str(secured_dir / "secrets" / "tickwheel.password")
    kwargs = kafka_broker.client_kwargs(app)
    assert kwargs["security_protocol"] == "SASL_SSL"
    assert kwargs["sasl_plain_username"] == "tickwheel"
    assert kwargs["sasl_plain_password"] == (secured_dir / "secrets/tickwheel.password").read_text()
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext)


def test_ssl_env_names_the_client_certificate(secured_dir: Path) -> None:
    settings = script.client_settings(secured_dir, "ssl", "127.0.0.1:1,127.0.0.1:2", "tickwheel")
    assert settings == {
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1,127.0.0.1:2",
        "KAFKA_SECURITY_PROTOCOL": "SSL",
        "KAFKA_SSL_CAFILE": str(secured_dir / "tls" / "ca.pem"),
        "KAFKA_SSL_CERTFILE": str(secured_dir / "tls" / "tickwheel.crt"),
        "KAFKA_SSL_KEYFILE": str(secured_dir / "tls" / "tickwheel.key"),
    }
    assert kafka_broker.client_kwargs(settings)["security_protocol"] == "SSL"


def test_plaintext_env_is_the_bootstrap_only(tmp_path: Path) -> None:
    settings = script.client_settings(tmp_path, "plaintext", "127.0.0.1:9092")
    assert settings == {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092"}
    assert script.env_lines(settings) == ["export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092"]
    with pytest.raises(script.BrokerError, match="no users"):
        script.client_settings(tmp_path, "plaintext", "127.0.0.1:9092", "tickwheel")
    with pytest.raises(script.BrokerError, match="unknown user"):
        script.client_settings(tmp_path, "sasl_ssl", "127.0.0.1:9092", "root")


def test_env_lines_quote_for_the_shell() -> None:
    lines = script.env_lines({"KAFKA_SSL_CAFILE": "/a dir/ca.pem", "KAFKA_X": "y"})
    assert lines == ["export KAFKA_SSL_CAFILE='/a dir/ca.pem'", "export KAFKA_X=y"]


# --------------------------------------------------------------------------- security choice


def test_a_kept_broker_keeps_its_security() -> None:
    sasl = script.Remembered("c", 1, 2, security="sasl_ssl")
    assert script.resolve_security(None, sasl, keep=True) == "sasl_ssl"
    assert script.resolve_security(None, sasl, keep=False) == "sasl_ssl"
    assert script.resolve_security("sasl_ssl", sasl, keep=True) == "sasl_ssl"
    with pytest.raises(script.BrokerError, match="--fresh --security ssl"):
        script.resolve_security("ssl", sasl, keep=True)
    assert script.resolve_security("plaintext", sasl, keep=False) == "plaintext"  # --fresh
    assert script.resolve_security(None, script.Remembered(), keep=False) == "plaintext"
    with pytest.raises(script.BrokerError, match="security must be"):
        script.resolve_security("tls", sasl, keep=False)


# --------------------------------------------------------------------------- the script's client


def test_scram_sha_256_matches_rfc_7677() -> None:
    client = script.ScramClient("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert client.first() == "n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    server_first = (
        "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    assert client.final(server_first) == (
        "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    client.verify("v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
    with pytest.raises(script.AuthenticationFailed, match="signature"):
        client.verify("v=AAAA")


def test_scram_refuses_a_server_that_changes_the_nonce() -> None:
    client = script.ScramClient("SCRAM-SHA-512", "a=b,c", "pw", nonce="abc")
    assert client.first() == "n,,n=a=3Db=2Cc,r=abc"
    with pytest.raises(script.AuthenticationFailed, match="unexpected"):
        client.final("r=xyz123,s=AAAA,i=4096")
    with pytest.raises(script.AuthenticationFailed, match="unexpected"):
        client.final("e=invalid-proof")
    with pytest.raises(script.AuthenticationFailed, match="unsupported"):
        script.ScramClient("PLAIN", "a", "b")


def _kafka_string(text: str) -> bytes:
    return struct.pack(">h", len(text)) + text.encode()


def test_create_acls_v1_encoding() -> None:
    acl = script.Acl("User:tickwheel", "topic", "orders", "read", "prefixed")
    assert script.encode_create_acls([acl]) == (
        struct.pack(">i", 1)
        + struct.pack(">b", 2)  # TOPIC
        + _kafka_string("orders")
        + struct.pack(">b", 4)  # PREFIXED
        + _kafka_string("User:tickwheel")
        + _kafka_string("*")
        + struct.pack(">bb", 3, 3)  # READ, ALLOW
    )
    with pytest.raises(script.BrokerError, match="operation must be"):
        script.Acl("User:x", "topic", "t", "fly")
    with pytest.raises(script.BrokerError, match="resource type must be"):
        script.Acl("User:x", "queue", "t", "read")


def test_describe_acls_v1_parsing() -> None:
    def entry(principal: str, operation: int, permission: int) -> bytes:
        return (
            _kafka_string(principal)
            + _kafka_string("*")
            + struct.pack(">bb", operation, permission)
        )

    response = (
        struct.pack(">ih", 0, 0)  # throttle, no error
        + struct.pack(">h", -1)  # error message: null
        + struct.pack(">i", 2)
        + struct.pack(">b", 2)
        + _kafka_string("orders")
        + struct.pack(">bi", 3, 2)  # LITERAL, 2 ACLs
        + entry("User:tickwheel", 4, 3)  # WRITE ALLOW
        + entry("User:tickwheel", 3, 2)  # READ DENY: not an allowance
        + struct.pack(">b", 3)
        + _kafka_string("tw-")
        + struct.pack(">bi", 4, 1)
        + entry("User:tickwheel", 3, 3)
    )
    assert script.parse_describe_acls(response) == [
        script.Acl("User:tickwheel", "topic", "orders", "write", "literal"),
        script.Acl("User:tickwheel", "group", "tw-", "read", "prefixed"),
    ]


def test_grant_on_a_plaintext_broker_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(script.BrokerError, match="PLAINTEXT"):
        script.grant(tmp_path, "tickwheel", "topic", "t", ["read"])


def test_a_secured_probe_of_nothing_is_no_answer(secured_dir: Path) -> None:
    auth = script.client_auth(script.read_credentials(secured_dir, "sasl_ssl"))
    port = script.free_port()
    assert script.broker_ids(f"127.0.0.1:{port}", timeout=0.5, auth=auth) is None
    assert script.probe(f"127.0.0.1:{port}", timeout=0.5, auth=auth) is False
