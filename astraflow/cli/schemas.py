"""The JSON every `--json` flag prints, as JSON Schemas: the stable shapes scripts rely on.

One grammar for all of them: a document names the flow and keys what it says per
policy under `policies`, the same whether the flow has one policy or several.
Additions are allowed (schemas leave `additionalProperties` open); removing or
retyping a field is a breaking change, caught by tests/test_cli_json.py, which
validates each command's real output against these.

`inspect --json` prints one episode object per line (JSON Lines), newest first, so a
pipe can stop early; `EPISODE` is one line.
"""

from __future__ import annotations

from typing import Any

_INT = {"type": "integer"}
_NUM = {"type": "number"}
_STR = {"type": "string"}


def _per_policy(entry: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "minProperties": 1, "additionalProperties": entry}


STATUS: dict[str, Any] = {
    "type": "object",
    "required": ["flow", "policies"],
    "properties": {
        "flow": _STR,
        "policies": _per_policy({
            "type": "object",
            "required": ["steps", "optimizer_steps", "rows_read", "rows_used", "rows_stale",
                         "rows_filtered", "final_cursor", "weight_versions", "trajectory_rows"],
            "properties": {
                "steps": _INT, "optimizer_steps": _INT, "rows_read": _INT, "rows_used": _INT,
                "rows_stale": _INT, "rows_filtered": _INT, "final_cursor": _INT,
                "weight_versions": {"type": "array", "items": _INT},
                "trajectory_rows": _INT, "summary": {"type": "object"},
            },
        }),
    },
}

EVAL: dict[str, Any] = {
    "type": "object",
    "required": ["flow", "policies"],
    "properties": {
        "flow": _STR,
        "policies": _per_policy({
            "type": "object", "required": ["version", "metric", "accuracy", "tasks"],
            "properties": {"version": _INT, "metric": _STR,
                           "accuracy": {"type": "number", "minimum": 0, "maximum": 1},
                           "tasks": _INT},
        }),
    },
}

AUDIT: dict[str, Any] = {
    "type": "object",
    "required": ["flow", "ok", "policies"],
    "properties": {
        "flow": _STR,
        "ok": {"type": "boolean"},
        "policies": _per_policy({
            "type": "object",
            "required": ["steps", "rollbacks", "voided_steps", "duplicate_rows", "violations",
                         "problems"],
            "properties": {"steps": _INT, "rollbacks": _INT, "voided_steps": _INT,
                           "duplicate_rows": _INT, "violations": _INT,
                           "problems": {"type": "array", "items": _STR}},
        }),
    },
}

EPISODE: dict[str, Any] = {
    "type": "object",
    "required": ["traj_id", "group_id", "policy", "behavior_version", "reward", "prompt",
                 "turns"],
    "properties": {
        "traj_id": _STR, "group_id": _STR, "policy": _STR, "behavior_version": _INT,
        "reward": _NUM, "prompt": _STR,
        "turns": {"type": "array", "items": {
            "type": "object", "required": ["who", "text"],
            "properties": {"who": {"enum": ["policy", "context"]}, "text": _STR}}},
    },
}

SCHEMAS: dict[str, dict[str, Any]] = {"status": STATUS, "eval": EVAL, "audit": AUDIT,
                                      "inspect": EPISODE}
