"""A public address serve cannot listen on names the setting that is wrong: the host when the address is not this
machine's (or no address at all), the port when another process holds it. Real binds, no mocks."""
from __future__ import annotations

import socket

import pytest

from turingbox.errors import UsageError
from turingbox.serve.controller import bind_public

TEST_NET = "192.0.2.1"          # RFC 5737 documentation address: assigned to no machine


def refusal(host: str, port: int) -> str:
    with pytest.raises(UsageError) as err:
        bind_public(host, port).close()
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    return str(err.value)


def test_an_address_of_another_machine_names_the_host():
    message = refusal(TEST_NET, 0)
    assert message.startswith(f"The sidecar cannot listen on {TEST_NET}:0: {TEST_NET} is not an address of this "
                              "machine (")
    assert message.endswith("choose another --host / TURINGBOX_HOST (an address of this machine, or 0.0.0.0 for all).")
    assert "TURINGBOX_PORT" not in message


def test_a_name_that_resolves_to_nothing_names_the_host():
    message = refusal("no-such-host.invalid", 8000)
    assert "no-such-host.invalid is not an address and does not resolve to one" in message
    assert "--host / TURINGBOX_HOST" in message and "TURINGBOX_PORT" not in message


def test_a_port_in_use_names_the_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        message = refusal("127.0.0.1", port)
    assert message.startswith(f"The sidecar cannot listen on 127.0.0.1:{port}: port {port} is in use by another "
                              "process (")
    assert message.endswith("choose another --port / TURINGBOX_PORT.") and "TURINGBOX_HOST" not in message


def test_serve_with_a_foreign_host_exits_2_with_the_sentence(serve_factory):
    s = serve_factory(args=["--host", TEST_NET])
    assert s.wait_exit(20) == 2
    out = s.output()
    assert f"turingbox: The sidecar cannot listen on {TEST_NET}:{s.port}: {TEST_NET} is not an address of this " \
           "machine" in out, out
    assert "Traceback" not in out and not s.events("started")
