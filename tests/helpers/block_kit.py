"""Slack's published Block Kit limits, checked on a message payload ("Blocks" reference,
docs.slack.dev/reference/block-kit/blocks, and its composition objects and block elements pages).
Written from the documentation, independently of relevo_core.notify.messages."""

from __future__ import annotations

from typing import Any

MAX_BLOCKS = 50
TEXT_TYPES = {"plain_text", "mrkdwn"}


def _text(obj: Any, where: str, limit: int, plain_only: bool = False) -> list[str]:
    if not isinstance(obj, dict) or obj.get("type") not in TEXT_TYPES:
        return [f"{where}: not a text object"]
    problems = []
    if plain_only and obj["type"] != "plain_text":
        problems.append(f"{where}: must be plain_text")
    text = obj.get("text")
    if not isinstance(text, str) or not 1 <= len(text) <= limit:
        problems.append(f"{where}: text of {len(text or '')} characters (1 to {limit})")
    return problems


def check_message(payload: dict[str, Any]) -> list[str]:
    """Every way the payload breaks a documented limit; [] when it keeps them all."""
    problems: list[str] = []
    blocks = payload.get("blocks", [])
    if len(blocks) > MAX_BLOCKS:
        problems.append(f"{len(blocks)} blocks (at most {MAX_BLOCKS})")
    if not payload.get("text"):
        problems.append("no top-level text (the notification's fallback)")
    for i, block in enumerate(blocks):
        where = f"blocks[{i}] ({block.get('type')})"
        kind = block.get("type")
        if kind == "header":
            problems += _text(block.get("text"), where, 150, plain_only=True)
        elif kind == "section":
            if "text" not in block and "fields" not in block:
                problems.append(f"{where}: a section needs text or fields")
            if "text" in block:
                problems += _text(block["text"], where + ".text", 3000)
            fields = block.get("fields", [])
            if len(fields) > 10:
                problems.append(f"{where}: {len(fields)} fields (at most 10)")
            for j, f in enumerate(fields):
                problems += _text(f, f"{where}.fields[{j}]", 2000)
        elif kind == "context":
            elements = block.get("elements", [])
            if not 1 <= len(elements) <= 10:
                problems.append(f"{where}: {len(elements)} elements (1 to 10)")
            for j, e in enumerate(elements):
                problems += _text(e, f"{where}.elements[{j}]", 3000)
        elif kind == "actions":
            elements = block.get("elements", [])
            if not 1 <= len(elements) <= 25:
                problems.append(f"{where}: {len(elements)} elements (1 to 25)")
            for j, e in enumerate(elements):
                if e.get("type") != "button":
                    continue
                problems += _text(e.get("text"), f"{where}.elements[{j}].text", 75, plain_only=True)
                if "url" in e and len(e["url"]) > 3000:
                    problems.append(f"{where}.elements[{j}].url: {len(e['url'])} characters (at most 3000)")
        elif kind != "divider":
            problems.append(f"{where}: a block type this check does not know")
        if "block_id" in block and len(block["block_id"]) > 255:
            problems.append(f"{where}: block_id over 255 characters")
    return problems
