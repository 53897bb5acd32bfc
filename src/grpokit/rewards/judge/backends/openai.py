"""A judge behind any OpenAI-compatible chat completions endpoint.

Requests of one batch run concurrently (asyncio + httpx) on an event loop owned by the backend,
in its own thread, so the synchronous reward call waits about as long as the slowest request,
not the sum; a semaphore bounds how many are in flight. Failed attempts (timeout, refused
connection, HTTP 429/5xx) are retried with exponential back-off; what still fails comes back as
an error reply, never an exception, so a judge outage costs scores, not the training run.

Servers differ in the request fields they accept. OpenAI's reasoning models answer HTTP 400 to
``max_tokens`` (they want ``max_completion_tokens``) and to any ``temperature`` but their
default; a server may refuse ``logprobs``. Such a refusal is read from the error reply, the
request is sent again once without the refused field, and the choice is kept (and logged once)
for the backend's lifetime.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import email.utils
import json
import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Literal, TypeVar

import httpx

from grpokit.errors import UserError
from grpokit.rewards.judge.backends.base import JudgeReply
from grpokit.rewards.judge.config import OpenAIJudge
from grpokit.rewards.judge.expected import TokenLogprob

logger = logging.getLogger(__name__)

T = TypeVar("T")

_RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
_MAX_BACKOFF_S = 30.0
# A server's Retry-After is followed up to this long (an API's minute window, with margin);
# longer would stall the run for what is likely a misconfigured server.
_MAX_RETRY_AFTER_S = 300.0


class RateLimiter:
    """An endpoint's request and token budgets per minute, and the pauses its 429s ask for.

    Requests start at least ``60 / requests_per_minute`` seconds apart (a steady pace rather
    than a burst at the start of each minute, which APIs meter anyway). Tokens come from a
    bucket holding a minute's budget, refilled continuously: a request takes its estimate
    (prompt bytes / 4 plus the reply's token limit, as APIs count the limit up front) before it
    starts, and :meth:`settle` corrects the bucket by what the server's ``usage`` says it used.
    Waiters are served in order. Runs on the backend's event loop (one thread).
    """

    def __init__(
        self,
        requests_per_minute: int | None,
        tokens_per_minute: int | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._interval = 60.0 / requests_per_minute if requests_per_minute else 0.0
        self._capacity = float(tokens_per_minute) if tokens_per_minute else 0.0
        self._clock = clock
        self._next_start = -math.inf
        self._tokens = self._capacity
        self._refilled = clock()
        self._paused_until = -math.inf
        self._lock: asyncio.Lock | None = None

    def _cost(self, tokens: int) -> float:
        # A request larger than the whole bucket would wait forever: it takes the whole bucket.
        return min(float(tokens), self._capacity)

    def _wait(self, now: float, estimate: int) -> float:
        waits = [self._paused_until - now, self._next_start - now]
        if self._capacity:
            rate = self._capacity / 60.0
            self._tokens = min(self._capacity, self._tokens + (now - self._refilled) * rate)
            self._refilled = now
            waits.append((self._cost(estimate) - self._tokens) / rate)
        return max(waits)

    async def acquire(self, estimate: int) -> None:
        """Wait until a request estimated at ``estimate`` tokens may start, and book it."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            while (wait := self._wait(self._clock(), estimate)) > 0:
                await asyncio.sleep(wait)
            self._next_start = self._clock() + self._interval
            self._tokens -= self._cost(estimate)

    def settle(self, estimate: int, used: int) -> None:
        """Correct the token bucket once the server said what a request used."""
        if self._capacity:
            self._tokens += self._cost(estimate) - self._cost(used)

    def pause(self, seconds: float) -> None:
        """Start no request for ``seconds`` (a 429's Retry-After holds for the whole endpoint)."""
        self._paused_until = max(self._paused_until, self._clock() + seconds)


class _LoopThread:
    """An asyncio event loop running in a daemon thread, for calling async code from sync code
    (also when the caller itself runs inside an event loop, e.g. a notebook)."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5.0)
        if not self._thread.is_alive():
            self.loop.close()


def _token_offsets(content: str, entries: list[dict[str, Any]]) -> tuple[str, list[int]] | None:
    """The generated text as the tokens spell it, and each token's character offset in it.

    Uses the tokens' UTF-8 bytes when the server gives them (a Japanese character can be split
    across tokens, whose text is then unreadable alone).
    """
    pieces: list[bytes] = []
    for entry in entries:
        raw = entry.get("bytes")
        if isinstance(raw, list) and all(isinstance(b, int) for b in raw):
            pieces.append(bytes(raw))
        else:
            pieces.append(str(entry.get("token", "")).encode("utf-8"))
    joined = b"".join(pieces)
    text = joined.decode("utf-8", errors="replace")
    if text.strip() != content.strip():
        # The tokens do not spell the message (a server that post-processes it): positions
        # cannot be trusted, so the caller scores the text without logprobs.
        return None
    offsets: list[int] = []
    consumed = 0
    for piece in pieces:
        offsets.append(len(joined[:consumed].decode("utf-8", errors="ignore")))
        consumed += len(piece)
    return text, offsets


def parse_usage(data: Any) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) from a response body's ``usage``; None without one."""
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        return None
    counts = (usage.get("prompt_tokens"), usage.get("completion_tokens"))
    if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
        return None
    return int(counts[0]), int(counts[1])  # type: ignore[arg-type]


def parse_cached_tokens(data: Any) -> int:
    """``usage.prompt_tokens_details.cached_tokens`` of a response body; 0 where absent."""
    usage = data.get("usage") if isinstance(data, dict) else None
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) and not isinstance(cached, bool) and cached > 0 else 0


def parse_chat_response(data: Any) -> JudgeReply:
    """A :class:`JudgeReply` from an OpenAI chat completions response body."""
    reply = _parse_choice(data)
    if reply.text is None:
        return reply
    return dataclasses.replace(
        reply, usage=parse_usage(data), cached_tokens=parse_cached_tokens(data)
    )


def _parse_choice(data: Any) -> JudgeReply:
    try:
        choice = data["choices"][0]
        content = choice["message"].get("content") or ""
    except (KeyError, IndexError, TypeError, AttributeError):
        return JudgeReply.failed(f"malformed response: {str(data)[:200]}")
    if not isinstance(content, str):
        return JudgeReply.failed(f"malformed response content: {str(content)[:200]}")
    logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
    entries = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(entries, list) or not entries:
        return JudgeReply(text=content)
    located = _token_offsets(content, entries)
    if located is None:
        return JudgeReply(text=content)
    text, offsets = located
    tokens: list[TokenLogprob] = []
    for entry, offset in zip(entries, offsets, strict=True):
        top = tuple(
            (str(alt.get("token", "")), float(alt.get("logprob", float("-inf"))))
            for alt in entry.get("top_logprobs") or []
            if isinstance(alt, dict)
        )
        tokens.append(
            TokenLogprob(
                offset=offset,
                token=text[offset : offset + len(str(entry.get("token", "")))],
                logprob=float(entry.get("logprob", 0.0)),
                top=top,
            )
        )
    return JudgeReply(text=text, tokens=tuple(tokens))


RefusedField = Literal["max_tokens", "temperature"]


def refused_field(error_body: str) -> RefusedField | None:
    """The request field an HTTP 400 reply says the model does not accept, among those the
    backend can do without: ``max_tokens`` (when the reply points to max_completion_tokens) or
    ``temperature``; None for any other error.

    Reads OpenAI's error shape ``{"error": {"message", "param", "code"}}`` and, for servers
    that copy only the wording, the plain message.
    """
    message, param = error_body, None
    try:
        data = json.loads(error_body)
    except ValueError:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        message = str(error.get("message") or "")
        param = error.get("param")
    elif isinstance(error, str):
        message = error
    text = message.lower()
    rest = text.replace("max_completion_tokens", "")
    if "max_completion_tokens" in text and (param == "max_tokens" or "max_tokens" in rest):
        return "max_tokens"
    refusal = ("unsupported", "not supported", "does not support", "only the default")
    if (param == "temperature" or "temperature" in text) and any(w in text for w in refusal):
        return "temperature"
    return None


class OpenAIBackend:
    """A judge reached over HTTP at an OpenAI-compatible ``/chat/completions``."""

    def __init__(self, spec: OpenAIJudge, *, where: str) -> None:
        self.spec = spec
        self.where = where
        self.base_url = spec.base_url.rstrip("/")
        self._headers = {"Content-Type": "application/json"}
        if spec.api_key_env is not None:
            key = os.environ.get(spec.api_key_env, "")
            if not key.strip():
                raise UserError(
                    f"{where}.api_key_env: the environment variable {spec.api_key_env} is not "
                    "set (or empty). Export it with the API key before starting, e.g. "
                    f"`export {spec.api_key_env}=...`."
                )
            self._headers["Authorization"] = f"Bearer {key.strip()}"
        # None until the endpoint has answered a logprobs request one way or the other.
        self.logprobs_supported: bool | None = None
        # What the server accepts (see refused_field): the token limit's field name, and
        # whether temperature is sent at all.
        self.limit_field: Literal["max_tokens", "max_completion_tokens"] = (
            "max_tokens" if spec.max_completion_tokens is None else "max_completion_tokens"
        )
        self.send_temperature = True
        self.limiter = RateLimiter(spec.max_requests_per_minute, spec.max_tokens_per_minute)
        self._loop = _LoopThread(name=f"grpokit-judge-{spec.model}")
        self._client: httpx.AsyncClient | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._closed = False

    @property
    def identity(self) -> str:
        s = self.spec
        parts: list[Any] = [
            "openai", self.base_url, s.model, s.temperature, s.max_tokens, s.top_logprobs
        ]  # fmt: skip
        # Appended only when set, so that caches written before these settings existed stay
        # valid. What the server negotiates away is not part of it: the same settings against
        # the same server negotiate the same way.
        if s.max_completion_tokens is not None:
            parts.append({"max_completion_tokens": s.max_completion_tokens})
        if s.extra_body:
            parts.append({"extra_body": s.extra_body})
        return json.dumps(parts, sort_keys=True)

    @property
    def description(self) -> str:
        return f"openai {self.spec.model} @ {self.base_url}"

    def check_reachable(self) -> None:
        """Contact the endpoint once; raise :class:`UserError` if it cannot be reached or
        rejects the key. Endpoints without ``/models`` are accepted."""
        url = f"{self.base_url}/models"
        try:
            response = httpx.get(url, headers=self._headers, timeout=min(self.spec.timeout_s, 10.0))
        except httpx.HTTPError as exc:
            raise UserError(
                f"{self.where}.base_url: the judge endpoint {self.base_url} is unreachable "
                f"({type(exc).__name__}: {exc}). Start the server, fix base_url (it should end "
                "in /v1), or set check_at_start: false to start anyway."
            ) from exc
        if response.status_code in (401, 403):
            env = self.spec.api_key_env
            hint = f"the key in {env} was rejected" if env else "it needs a key: set api_key_env"
            raise UserError(
                f"{self.where}: the judge endpoint {self.base_url} answered HTTP "
                f"{response.status_code}: {hint}."
            )
        if response.status_code == 200:
            try:
                served = [m.get("id") for m in response.json().get("data", [])]
            except (ValueError, AttributeError):
                served = []
            if served and self.spec.model not in served:
                logger.warning(
                    "%s: model %r is not among the models %s lists (%s); requests may fail",
                    self.where,
                    self.spec.model,
                    self.base_url,
                    ", ".join(str(m) for m in served[:10]),
                )

    def complete(self, prompts: Sequence[str], *, logprobs: bool) -> list[JudgeReply]:
        if self._closed:
            raise RuntimeError("this judge backend is closed")
        if not prompts:
            return []
        return self._loop.run(self._complete_all(list(prompts), logprobs))

    async def _complete_all(self, prompts: list[str], logprobs: bool) -> list[JudgeReply]:
        if self._client is None:
            limits = httpx.Limits(max_connections=self.spec.max_concurrency)
            self._client = httpx.AsyncClient(
                headers=self._headers, timeout=httpx.Timeout(self.spec.timeout_s), limits=limits
            )
            self._semaphore = asyncio.Semaphore(self.spec.max_concurrency)
        return list(await asyncio.gather(*(self._complete_one(p, logprobs) for p in prompts)))

    def _body(self, prompt: str, logprobs: bool) -> dict[str, Any]:
        """The request: extra_body, then grpokit's own fields (the config keeps the two sets
        apart, and grpokit's would win)."""
        spec = self.spec
        body: dict[str, Any] = dict(spec.extra_body)
        body["model"] = spec.model
        body["messages"] = [{"role": "user", "content": prompt}]
        if self.send_temperature:
            body["temperature"] = spec.temperature
        body[self.limit_field] = spec.max_completion_tokens or spec.max_tokens
        if logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = spec.top_logprobs
        return body

    def _do_without(self, field: RefusedField, body: dict[str, Any]) -> bool:
        """Stop sending ``field`` after the server refused it; True when ``body`` had it, so
        that the request is worth sending again."""
        if field not in body:
            return False
        if field == "max_tokens" and self.limit_field == "max_tokens":
            self.limit_field = "max_completion_tokens"
            logger.warning(
                "%s: %s refuses max_tokens for %s; the limit (%d) is sent as "
                "max_completion_tokens from now on. Reasoning models spend it on hidden "
                "reasoning too: set max_completion_tokens higher if replies come back empty.",
                self.where,
                self.base_url,
                self.spec.model,
                self.spec.max_tokens,
            )
        elif field == "temperature" and self.send_temperature:
            self.send_temperature = False
            logger.warning(
                "%s: %s refuses temperature %g for %s; requests go without it from now on "
                "(the server's default applies, so repeated scores of one text may differ).",
                self.where,
                self.base_url,
                self.spec.temperature,
                self.spec.model,
            )
        return True

    async def _complete_one(self, prompt: str, logprobs: bool) -> JudgeReply:
        assert self._client is not None and self._semaphore is not None
        url = f"{self.base_url}/chat/completions"
        attempts = self.spec.max_retries + 1
        error = "no attempt made"
        attempt = 0
        while attempt < attempts:
            want_logprobs = logprobs and self.logprobs_supported is not False
            retry_after: float | None = None
            body = self._body(prompt, want_logprobs)
            # What an API counts against tokens per minute before it answers: the prompt (about
            # 4 bytes a token) and the reply's limit.
            estimate = len(prompt.encode("utf-8")) // 4 + 1 + int(body[self.limit_field])
            try:
                async with self._semaphore:
                    await self.limiter.acquire(estimate)
                    # httpx's timeout bounds each phase; wait_for bounds the whole request,
                    # so a server trickling bytes still hits the limit.
                    response = await asyncio.wait_for(
                        self._client.post(url, json=body), timeout=self.spec.timeout_s
                    )
            except (asyncio.TimeoutError, httpx.TimeoutException):
                error = f"timeout after {self.spec.timeout_s:g} s"
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code == 200:
                    try:
                        data = response.json()
                    except ValueError:
                        return JudgeReply.failed(f"response is not JSON: {response.text[:200]}")
                    reply = parse_chat_response(data)
                    if reply.usage is not None:
                        self.limiter.settle(estimate, sum(reply.usage))
                    if want_logprobs and reply.text is not None:
                        self.logprobs_supported = reply.tokens is not None
                    return reply
                refused = (
                    refused_field(response.text) if response.status_code in (400, 422) else None
                )
                if refused is not None and self._do_without(refused, body):
                    continue  # the same request without the field; a field is dropped once
                if (
                    response.status_code in (400, 422)
                    and want_logprobs
                    and "logprob" in response.text.lower()
                ):
                    # The endpoint refuses logprobs: remember, and ask again without.
                    logger.warning(
                        "%s: %s does not support logprobs (%s); expected mode falls back to the "
                        "written number",
                        self.where,
                        self.base_url,
                        response.text[:200],
                    )
                    self.logprobs_supported = False
                    continue
                error = f"HTTP {response.status_code}: {response.text[:200]}"
                if response.status_code not in _RETRY_STATUS:
                    return JudgeReply.failed(error)
                retry_after = _retry_after(response)
                if retry_after is not None:
                    # The server's wait holds for every request to it, not just this one.
                    self.limiter.pause(retry_after)
            attempt += 1
            if attempt < attempts:
                delay = min(_MAX_BACKOFF_S, self.spec.backoff_s * 2 ** (attempt - 1))
                delay *= 1.0 + 0.25 * random.random()  # jitter: retries of a batch spread out
                if retry_after is not None:
                    delay = max(delay, retry_after)
                await asyncio.sleep(delay)
        return JudgeReply.failed(f"{error} (after {attempts} attempt(s))")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._client is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.run(self._client.aclose())
        self._loop.stop()


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds the server asks to wait (Retry-After as seconds or an HTTP date), at most
    ``_MAX_RETRY_AFTER_S``; None when it does not say."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    return retry_after_seconds(value, time.time())


def retry_after_seconds(value: str, now: float) -> float | None:
    """A Retry-After header's wait in seconds from ``now`` (a Unix time), capped at
    ``_MAX_RETRY_AFTER_S``; None when it is neither a number nor an HTTP date.

    >>> retry_after_seconds("2.5", 0.0), retry_after_seconds("Thu, 01 Jan 1970 00:00:10 GMT", 4.0)
    (2.5, 6.0)
    """
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value.strip())
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - now
    if not math.isfinite(seconds):
        return None
    return min(_MAX_RETRY_AFTER_S, max(0.0, seconds))
