"""The client options of docs/client.md that had no test of their own: ``verify_crc``,
``http_timeout`` and ``bootstrap_new_consumers``, each through a real client against
a real HTTP server (the memory relay, or a socket that never answers)."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest

from databus.client import ClientConfig, Consumer, DatabusClient, DataEvent, MemoryCheckpointStore
from databus.core.errors import CorruptEventError, RetriesExhaustedError
from tests.support.memrelay import MemoryRelay, customer
from tests.support.procs import free_port


class Names(Consumer):
    """Keeps the name of every customer it receives."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.errors: list[BaseException] = []

    def on_data_event(self, event: DataEvent) -> Any:
        self.names.append(event.after["name"] if event.after else "")

    def on_error(self, exc: BaseException) -> None:
        self.errors.append(exc)


def _config(relay_url: str, **kw: Any) -> ClientConfig:
    return ClientConfig(relay=relay_url, poll_timeout=0.2, backoff_initial=0.01,
                        backoff_max=0.05, **kw)



@pytest.mark.parametrize("verify", [True, False])
def test_verify_crc_refuses_a_changed_body_or_delivers_it_when_off(
        memrelay: MemoryRelay, verify: bool) -> None:
    good = customer(10, 1, name="zzzz")
    assert good.count(b"zzzz") == 1
    memrelay.add_window(10, [good.replace(b"zzzz", b"zzzy")])  # the body CRC no longer matches
    memrelay.add_window(20, [customer(20, 2, name="next")])
    rec = Names()
    client = DatabusClient(_config(memrelay.url, verify_crc=verify, relay_max_retries=2), rec,
                           MemoryCheckpointStore())
    if verify:
        # a damaged answer is fetched again (it may have been damaged on the way); the same
        # damage three times in a row ends the run, naming it
        with pytest.raises(RetriesExhaustedError, match="CRC") as info:
            client.run(max_windows=2)
        assert isinstance(info.value.__cause__, CorruptEventError)
        assert rec.names == []  # nothing of the damaged window reached the consumer
        assert len(memrelay.stream_requests) == 3
    else:
        client.run(max_windows=2)
        assert rec.names == ["zzzy", "next"]  # what the option trades away


def test_http_timeout_bounds_a_relay_that_accepts_and_never_answers() -> None:
    with socket.create_server(("127.0.0.1", 0)) as mute:  # the kernel accepts; nobody reads
        url = f"http://127.0.0.1:{mute.getsockname()[1]}"
        cfg = _config(url, http_timeout=0.3, relay_max_retries=1)
        t0 = time.monotonic()
        with pytest.raises(RetriesExhaustedError, match="failed 2 times"):
            DatabusClient(cfg, Names(), MemoryCheckpointStore()).run()
        took = time.monotonic() - t0
    assert took < 5, f"two attempts with http_timeout 0.3 s took {took:.1f} s"


@pytest.mark.parametrize("bootstrap_first", [True, False])
def test_bootstrap_new_consumers_decides_where_a_new_consumer_starts(
        memrelay: MemoryRelay, bootstrap_first: bool) -> None:
    memrelay.add_window(10, [customer(10, 1, name="a")])
    memrelay.add_window(20, [customer(20, 2, name="b")])
    dead = f"http://127.0.0.1:{free_port()}"  # a bootstrap server nobody runs
    rec = Names()
    client = DatabusClient(
        _config(memrelay.url, bootstrap_url=dead, bootstrap_new_consumers=bootstrap_first,
                relay_max_retries=1), rec, MemoryCheckpointStore())
    if bootstrap_first:
        # the new consumer goes to the bootstrap server first, and that is down
        with pytest.raises(RetriesExhaustedError, match="bootstrap"):
            client.run(max_windows=2)
        assert rec.names == [] and memrelay.stream_requests == []
    else:
        client.run(max_windows=2)
        assert rec.names == ["a", "b"]  # the relay's oldest window, no bootstrap
