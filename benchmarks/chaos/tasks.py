"""The chaos benchmark's task suite: a small shop with real state, tasks with ground truth,
and the scripted models and human that drive them.

`Shop` is an in-memory backend (customers, orders, inventory, refunds, an email
outbox, a geo and weather lookup, and an alternative endpoint for each read:
`ALTERNATIVES`) whose tools really mutate it. It counts every committed side
effect per *identity* (tool + the arguments that make the effect what it is),
so a duplicate order, refund or email is visible however it came about, and
it answers `Shop.status_check` by idempotency key, as a real API does.

A `Task` is data: ordered `Step`s, each one or more `Call`s issued together
(parallel tool calls), whose arguments may refer to earlier results (`Ref`), and
an optional final answer. Its `oracle` is the backend state and answer after
executing the intended calls directly, without any agent or framework; a run
succeeds when the shop ends in exactly that state (and the agent gives exactly
that answer).

A `Conversation` is several tasks asked one after another on one thread, one
human message each (`CONVERSATIONS`); tasks come back in later turns, so their
calls repeat identical calls of earlier turns, and a side effect may rightly be
asked for twice. Its oracle runs the tasks in order on one shop.

`scripted_agent(task)` is a real tool-calling `BaseChatModel` whose every reply
is a pure function of the messages it is shown: it issues the next step's
calls, and when a call fails it does only what the step's ``on_error`` says
(``retry``: re-issue the failed calls once, then give up; ``skip``: move on;
``abort``: give up). It sees what any model would see (an error
`ToolMessage`, output that is not JSON, a batch result listing failed items, a
result someone else obtained for a call of its that failed) and never what the
fault plan is. An `AgentStyle` makes it behave more like a real model:
``reissue`` re-issues every failed call once under a new id before ``on_error``
applies (as models do when an answer is lost), ``ids="per_message"`` numbers
tool-call ids ``call_0``, ``call_1`` in every message (as several providers do).
In a conversation it works on the task of the latest human message, from the
messages after it.

For ``add_resilience``: `scripted_repairer()` reads the error envelope and
renames an argument the tool now requires or picks the closest allowed enum
value; `scripted_planner(task)` plans a failed read through its alternative
endpoint, re-deriving the arguments from the goal; `operator_decision` is the
human behind escalations (retry once, then skip).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolCall, ToolMessage
from langchain_core.tools import BaseTool, StructuredTool, ToolException, tool
from pydantic import BaseModel, Field

from langgraph_resilience import current_idempotency_key
from langgraph_resilience.core import canonical_args
from langgraph_resilience.stores import EffectStatus
from langgraph_resilience.testing import ScriptedChatModel

__all__ = [
    "ABORT_ANSWER",
    "ALTERNATIVES",
    "CONVERSATIONS",
    "OUTPUT_SCHEMAS",
    "SIDE_EFFECT_TOOLS",
    "TASKS",
    "AgentStyle",
    "Call",
    "Conversation",
    "IdStyle",
    "Oracle",
    "Ref",
    "Scenario",
    "Shop",
    "Step",
    "Task",
    "Text",
    "agent_reply",
    "current_turn",
    "extra_effects",
    "judge",
    "operator_decision",
    "oracle",
    "planner_reply",
    "repair_reply",
    "resolve",
    "scripted_agent",
    "scripted_planner",
    "scripted_repairer",
    "turn_judged",
    "turns_of",
]

ABORT_ANSWER = "Sorry, I could not complete this task."
"""The scripted agent's answer when a step's ``on_error`` tells it to give up."""

MAX_MODEL_CALLS = 400
"""Replies a scripted model has in store; frameworks stop far earlier."""

# --------------------------------------------------------------------- the shop

_CUSTOMERS: Mapping[str, tuple[str, str, str]] = {
    "c1": ("Ada Lovelace", "ada@example.com", "Paris"),
    "c2": ("Alan Turing", "alan@example.com", "London"),
    "c3": ("Grace Hopper", "grace@example.com", "New York"),
    "c4": ("Linus Torvalds", "linus@example.com", "Helsinki"),
    "c5": ("Margaret Hamilton", "margaret@example.com", "Boston"),
    "c6": ("Edsger Dijkstra", "edsger@example.com", "Amsterdam"),
}
_CITIES: Mapping[str, tuple[float, float]] = {
    "Paris": (48.8566, 2.3522),
    "London": (51.5074, -0.1278),
    "New York": (40.7128, -74.006),
    "Helsinki": (60.1699, 24.9384),
    "Boston": (42.3601, -71.0589),
    "Amsterdam": (52.3676, 4.9041),
    "Rome": (41.9028, 12.4964),
    "Tokyo": (35.6762, 139.6503),
    "Sydney": (-33.8688, 151.2093),
    "Lisbon": (38.7223, -9.1393),
}
_INVENTORY: Mapping[str, tuple[float, int]] = {
    "lamp": (40.0, 12),
    "desk": (250.0, 4),
    "chair": (120.0, 9),
    "mug": (8.5, 50),
    "pen": (2.0, 200),
    "kettle": (35.0, 3),
    "rug": (90.0, 6),
    "clock": (25.0, 7),
}
_ORDERS: Mapping[int, tuple[str, str, int, str]] = {
    1001: ("c1", "lamp", 1, "delivered"),
    1002: ("c2", "desk", 1, "shipped"),
    1003: ("c3", "chair", 2, "delivered"),
    1004: ("c4", "mug", 4, "placed"),
    1005: ("c5", "kettle", 1, "delivered"),
    1006: ("c6", "rug", 1, "shipped"),
    1007: ("c1", "pen", 10, "delivered"),
    1008: ("c3", "lamp", 2, "placed"),
    1009: ("c2", "clock", 1, "delivered"),
    1010: ("c4", "chair", 1, "shipped"),
}
_CONDITIONS = ("sunny", "cloudy", "rain", "windy", "snow")

RefundReason = Literal["damaged", "late", "wrong_item", "other"]

SIDE_EFFECT_TOOLS: frozenset[str] = frozenset(
    {"create_order", "cancel_order", "refund_order", "send_email", "send_bulk_email", "restock"}
)
"""The shop's tools that change the world."""

BATCH_ARGS: Mapping[str, str] = {"send_bulk_email": "to"}
"""The shop's batch tools and the list argument that holds their items."""


def merge_bulk_email(sent_earlier: list[Any], last: Any) -> Any:
    """`ToolProfile.merge_batches` for send_bulk_email: one answer in its own shape."""
    if not isinstance(last, dict):
        return last
    return {**last, "sent": [*sent_earlier, *last.get("sent", [])]}


BATCH_MERGES: Mapping[str, Callable[[list[Any], Any], Any]] = {"send_bulk_email": merge_bulk_email}

ALTERNATIVES: Mapping[str, str] = {
    "get_customer": "find_customer",
    "get_order": "find_order",
    "list_orders": "customer_orders",
    "check_stock": "stock_level",
    "geocode": "geocode_backup",
    "get_weather": "get_forecast",
}
"""Each read tool's alternative endpoint (another provider of the same data, same output).
The scripted agent never calls them; a planner may."""


def _identities(tool_name: str, args: Mapping[str, Any]) -> list[str]:
    """What makes a side effect the same effect: one identity per effect it commits."""

    def key(kind: str, **fields: Any) -> str:
        return f"{kind}:{canonical_args(fields)}"

    match tool_name:
        case "create_order":
            return [key(tool_name, **{k: args.get(k) for k in ("customer_id", "item", "qty")})]
        case "cancel_order":
            return [key(tool_name, order_id=args.get("order_id"))]
        case "refund_order":
            fields = {k: args.get(k) for k in ("order_id", "amount", "reason")}
            return [key(tool_name, **fields)]
        case "send_email":
            return [key("email", to=args.get("to"), subject=args.get("subject"))]
        case "send_bulk_email":
            return [key("email", to=to, subject=args.get("subject")) for to in args.get("to") or []]
        case "restock":
            return [key(tool_name, item=args.get("item"), qty=args.get("qty"))]
    return []


class Shop:
    """The backend: real state, mutated by its tools, with effects counted per identity.

    >>> shop = Shop(); shop.create_order("c1", "lamp", 2)["order_id"]
    1011
    >>> shop.snapshot()["inventory"]["lamp"], shop.duplicate_effects
    (10, 0)
    """

    def __init__(self) -> None:
        self.customers = {
            cid: {"customer_id": cid, "name": n, "email": e, "city": c}
            for cid, (n, e, c) in _CUSTOMERS.items()
        }
        self.prices = {item: price for item, (price, _) in _INVENTORY.items()}
        self.inventory = {item: stock for item, (_, stock) in _INVENTORY.items()}
        self.orders: dict[int, dict[str, Any]] = {
            oid: {
                "order_id": oid,
                "customer_id": cid,
                "item": item,
                "qty": qty,
                "total": self.prices[item] * qty,
                "status": status,
                "refunded": 0.0,
            }
            for oid, (cid, item, qty, status) in _ORDERS.items()
        }
        self.next_order_id = max(self.orders) + 1
        self.refunds: list[dict[str, Any]] = []
        self.outbox: list[dict[str, str]] = []
        self.effects: Counter[str] = Counter()
        self._by_key: dict[str, Any] = {}

    # ------------------------------------------------------------ bookkeeping

    def _effect(self, tool_name: str, **args: Any) -> None:
        for identity in _identities(tool_name, args):
            self.effects[identity] += 1

    def _done(self, result: dict[str, Any]) -> dict[str, Any]:
        """The result of a committed call, remembered under the caller's idempotency key
        (as a real API does when it takes an ``Idempotency-Key``)."""
        key = current_idempotency_key()
        if key is not None:
            self._by_key[key] = result
        return result

    def status_check(self, key: str) -> EffectStatus:
        """Whether the effect sent with idempotency key `key` happened, and its result
        (`ToolProfile.status_check`: what the service answers when asked by key)."""
        if key in self._by_key:
            return EffectStatus(done=True, result=self._by_key[key])
        return EffectStatus(done=False)

    @property
    def duplicate_effects(self) -> int:
        """Committed effects beyond the first, per identity."""
        return sum(count - 1 for count in self.effects.values() if count > 1)

    def snapshot(self) -> dict[str, Any]:
        """The state a task is judged on (order-insensitive where order is not meaningful)."""
        return {
            "orders": {str(k): dict(v) for k, v in sorted(self.orders.items())},
            "inventory": dict(sorted(self.inventory.items())),
            "refunds": sorted(json.dumps(r, sort_keys=True) for r in self.refunds),
            "outbox": sorted(json.dumps(m, sort_keys=True) for m in self.outbox),
        }

    # ------------------------------------------------------------------ reads

    def get_customer(self, customer_id: str) -> dict[str, Any]:
        if customer_id not in self.customers:
            raise ToolException(f"no customer {customer_id!r}")
        return dict(self.customers[customer_id])

    def get_order(self, order_id: int) -> dict[str, Any]:
        if order_id not in self.orders:
            raise ToolException(f"no order {order_id}")
        order = self.orders[order_id]
        return {k: order[k] for k in ("order_id", "customer_id", "item", "qty", "total", "status")}

    def list_orders(self, customer_id: str) -> dict[str, Any]:
        self.get_customer(customer_id)
        ids = [oid for oid, o in sorted(self.orders.items()) if o["customer_id"] == customer_id]
        return {"customer_id": customer_id, "orders": ids}

    def check_stock(self, item: str) -> dict[str, Any]:
        if item not in self.inventory:
            raise ToolException(f"unknown item {item!r}")
        return {"item": item, "stock": self.inventory[item], "price": self.prices[item]}

    def geocode(self, city: str) -> dict[str, Any]:
        if city not in _CITIES:
            raise ToolException(f"unknown city {city!r}")
        lat, lon = _CITIES[city]
        return {"city": city, "lat": lat, "lon": lon}

    def get_weather(self, lat: float, lon: float) -> dict[str, Any]:
        # A pure function of the coordinates: wrong coordinates give plausible wrong weather.
        temp = round(((lat * 7.3 + lon * 3.1) % 30.0) - 2.0, 1)
        condition = _CONDITIONS[int(abs(lat * 10 + lon)) % len(_CONDITIONS)]
        return {"temp_c": temp, "condition": condition}

    # ---------------------------------------------------------------- effects

    def create_order(self, customer_id: str, item: str, qty: int) -> dict[str, Any]:
        self.get_customer(customer_id)
        stock = self.check_stock(item)["stock"]
        if qty < 1 or qty > stock:
            raise ToolException(f"cannot order {qty} x {item}: {stock} in stock")
        order_id = self.next_order_id
        self.next_order_id += 1
        total = self.prices[item] * qty
        self.inventory[item] = stock - qty
        self.orders[order_id] = {
            "order_id": order_id,
            "customer_id": customer_id,
            "item": item,
            "qty": qty,
            "total": total,
            "status": "placed",
            "refunded": 0.0,
        }
        self._effect("create_order", customer_id=customer_id, item=item, qty=qty)
        return self._done({"order_id": order_id, "total": total})

    def cancel_order(self, order_id: int) -> dict[str, Any]:
        order = self.orders.get(order_id)
        if order is None:
            raise ToolException(f"no order {order_id}")
        if order["status"] not in ("placed", "shipped"):
            raise ToolException(f"order {order_id} is {order['status']}; it cannot be cancelled")
        order["status"] = "cancelled"
        self.inventory[order["item"]] += order["qty"]
        self._effect("cancel_order", order_id=order_id)
        return self._done({"order_id": order_id, "status": "cancelled"})

    def refund_order(self, order_id: int, amount: float, reason: str) -> dict[str, Any]:
        order = self.orders.get(order_id)
        if order is None:
            raise ToolException(f"no order {order_id}")
        left = order["total"] - order["refunded"]
        if not 0 < amount <= left + 1e-9:
            raise ToolException(f"refund of {amount} on order {order_id}: {left} refundable")
        order["refunded"] += amount
        order["status"] = "refunded" if order["refunded"] >= order["total"] else "part_refunded"
        self.refunds.append({"order_id": order_id, "amount": amount, "reason": reason})
        self._effect("refund_order", order_id=order_id, amount=amount, reason=reason)
        return self._done({"order_id": order_id, "amount": amount})

    def _send(self, to: str, subject: str, body: str) -> None:
        if "@" not in to:
            raise ToolException(f"invalid address {to!r}")
        self.outbox.append({"to": to, "subject": subject, "body": body})
        self._effect("send_email", to=to, subject=subject)

    def send_email(self, to: str, subject: str, body: str) -> dict[str, Any]:
        self._send(to, subject, body)
        return self._done({"status": "sent", "to": to})

    def send_bulk_email(self, to: list[str], subject: str, body: str) -> dict[str, Any]:
        for address in to:
            self._send(address, subject, body)
        return self._done({"sent": list(to), "failed": []})

    def restock(self, item: str, qty: int) -> dict[str, Any]:
        self.check_stock(item)
        if qty < 1:
            raise ToolException("qty must be >= 1")
        self.inventory[item] += qty
        self._effect("restock", item=item, qty=qty)
        return self._done({"item": item, "stock": self.inventory[item]})

    # The alternative endpoints serve the same data.
    find_customer = get_customer
    find_order = get_order
    customer_orders = list_orders
    stock_level = check_stock
    geocode_backup = geocode
    get_forecast = get_weather

    # ------------------------------------------------------------------ tools

    def tools(self) -> list[BaseTool]:
        """This shop's tools, as LangChain tools bound to it."""
        return [
            StructuredTool(
                name=spec.name,
                description=spec.description,
                args_schema=spec.args_schema,
                func=getattr(self, spec.name),
            )
            for spec in _tool_specs()
        ]


def _get_customer(customer_id: str) -> dict[str, Any]:
    """Look up a customer's name, email and city by id (e.g. "c1")."""
    raise NotImplementedError


def _get_order(order_id: int) -> dict[str, Any]:
    """Look up an order: customer, item, quantity, total and status."""
    raise NotImplementedError


def _list_orders(customer_id: str) -> dict[str, Any]:
    """List the ids of a customer's orders."""
    raise NotImplementedError


def _check_stock(item: str) -> dict[str, Any]:
    """Stock level and unit price of an item."""
    raise NotImplementedError


def _geocode(city: str) -> dict[str, Any]:
    """Latitude and longitude of a city."""
    raise NotImplementedError


def _get_weather(lat: float, lon: float) -> dict[str, Any]:
    """Current temperature (Celsius) and condition at a position."""
    raise NotImplementedError


def _create_order(customer_id: str, item: str, qty: int) -> dict[str, Any]:
    """Place an order (takes the items out of stock). Returns its id and total."""
    raise NotImplementedError


def _cancel_order(order_id: int) -> dict[str, Any]:
    """Cancel a placed or shipped order (puts the items back in stock)."""
    raise NotImplementedError


def _refund_order(order_id: int, amount: float, reason: RefundReason) -> dict[str, Any]:
    """Refund part or all of an order."""
    raise NotImplementedError


def _send_email(to: str, subject: str, body: str) -> dict[str, Any]:
    """Send an email to one address."""
    raise NotImplementedError


def _send_bulk_email(to: list[str], subject: str, body: str) -> dict[str, Any]:
    """Send the same email to several addresses."""
    raise NotImplementedError


def _restock(item: str, qty: int) -> dict[str, Any]:
    """Add units of an item to the stock."""
    raise NotImplementedError


def _find_customer(customer_id: str) -> dict[str, Any]:
    """Customer directory (second provider): name, email and city by id."""
    raise NotImplementedError


def _find_order(order_id: int) -> dict[str, Any]:
    """Order search (v2 endpoint): customer, item, quantity, total and status."""
    raise NotImplementedError


def _customer_orders(customer_id: str) -> dict[str, Any]:
    """Order history (v2 endpoint): the ids of a customer's orders."""
    raise NotImplementedError


def _stock_level(item: str) -> dict[str, Any]:
    """Warehouse system: stock level and unit price of an item."""
    raise NotImplementedError


def _geocode_backup(city: str) -> dict[str, Any]:
    """Backup geocoder (another provider): latitude and longitude of a city."""
    raise NotImplementedError


def _get_forecast(lat: float, lon: float) -> dict[str, Any]:
    """Forecast service (another provider): temperature (Celsius) and condition now."""
    raise NotImplementedError


_SIGNATURES = (
    _get_customer,
    _get_order,
    _list_orders,
    _check_stock,
    _geocode,
    _get_weather,
    _create_order,
    _cancel_order,
    _refund_order,
    _send_email,
    _send_bulk_email,
    _restock,
    _find_customer,
    _find_order,
    _customer_orders,
    _stock_level,
    _geocode_backup,
    _get_forecast,
)
"""The shop's tool signatures and descriptions; `Shop` implements each by name."""


@functools.cache
def _tool_specs() -> tuple[BaseTool, ...]:
    """The tools' schemas, inferred once (inference costs ~8 ms per tool)."""
    return tuple(tool(f.__name__.removeprefix("_"))(f) for f in _SIGNATURES)


# ------------------------------------------------------- output contracts


class _CustomerOut(BaseModel):
    customer_id: str
    name: str
    email: Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+$")]
    city: str


class _OrderOut(BaseModel):
    order_id: Annotated[int, Field(ge=1)]
    total: Annotated[float, Field(ge=0)]


class _OrdersOut(BaseModel):
    customer_id: str
    orders: list[Annotated[int, Field(ge=1)]]


class _StockOut(BaseModel):
    item: str
    stock: Annotated[int, Field(ge=0)]


class _GeoOut(BaseModel):
    lat: Annotated[float, Field(ge=-90, le=90)]
    lon: Annotated[float, Field(ge=-180, le=180)]


class _WeatherOut(BaseModel):
    temp_c: Annotated[float, Field(ge=-90, le=60)]
    condition: str


class _CancelOut(BaseModel):
    order_id: Annotated[int, Field(ge=1)]
    status: Literal["cancelled"]


class _RefundOut(BaseModel):
    order_id: Annotated[int, Field(ge=1)]
    amount: Annotated[float, Field(gt=0)]


class _SentOut(BaseModel):
    status: Literal["sent"]


class _BulkOut(BaseModel):
    sent: list[str]
    failed: Annotated[list[str], Field(max_length=0)]


_READ_SCHEMAS: Mapping[str, type[BaseModel]] = {
    "get_customer": _CustomerOut,
    "get_order": _OrderOut,
    "list_orders": _OrdersOut,
    "check_stock": _StockOut,
    "geocode": _GeoOut,
    "get_weather": _WeatherOut,
}

OUTPUT_SCHEMAS: Mapping[str, type[BaseModel]] = {
    **_READ_SCHEMAS,
    "create_order": _OrderOut,
    "cancel_order": _CancelOut,
    "refund_order": _RefundOut,
    "send_email": _SentOut,
    "send_bulk_email": _BulkOut,
    "restock": _StockOut,
    **{alt: _READ_SCHEMAS[tool] for tool, alt in ALTERNATIVES.items()},
}
"""The documented output of each shop tool, as a contract (`ToolProfile.output_schema`).
Coordinates and temperatures can be wrong yet valid: no contract catches that."""


# ------------------------------------------------------------------------ tasks


@dataclasses.dataclass(frozen=True, slots=True)
class Ref:
    """A value from an earlier call's result: ``Ref("cust", "email")``."""

    call: str
    path: tuple[str, ...] = ()

    @classmethod
    def to(cls, dotted: str) -> Ref:
        """``Ref.to("cust.email")``."""
        call, *path = dotted.split(".")
        return cls(call, tuple(path))


@dataclasses.dataclass(frozen=True, slots=True)
class Text:
    """A string built from literal parts and `Ref`s."""

    parts: tuple[str | int | float | Ref, ...]


def _t(*parts: str | int | float | Ref) -> Text:
    return Text(
        tuple(Ref.to(p[1:]) if isinstance(p, str) and p.startswith("@") else p for p in parts)
    )


def _r(dotted: str) -> Ref:
    return Ref.to(dotted)


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """One intended tool call; `id` names its result for later `Ref`s."""

    id: str
    tool: str
    args: Mapping[str, Any]


OnError = Literal["retry", "skip", "abort"]
IdStyle = Literal["unique", "per_message"]


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """Calls issued together, and what the agent does when one of them fails."""

    calls: tuple[Call, ...]
    on_error: OnError = "retry"


@dataclasses.dataclass(frozen=True, slots=True)
class Task:
    """A multi-step task with its intended calls and final answer."""

    id: str
    family: str
    prompt: str
    steps: tuple[Step, ...]
    answer: Text | None = None

    @property
    def calls(self) -> int:
        """Tool calls on the intended path."""
        return sum(len(step.calls) for step in self.steps)

    @property
    def side_effects(self) -> int:
        """Side-effecting calls on the intended path."""
        return sum(1 for s in self.steps for c in s.calls if c.tool in SIDE_EFFECT_TOOLS)

    @property
    def tools(self) -> frozenset[str]:
        """The tools the task uses."""
        return frozenset(c.tool for s in self.steps for c in s.calls)


def _step(*calls: tuple[str, str, Mapping[str, Any]], on_error: OnError = "retry") -> Step:
    return Step(tuple(Call(cid, name, args) for cid, name, args in calls), on_error)


def _weather_for_customer(n: int, cid: str) -> Task:
    return Task(
        id=f"weather-{n}",
        family="weather",
        prompt=f"What is the weather where customer {cid} lives?",
        steps=(
            _step(("cust", "get_customer", {"customer_id": cid})),
            _step(("geo", "geocode", {"city": _r("cust.city")})),
            _step(("wx", "get_weather", {"lat": _r("geo.lat"), "lon": _r("geo.lon")})),
        ),
        answer=_t("@cust.name", ": ", "@wx.condition", ", ", "@wx.temp_c", " C in ", "@cust.city"),
    )


def _order_status_email(n: int, order_id: int) -> Task:
    return Task(
        id=f"status-email-{n}",
        family="status-email",
        prompt=f"Email the customer of order {order_id} its status.",
        steps=(
            _step(("order", "get_order", {"order_id": order_id})),
            _step(("cust", "get_customer", {"customer_id": _r("order.customer_id")})),
            _step(
                (
                    "mail",
                    "send_email",
                    {
                        "to": _r("cust.email"),
                        "subject": _t("Order ", "@order.order_id"),
                        "body": _t("Your ", "@order.item", " order is ", "@order.status", "."),
                    },
                )
            ),
        ),
    )


def _buy_and_confirm(n: int, cid: str, item: str, qty: int, on_error: OnError) -> Task:
    return Task(
        id=f"buy-{n}",
        family="buy",
        prompt=f"Order {qty} x {item} for customer {cid} and email a confirmation.",
        steps=(
            _step(("cust", "get_customer", {"customer_id": cid})),
            _step(("stock", "check_stock", {"item": item})),
            _step(
                ("order", "create_order", {"customer_id": cid, "item": item, "qty": qty}),
                on_error=on_error,
            ),
            _step(
                (
                    "mail",
                    "send_email",
                    {
                        "to": _r("cust.email"),
                        "subject": _t("Order ", "@order.order_id", " confirmed"),
                        "body": _t(qty, " x ", item, ", total ", "@order.total"),
                    },
                )
            ),
        ),
        answer=_t("Order ", "@order.order_id", " placed, total ", "@order.total"),
    )


def _refund_damaged(n: int, order_id: int, on_error: OnError) -> Task:
    return Task(
        id=f"refund-{n}",
        family="refund",
        prompt=f"Order {order_id} arrived damaged: refund it in full and tell the customer.",
        steps=(
            _step(("order", "get_order", {"order_id": order_id})),
            _step(
                (
                    "refund",
                    "refund_order",
                    {"order_id": order_id, "amount": _r("order.total"), "reason": "damaged"},
                ),
                on_error=on_error,
            ),
            _step(("cust", "get_customer", {"customer_id": _r("order.customer_id")})),
            _step(
                (
                    "mail",
                    "send_email",
                    {
                        "to": _r("cust.email"),
                        "subject": _t("Refund for order ", order_id),
                        "body": _t("We refunded ", "@refund.amount", "."),
                    },
                )
            ),
        ),
        answer=_t("Refunded ", "@refund.amount", " on order ", order_id),
    )


def _restock_low(n: int, items: Sequence[str], low: Sequence[str]) -> Task:
    checks = tuple((f"s_{i}", "check_stock", {"item": i}) for i in items)
    restocks = tuple((f"r_{i}", "restock", {"item": i, "qty": 10}) for i in low)
    answer: list[str | int | float | Ref] = []
    for i in items:
        answer += [f"{i}=", _r(f"s_{i}.stock"), "; "]
    answer += ["restocked ", ", ".join(low)]
    return Task(
        id=f"restock-{n}",
        family="restock",
        prompt=f"Check the stock of {', '.join(items)} and restock the low ones by 10.",
        steps=(_step(*checks), _step(*restocks)),
        answer=Text(tuple(answer)),
    )


def _trip_digest(n: int, cid: str, cities: Sequence[str]) -> Task:
    geos = tuple((f"g{k}", "geocode", {"city": c}) for k, c in enumerate(cities))
    wxs = tuple(
        (f"w{k}", "get_weather", {"lat": _r(f"g{k}.lat"), "lon": _r(f"g{k}.lon")})
        for k in range(len(cities))
    )
    body: list[str | int | float | Ref] = []
    for k, c in enumerate(cities):
        body += [f"{c}: ", _r(f"w{k}.condition"), " ", _r(f"w{k}.temp_c"), " C. "]
    return Task(
        id=f"trip-{n}",
        family="trip",
        prompt=f"Send customer {cid} the weather in {', '.join(cities)}.",
        steps=(
            _step(("cust", "get_customer", {"customer_id": cid})),
            _step(*geos),
            _step(*wxs),
            _step(
                (
                    "mail",
                    "send_email",
                    {
                        "to": _r("cust.email"),
                        "subject": "Your trip weather",
                        "body": Text(tuple(body)),
                    },
                )
            ),
        ),
        answer=Text(tuple(body)),
    )


def _cancel_and_reorder(n: int, order_id: int, new_item: str) -> Task:
    return Task(
        id=f"reorder-{n}",
        family="reorder",
        prompt=f"Cancel order {order_id}, order {new_item} instead, and confirm by email.",
        steps=(
            _step(("order", "get_order", {"order_id": order_id})),
            _step(("cancel", "cancel_order", {"order_id": order_id}), on_error="abort"),
            # Reading the order again to verify the cancellation is a legitimate repeat.
            _step(("check", "get_order", {"order_id": order_id})),
            _step(("stock", "check_stock", {"item": new_item})),
            _step(
                (
                    "new",
                    "create_order",
                    {
                        "customer_id": _r("order.customer_id"),
                        "item": new_item,
                        "qty": _r("order.qty"),
                    },
                )
            ),
            _step(("cust", "get_customer", {"customer_id": _r("order.customer_id")})),
            _step(
                (
                    "mail",
                    "send_email",
                    {
                        "to": _r("cust.email"),
                        "subject": _t("Order ", order_id, " replaced"),
                        "body": _t(
                            "Order ",
                            order_id,
                            " is ",
                            "@check.status",
                            "; new order ",
                            "@new.order_id",
                        ),
                    },
                )
            ),
        ),
        answer=_t("Replaced order ", order_id, " with order ", "@new.order_id"),
    )


def _announcement(n: int, cids: Sequence[str], subject: str) -> Task:
    custs = tuple((f"c{k}", "get_customer", {"customer_id": c}) for k, c in enumerate(cids))
    return Task(
        id=f"announce-{n}",
        family="announce",
        prompt=f"Email {', '.join(cids)} about: {subject}.",
        steps=(
            _step(*custs),
            _step(
                (
                    "bulk",
                    "send_bulk_email",
                    {
                        "to": [_r(f"c{k}.email") for k in range(len(cids))],
                        "subject": subject,
                        "body": f"News: {subject}.",
                    },
                )
            ),
        ),
        answer=_t("Sent to ", "@bulk.sent"),
    )


def _ten_reads(n: int, cid: str, items: Sequence[str], orders: Sequence[int]) -> Task:
    steps = [
        _step(("cust", "get_customer", {"customer_id": cid})),
        _step(("geo", "geocode", {"city": _r("cust.city")})),
        _step(("wx", "get_weather", {"lat": _r("geo.lat"), "lon": _r("geo.lon")})),
        *(_step((f"s{k}", "check_stock", {"item": i})) for k, i in enumerate(items)),
        *(_step((f"o{k}", "get_order", {"order_id": o})) for k, o in enumerate(orders)),
        _step(("mine", "list_orders", {"customer_id": cid})),
    ]
    answer: list[str | int | float | Ref] = [_r("cust.name"), ": ", _r("wx.condition"), "; "]
    answer += [x for k, i in enumerate(items) for x in (f"{i} ", _r(f"s{k}.stock"), ", ")]
    answer += [x for k, _ in enumerate(orders) for x in (_r(f"o{k}.status"), ", ")]
    answer += ["orders ", _r("mine.orders")]
    task = Task(
        id=f"ten-reads-{n}",
        family="ten-reads",
        prompt=f"Give me a status report for customer {cid}.",
        steps=tuple(steps),
        answer=Text(tuple(answer)),
    )
    assert task.calls == 10, task.id
    return task


def _ten_with_effects(n: int, cid: str, first: str, second: str) -> Task:
    return Task(
        id=f"ten-effects-{n}",
        family="ten-effects",
        prompt=f"Order one {first} and one {second} for {cid}, then email a summary.",
        steps=(
            _step(("cust", "get_customer", {"customer_id": cid})),
            _step(("mine", "list_orders", {"customer_id": cid})),
            _step(("s1", "check_stock", {"item": first})),
            _step(("o1", "create_order", {"customer_id": cid, "item": first, "qty": 1})),
            _step(("s2", "check_stock", {"item": second})),
            _step(("o2", "create_order", {"customer_id": cid, "item": second, "qty": 1})),
            _step(("v1", "get_order", {"order_id": _r("o1.order_id")})),
            _step(("geo", "geocode", {"city": _r("cust.city")})),
            _step(("wx", "get_weather", {"lat": _r("geo.lat"), "lon": _r("geo.lon")})),
            _step(
                (
                    "mail",
                    "send_email",
                    {
                        "to": _r("cust.email"),
                        "subject": "Your orders",
                        "body": _t(
                            "Orders ",
                            "@o1.order_id",
                            " and ",
                            "@o2.order_id",
                            " placed; expect ",
                            "@wx.condition",
                            " weather.",
                        ),
                    },
                )
            ),
        ),
        answer=_t("Placed ", "@o1.order_id", " and ", "@o2.order_id", " (", "@v1.status", ")"),
    )


def _fifteen_ops(n: int, cids: Sequence[str], item: str, city: str) -> Task:
    k = range(len(cids))
    return Task(
        id=f"ops-{n}",
        family="ops",
        prompt=f"Weekly ops for {', '.join(cids)}: restock {item}, order one for {cids[0]}, "
        f"and announce the {city} weather.",
        steps=(
            _step(
                *(
                    (f"c{i}", "get_customer", {"customer_id": c})
                    for i, c in zip(k, cids, strict=True)
                )
            ),
            _step(
                *(
                    (f"l{i}", "list_orders", {"customer_id": c})
                    for i, c in zip(k, cids, strict=True)
                )
            ),
            _step(
                *(
                    (f"s{i}", "check_stock", {"item": x})
                    for i, x in enumerate(("lamp", "mug", item))
                )
            ),
            _step(("restock", "restock", {"item": item, "qty": 5})),
            _step(("order", "create_order", {"customer_id": cids[0], "item": item, "qty": 1})),
            _step(("verify", "get_order", {"order_id": _r("order.order_id")})),
            _step(("geo", "geocode", {"city": city})),
            _step(("wx", "get_weather", {"lat": _r("geo.lat"), "lon": _r("geo.lon")})),
            _step(
                (
                    "bulk",
                    "send_bulk_email",
                    {
                        "to": [_r(f"c{i}.email") for i in k],
                        "subject": f"{city} weather",
                        "body": _t("It is ", "@wx.condition", " in ", city, "."),
                    },
                )
            ),
        ),
        answer=_t("Order ", "@order.order_id", "; ", item, " stock ", "@restock.stock"),
    )


def _suite() -> tuple[Task, ...]:
    tasks: list[Task] = []
    tasks += [_weather_for_customer(n, c) for n, c in enumerate(("c1", "c2", "c3", "c4", "c5"))]
    tasks += [_order_status_email(n, o) for n, o in enumerate((1002, 1004, 1006, 1010))]
    buys: list[tuple[str, str, int, OnError]] = [
        ("c1", "mug", 2, "retry"),
        ("c2", "lamp", 1, "retry"),
        ("c3", "pen", 20, "retry"),
        ("c5", "chair", 1, "abort"),
        ("c6", "clock", 2, "abort"),
    ]
    tasks += [_buy_and_confirm(n, *b) for n, b in enumerate(buys)]
    refunds: list[tuple[int, OnError]] = [
        (1001, "retry"),
        (1003, "retry"),
        (1005, "skip"),
        (1009, "abort"),
    ]
    tasks += [_refund_damaged(n, *r) for n, r in enumerate(refunds)]
    tasks += [
        _restock_low(0, ("desk", "kettle", "lamp"), ("desk", "kettle")),
        _restock_low(1, ("rug", "clock", "mug"), ("rug", "clock")),
        _restock_low(2, ("desk", "rug", "pen"), ("desk", "rug")),
    ]
    tasks += [
        _trip_digest(0, "c1", ("Rome", "Tokyo", "Lisbon")),
        _trip_digest(1, "c3", ("London", "Sydney", "Paris")),
        _trip_digest(2, "c6", ("Helsinki", "Boston", "Rome")),
    ]
    tasks += [
        _cancel_and_reorder(0, 1004, "pen"),
        _cancel_and_reorder(1, 1008, "clock"),
        _cancel_and_reorder(2, 1010, "desk"),
    ]
    tasks += [
        _announcement(0, ("c1", "c2", "c3"), "summer sale"),
        _announcement(1, ("c4", "c5", "c6"), "new opening hours"),
        _announcement(2, ("c2", "c4", "c6"), "loyalty points"),
    ]
    tasks += [
        _ten_reads(0, "c1", ("lamp", "desk", "mug", "pen"), (1001, 1007)),
        _ten_reads(1, "c2", ("chair", "kettle", "rug", "clock"), (1002, 1009)),
        _ten_reads(2, "c3", ("pen", "lamp", "chair", "desk"), (1003, 1008)),
        _ten_reads(3, "c4", ("mug", "rug", "kettle", "lamp"), (1004, 1010)),
        _ten_reads(4, "c5", ("clock", "pen", "desk", "chair"), (1005, 1001)),
    ]
    tasks += [
        _ten_with_effects(0, "c1", "lamp", "mug"),
        _ten_with_effects(1, "c2", "chair", "pen"),
        _ten_with_effects(2, "c4", "rug", "clock"),
        _ten_with_effects(3, "c6", "kettle", "lamp"),
    ]
    tasks += [
        _fifteen_ops(0, ("c1", "c2", "c3"), "kettle", "Rome"),
        _fifteen_ops(1, ("c4", "c5", "c6"), "desk", "Tokyo"),
    ]
    return tuple(tasks)


TASKS: tuple[Task, ...] = _suite()
"""The suite: 41 tasks of 3 to 15 tool calls, 31 of them with side effects."""

_BY_ID: Mapping[str, Task] = {t.id: t for t in TASKS}


@dataclasses.dataclass(frozen=True, slots=True)
class Conversation:
    """Several tasks asked one after another on ONE thread, one human message each.

    A task may come back (the same question later in the day, the same restock
    again): its calls then repeat identical calls of earlier turns, and a
    repeated side effect is asked for anew, not duplicated. Its oracle runs the
    tasks in order on one shop.
    """

    id: str
    family: str
    turns: tuple[Task, ...]

    @property
    def prompt(self) -> str:
        """The first human message."""
        return self.turns[0].prompt

    @property
    def calls(self) -> int:
        """Tool calls on the intended path, over every turn."""
        return sum(t.calls for t in self.turns)

    @property
    def side_effects(self) -> int:
        """Side-effecting calls on the intended path, over every turn."""
        return sum(t.side_effects for t in self.turns)

    @property
    def tools(self) -> frozenset[str]:
        """The tools the conversation uses."""
        return frozenset(name for t in self.turns for name in t.tools)

    def repeats(self) -> int:
        """Intended calls identical (tool + arguments as written) to one of an earlier
        turn: what a thread-wide loop guard would count against the agent."""
        seen: set[str] = set()
        count = 0
        for turn in self.turns:
            mine = {f"{c.tool}:{c.args!r}" for s in turn.steps for c in s.calls}
            count += len(mine & seen)
            seen |= mine
        return count


Scenario = Task | Conversation
"""What one run of the benchmark drives: a task on a fresh thread, or a conversation."""


def turns_of(scenario: Scenario) -> tuple[Task, ...]:
    """The tasks of `scenario`, one per human message."""
    return scenario.turns if isinstance(scenario, Conversation) else (scenario,)


def _conversation(cid: str, *task_ids: str) -> Conversation:
    return Conversation(cid, "conversation", tuple(_BY_ID[t] for t in task_ids))


CONVERSATIONS: tuple[Conversation, ...] = (
    # A regular customer's day: the same weather question three times, the same status
    # report twice, the same restock twice. get_customer("c1") is asked in 7 turns.
    _conversation(
        "conv-regular",
        "weather-0",
        "ten-reads-0",
        "buy-0",
        "weather-0",
        "ten-reads-0",
        "trip-0",
        "restock-0",
        "restock-0",
        "weather-0",
    ),
    # A support shift: 14 tasks and over 100 tool calls on one thread (the per-task
    # max_tool_attempts is 100), the same status email sent twice, on request.
    _conversation(
        "conv-shift",
        "status-email-0",
        "buy-1",
        "refund-0",
        "announce-0",
        "ten-reads-1",
        "ten-effects-0",
        "reorder-0",
        "ten-reads-2",
        "trip-1",
        "ops-0",
        "ten-effects-1",
        "ten-reads-3",
        "status-email-0",
        "restock-1",
    ),
)
"""Conversations of many tasks on one thread (the loop guard and the budgets are per task)."""


@dataclasses.dataclass(frozen=True, slots=True)
class AgentStyle:
    """How the scripted agent behaves beyond each step's ``on_error``, as real models do.

    >>> AgentStyle(reissue=True, ids="per_message").ids
    'per_message'
    """

    reissue: bool = False
    """Re-issue a call answered with an error once more (same tool, same arguments,
    a new tool-call id) before doing what the step's ``on_error`` says: a model whose
    call's answer was lost asks again before it gives up or moves on."""
    ids: IdStyle = "unique"
    """``unique``: every tool-call id is new on the thread (``<call>~<task>.<n>``);
    ``per_message``: ``call_0``, ``call_1`` in every assistant message, as several
    providers and local model servers number them."""


_DEFAULT_STYLE = AgentStyle()


# --------------------------------------------------------------- agent logic


class _Missing(Exception):
    """A `Ref` to a result the agent does not have."""


def _lookup(ref: Ref, results: Mapping[str, Any]) -> Any:
    if ref.call not in results:
        raise _Missing(ref.call)
    value = results[ref.call]
    for part in ref.path:
        if not isinstance(value, Mapping) or part not in value:
            raise _Missing(f"{ref.call}.{'.'.join(ref.path)}")
        value = value[part]
    return value


def _render(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def resolve(value: Any, results: Mapping[str, Any]) -> Any:
    """`value` with every `Ref` and `Text` replaced by what it refers to.

    Raises `_Missing` when a referenced result is not there.
    """
    if isinstance(value, Ref):
        return _lookup(value, results)
    if isinstance(value, Text):
        return "".join(_render(resolve(p, results)) for p in value.parts)
    if isinstance(value, Mapping):
        return {k: resolve(v, results) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [resolve(v, results) for v in value]
    return value


def _resolvable(call: Call, results: Mapping[str, Any]) -> bool:
    try:
        resolve(call.args, results)
    except _Missing:
        return False
    return True


@dataclasses.dataclass(frozen=True, slots=True)
class _Issue:
    calls: tuple[Call, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class _Finish:
    aborted: bool


def _next_action(
    task: Task, results: Mapping[str, Any], tries: Mapping[str, int], *, reissue: bool = False
) -> _Issue | _Finish:
    """The scripted policy: the next calls to issue, or the end of the task. With
    `reissue`, every failed call is issued once more before ``on_error`` applies."""
    for step in task.steps:
        pending = [c for c in step.calls if c.id not in results]
        ready = [c for c in pending if _resolvable(c, results)]  # others: a dependency failed
        if not ready:
            continue
        allowed = 2 if step.on_error == "retry" or reissue else 1
        fresh = tuple(c for c in ready if tries.get(c.id, 0) < allowed)
        if fresh:
            return _Issue(fresh)
        if step.on_error != "skip":
            return _Finish(aborted=True)
    return _Finish(aborted=False)


def _observe(message: ToolMessage | None) -> tuple[bool, Any]:
    """What any model can tell from a tool's answer: did it work, and what came back.

    An error that a human resolved with ``skip`` and a note holding the result (a
    JSON object, e.g. the order an operator found already placed) counts as that
    result: the model takes the human's word for it.
    """
    if message is None:
        return False, None
    content = message.content
    try:
        value = json.loads(content) if isinstance(content, str) else content
    except json.JSONDecodeError:
        return False, None  # not the JSON the tool documents
    if not isinstance(value, dict):
        return False, None
    if message.status == "error":
        return _human_result(value)
    if value.get("failed"):
        return False, value  # a batch that partly failed
    return True, value


def _human_result(envelope: Mapping[str, Any]) -> tuple[bool, Any]:
    context = envelope.get("context")
    if not isinstance(context, Mapping) or context.get("human_decision") != "skip":
        return False, None
    try:
        note = json.loads(str(context.get("note") or ""))
    except json.JSONDecodeError:
        return False, None
    return (True, note) if isinstance(note, dict) else (False, None)


_ID_SEP = "~"


def _task_calls(task: Task) -> dict[str, Call]:
    return {c.id: c for s in task.steps for c in s.calls}


@dataclasses.dataclass(slots=True)
class _Issued:
    """One tool call of an assistant message, waiting for (or given) its answer."""

    position: int
    call: ToolCall
    intended: str | None
    """The intended call it is (a `Call.id`), None for someone else's call."""


def _history(
    task: Task, messages: Sequence[BaseMessage], style: AgentStyle = _DEFAULT_STYLE
) -> tuple[dict[str, Any], Counter[str], int]:
    """The agent's memory, read back from the conversation: results by intended call,
    tries by intended call, and how many AI turns there were.

    Which intended call a tool call was: with unique ids, the id says so; with
    per-message ids (``call_0`` in every message) the agent replays its own policy
    on the conversation up to each of its messages, as a model knows what it asked
    for. Each tool call is answered by the first `ToolMessage` after it with its id
    (the latest call still waiting, when ids repeat).
    """
    known = _task_calls(task)
    results: dict[str, Any] = {}
    tries: Counter[str] = Counter()
    last_try: dict[str, int] = {}
    seen: list[tuple[int, str, Any, Any]] = []  # successful calls someone else made
    waiting: dict[str, list[_Issued]] = {}
    turns = 0
    for position, message in enumerate(messages):
        if isinstance(message, ToolMessage):
            queue = waiting.get(message.tool_call_id)
            if not queue:
                continue
            issued = queue.pop()
            ok, value = _observe(message)
            if issued.intended is None:
                if ok:
                    seen.append((issued.position, issued.call["name"], issued.call["args"], value))
            elif ok:
                results[issued.intended] = value
            continue
        if not isinstance(message, AIMessage):
            continue
        turns += 1
        if style.ids == "per_message":
            intended = _replayed(
                task,
                message,
                results=results,
                tries=tries,
                last_try=last_try,
                seen=seen,
                reissue=style.reissue,
            )
        else:
            intended = [_named(c.get("id"), known) for c in message.tool_calls]
        for call, intended_call in zip(message.tool_calls, intended, strict=True):
            if intended_call is not None:
                tries[intended_call] += 1
                last_try[intended_call] = position
            issued = _Issued(position, call, intended_call)
            waiting.setdefault(call.get("id") or "", []).append(issued)
    if seen:
        _adopt(task, results, last_try, seen)
    return results, tries, turns


def _named(call_id: str | None, known: Mapping[str, Call]) -> str | None:
    """The intended call a unique id names (``<call>~<task>.<n>``), None for another's."""
    name = (call_id or "").rsplit(_ID_SEP, 1)[0]
    return name if name in known else None


def _replayed(
    task: Task,
    message: AIMessage,
    *,
    results: Mapping[str, Any],
    tries: Mapping[str, int],
    last_try: Mapping[str, int],
    seen: Sequence[tuple[int, str, Any, Any]],
    reissue: bool,
) -> list[str | None]:
    """The intended calls behind `message`'s tool calls, by replaying the policy on what
    the agent knew when it wrote it; None for a message that is not the agent's (a
    named one, e.g. a plan's) or a call the replay does not explain."""
    none: list[str | None] = [None] * len(message.tool_calls)
    if message.name:
        return none
    known = dict(results)
    if seen:
        _adopt(task, known, last_try, seen)
    action = _next_action(task, known, tries, reissue=reissue)
    if not isinstance(action, _Issue) or len(action.calls) != len(message.tool_calls):
        return none
    if any(c.tool != t["name"] for c, t in zip(action.calls, message.tool_calls, strict=True)):
        return none
    return [c.id for c in action.calls]


def _adopt(
    task: Task,
    results: dict[str, Any],
    last_try: Mapping[str, int],
    seen: Sequence[tuple[int, str, Any, Any]],
) -> None:
    """Use a result someone else obtained (e.g. a replan) for a call of ours that failed:
    a later successful call of the same tool, or of its alternative endpoint, with the
    arguments we needed."""
    for step in task.steps:
        for call in step.calls:
            tried = last_try.get(call.id)
            if tried is None or call.id in results or not _resolvable(call, results):
                continue
            wanted = resolve(call.args, results)
            tools = {call.tool, ALTERNATIVES.get(call.tool)}
            for position, name, args, value in seen:
                if position > tried and name in tools and args == wanted:
                    results[call.id] = value
                    break


def _answer(task: Task, results: Mapping[str, Any], *, aborted: bool) -> str:
    if aborted:
        return ABORT_ANSWER
    if task.answer is None:
        return "Done."
    try:
        return str(resolve(task.answer, results))
    except _Missing:
        return ABORT_ANSWER


def current_turn(scenario: Scenario, messages: Sequence[BaseMessage]) -> tuple[Task, int]:
    """The task the latest human message asks for, and where its messages start.

    A conversation's k-th human message asks for its k-th task; only the messages
    after it are that task's (a task's memory starts with its request)."""
    humans = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
    turns = turns_of(scenario)
    task = turns[min(max(0, len(humans) - 1), len(turns) - 1)]
    return task, (humans[-1] + 1 if humans else 0)


def agent_reply(
    task: Scenario, messages: Sequence[BaseMessage], style: AgentStyle = _DEFAULT_STYLE
) -> AIMessage:
    """The scripted agent's reply to `messages` (a pure function of them)."""
    current, start = current_turn(task, messages)
    results, tries, _ = _history(current, messages[start:], style)
    action = _next_action(current, results, tries, reissue=style.reissue)
    if isinstance(action, _Finish):
        return AIMessage(content=_answer(current, results, aborted=action.aborted))
    serial = sum(isinstance(m, AIMessage) for m in messages)  # unique on the whole thread
    calls = [
        ToolCall(
            name=c.tool,
            args=resolve(c.args, results),
            id=f"call_{i}"
            if style.ids == "per_message"
            else f"{c.id}{_ID_SEP}{current.id}.{serial}",
            type="tool_call",
        )
        for i, c in enumerate(action.calls)
    ]
    return AIMessage(content="", tool_calls=calls)


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class _Reply:
    """One scripted reply (LangChain serializes a model's fields: keep the repr short)."""

    task: Scenario | None
    role: Literal["agent", "planner", "repairer"] = "agent"
    style: AgentStyle = _DEFAULT_STYLE

    def __call__(self, messages: list[BaseMessage]) -> AIMessage:
        if self.task is None or self.role == "repairer":
            return repair_reply(messages)
        if self.role == "planner":
            return planner_reply(self.task, messages)
        return agent_reply(self.task, messages, self.style)

    def __repr__(self) -> str:
        return f"{self.role}({self.task.id if self.task else '-'})"


def scripted_agent(
    task: Scenario, *, budget: int | None = None, style: AgentStyle = _DEFAULT_STYLE
) -> ScriptedChatModel:
    """A tool-calling chat model that works through `task` (or each task of a
    conversation, one per human message) as its script says, in `style`."""
    replies = budget if budget is not None else MAX_MODEL_CALLS * len(turns_of(task))
    return ScriptedChatModel(responses=[_Reply(task, style=style)] * replies)


# ------------------------------------------------------------------- oracle


@dataclasses.dataclass(frozen=True, slots=True)
class Oracle:
    """The ground truth of a task (or conversation): the backend state and answer of the
    intended path."""

    state: dict[str, Any]
    answer: str | None
    """The (last) task's answer; None when the task defines none."""
    duplicate_effects: int
    answers: tuple[str | None, ...] = ()
    """Each task's answer, in turn order."""
    effects: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Committed effects per identity at the end (a conversation may ask for one twice)."""
    turn_effects: tuple[Mapping[str, int], ...] = ()
    """The effects each task commits, in turn order."""


_ORACLES: dict[str, tuple[Scenario, Oracle]] = {}


def _execute(task: Task, tools: Mapping[str, BaseTool]) -> dict[str, Any]:
    """Run `task`'s intended calls directly; its results by call."""
    results: dict[str, Any] = {}
    tries: Counter[str] = Counter()
    while True:
        action = _next_action(task, results, tries)
        if isinstance(action, _Finish):
            if action.aborted:
                raise AssertionError(f"task {task.id} cannot complete on a clean shop")
            break
        for call in action.calls:
            tries[call.id] += 1
            output = tools[call.tool].invoke(resolve(call.args, results))
            results[call.id] = json.loads(json.dumps(output))
    if len(results) != task.calls:
        raise AssertionError(f"task {task.id} skipped calls on a clean shop")
    return results


def oracle(task: Scenario) -> Oracle:
    """Execute `task`'s intended calls directly on a fresh `Shop`: no agent, no framework.
    A conversation's tasks run one after another on the same shop."""
    cached = _ORACLES.get(task.id)
    if cached is not None and cached[0] is task:
        return cached[1]
    shop = Shop()
    tools = {t.name: t for t in shop.tools()}
    answers: list[str | None] = []
    turn_effects: list[Mapping[str, int]] = []
    for turn in turns_of(task):
        before = Counter(shop.effects)
        results = _execute(turn, tools)
        answers.append(_answer(turn, results, aborted=False) if turn.answer is not None else None)
        turn_effects.append(dict(shop.effects - before))
    truth = Oracle(
        shop.snapshot(),
        answers[-1],
        shop.duplicate_effects,
        tuple(answers),
        dict(shop.effects),
        tuple(turn_effects),
    )
    _ORACLES[task.id] = (task, truth)
    return truth


def judge(task: Scenario, shop: Shop, answer: str | Sequence[str | None] | None) -> bool:
    """True when the run left the shop in the oracle's state (and gave its answer; for a
    conversation `answer` holds each turn's, and every one must be right)."""
    truth = oracle(task)
    if shop.snapshot() != truth.state:
        return False
    given = (answer,) if answer is None or isinstance(answer, str) else tuple(answer)
    if len(given) != len(truth.answers):
        return False
    return all(want is None or got == want for got, want in zip(given, truth.answers, strict=True))


def turn_judged(
    task: Scenario, effects: Sequence[Mapping[str, int]], answers: Sequence[str | None]
) -> list[bool]:
    """Per turn: did it give the oracle's answer and commit exactly the oracle's effects
    for that turn (`effects`: what each turn committed, per identity)?"""
    truth = oracle(task)
    out = []
    for k, want in enumerate(truth.answers):
        got = answers[k] if k < len(answers) else None
        made = effects[k] if k < len(effects) else {}
        right = k < len(answers) and (want is None or got == want)
        out.append(right and dict(made) == dict(truth.turn_effects[k]))
    return out


def extra_effects(task: Scenario, shop: Shop) -> int:
    """Committed effects beyond what the oracle commits, per identity: duplicates (a
    conversation may rightly ask for the same effect twice; that is not one)."""
    expected = oracle(task).effects
    return sum(max(0, n - max(1, expected.get(k, 0))) for k, n in shop.effects.items())


# ------------------------------------------------------------------- planner

_ENVELOPES = re.compile(
    r"## Failed calls \(error envelopes\)\n```json\n(?P<json>.*?)\n```", re.DOTALL
)


def _as_reference(value: Any) -> Any:
    """A task argument as a plan argument: `Ref` -> ``$steps`` reference, `Text` ->
    interpolation."""
    if isinstance(value, Ref):
        return ".".join(["$steps", value.call, "output", *value.path])
    if isinstance(value, Text):
        return "".join(
            "{" + _as_reference(p) + "}" if isinstance(p, Ref) else _render(p) for p in value.parts
        )
    if isinstance(value, Mapping):
        return {k: _as_reference(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_as_reference(v) for v in value]
    return value


def _refs(value: Any) -> set[str]:
    if isinstance(value, Ref):
        return {value.call}
    if isinstance(value, Text):
        return {p.call for p in value.parts if isinstance(p, Ref)}
    if isinstance(value, Mapping):
        return {r for v in value.values() for r in _refs(v)}
    if isinstance(value, list | tuple):
        return {r for v in value for r in _refs(v)}
    return set()


def _chain(call: Call, calls: Mapping[str, Call]) -> list[Call]:
    """`call` and the earlier calls its arguments come from, dependencies first."""
    order: list[Call] = []

    def visit(current: Call) -> None:
        if current in order:
            return
        for name in sorted(_refs(current.args)):
            visit(calls[name])
        order.append(current)

    visit(call)
    return order


def planner_reply(scenario: Scenario, messages: Sequence[BaseMessage]) -> AIMessage:
    """The scripted planner's `Plan` for a plan request (see `replan.format_plan_request`).

    It sees what the request shows: the goal and the failed calls' envelopes, not
    their arguments. Like a model that knows how the task is done, it plans each
    failed call through the call's alternative endpoint (`ALTERNATIVES`),
    re-deriving its arguments with the earlier calls they come from. It plans
    nothing for a call without an alternative (a side effect) or whose arguments
    come from a side effect: the request shows neither the arguments nor earlier
    results, so re-deriving them would repeat the effect (the verifier would not
    object). Then the replan budget is spent and the call escalates.
    """
    prompt = messages[-1].text if messages else ""
    found = _ENVELOPES.search(prompt)
    envelopes = json.loads(found["json"]) if found else []
    task = _planned_task(scenario, envelopes)
    calls = _task_calls(task)
    steps: dict[str, dict[str, Any]] = {}
    failed: list[tuple[Mapping[str, Any], Call, str]] = []
    for envelope in envelopes:
        call = calls.get(str(envelope.get("call_id") or "").rsplit(_ID_SEP, 1)[0])
        alternative = ALTERNATIVES.get(call.tool) if call is not None else None
        if call is None or alternative is None:
            continue
        chain = _chain(call, calls)
        if any(c.tool in SIDE_EFFECT_TOOLS for c in chain):
            continue  # re-deriving the arguments would repeat a side effect: no plan
        failed.append((envelope, call, alternative))
        for current in chain:
            steps.setdefault(
                current.id,
                {
                    "id": current.id,
                    "tool": alternative if current is call else current.tool,
                    "args": _as_reference(current.args),
                    "depends_on": sorted(_refs(current.args)),
                },
            )
    if not failed:
        return AIMessage(content="No alternative path: these calls have no other endpoint.")
    envelope, call, _ = failed[0]
    cause = f"{call.tool} failed with {envelope.get('type')}: {envelope.get('message')}"
    plan = {
        "diagnosis": {
            "failed_tool": call.tool,
            "failure_class": envelope.get("failure_class"),
            "cause": f"{cause}, a {envelope.get('failure_class')} failure reported by the tool",
        },
        "rationale": "; ".join(
            f"{alt} serves the same data as the failing {c.tool} from another provider"
            for _, c, alt in failed
        )
        + ", and the steps it depends on re-derive its arguments",
        "steps": list(steps.values()),
    }
    return AIMessage(
        content="",
        tool_calls=[ToolCall(name="Plan", args=plan, id=None, type="tool_call")],
    )


def _planned_task(scenario: Scenario, envelopes: Sequence[Mapping[str, Any]]) -> Task:
    """The task whose calls failed: named in the envelopes' call ids (``<call>~<task>.<n>``),
    else the first (a single task, or ids that say nothing)."""
    turns = turns_of(scenario)
    by_id = {t.id: t for t in turns}
    for envelope in envelopes:
        tail = str(envelope.get("call_id") or "").rpartition(_ID_SEP)[2]
        found = by_id.get(tail.rpartition(".")[0])
        if found is not None:
            return found
    return turns[0]


def scripted_planner(task: Scenario, *, budget: int = MAX_MODEL_CALLS) -> ScriptedChatModel:
    """The planner model for `add_resilience(planner_model=...)` in the benchmark."""
    return ScriptedChatModel(responses=[_Reply(task, role="planner")] * budget)


# ------------------------------------------------------------------ operator


def operator_decision(
    request: Mapping[str, Any], asked: Counter[str], *, call: str | None = None
) -> dict[str, Any]:
    """The scripted human behind escalations (a ``Command(resume=...)`` value).

    The first escalation of a call is answered ``retry`` (as after fixing its
    cause: a permission, a service, or "check it and run it if needed"), a
    second one ``skip``. The operator does not look into the shop: a side
    effect whose outcome was unknown is reconciled by the package's idempotency
    ledger and the tool's ``status_check`` when the call runs again. `call`
    names the call asked about (default: its ``call_id``; a caller whose agent
    numbers ids per message says which message's call it is).
    """
    name = call if call is not None else str(request.get("call_id"))
    asked[name] += 1
    if asked[name] == 1:
        return {"action": "retry"}
    return {"action": "skip", "note": "could not be completed"}


# ------------------------------------------------------------------ repairer

_FAILED = re.compile(r"^Failed call: (?P<tool>[\w-]+)\((?P<args>.*)\)$", re.MULTILINE)
_ENVELOPE = re.compile(r"^Error envelope: (?P<json>\{.*\})$", re.MULTILINE)
_CHOICES = re.compile(r"'([^']*)'")


def _fix(args: dict[str, Any], errors: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    fixed = dict(args)
    errors = list(errors)
    missing = [
        str(e.get("field")) for e in errors if "required" in str(e.get("problem", "")).lower()
    ]
    for field in missing:
        spare = [a for a in fixed if a not in missing and not _mentioned(a, errors)]
        match = difflib.get_close_matches(field, spare, n=1, cutoff=0.5)
        if match:
            fixed[field] = fixed.pop(match[0])
    for error in errors:
        field, problem = str(error.get("field")), str(error.get("problem", ""))
        if field in fixed and problem.startswith("Input should be"):
            choices = _CHOICES.findall(problem)
            value = str(fixed[field])
            best = difflib.get_close_matches(value, choices, n=1, cutoff=0.0)
            if best:
                fixed[field] = best[0]
    return fixed


def _mentioned(name: str, errors: Iterable[Mapping[str, Any]]) -> bool:
    return any(str(e.get("field")) == name for e in errors)


def repair_reply(messages: Sequence[BaseMessage]) -> AIMessage:
    """The scripted repairer's reply to a repair request (see `repair.repair_prompt`).

    It reads the failed call and the error envelope: a required argument that
    is missing is taken from the closest-named argument the call did pass
    (schema drift), an invalid choice becomes the closest allowed one (enum
    error). Anything else it cannot fix, and says so without calling a tool.
    """
    prompt = messages[-1].text if messages else ""
    failed, envelope = _FAILED.search(prompt), _ENVELOPE.search(prompt)
    if failed is None or envelope is None:
        return AIMessage(content="I cannot tell which call failed.")
    try:
        args = json.loads(failed["args"])
        error = json.loads(envelope["json"])
    except json.JSONDecodeError:
        return AIMessage(content="I cannot read the failed call.")
    errors = (error.get("context") or {}).get("errors") or []
    fixed = _fix(args, errors)
    if fixed == args:
        return AIMessage(content="Nothing in the error tells me how to fix this call.")
    return AIMessage(
        content="",
        tool_calls=[ToolCall(name=failed["tool"], args=fixed, id=None, type="tool_call")],
    )


def scripted_repairer(*, budget: int = MAX_MODEL_CALLS) -> ScriptedChatModel:
    """The repair model for `add_resilience(repair_model=...)` in the benchmark."""
    return ScriptedChatModel(responses=[_Reply(None, role="repairer")] * budget)
