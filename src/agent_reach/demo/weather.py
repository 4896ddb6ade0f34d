"""Demo agent: ``weather.query`` and ``weather.forecast`` (made-up, deterministic weather).

``weather.query`` takes its city from the payload (``{"city": ..., "date": ...}``), or, when the
payload names none, from the caller's words (``ctx.intent_text``, a request matched by meaning):
:func:`understand` reads a city of a small fixed list (in Chinese or English) and a day word
(今天/today, 明天/tomorrow, 后天/the day after tomorrow) out of them. A payload with a city is
answered as it always was, and the words are then not read; with neither, the request is refused
(422), never guessed.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from typing import Any

from agent_reach.demo._cli import main
from agent_reach.sdk import Agent, ReachContext, Reject

__all__ = ["CITIES", "build", "understand"]

# a city's names -> the name answered with (the one the made-up weather is keyed on)
CITIES = {
    "成都": "成都",
    "chengdu": "成都",
    "北京": "北京",
    "beijing": "北京",
    "上海": "上海",
    "shanghai": "上海",
    "广州": "广州",
    "guangzhou": "广州",
    "深圳": "深圳",
    "shenzhen": "深圳",
    "重庆": "重庆",
    "chongqing": "重庆",
    "杭州": "杭州",
    "hangzhou": "杭州",
    "拉萨": "拉萨",
    "lhasa": "拉萨",
}
# day words -> days from today; the longer first ("day after tomorrow" holds "tomorrow")
_DAYS = (
    ("the day after tomorrow", 2),
    ("day after tomorrow", 2),
    ("后天", 2),
    ("tomorrow", 1),
    ("明天", 1),
    ("明日", 1),
    ("today", 0),
    ("今天", 0),
    ("今日", 0),
)
_NO_CITY = "payload needs a city (text), or words naming one (e.g. 成都, Beijing)"


def _fake(city: str, date: str) -> dict[str, Any]:
    h = int(hashlib.sha256(f"{city}/{date}".encode()).hexdigest(), 16)
    return {
        "city": city,
        "date": date,
        "condition": ["sunny", "cloudy", "rain"][h % 3],
        "temp_c": 5 + h % 20,
    }


def _found(word: str, text: str) -> int:
    """Where ``word`` stands in ``text`` (lower-cased), -1 when absent: Latin words as whole
    words, Chinese ones anywhere (Chinese has no spaces between words)."""
    if word.isascii():
        hit = re.search(rf"\b{re.escape(word)}\b", text)
        return hit.start() if hit else -1
    return text.find(word)


def understand(text: str, today: dt.date) -> tuple[str | None, str]:
    """The city (its answered name; None when the words name none of :data:`CITIES`) and the
    date (ISO; ``today`` when no day word is given) that the caller's words ask about: the
    first city named wins."""
    lowered = text.lower()
    named = [(at, name) for word, name in CITIES.items() if (at := _found(word, lowered)) >= 0]
    city = min(named)[1] if named else None
    days = next((n for word, n in _DAYS if _found(word, lowered) >= 0), 0)
    return city, (today + dt.timedelta(days=days)).isoformat()


def _city(payload: Any) -> str:
    if not isinstance(payload, dict) or not isinstance(payload.get("city"), str):
        raise Reject("payload needs a city (text)", status=422)
    return str(payload["city"])


def build(gateway: str | None, endpoint_id: str = "agent://weather-cn-01", port: int = 0) -> Agent:
    """The weather agent, not yet started."""
    agent = Agent(
        endpoint_id,
        gateway=gateway,
        port=port,
        description="Weather for Chinese cities: current conditions and forecasts",
    )

    @agent.handle("weather.query")
    def query(payload: Any, ctx: ReachContext) -> dict[str, Any]:
        if isinstance(payload, dict) and "city" in payload:
            weather = _fake(_city(payload), str(payload.get("date", "today")))
            return {**weather, "trace_id": ctx.trace_id}
        if not ctx.intent_text or not isinstance(payload, dict):
            raise Reject(_NO_CITY, status=422)
        city, date = understand(ctx.intent_text, dt.date.today())
        if city is None:
            raise Reject(_NO_CITY, status=422)
        weather = _fake(city, str(payload.get("date", date)))
        return {**weather, "trace_id": ctx.trace_id}

    @agent.handle("weather.forecast")
    def forecast(payload: Any, ctx: ReachContext) -> dict[str, Any]:
        city = _city(payload)
        days = payload.get("days", 3)
        if not isinstance(days, int) or isinstance(days, bool) or not 1 <= days <= 14:
            raise Reject("days must be a whole number from 1 to 14", status=422)
        return {"city": city, "days": [_fake(city, f"+{d}") for d in range(days)]}

    return agent


if __name__ == "__main__":
    main(build, "agent://weather-cn-01")
