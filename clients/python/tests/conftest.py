"""The suite runs against the fleet of cmd/fanout/clients_e2e_test.go, which
starts it and passes it in the environment (FANOUT_ADDR, ...). Without that
environment every test fails, saying how to run it."""

from __future__ import annotations

import json
import os
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, TypeVar

import pytest

import fanout

T = TypeVar("T")

_ENV = ("FANOUT_ADDR", "FANOUT_HTTP_URL", "FANOUT_TLS_ADDR", "FANOUT_TLS_CA", "FANOUT_API_KEY",
        "FANOUT_TEST_CONTROL", "FANOUT_TEST_SPECS")


@dataclass
class Fleet:
    """Fleet is the test fleet's environment and its control endpoint."""

    addr: str
    http_url: str
    tls_addr: str
    tls_ca: str
    api_key: str = field(repr=False)  # a failing test prints the fleet, never the key
    control_url: str
    specs: str

    def control(self, path: str, body: str = "") -> str:
        """control POSTs to the driver's control endpoint (/cut, /key,
        /revoke) and returns the reply's body."""
        req = urllib.request.Request(self.control_url + path, data=body.encode(), method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200, f"POST {path}: {resp.status}"
            return resp.read().decode().strip()

    def spec(self, name: str) -> Dict[str, Any]:
        """spec is $FANOUT_TEST_SPECS/name.json with a unique idempotency key
        and a unique label, so that a test finds its own runs."""
        with open(os.path.join(self.specs, name + ".json")) as f:
            spec: Dict[str, Any] = json.load(f)
        spec["idempotencyKey"] = "py-test-" + uuid.uuid4().hex
        return spec


@pytest.fixture(scope="session")
def fleet() -> Fleet:
    missing = [k for k in _ENV if not os.environ.get(k)]
    if missing:
        pytest.fail(
            f"the client suite needs the test fleet; {', '.join(missing)} not set. "
            "Run it with: make python-env, then go test ./cmd/fanout -count=1 -v -run 'TestClients/python' "
            "(it starts the fleet and runs this suite; clients/README.md)",
            pytrace=False,
        )
    e = os.environ
    return Fleet(e["FANOUT_ADDR"], e["FANOUT_HTTP_URL"], e["FANOUT_TLS_ADDR"], e["FANOUT_TLS_CA"],
                 e["FANOUT_API_KEY"], e["FANOUT_TEST_CONTROL"], e["FANOUT_TEST_SPECS"])


@pytest.fixture
def client(fleet: Fleet) -> Any:
    # Target and key from FANOUT_ADDR and FANOUT_API_KEY, as a user's would.
    with fanout.Client(timeout=15) as c:
        yield c


def poll(what: str, fn: Callable[[], Optional[T]], within: float = 10.0) -> T:
    """poll calls fn until it returns something other than None, failing
    with what after within seconds."""
    deadline = time.monotonic() + within
    while True:
        v = fn()
        if v is not None:
            return v
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {within}s")
        time.sleep(0.05)
