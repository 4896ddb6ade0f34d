"""The dashboard in a real headless Chromium, on a real gateway with real agent processes.

The browser is Debian's ``chromium`` (``.ci/run`` installs it), driven by Playwright pointed at
its executable: Playwright's own browser download cannot work here. Without a Chromium (or
without the ``browser`` extra) the module is skipped, saying why. ``AGENT_REACH_CHROMIUM``
names another executable.

The NATS link (``GET /healthz``'s ``nats``) is shown by a gateway on a private nats-server,
stopped and started again under the open page. The page shows what the API answers whatever
the agents' transport, so tests/support.py's NATS switch skips this module (it ran in the HTTP
pass).

The screenshot test leaves a screenshot of a realistic state (agents healthy, degraded and suspect,
recent requests, one trace open): in pytest's temporary directory, or at
``AGENT_REACH_SCREENSHOT`` (``docs/img/dashboard.png`` is made that way).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support import (
    TEST_SERVE,
    Proc,
    gateway,
    http,
    private_nats,
    start_agent,
    status_of,
    wait_until,
)


def _find_chromium() -> str | None:
    candidates = [
        os.environ.get("AGENT_REACH_CHROMIUM"),
        "/usr/bin/chromium",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
    ]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


CHROMIUM = _find_chromium()
if CHROMIUM is None:
    pytest.skip(
        "no Chromium executable (apt-get install -y chromium, or set AGENT_REACH_CHROMIUM)",
        allow_module_level=True,
    )
if TEST_SERVE is not None:
    pytest.skip(
        "HTTP only: the page renders the API's answers whatever the agents' transport"
        " (its NATS element is tested on a private nats-server in the HTTP pass)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed: pip install -e '.[browser]'"
)
expect = sync_api.expect

WAIT_MS = 10_000  # bound on any one thing the page should show
HEALTHY = ("agent://weather-cn-01", "agent://weather-cn-02", "agent://note-01")
SLOW = "agent://report-01"  # slower than --slow-threshold-ms: degraded once it has answered
PILL = "e => [e.textContent, getComputedStyle(e).color]"  # the label and its colour, at once
PAUSED = "agent://pause-01"  # its process is stopped (SIGSTOP): heartbeats stop
# the NATS link's element: its text and its colour, at once
NATS_LINK = "e => [e.textContent, getComputedStyle(e).color]"
NATS_RED = "rgb(255, 123, 114)"


@pytest.fixture(scope="module")
def gw() -> Iterator[Proc]:
    # heartbeats every 0.5 s: suspect 1 s after the last one; down only after 60 s, so that the
    # stopped agent stays suspect (magenta) long enough to be seen and photographed. Slow above
    # 400 ms: over an agent's first (cold) deliveries, under the slow agent's 600 ms
    with gateway(
        "--heartbeat-interval", "0.5", "--down-after", "60", "--slow-threshold-ms", "400"
    ) as proc:
        agents = [
            start_agent(proc.url, HEALTHY[0], intents="weather.query,weather.forecast"),
            start_agent(proc.url, HEALTHY[1], intents="weather.query"),
            start_agent(proc.url, HEALTHY[2], intents="note.create"),
            start_agent(proc.url, SLOW, "slow", intents="report.build", delay_ms=600),
            start_agent(proc.url, PAUSED, intents="weather.query,note.create"),
        ]
        proc.extra["agents"] = dict(zip((*HEALTHY, SLOW, PAUSED), agents, strict=True))
        try:
            yield proc
        finally:
            for agent in agents:
                agent.popen.send_signal(signal.SIGCONT)  # a stopped process cannot stop itself
                agent.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM)
        try:
            yield chromium
        finally:
            chromium.close()


@contextmanager
def open_page(browser: Any, url: str) -> Iterator[Any]:
    """A fresh page on ``url``; fails the test on any console error or page error."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.goto(url)
    try:
        yield page
    finally:
        context.close()
    # Chromium drops a poll with ERR_NETWORK_CHANGED when the host's interfaces change: the
    # network-namespace tests beside this one add and remove veth pairs (one CI run saw it).
    # The machine's, not the page's: the next poll goes through
    assert [p for p in problems if "ERR_NETWORK_CHANGED" not in p] == []


@pytest.fixture
def page(browser: Any, gw: Proc) -> Iterator[Any]:
    """A fresh page on the dashboard; fails the test on any console error or page error."""
    with open_page(browser, f"{gw.url}/") as page:
        yield page


def agent_row(page: Any, endpoint_id: str) -> Any:
    return page.locator(f'#agents-body tr[data-endpoint-id="{endpoint_id}"]')


def test_the_page_loads_and_shows_the_registered_agents(page: Any, gw: Proc) -> None:
    for endpoint_id in (*HEALTHY, SLOW, PAUSED):
        row = agent_row(page, endpoint_id)
        expect(row).to_be_visible()
        expect(row.locator(".id")).to_have_text(endpoint_id)
    row = agent_row(page, HEALTHY[0])
    expect(row.locator("td.intents")).to_have_text("weather.query, weather.forecast")
    expect(row.locator(".pill")).to_have_text("healthy")
    expect(row.locator("td.age")).to_contain_text("s ago")
    expect(page.locator("#summary")).to_contain_text("5 agents")
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    # the NATS link: shown only when the gateway runs with --nats (the page has polled by now)
    expect(page.locator("#nats")).to_be_hidden()
    # intents: who serves each, how many are routable now
    intent = page.locator('#intents-body tr[data-key="weather.query"]')
    expect(intent.locator(".chip")).to_have_count(3)
    expect(intent).to_have_attribute("data-routable", "3")
    expect(intent.locator("td").nth(2)).to_have_text("3 of 3")
    # the same page at /dashboard
    page.goto(f"{gw.url}/dashboard")
    expect(agent_row(page, HEALTHY[2])).to_be_visible()


def test_untrusted_text_is_shown_as_text(page: Any, gw: Proc) -> None:
    hostile = '<img src=x onerror="window.__pwned=1"><b>bold</b>'
    record = {
        "endpoint_id": "agent://hostile-01",
        "capabilities": ["hostile.test"],
        "endpoint_url": "http://127.0.0.1:9/reach",
        "description": hostile,
    }
    assert http("POST", f"{gw.url}/v1/register", record)[0] == 200
    try:
        row = agent_row(page, "agent://hostile-01")
        expect(row.locator(".desc")).to_have_text(hostile)
        assert row.locator("img, b").count() == 0
        assert page.evaluate("window.__pwned") is None
    finally:
        http("POST", f"{gw.url}/v1/deregister", {"endpoint_id": "agent://hostile-01"})
    expect(row).to_have_count(0)  # gone from the page without a reload


def test_the_form_delivers_a_reach_and_explains_the_route(page: Any) -> None:
    page.get_by_label("Payload (JSON)").fill(json.dumps({"city": "<b>成都</b>"}))
    page.get_by_label("Timeout (ms)").fill("3000")
    intent = page.locator("#f-intent")
    intent.fill("weather.query")
    intent.press("Enter")  # the keyboard way: Enter in a field submits the form
    answer = page.locator("#reach-answer")
    expect(answer).to_contain_text("answered by agent://")
    result = json.loads(answer.locator("pre.json").text_content() or "")
    assert result["payload"] == {"city": "<b>成都</b>"}
    assert result["agent"] in (*HEALTHY, PAUSED)
    assert answer.locator("pre b").count() == 0
    route = page.locator("#reach-route")
    expect(route).to_contain_text("Route explanation")
    expect(route.locator("table.candidates tbody tr")).to_have_count(3)
    expect(route.locator("dl.facts")).to_contain_text("chosen")

    # an answer that is an error shows its code; a payload that is not JSON is not sent
    page.get_by_label("Payload (JSON)").fill("{not json")
    page.get_by_role("button", name="Send").click()
    expect(page.locator("#f-payload-error")).to_contain_text("not JSON")
    expect(page.get_by_label("Payload (JSON)")).to_be_focused()


def test_a_recent_request_opens_its_timeline(page: Any, gw: Proc) -> None:
    code, _ = http(
        "POST",
        f"{gw.url}/v1/send",
        {"intent": "note.create", "trace_id": "trace_dash_click", "payload": {"title": "t"}},
    )
    assert code == 200
    row = page.locator('#requests-body tr[data-trace-id="trace_dash_click"]')
    expect(row).to_be_visible()
    expect(row).to_contain_text("note.create")
    expect(row.locator(".pill")).to_have_text("ok")
    row.locator("td").nth(1).click()  # a click anywhere on the row
    events = page.locator("#timeline-events li")
    expect(page.locator("#timeline-trace")).to_have_text("trace_dash_click")
    expect(events).to_have_count(5)
    kinds = [events.nth(i).get_attribute("data-kind") for i in range(5)]
    assert kinds == ["received", "route", "attempt", "agent", "answer"]
    expect(events.nth(2)).to_contain_text("ok")
    expect(row).to_have_class("clickable selected")

    # the keyboard way: the row's trace button, then Enter; focus moves to the timeline
    http("POST", f"{gw.url}/v1/send", {"intent": "no.such-intent", "trace_id": "trace_dash_kb"})
    button = page.locator('#requests-body tr[data-trace-id="trace_dash_kb"] button')
    button.focus()
    button.press("Enter")
    expect(page.locator("#timeline-trace")).to_have_text("trace_dash_kb")
    expect(events.nth(1)).to_contain_text("no_capable_agent")
    expect(page.locator("#timeline-title")).to_be_focused()


def test_an_agent_changes_colour_when_its_heartbeats_stop(
    page: Any, gw: Proc, tmp_path: Path
) -> None:
    # some traffic, so that the screenshot shows a realistic state
    for payload in ({"city": "成都"}, {"city": "Lisbon"}, {"city": "Nairobi"}):
        http("POST", f"{gw.url}/v1/send", {"intent": "weather.query", "payload": payload})
    for _ in range(2):
        http("POST", f"{gw.url}/v1/send", {"intent": "report.build", "timeout_ms": 3000})
    http("POST", f"{gw.url}/v1/send", {"intent": "weather.querry"})  # a typo: refused

    row = agent_row(page, PAUSED)
    pill = row.locator(".pill")
    healthy = wait_until(lambda: (s := pill.evaluate(PILL))[0] == "healthy" and s, timeout=10)
    assert healthy[1] == "rgb(26, 127, 55)"  # green (--healthy)

    paused = gw.extra["agents"][PAUSED]
    paused.popen.send_signal(signal.SIGSTOP)
    try:
        expect(row).to_have_attribute("data-status", "suspect")
        # suspect until it heartbeats again (down only after 60 s): a stable state to read
        assert pill.evaluate(PILL) == ["suspect", "rgb(160, 34, 143)"]  # a word and magenta
        # not routable now: two of the three weather.query agents are
        weather = page.locator('#intents-body tr[data-key="weather.query"]')
        expect(weather).to_have_attribute("data-routable", "2")
        expect(agent_row(page, SLOW)).to_have_attribute("data-status", "degraded")

        # the picture: a request's timeline open, and a reach tried with the form
        page.locator('#requests-body tr:has-text("report.build")').first.click()
        expect(page.locator("#timeline-events li")).to_have_count(5)
        page.locator("#f-intent").fill("weather.query")
        page.get_by_label("Payload (JSON)").fill('{"city": "Lisbon", "date": "2025-01-02"}')
        page.get_by_role("button", name="Send").click()
        expect(page.locator("#reach-route table.candidates tbody tr")).to_have_count(3)
        save_screenshot(page, tmp_path)
    finally:
        paused.popen.send_signal(signal.SIGCONT)
    # heartbeats again: routable again (healthy, or degraded while a slow sample lasts), shown
    # without a reload
    wait_until(lambda: status_of(gw.url, PAUSED) in ("healthy", "degraded"), timeout=10)
    expect(row).to_have_attribute("data-status", re.compile("^(healthy|degraded)$"))


def test_the_nats_link_shows_connected_and_turns_red_when_it_drops(browser: Any) -> None:
    with (
        private_nats() as server,
        gateway("--nats", server.url) as proc,
        open_page(browser, f"{proc.url}/") as page,
    ):
        link = page.locator("#nats")
        expect(link).to_have_attribute("data-state", "connected")
        expect(link).to_be_visible()
        text, colour = link.evaluate(NATS_LINK)
        assert text == f"NATS connected · {server.url}", text
        assert colour != NATS_RED
        assert "reconnects: 0" in (link.get_attribute("title") or "")

        server.stop()  # the gateway keeps serving HTTP, and says its link is down
        expect(link).to_have_attribute("data-state", "disconnected")
        text, colour = link.evaluate(NATS_LINK)
        assert text.startswith("NATS disconnected"), text
        assert colour == NATS_RED
        assert http("GET", f"{proc.url}/healthz")[1]["nats"]["connected"] is False

        server.start()  # on the same port: the gateway's link comes back by itself
        expect(link).to_have_attribute("data-state", "connected")
        expect(link).to_contain_text("1 reconnect")
        assert link.evaluate(NATS_LINK)[1] != NATS_RED


def save_screenshot(page: Any, tmp_path: Path) -> None:
    target = os.environ.get("AGENT_REACH_SCREENSHOT")
    path = Path(target) if target else tmp_path / "dashboard.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    page.locator("#f-intent").blur()
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000


def test_token_mode_dashboard_takes_the_operator_token_from_the_fragment(
    browser: Any, tmp_path: Path
) -> None:
    from agent_reach.auth.keys import KeyRing, generate_key
    from agent_reach.auth.tokens import Kind, TokenService

    keys = tmp_path / "keys"
    generate_key(keys)
    policy = tmp_path / "policy.toml"
    policy.write_text('[[claim]]\nendpoints = ["agent://dash-*"]\nintents = ["dash.*"]\n')
    ring = KeyRing(keys)
    ring.load()
    operator, _ = TokenService(ring).issue(Kind.OPERATOR, "operator:test", 600)
    with gateway("--auth", "tokens", "--keys", str(keys), "--policy", str(policy)) as proc:
        enroll = http(
            "POST",
            f"{proc.url}/v1/tokens",
            {"kind": "enroll", "endpoints": ["agent://dash-*"], "intents": ["dash.*"]},
            token=operator,
        )[1]["token"]
        agent = start_agent(proc.url, "agent://dash-01", intents="dash.echo", token=enroll)
        context = browser.new_context()
        try:
            page = context.new_page()
            page.set_default_timeout(WAIT_MS)
            page.goto(f"{proc.url}/dashboard")  # no token: the page says what it needs
            expect(page.locator("#live")).to_contain_text("token mode")
            expect(agent_row(page, "agent://dash-01")).to_have_count(0)
            page.goto(f"{proc.url}/dashboard#token={operator}")
            expect(agent_row(page, "agent://dash-01")).to_be_visible()
            expect(page.locator("#live")).to_have_attribute("data-state", "live")
            assert "token=" not in page.url  # taken out of the address bar at once
        finally:
            context.close()
            agent.stop()


def test_the_domains_of_a_federation_show_with_their_state(browser: Any) -> None:
    from tests.federation_support import directory, domain_flags, send, wait_offered

    with (
        directory() as d,
        gateway(*domain_flags("beijing", d.url)) as beijing,
        gateway(*domain_flags("chengdu", d.url)) as chengdu,
    ):
        agent = start_agent(chengdu.url, "agent://weather-cn-01", intents="weather.query")
        try:
            wait_offered(beijing, "chengdu", "weather.query")
            code, answer = send(beijing, {"intent": "weather.query"})
            assert code == 200, answer
            with open_page(browser, f"{beijing.url}/") as page:
                panel = page.locator("#domains-panel")
                expect(panel).to_be_visible()
                expect(page.locator("#domains-self")).to_contain_text("domain beijing")
                row = page.locator('#domains-body tr[data-domain="chengdu"]')
                expect(row).to_have_attribute("data-state", "fresh")
                expect(row).to_contain_text("weather.query")
                # the forwarded request, its endpoint named with its domain
                expect(page.locator("#requests-body")).to_contain_text(
                    "agent://weather-cn-01@chengdu"
                )
                chengdu.stop(signal.SIGKILL)  # its summary stops: stale after 3 intervals
                expect(row).to_have_attribute("data-state", re.compile("stale|unreachable"))
        finally:
            agent.stop()


def test_a_gateway_in_no_federation_shows_no_domains(page: Any) -> None:
    expect(page.locator("#agents-body tr").first).to_be_visible()
    assert page.locator("#domains-panel").is_hidden()
