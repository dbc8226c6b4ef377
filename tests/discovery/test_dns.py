"""DNS discovery with an injected resolver: join, leave, flapping, a failed resolution."""

from __future__ import annotations

import anyio
import pytest

from burstsched.discovery import DnsDiscovery, address_name

from .helpers import eventually

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Records:
    """The answers of a fake DNS server: the current records, or an error."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = list(addresses)
        self.fail = False
        self.asked = 0

    async def __call__(self, host: str, port: int) -> list[str]:
        assert (host, port) == ("vllm.default.svc", 8000)
        self.asked += 1
        if self.fail:
            raise OSError("Name or service not known")
        return list(self.addresses)


async def test_join_leave_and_flap_yield_each_change_once() -> None:
    records = _Records("10.0.0.5")
    discovery = DnsDiscovery("vllm.default.svc", 8000, interval_s=0.001, resolver=records)
    seen: list[list[str]] = []

    async def follow() -> None:
        async for endpoints in discovery.endpoint_sets():
            seen.append([e.endpoint_name for e in endpoints])

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow)
        await eventually(lambda: len(seen) == 1, within_s=5)
        records.addresses = ["10.0.0.6", "10.0.0.5"]  # join
        await eventually(lambda: len(seen) == 2, within_s=5)
        records.addresses = ["10.0.0.6"]  # leave
        await eventually(lambda: len(seen) == 3, within_s=5)
        records.addresses = ["10.0.0.6", "10.0.0.5"]  # flap back
        await eventually(lambda: len(seen) == 4, within_s=5)
        records.fail = True  # failed resolutions keep the last set: nothing is yielded
        records.addresses = []
        asked = records.asked
        await eventually(lambda: records.asked > asked + 5, within_s=5)
        assert len(seen) == 4
        records.fail = False  # an empty answer does empty it
        await eventually(lambda: len(seen) == 5, within_s=5)
        tg.cancel_scope.cancel()
    assert seen == [
        ["host-10-0-0-5"],
        ["host-10-0-0-5", "host-10-0-0-6"],
        ["host-10-0-0-6"],
        ["host-10-0-0-5", "host-10-0-0-6"],
        [],
    ]


def test_names_and_urls_from_addresses() -> None:
    discovery = DnsDiscovery("h", 9000, interval_s=1.0, resolver=_Records())
    endpoints = discovery.endpoints(["fd00::5", "10.1.2.3", "10.1.2.3"])
    assert [(e.endpoint_name, e.url) for e in endpoints] == [
        ("host-10-1-2-3", "http://10.1.2.3:9000"),
        ("host-fd00--5", "http://[fd00::5]:9000"),
    ]
    assert address_name("10.0.0.5") == "host-10-0-0-5"
