"""The federation directory as a real process (`agent-reach directory --port 0`), over HTTP:
publishing and listing summaries, refusals that change nothing, token mode, Redis shared by
two directory processes and kept across a restart, Redis going away and coming back, and a
fuzz of bodies that never gets a 5xx."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_reach.auth.keys import generate_key
from agent_reach.auth.tokens import Kind
from tests.fuzz_support import check_error_shape, json_values
from tests.support import (
    REDIS_URL,
    Proc,
    _start,
    cli,
    drop_prefix,
    free_port,
    http,
    service_of,
    wait_until,
)


@contextmanager
def directory(*flags: str) -> Iterator[Proc]:
    """A real directory process on a free port (stopped with SIGTERM afterwards)."""
    proc = _start([sys.executable, "-m", "agent_reach", "directory", "--port", "0", *flags])
    try:
        yield proc
    finally:
        proc.stop()


def summary(domain: str, healthy: int = 1, url: str = "http://127.0.0.1:7700") -> dict[str, Any]:
    return {
        "domain": domain,
        "gateway_url": url,
        "at": 1_700_000_000.5,
        "intents": {
            "weather.get": {"healthy": healthy, "degraded": 0, "p95_ms": 12.5, "inflight": 0}
        },
    }


def put(d: Proc, domain: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
    return http("PUT", f"{d.url}/v1/summaries/{domain}", body, **kw)


def listed(d: Proc, **kw: Any) -> list[dict[str, Any]]:
    status, body = http("GET", f"{d.url}/v1/summaries", **kw)
    assert status == 200, body
    assert body["ok"] is True
    return list(body["summaries"])


def without_ages(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k != "age_s"} for e in entries]


def test_each_domain_gets_the_others_and_get_lists_all() -> None:
    with directory() as d:
        assert d.url.startswith("http://127.0.0.1:") and not d.url.endswith(":0")
        assert put(d, "beijing", summary("beijing")) == (200, {"ok": True, "summaries": []})
        status, body = put(d, "shanghai", summary("shanghai", healthy=2))
        assert status == 200
        assert without_ages(body["summaries"]) == [summary("beijing")]
        status, body = put(d, "beijing", summary("beijing", healthy=5))
        assert without_ages(body["summaries"]) == [summary("shanghai", healthy=2)]
        entries = listed(d)
        assert without_ages(entries) == [summary("beijing", 5), summary("shanghai", 2)]
        assert all(0 <= e["age_s"] < 5 for e in entries)
        assert http("GET", f"{d.url}/healthz") == (
            200,
            {"ok": True, "store": "memory", "domains": 2},
        )
        code = d.stop(signal.SIGINT)
        added = [x["domain"] for x in d.log_lines() if x["event"] == "directory.domain_added"]
    assert code == 0
    assert added == ["beijing", "shanghai"]


def test_refusals_name_the_fault_and_change_nothing() -> None:
    with directory("--max-body-bytes", "4096", "--max-domains", "2") as d:
        assert put(d, "beijing", summary("beijing"))[0] == 200
        before = without_ages(listed(d))
        bad_count = summary("beijing")
        bad_count["intents"]["weather.get"]["healthy"] = "many"
        no_url = summary("beijing")
        del no_url["gateway_url"]
        bad_tag = summary("beijing")
        bad_tag["intents"] = {"Not A Tag": bad_count["intents"]["weather.get"] | {"healthy": 1}}
        cases: list[tuple[str, Any, bytes | None, int, str]] = [
            ("beijing", bad_count, None, 422, "healthy"),
            ("beijing", no_url, None, 422, "gateway_url"),
            ("beijing", bad_tag, None, 422, "intents"),
            ("beijing", summary("beijing") | {"at": -1}, None, 422, "at"),
            ("beijing", summary("shanghai"), None, 422, "domain"),  # path and body disagree
            ("Bad%20Name", summary("beijing"), None, 422, "domain"),
            ("beijing", None, b"{not json", 400, "not JSON"),
            ("beijing", None, b"[" * 5000, 413, "byte limit"),
            ("beijing", summary("beijing") | {"pad": "x" * 5000}, None, 413, "byte limit"),
        ]
        for domain, body, raw, status, names in cases:
            got, answer = put(d, domain, body, raw=raw)
            assert (got, answer["ok"], answer["error"]) == (
                status,
                False,
                "payload_too_large" if status == 413 else "invalid_request",
            ), (domain, answer)
            assert names in answer["detail"] or answer.get("field") == names, answer
            assert without_ages(listed(d)) == before, (domain, answer)
        status, answer = put(d, "shanghai", summary("beijing"))
        assert answer["field"] == "domain"
        # the bound: a new domain past --max-domains is refused, a known one publishes again
        assert put(d, "shanghai", summary("shanghai"))[0] == 200
        status, answer = put(d, "tokyo", summary("tokyo"))
        assert (status, answer["error"]) == (503, "registry_full")
        assert put(d, "beijing", summary("beijing", healthy=9))[0] == 200
        assert [e["domain"] for e in listed(d)] == ["beijing", "shanghai"]
        assert http("GET", f"{d.url}/nope")[1]["error"] == "not_found"
        assert http("POST", f"{d.url}/v1/summaries", {})[0] == 405
        assert http("GET", f"{d.url}/v1/summaries/beijing")[0] == 405
        assert put(d, "", summary("beijing"))[1]["error"] == "not_found"  # /v1/summaries/
        # what a web page could send (open mode): refused
        status, answer = http(
            "GET", f"{d.url}/v1/summaries", headers={"Origin": "http://evil.example"}
        )
        assert (status, answer["error"]) == (403, "forbidden")
        full = [x for x in d.log_lines() if x["event"] == "directory.full"]
    assert full and full[0]["domain"] == "tokyo"


def test_token_mode(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    generate_key(keys)
    tokens = service_of(keys)
    beijing = tokens.issue(Kind.PEER, "beijing", 600)[0]
    operator = tokens.issue(Kind.OPERATOR, "operator:test", 600)[0]
    client = tokens.issue(Kind.CLIENT, "agent://caller", 600)[0]
    generate_key(tmp_path / "other")
    forged = service_of(tmp_path / "other").issue(Kind.PEER, "beijing", 600)[0]
    made = cli("auth", "token", "peer", "--keys", str(keys), "--domain", "shanghai", "--json")
    assert made.code == 0, made.err
    issued = made.json()
    assert (issued["kind"], issued["subject"]) == ("peer", "shanghai")
    shanghai = issued["token"]
    bad_domain = cli("auth", "token", "peer", "--keys", str(keys), "--domain", "Not A Domain")
    assert bad_domain.code == 2 and "--domain" in bad_domain.err

    with directory("--auth", "tokens", "--keys", str(keys)) as d:
        assert put(d, "beijing", summary("beijing"), token=beijing)[0] == 200
        before = without_ages(listed(d, token=operator))
        refusals = [
            ("shanghai", None, 401, "unauthorized"),
            ("shanghai", "not-a-jwt", 401, "unauthorized"),
            ("beijing", forged, 401, "unauthorized"),
            ("shanghai", beijing, 403, "forbidden"),  # beijing publishing as shanghai
            ("shanghai", client, 403, "forbidden"),
            ("shanghai", operator, 403, "forbidden"),
        ]
        for domain, token, status, error in refusals:
            got, answer = put(d, domain, summary(domain), token=token)
            assert (got, answer["error"]) == (status, error), (domain, answer)
            assert without_ages(listed(d, token=operator)) == before
        _, answer = put(d, "shanghai", summary("shanghai"), token=beijing)
        assert "another domain's name" in answer["detail"]
        status, answer = put(d, "shanghai", summary("shanghai"), token=shanghai)
        assert status == 200
        assert [e["domain"] for e in answer["summaries"]] == ["beijing"]
        # reading: a peer or an operator token
        assert [e["domain"] for e in listed(d, token=shanghai)] == ["beijing", "shanghai"]
        assert http("GET", f"{d.url}/v1/summaries")[0] == 401
        assert http("GET", f"{d.url}/v1/summaries", token=client)[0] == 403
        assert http("GET", f"{d.url}/healthz")[0] == 200  # probes need no token
        # a key added to the directory is taken up without a restart (checked every 2 s)
        generate_key(keys)
        rotated = service_of(keys).issue(Kind.PEER, "beijing", 600)[0]
        wait_until(lambda: put(d, "beijing", summary("beijing"), token=rotated)[0] == 200, 10)
        denied = [x for x in d.log_lines() if x["event"] == "directory.denied"]
    assert denied and {x["status"] for x in denied} <= {401, 403}


def test_start_refusals() -> None:
    open_off_loopback = cli("directory", "--host", "0.0.0.0", "--port", "0")
    assert open_off_loopback.code == 2
    assert "refusing to serve the directory in open mode" in open_off_loopback.err
    assert cli("directory", "--auth", "tokens", "--port", "0").code == 2
    missing = cli("directory", "--auth", "tokens", "--keys", "/nonexistent/k", "--port", "0")
    assert missing.code == 2 and "does not exist" in missing.err
    away = cli("directory", "--port", "0", "--registry", f"redis://127.0.0.1:{free_port()}/0")
    assert away.code == 1 and away.err.startswith("Error: cannot reach")
    with directory() as d:
        port = d.url.rsplit(":", 1)[1]
        taken = cli("directory", "--port", port)
    assert taken.code == 1 and "cannot listen" in taken.err


def test_two_directories_on_one_redis_and_a_restart() -> None:
    prefix = f"test-{time.time_ns()}"
    flags = ("--registry", REDIS_URL, "--registry-prefix", prefix)
    try:
        with directory(*flags) as first, directory(*flags) as second:
            assert put(first, "beijing", summary("beijing"))[0] == 200
            status, body = put(second, "shanghai", summary("shanghai"))
            assert status == 200
            assert without_ages(body["summaries"]) == [summary("beijing")]
            assert without_ages(listed(first)) == [summary("beijing"), summary("shanghai")]
            a, b = listed(first), listed(second)
            # one clock (Redis TIME): both give the same ages, up to the time between the reads
            assert all(abs(x["age_s"] - y["age_s"]) < 1 for x, y in zip(a, b, strict=True))
            assert http("GET", f"{second.url}/healthz")[1] == {
                "ok": True,
                "store": "redis",
                "domains": 2,
            }
        with directory(*flags) as again:  # every directory process stopped, one restarted
            assert without_ages(listed(again)) == [summary("beijing"), summary("shanghai")]
    finally:
        drop_prefix(prefix)


@contextmanager
def private_redis(port: int) -> Iterator[subprocess.Popen[bytes]]:
    server = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.02)
        yield server
    finally:
        client.close()
        server.terminate()
        server.wait(5)


@pytest.mark.skipif(
    subprocess.run(["which", "redis-server"], capture_output=True).returncode,
    reason="no redis-server",
)
def test_redis_away_is_503_and_back() -> None:
    port = free_port()
    with private_redis(port) as server:
        url = f"redis://127.0.0.1:{port}/0"
        d = _start(
            [sys.executable, "-m", "agent_reach", "directory", "--port", "0", "--registry", url]
        )
        try:
            assert put(d, "beijing", summary("beijing"))[0] == 200
            server.terminate()
            server.wait(5)
            for status, answer in (
                http("GET", f"{d.url}/healthz"),
                http("GET", f"{d.url}/v1/summaries"),
                put(d, "beijing", summary("beijing")),
            ):
                assert (status, answer["error"]) == (503, "backend_unavailable"), answer
            with private_redis(port):  # back (empty: nothing was saved)
                assert http("GET", f"{d.url}/healthz")[0] == 200
                assert put(d, "beijing", summary("beijing"))[0] == 200
                assert [e["domain"] for e in listed(d)] == ["beijing"]
                events = [x["event"] for x in d.log_lines()]
        finally:
            d.stop()
    assert events.count("directory.store_unavailable") == 1
    assert events.count("directory.store_recovered") == 1


# --- a fuzz of bodies and paths ------------------------------------------------------------


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    domain = draw(st.sampled_from(["fuzz", "fuzz", "other"]) | st.text(max_size=12))
    body: dict[str, Any] = summary("fuzz")
    how = draw(st.sampled_from(["replace", "drop", "add", "counts", "whole", "bytes"]))
    if how == "replace":
        body[draw(st.sampled_from(sorted(body)))] = draw(json_values)
    elif how == "drop":
        body.pop(draw(st.sampled_from(sorted(body))))
    elif how == "add":
        body[draw(st.text(min_size=1, max_size=12))] = draw(json_values)
    elif how == "counts":
        counts = body["intents"]["weather.get"]
        counts[draw(st.sampled_from(sorted(counts)))] = draw(json_values)
        if draw(st.booleans()):
            body["intents"] = {draw(st.text(max_size=20)): counts}
    elif how == "whole":
        return domain, json.dumps(draw(json_values)).encode()
    else:
        return domain, draw(st.binary(max_size=200))
    return domain, json.dumps(body).encode()


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[Proc]:
    with directory("--max-body-bytes", "4096") as d:
        yield d


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=bodies())
def test_fuzz_never_a_server_error(fuzzed: Proc, case: tuple[str, bytes]) -> None:
    domain, raw = case
    before = without_ages(listed(fuzzed))
    status, answer = http("PUT", f"{fuzzed.url}/v1/summaries/{quote(domain, safe='')}", raw=raw)
    assert status < 500, answer
    check_error_shape(status, answer)
    if status != 200:
        assert without_ages(listed(fuzzed)) == before
    else:
        assert answer["ok"] is True
        assert domain in {e["domain"] for e in listed(fuzzed)}
