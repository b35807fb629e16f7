"""Partial results: a batch tool's marker for "some items failed", and the redo of only those.

A batch call (charge 20 cards, send 50 mails) that partly succeeds must not be
redone whole: the succeeded items would happen twice. The tool returns a
`PartialResult` naming the failed items; `failed_items` selects only those, each
with the idempotency key it had on the first run
(`~langgraph_resilience.core.effects.item_idempotency_key`), so a service that did
process one of them deduplicates it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from langgraph_resilience.core.canonical import canonical_args
from langgraph_resilience.core.effects import item_idempotency_key

__all__ = ["FailedItem", "PartialResult", "RedoItem", "as_partial_result", "failed_items"]


class FailedItem(BaseModel):
    """One failed item of a batch call. Identify it by `index`, `key` or `item`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    item: Any = None
    """The item itself (matched against the original items when no index/key is given)."""
    error: str = Field(description="Why this item failed (redacted by the tool).")
    index: int | None = Field(default=None, description="Its position in the original items.")
    key: str | None = Field(
        default=None, description="Its own stable key (e.g. an order id), with `item_key=`."
    )


class PartialResult(BaseModel):
    """The partial-success marker a batch tool returns when some items failed.

    Shape (JSON)::

        {"partial": true,
         "succeeded": [...],
         "failed": [{"item": ..., "error": "...", "index": 2}]}

    Only the failed items are redone (`failed_items`), each under its own key.

    >>> PartialResult(succeeded=["a"], failed=[FailedItem(index=1, error="503")]).partial
    True
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    partial: Literal[True] = True
    """The marker that tells a partial result from an ordinary one."""
    succeeded: list[Any] = Field(default_factory=list)
    failed: list[FailedItem]


def as_partial_result(value: Any) -> PartialResult | None:
    """The `PartialResult` in a tool's return value (model, dict or JSON text), or None.

    >>> as_partial_result({"partial": True, "failed": [{"index": 0, "error": "x"}]}).failed[0].index
    0
    >>> as_partial_result({"succeeded": []}) is None
    True
    """
    if isinstance(value, PartialResult):
        return value
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, Mapping) and value.get("partial") is True and "failed" in value:
        return PartialResult.model_validate(dict(value))
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class RedoItem:
    """One item to redo, with the idempotency key it had on the first run."""

    index: int
    """Its position in the original items."""
    item: Any
    """The item itself, as the batch gave it."""
    key: str
    """``<call key>#<index>`` or ``<call key>#<item key>``."""


def failed_items(
    items: Sequence[Any],
    partial: PartialResult,
    *,
    call_key: str,
    item_key: Callable[[Any], str] | None = None,
) -> list[RedoItem]:
    """Select only the failed items of a batch, in their original order, with their keys.

    Each failed entry is matched to the original items by `index`, else by
    `key` (through `item_key`), else by canonical equality of `item`. The
    per-item key is ``item_idempotency_key(call_key, item_key(item))`` when
    `item_key` is given, else ``item_idempotency_key(call_key, index)``: the
    same key the first run used, so the service deduplicates an item that did
    go through. An entry that names no original item is a bug in the tool and
    raises ValueError.

    >>> p = PartialResult(succeeded=["a", "c"], failed=[FailedItem(item="b", error="503")])
    >>> [(r.index, r.key) for r in failed_items(["a", "b", "c"], p, call_key="bulk:9")]
    [(1, 'bulk:9#1')]
    """
    canon = [canonical_args(item, noise_fields=()) for item in items]
    own_keys = [item_key(item) for item in items] if item_key is not None else None
    chosen: dict[int, None] = {}
    for failed in partial.failed:
        index = _match_item(failed, items, canon, own_keys, chosen)
        chosen[index] = None
    result = []
    for index in sorted(chosen):
        suffix: int | str = own_keys[index] if own_keys is not None else index
        result.append(RedoItem(index, items[index], item_idempotency_key(call_key, suffix)))
    return result


def _match_item(
    failed: FailedItem,
    items: Sequence[Any],
    canon: list[str],
    own_keys: list[str] | None,
    chosen: Mapping[int, None],
) -> int:
    if failed.index is not None:
        if not 0 <= failed.index < len(items):
            raise ValueError(
                f"partial result names item index {failed.index}, "
                f"but the batch has {len(items)} items"
            )
        return failed.index
    if failed.key is not None:
        if own_keys is None:
            raise ValueError(
                f"partial result names item key {failed.key!r}; pass item_key= to map keys"
            )
        if failed.key not in own_keys:
            raise ValueError(f"partial result names item key {failed.key!r}, not in the batch")
        return own_keys.index(failed.key)
    wanted = canonical_args(failed.item, noise_fields=())
    for index, text in enumerate(canon):
        if text == wanted and index not in chosen:
            return index
    raise ValueError(f"partial result names an item that is not in the batch: {failed.item!r}")
