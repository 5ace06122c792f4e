"""What an agent needs of the endpoint besides an OpenAI client: an episode's URL and
one call to report its reward. Standard library only, so any agent can import it."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
import uuid
from typing import Any


def root(url: str) -> str:
    """The server's root from its root, its `/v1` URL or an episode's `…/episodes/E/v1`."""
    return re.sub(r"(/episodes/[^/]+)?(/v1)?/*$", "", url)


def episode_url(url: str, episode: str | None = None) -> tuple[str, str]:
    """(base_url for the OpenAI client, episode id): every call made with that base_url
    belongs to the episode (a fresh id when none is given)."""
    episode = episode or uuid.uuid4().hex
    return f"{root(url)}/episodes/{episode}/v1", episode


def report_reward(url: str, episode: str, reward: float, *, group: str | None = None,
                  task: str | None = None, token: str | None = None,
                  timeout_s: float = 30.0) -> dict[str, Any]:
    """End `episode` with its `reward`; its rows join `group` (episodes compared with each
    other, e.g. one task's samples; default: alone). Raises `RuntimeError` with the
    endpoint's error message when it refuses."""
    body = {"reward": reward, **({"group": group} if group else {}),
            **({"task": task} if task else {})}
    req = urllib.request.Request(
        f"{root(url)}/episodes/{episode}/reward", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json",
                 **({"Authorization": f"Bearer {token}"} if token else {})}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as err:
        detail = json.loads(err.read() or b"{}").get("error", {}).get("message", err.reason)
        raise RuntimeError(f"reward for episode {episode} refused ({err.code}): {detail}") from None
