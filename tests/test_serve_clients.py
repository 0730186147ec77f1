"""`picasso serve` under the clients and the process managers users have: real processes on
loopback (an `mlflow server`, `picasso serve`), and real clients: a kept-alive connection
(http.client, requests.Session), a new connection per request, eight at once.

What is checked is what a client, an operator or the kernel sees: answers, exit statuses,
lines, the files left in TMPDIR, and TCP_NODELAY on the server's own end of a connection
(read from a copy of that socket, taken from the server process). Nothing is timed."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import threading
from urllib.parse import urlparse

import mlflow
import numpy as np
import pandas as pd
import pytest
import requests
from publish_helpers import CheckpointMaker, fresh_target, request
from serving_helpers import (HANG_GUARD_S, ServeProcess, call, metric, post, probabilities, server_side_nodelay,
                             wait_for)

from picasso.serving.publishing.publication import publish
from picasso.serving.server import nesting_depth

EVENTS = pd.DataFrame({"d1": [0.5, 3.0, None, 1.0], "h": ["a", None, "b", 42], "v": [3, 7, None, 0]})
BODY = json.dumps({"dataframe_split": json.loads(EVENTS.to_json(orient="split", index=False))}).encode()
HEADERS = {"Content-Type": "application/json"}
MAX_ROWS = 50
REQUESTS = 20  # on one connection


@pytest.fixture(scope="module")
def published(mlflow_server, tmp_path_factory):
    """A model with version 1, and what MLflow's own loader answers for EVENTS."""
    target = fresh_target(mlflow_server)
    publish(request(CheckpointMaker(tmp_path_factory.mktemp("clients") / "checkpoints").next(), 0.7), target)
    mlflow.set_tracking_uri(mlflow_server)
    expected = mlflow.pyfunc.load_model(f"models:/{target.model_name}/1").predict(EVENTS)
    return target, expected


@pytest.fixture(scope="module")
def served(published, mlflow_server, tmp_path_factory):
    target, _ = published
    with ServeProcess(f"models:/{target.model_name}/1", mlflow_server, tmp_path_factory.mktemp("served"),
                      "--max-rows", str(MAX_ROWS)) as server:
        yield server.wait_serving()


def _address(url: str) -> tuple[str, int]:
    parsed = urlparse(url)
    return parsed.hostname, parsed.port


def _nodelay_with_no_request_sent(pid: int, client: socket.socket) -> None:
    """The server's end of `client`'s connection gets TCP_NODELAY while no request has been
    sent on it, so before any can be answered. Read once the server has taken it up: connect()
    returns when the kernel has finished the handshake, with the connection still in the
    listening socket's queue, and asyncio hands an accepted socket to its protocol
    (connection_made, where NoDelayHTTP sets the option) a few turns of its loop after
    accept(); a loaded machine can hold the server between either step and the next. Nothing
    but the connection's own setting-up runs on it while no byte has been sent, so a server
    that set the option on a request only, or never, leaves 0 here until the hang guard."""
    last = []

    def set_on_the_servers_end() -> bool:
        try:
            last[:] = [server_side_nodelay(pid, client)]
        except AssertionError as not_accepted_yet:  # still queued in the kernel, or being accepted
            last[:] = [str(not_accepted_yet)]
        return last == [1]

    try:
        wait_for(set_on_the_servers_end, f"TCP_NODELAY on the server's end of {client.getsockname()}")
    except AssertionError as hung:
        raise AssertionError(f"{hung}; last read: {last}") from None


# -- kept-alive connections, new ones, several at once -------------------------------------


def test_an_http_client_connection_kept_alive_gets_every_answer_on_a_socket_with_tcp_nodelay(served, published):
    _, expected = published
    connection = http.client.HTTPConnection(*_address(served.url), timeout=HANG_GUARD_S)
    try:
        local = None
        for _ in range(REQUESTS):
            connection.request("POST", "/invocations", body=BODY, headers=HEADERS)
            answer = connection.getresponse()
            assert answer.status == 200
            np.testing.assert_array_equal(probabilities(json.loads(answer.read()), len(EVENTS)), expected)
            # http.client never reconnects by itself: one address throughout is one connection.
            assert local in (None, connection.sock.getsockname())
            local = connection.sock.getsockname()
        assert server_side_nodelay(served.process.pid, connection.sock) == 1
    finally:
        connection.close()


def test_a_requests_session_reuses_its_pooled_connection_which_has_tcp_nodelay(served, published):
    _, expected = published
    with requests.Session() as session:
        locals_seen = set()
        for _ in range(REQUESTS):
            answer = session.post(f"{served.url}/invocations", data=BODY, headers=HEADERS, stream=True,
                                  timeout=HANG_GUARD_S)
            sock = answer.raw.connection.sock
            locals_seen.add(sock.getsockname())
            assert answer.status_code == 200
            np.testing.assert_array_equal(probabilities(answer.json(), len(EVENTS)), expected)
        assert len(locals_seen) == 1  # the pool kept one connection open
        assert server_side_nodelay(served.process.pid, sock) == 1  # the pooled one, idle between two requests


def test_every_accepted_connection_has_tcp_nodelay_before_its_first_request_and_new_ones_are_answered(
        served, published):
    _, expected = published
    # one that sends nothing and goes, as a port check does
    with socket.create_connection(_address(served.url), timeout=HANG_GUARD_S) as bare:
        _nodelay_with_no_request_sent(served.process.pid, bare)
    seen = set()
    for _ in range(5):  # a new connection per request, as urllib makes them
        connection = http.client.HTTPConnection(*_address(served.url), timeout=HANG_GUARD_S)
        connection.connect()
        _nodelay_with_no_request_sent(served.process.pid, connection.sock)
        connection.request("POST", "/invocations", body=BODY, headers={**HEADERS, "Connection": "close"})
        seen.add(connection.sock.getsockname())
        answer = connection.getresponse()
        assert answer.status == 200 and answer.getheader("Connection") == "close"
        np.testing.assert_array_equal(probabilities(json.loads(answer.read()), len(EVENTS)), expected)
        connection.close()
    assert len(seen) == 5  # five connections
    status, body = post(served.url, BODY)  # urllib's: a new connection too
    assert status == 200
    np.testing.assert_array_equal(probabilities(body, len(EVENTS)), expected)


def test_eight_kept_alive_clients_at_once_each_get_every_answer(served, published):
    _, expected = published
    answers: list[list[tuple[int, list]]] = [[] for _ in range(8)]

    def client(mine: list) -> None:
        with requests.Session() as session:
            for _ in range(10):
                answer = session.post(f"{served.url}/invocations", data=BODY, headers=HEADERS, timeout=HANG_GUARD_S)
                mine.append((answer.status_code, answer.json()))

    threads = [threading.Thread(target=client, args=(mine,)) for mine in answers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=HANG_GUARD_S)
    assert [len(mine) for mine in answers] == [10] * 8
    for status, body in (answer for mine in answers for answer in mine):
        assert status == 200
        np.testing.assert_array_equal(probabilities(body, len(EVENTS)), expected)


# -- bodies refused with a reason -----------------------------------------------------------


@pytest.mark.parametrize("depth", [1_000, 5_000, 100_000])
def test_a_body_nested_too_deep_is_a_400_saying_how_deep(served, depth):
    status, body = post(served.url, b'{"dataframe_records": ' + b"[" * depth + b"]" * depth + b"}")
    assert status == 400, body
    assert body["error_code"] == "INVALID_PARAMETER_VALUE"
    assert f"nested {depth + 1:,} levels deep" in body["message"]
    assert call(served.url, "/ping").status == 200


def test_brackets_inside_strings_are_text_and_a_few_levels_are_fine(served):
    """Merely unusual: ids made of brackets, deeper than any JSON parser's limit if they
    were read as nesting; and a bag field, a list in a list in the body."""
    text = "[" * 3_000 + "{" * 3_000
    status, body = post(served.url, {"dataframe_records": [{"h": text, "d1": 1.0}, {"h": "]\\\"[", "bag": ["a"]}]})
    assert status == 200, body
    probabilities(body, 2)
    assert nesting_depth(json.dumps({"a": [text, {"b": ["]"]}]}).encode()) == 4


def test_too_many_rows_is_a_413_with_a_real_error_code(served):
    status, body = post(served.url, {"dataframe_records": [{"d1": 1.0}] * (MAX_ROWS + 1)})
    assert status == 413
    assert body == {"error_code": "INVALID_PARAMETER_VALUE",
                    "message": f"a request of {MAX_ROWS + 1} rows is over this server's limit of {MAX_ROWS} "
                               "(--max-rows)"}
    status, _ = post(served.url, {"dataframe_records": [{"d1": 1.0}] * MAX_ROWS})
    assert status == 200


# -- stopped as Kubernetes, systemd and a terminal stop it ----------------------------------


def _partial_request(url: str) -> tuple[socket.socket, bytes]:
    """A connection that has sent a request's headers and half its body: in flight at the
    server, which waits for the rest. The rest is returned, to send later."""
    sock = socket.create_connection(_address(url), timeout=HANG_GUARD_S)
    head = (f"POST /invocations HTTP/1.1\r\nHost: {_address(url)[0]}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(BODY)}\r\n\r\n").encode()
    half = len(BODY) // 2
    sock.sendall(head + BODY[:half])
    return sock, BODY[half:]


def _read_answer(sock: socket.socket) -> http.client.HTTPResponse:
    answer = http.client.HTTPResponse(sock)
    answer.begin()
    return answer


def _port_closed(url: str) -> bool:
    """Whether the server refuses new connections: it has taken the signal and is draining."""
    try:
        socket.create_connection(_address(url), timeout=10).close()
    except ConnectionRefusedError:
        return True
    return False


def test_sigterm_answers_the_request_in_flight_then_exits_0_says_stopped_and_removes_its_cache(
        published, mlflow_server, tmp_path):
    target, expected = published
    with ServeProcess(f"models:/{target.model_name}/1", mlflow_server, tmp_path) as server:
        server.wait_serving()
        assert len(server.caches()) == 1 and any(server.caches()[0].rglob("MLmodel"))
        sock, rest = _partial_request(server.url)
        wait_for(lambda: metric(server.url, "picasso_serve_requests_in_flight") == 1, "the request at the server")
        server.process.send_signal(signal.SIGTERM)
        wait_for(lambda: _port_closed(server.url), "the port closed after SIGTERM")
        assert server.process.poll() is None  # waiting for the request in flight
        sock.sendall(rest)
        answer = _read_answer(sock)
        assert answer.status == 200
        np.testing.assert_array_equal(probabilities(json.loads(answer.read()), len(EVENTS)), expected)
        sock.close()
        assert server.process.wait(timeout=HANG_GUARD_S) == 0, server.output()
        assert "picasso serve: stopped by SIGTERM, every request in flight answered" in server.output()
        assert "Traceback" not in server.output()
        assert server.caches() == []
        with pytest.raises(OSError):  # the port is closed
            socket.create_connection(_address(server.url), timeout=10).close()


def test_sigint_stops_as_sigterm_does(published, mlflow_server, tmp_path):
    target, _ = published
    with ServeProcess(f"models:/{target.model_name}/1", mlflow_server, tmp_path) as server:
        server.wait_serving()
        with requests.Session() as session:  # an idle kept-alive connection does not hold the stop
            assert session.post(f"{server.url}/invocations", data=BODY, headers=HEADERS).status_code == 200
            assert server.signal(signal.SIGINT) == 0, server.output()
        assert "picasso serve: stopped by SIGINT, every request in flight answered" in server.output()
        assert "Traceback" not in server.output() and server.caches() == []


def test_a_stop_while_the_first_version_is_awaited_exits_0_and_removes_the_cache(published, mlflow_server, tmp_path):
    target, _ = published
    with ServeProcess(f"models:/{target.model_name}@nobody-yet", mlflow_server, tmp_path, "--poll-s", "0.2") as server:
        server.wait_for_line("points at no version yet")
        assert server.signal(signal.SIGTERM) == 0, server.output()
        assert "picasso serve: stopped by SIGTERM before serving" in server.output()
        assert "Traceback" not in server.output() and server.caches() == []


def test_after_sigkill_a_new_server_on_the_same_port_serves_and_removes_the_cache_left_behind(
        published, mlflow_server, tmp_path):
    target, expected = published
    uri = f"models:/{target.model_name}/1"
    with ServeProcess(uri, mlflow_server, tmp_path) as killed:
        killed.wait_serving()
        assert killed.signal(signal.SIGKILL) == -signal.SIGKILL
        left = killed.caches()
        assert len(left) == 1  # nothing runs after SIGKILL: the next start removes it
    with ServeProcess(uri, mlflow_server, tmp_path, port=killed.port) as server:
        server.wait_serving()
        assert left[0] not in server.caches() and len(server.caches()) == 1
        status, body = post(server.url, BODY)
        assert status == 200
        np.testing.assert_array_equal(probabilities(body, len(EVENTS)), expected)
        assert server.signal(signal.SIGTERM) == 0 and server.caches() == []


def test_a_second_sigint_stops_waiting_for_the_request_in_flight_and_says_so(published, mlflow_server, tmp_path):
    target, _ = published
    with ServeProcess(f"models:/{target.model_name}/1", mlflow_server, tmp_path) as server:
        server.wait_serving()
        sock, _ = _partial_request(server.url)  # never finished: only a second Ctrl-C ends the wait
        wait_for(lambda: metric(server.url, "picasso_serve_requests_in_flight") == 1, "the request at the server")
        server.process.send_signal(signal.SIGINT)
        wait_for(lambda: _port_closed(server.url), "the port closed after the first SIGINT")
        assert server.process.poll() is None
        assert server.signal(signal.SIGINT) == 0, server.output()
        sock.close()
        assert "picasso serve: stopped by SIGINT, requests in flight cut short" in server.output()
        assert server.caches() == []
