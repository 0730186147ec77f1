"""The parameter server's transport: messages without pickle, TLS and the token, and
workers that join a running job (extra or replacing a dead one)."""

from __future__ import annotations

import datetime
import ipaddress
import signal

import pytest
import torch
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from picasso.checkpoint import latest_checkpoint, load_checkpoint
from picasso.connectors.testing.loopback import free_port
from picasso.distributed import transport, wire
from picasso.distributed.aggregation import Contribution, RowGradient
from picasso.distributed.param_server import JobDescription
from picasso.distributed.transport import Security, TransportError
from picasso.pipelines.cli import distributed as distributed_cli
from test_gba_ps import _finish, _ps, _start, _wait_for_log, _worker, tiny_spec  # noqa: F401
from test_trainer import SPEC, CONFIG


# -- messages ---------------------------------------------------------------------------------

def test_a_message_comes_back_as_it_was_sent():
    grads = torch.randn(3, 4)
    message = (Contribution("worker0/a", 3, 64, {"w": torch.randn(2, 2)},
                            {"t": RowGradient(torch.tensor([1, 5, 9]), grads, torch.zeros(3, dtype=torch.int64))},
                            {"src": 640}, sequence=2),
               {"empty": torch.zeros(0, 8), "scalar": torch.tensor(7), "half": torch.ones(2, dtype=torch.bfloat16)},
               [None, True, 1.5, "x"], ("a", 1))
    back = wire.decode(wire.encode(message))
    contribution, tensors, items, pair = back
    assert contribution.worker == "worker0/a" and contribution.sequence == 2 and contribution.positions == {"src": 640}
    assert torch.equal(contribution.sparse["t"].grads, grads) and torch.equal(contribution.dense["w"],
                                                                             message[0].dense["w"])
    assert tensors["empty"].shape == (0, 8) and int(tensors["scalar"]) == 7 and tensors["half"].dtype == torch.bfloat16
    assert items == [None, True, 1.5, "x"] and pair == ("a", 1)


def test_the_job_description_travels_whole():
    from picasso.distributed.layout import ShardLayout
    from picasso.trainer import Trainer

    trainer = Trainer(SPEC, CONFIG)
    description = JobDescription(SPEC, CONFIG, ShardLayout.from_model(trainer.model, 2), 30.0)
    assert wire.decode(wire.encode(description)) == description


def test_only_registered_types_are_sent_or_built():
    class Sneaky:
        pass

    with pytest.raises(TypeError, match="not a registered message type"):
        wire.encode(Sneaky())
    forged = wire.encode(("x",)).replace(b'{"u":["x"]}', b'{"c":"Popen","f":{}}')
    forged = forged[:4] + (len(b'{"c":"Popen","f":{}}')).to_bytes(8, "little") + forged[12:]
    with pytest.raises(wire.WireError, match="'Popen' is not one this side reads"):
        wire.decode(forged)
    with pytest.raises(wire.WireError, match="bad magic"):
        wire.decode(b"\x80\x04pickle")
    with pytest.raises(wire.WireError, match="ends inside a tensor"):
        wire.decode(wire.encode(torch.ones(4))[:-1])


# -- who gets in ------------------------------------------------------------------------------

def _echo_server(security: Security, host: str = "127.0.0.1"):
    port = free_port()
    return transport.serve({"echo": lambda value: value}, host, port, security, threads=2), port


def test_a_call_without_the_token_is_refused_and_one_with_it_answered():
    server, port = _echo_server(Security(token="s3cret"))
    try:
        for presented in (None, "guess"):
            connection = transport.Connection("127.0.0.1", port, Security(token=presented), 10)
            with pytest.raises(TransportError, match="refused the caller: no valid token") as refused:
                connection.call("echo", 1)
            assert refused.value.code.name == "UNAUTHENTICATED"
            connection.close()
        connection = transport.Connection("127.0.0.1", port, Security(token="s3cret"), 10)
        assert torch.equal(connection.call("echo", torch.arange(5)), torch.arange(5))
        connection.close()
    finally:
        server.stop(None)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1: (its path, its key's path)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "picasso-ps")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    folder = tmp_path_factory.mktemp("tls")
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    return str(folder / "cert.pem"), str(folder / "key.pem")


def test_over_tls_only_a_client_that_trusts_the_server_and_has_the_token_is_answered(certificate):
    cert, key = certificate
    server, port = _echo_server(Security(token="s3cret", tls_cert=cert, tls_key=key))
    try:
        trusted = transport.Connection("127.0.0.1", port, Security(token="s3cret", tls_cert=cert), 10)
        assert trusted.call("echo", "over tls") == "over tls"
        tokenless = transport.Connection("127.0.0.1", port, Security(tls_cert=cert), 10)
        with pytest.raises(TransportError, match="no valid token"):
            tokenless.call("echo", 1)
        plain = transport.Connection("127.0.0.1", port, Security(token="s3cret"), 3)
        with pytest.raises(TransportError, match="unreachable|did not answer"):  # no TLS: no connection at all
            plain.call("echo", 1)
        for connection in (trusted, tokenless, plain):
            connection.close()
    finally:
        server.stop(None)


@pytest.mark.parametrize("security, message", [
    (Security(), "needs TLS"),
    (Security(token="s3cret"), "needs TLS"),
])
def test_a_server_off_loopback_without_tls_and_a_token_refuses_to_start(security, message):
    with pytest.raises(ValueError, match=message):
        transport.serve({}, "0.0.0.0", free_port(), security, threads=1)


def test_ps_off_loopback_without_tls_says_why(tiny_spec, tmp_path):
    with pytest.raises(SystemExit, match="not loopback.*needs TLS"):
        distributed_cli.main(["ps", "--spec", tiny_spec, "--workdir", str(tmp_path), "--host", "0.0.0.0", "--port",
                              str(free_port()), "--workers", "1", "--hidden", "16,8"])


def test_a_job_over_tls_with_a_token_trains_and_a_worker_without_the_token_is_refused(tiny_spec, tmp_path, certificate,
                                                                                      monkeypatch):
    cert, key = certificate
    port = free_port(count=2)
    monkeypatch.setenv(transport.TOKEN_ENV, "s3cret")
    server = _ps(tiny_spec, tmp_path, port, 2, 1, "--tls-cert", cert, "--tls-key", key)
    monkeypatch.delenv(transport.TOKEN_ENV)
    refused = _worker(port, 0, 300, "--tls-ca", cert)
    code, _, err = _finish(refused)
    assert code != 0 and "refused the caller: no valid token" in err, err
    monkeypatch.setenv(transport.TOKEN_ENV, "s3cret")
    code, stats, err = _finish(_worker(port, 0, 300, "--tls-ca", cert))
    assert code == 0 and stats["samples"] == 300, err
    code, summary, err = _finish(server)
    assert code == 0 and summary["samples"] == 300, err


# -- workers that come and go -----------------------------------------------------------------

def test_a_killed_worker_is_replaced_by_a_new_process_that_reads_on_from_the_server(tiny_spec, tmp_path):
    """worker1 is killed while training; a new process with its rank joins the running job,
    reads its source on from the server's positions and trains it to the end. An extra
    worker (rank 2, beyond --workers) joins half-way too. No restart of anything else."""
    port = free_port(count=2)
    # The replacement takes the dead one's name when it joins, whatever the lease; a long
    # lease keeps the frozen worker below in the job.
    server = _ps(tiny_spec, tmp_path, port, 2, 2, "--lease", "120", "--decay", "exp:limit=none")
    steady = _worker(port, 0, 20_000, "--straggler", "0:3")
    doomed = _worker(port, 1, 20_000)
    _wait_for_log(doomed, "training from step")
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    # Frozen until the others train: the job ends when its workers are done, and a steady
    # worker that finished while new processes were still starting (a busy machine takes
    # many seconds to start one) would leave them no job to join.
    steady.send_signal(signal.SIGSTOP)
    replacement = _worker(port, 1, 2_000)
    extra = _worker(port, 2, 1_000)
    for process in (replacement, extra):
        _wait_for_log(process, "training from step")
    steady.send_signal(signal.SIGCONT)
    results = {name: _finish(process) for name, process in
               (("replacement", replacement), ("extra", extra), ("steady", steady))}
    code, summary, err = _finish(server)
    assert code == 0, err
    for name, (worker_code, stats, worker_err) in results.items():
        assert worker_code == 0, (name, worker_err)
    replacement_stats = results["replacement"][1]
    checkpoint = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    assert checkpoint.positions == {"planted-100": 20_000, "planted-101": replacement_stats["start"] + 2_000,
                                    "planted-102": 1_000}
    assert set(summary["contributed"]) == {"worker0", "worker1", "worker2"}
    # Every sample once: what the dead one had trained out of order was acknowledged, not trained again.
    assert checkpoint.state["samples"] == sum(checkpoint.positions.values())
    assert checkpoint.applied == {source: [[0, end]] for source, end in checkpoint.positions.items()}


def test_a_worker_with_a_negative_rank_is_refused_by_name():
    with pytest.raises(SystemExit, match="--rank must be >= 0"):
        distributed_cli.main(["gba-worker", "--port", "1", "--rank", "-1"])
