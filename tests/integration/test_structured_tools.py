"""Structured parameters and results (dataclass, TypedDict, NamedTuple, pydantic v2) through the real server."""

from __future__ import annotations

import dataclasses
import enum
from typing import List, NamedTuple, Optional, TypedDict

import pydantic  # test extra only: the SDK never imports it
import pytest

from conductor_agents import Agent, RunStatus, tool
from conductor_agents.testing import ToolCall

pytestmark = pytest.mark.integration


class Priority(enum.Enum):
    LOW = "low"
    HIGH = "high"


@dataclasses.dataclass
class Address:
    """Where to ship."""

    street: str
    city: str = "Paris"


@dataclasses.dataclass
class Order:
    item: str
    quantity: int
    ship_to: Address
    priority: Optional[Priority] = None
    notes: List[str] = dataclasses.field(default_factory=list)


class Filters(TypedDict, total=False):
    text: str
    limit: int


class Point(NamedTuple):
    x: float
    y: float = 0.0


class Customer(pydantic.BaseModel):
    """A customer record."""

    name: str
    tier: int = 1
    address: Optional["Street"] = None


class Street(pydantic.BaseModel):
    line: str


Customer.model_rebuild()


def test_structured_values_round_trip_through_a_tool(agent_runtime, scripted_llm, unique_name):
    """The model's JSON arguments arrive as instances; the instances returned reach the model as JSON."""
    order_name, search_name, move_name, upgrade_name = (unique_name(n) for n in ("order", "search", "move", "upgrade"))
    received = {}

    @tool(name=order_name)
    def place_order(order: Order) -> Order:
        """Place an order."""
        received["order"] = order
        return dataclasses.replace(order, quantity=order.quantity * 2)

    @tool(name=search_name)
    def search(filters: Filters) -> Filters:
        """Search."""
        received["filters"] = filters
        return {"text": filters["text"].upper(), "limit": filters.get("limit", 10)}

    @tool(name=move_name)
    def move(point: Point) -> Point:
        """Move a point."""
        received["point"] = point
        return point._replace(y=point.y + 1)

    @tool(name=upgrade_name)
    def upgrade(customer: Customer) -> Customer:
        """Upgrade a customer."""
        received["customer"] = customer
        return customer.model_copy(update={"tier": customer.tier + 1})

    calls = [
        ToolCall(order_name, {"order": {"item": "pen", "quantity": 3, "ship_to": {"street": "1 rue X"},
                                        "priority": "high"}}),
        ToolCall(search_name, {"filters": {"text": "pens"}}),
        ToolCall(move_name, {"point": {"x": 1}}),
        ToolCall(upgrade_name, {"customer": {"name": "Ada", "address": {"line": "2 Main St"}}}),
    ]
    model = scripted_llm.script([calls, "done"])
    agent = Agent(unique_name("structured"), model, tools=[place_order, search, move, upgrade])
    result = agent_runtime.run(agent, "Go.", timeout=90)
    assert result.status is RunStatus.COMPLETED

    assert received["order"] == Order("pen", 3, Address("1 rue X", "Paris"), Priority.HIGH, [])
    assert received["filters"] == {"text": "pens"}
    assert received["point"] == Point(1.0, 0.0) and isinstance(received["point"].x, float)
    assert received["customer"] == Customer(name="Ada", address=Street(line="2 Main St"))

    requests = scripted_llm.requests_for(model)
    outputs = {o.name: o.output for o in requests[1].tool_outputs}
    assert outputs[order_name] == {"item": "pen", "quantity": 6, "ship_to": {"street": "1 rue X", "city": "Paris"},
                                   "priority": "high", "notes": []}
    assert outputs[search_name] == {"text": "PENS", "limit": 10}
    assert outputs[move_name] == {"x": 1.0, "y": 1.0}
    assert outputs[upgrade_name] == {"name": "Ada", "tier": 2, "address": {"line": "2 Main St"}}

    offered = {t["name"]: t["parameters"] for t in requests[0].body["tools"]}
    order_schema = offered[order_name]["properties"]["order"]
    assert order_schema["required"] == ["item", "quantity", "ship_to"]
    assert order_schema["properties"]["ship_to"]["properties"]["city"]["default"] == "Paris"
    customer_schema = offered[upgrade_name]["properties"]["customer"]
    assert "$ref" not in str(customer_schema) and customer_schema["required"] == ["name"]
    scripted_llm.assert_no_anomalies(model)


def test_arguments_that_do_not_fit_the_type_are_shown_to_the_model(agent_runtime, scripted_llm, unique_name):
    """A missing nested field (schema check) and a pydantic validation error both reach the model by name."""
    order_name, upgrade_name = unique_name("order"), unique_name("upgrade")
    ran = []

    @tool(name=order_name)
    def place_order(order: Order) -> str:
        """Place an order."""
        ran.append(order)
        return "ok"

    @tool(name=upgrade_name)
    def upgrade(customer: Customer) -> str:
        """Upgrade."""
        ran.append(customer)
        return "ok"

    model = scripted_llm.script([
        [ToolCall(order_name, {"order": {"item": "pen", "quantity": 1, "ship_to": {}}}),
         ToolCall(upgrade_name, {"customer": {"name": "Ada", "tier": "gold"}})],
        "noted",
    ])
    result = agent_runtime.run(Agent(unique_name("bad_args"), model, tools=[place_order, upgrade]), "Go.", timeout=90)
    assert result.status is RunStatus.COMPLETED and ran == []
    outputs = {o.name: str(o.output) for o in scripted_llm.requests_for(model)[1].tool_outputs}
    assert "order.ship_to.street" in outputs[order_name]
    assert "tier" in outputs[upgrade_name]
