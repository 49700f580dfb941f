"""The Host header check (`app.hosts`): DNS rebinding against a server without an API key."""

from __future__ import annotations

import httpx
import pytest

from app.hosts import AllowedHosts, host_name, parse_hosts
from tests.app.helpers import FAST, live_server, serving

RECORDS = {"dataset": {"records": [{"text": "one two three four", "reference": "one two"}]}, "generation": FAST}


def test_without_a_key_a_forged_host_is_refused_on_a_real_server_and_own_names_pass(make_app):
    app = make_app(allowed_hosts=None)  # the default rule (the test session allows TestClient's name)
    with live_server(app) as (host, port), httpx.Client(base_url=f"http://{host}:{port}", timeout=60) as client:
        forged = {"Host": f"attacker.example:{port}"}
        listing = client.get("/evaluate", headers=forged)
        submitted = client.post("/evaluate", headers=forged, json=RECORDS)
        health = client.get("/health", headers=forged)
        own = {name: client.get("/evaluate", headers={"Host": name}).status_code
               for name in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}", "app.localhost:9")}
        jobs = client.get("/evaluate").json()["jobs"]
    for response in (listing, submitted, health):
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == "host_not_allowed" and error["field"] == "Host"
        assert "attacker.example" in error["message"] and "BART_OPT_ALLOWED_HOSTS" in error["message"]
        assert response.headers["x-content-type-options"] == "nosniff"
    assert set(own.values()) == {200}, own
    assert jobs == []  # the forged submission reached nothing


def test_allowed_hosts_lists_exactly_the_names_served_and_a_key_lifts_the_default_rule(make_app):
    with serving(make_app(allowed_hosts="bart.example.com, *.internal.example")) as client:
        statuses = {name: client.get("/health", headers={"Host": name}).status_code
                    for name in ("bart.example.com:8000", "BART.example.com", "a.internal.example", "internal.example",
                                 "attacker.example", "localhost")}
    assert statuses == {"bart.example.com:8000": 200, "BART.example.com": 200, "a.internal.example": 200,
                        "internal.example": 400, "attacker.example": 400, "localhost": 400}
    with serving(make_app(allowed_hosts=None, api_key="k")) as client:  # another origin has no key: any Host
        keyed = client.get("/evaluate", headers={"Host": "attacker.example", "Authorization": "Bearer k"})
    assert keyed.status_code == 200


@pytest.mark.parametrize(("bound", "name", "allowed"), [
    ("127.0.0.1", "127.0.0.1", True), ("127.0.0.1", "127.9.9.9", True), ("127.0.0.1", "::1", True),
    ("127.0.0.1", "10.0.0.5", False), ("127.0.0.1", "attacker.example", False), ("127.0.0.1", "", False),
    ("127.0.0.1", "localhost.attacker.example", False),
    ("gpu-box.lan", "gpu-box.lan", True), ("gpu-box.lan", "attacker.example", False),
    ("0.0.0.0", "10.0.0.5", True), ("0.0.0.0", "2001:db8::1", True), ("0.0.0.0", "attacker.example", False),
    ("::", "192.168.1.20", True),
])
def test_the_default_rule_passes_loopback_the_bound_address_and_on_every_interface_any_address(bound, name, allowed):
    assert AllowedHosts.from_settings(None, api_key_set=False, host=bound).allows(name) is allowed


def test_the_address_a_connection_arrived_on_passes():
    assert AllowedHosts.from_settings(None, api_key_set=False, host="0.0.0.0").allows("172.17.0.2", "172.17.0.2")
    assert AllowedHosts.from_settings(None, False, "gpu-box.lan").allows("192.168.1.20", "192.168.1.20")


def test_host_names_lose_their_port_brackets_and_final_dot():
    assert [host_name(value) for value in ("Example.COM:80", "[::1]:8000", "localhost.", "::1", "")] == [
        "example.com", "::1", "localhost", "::1", ""]


@pytest.mark.parametrize("value", ["bart.example.com:8000", "http://bart.example.com", "a b"])
def test_an_allowed_hosts_entry_with_a_port_or_a_path_is_refused_at_start(value, make_app):
    with pytest.raises(ValueError, match="BART_OPT_ALLOWED_HOSTS"):
        parse_hosts(value)
    with pytest.raises(ValueError, match="BART_OPT_ALLOWED_HOSTS"):
        make_app(allowed_hosts=value)
