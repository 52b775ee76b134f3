"""Inventory bookkeeping for a small warehouse: items, stock moves and reports."""

from dataclasses import dataclass, field
from datetime import date
from typing import Dict, List, Optional


@dataclass
class Item:
    sku: str
    name: str
    unit_price: float
    quantity: int = 0
    tags: List[str] = field(default_factory=list)

    def value(self) -> float:
        return self.unit_price * self.quantity


@dataclass
class Move:
    sku: str
    delta: int
    day: date
    note: str = ""


class Inventory:
    def __init__(self) -> None:
        self.items: Dict[str, Item] = {}
        self.moves: List[Move] = []

    def add_item(self, item: Item) -> None:
        if item.sku in self.items:
            raise ValueError(f"duplicate sku {item.sku}")
        self.items[item.sku] = item

    def find(self, sku: str) -> Optional[Item]:
        return self.items.get(sku)

    def receive(self, sku: str, count: int, day: date, note: str = "") -> None:
        if count <= 0:
            raise ValueError("count must be positive")
        item = self.items[sku]
        item.quantity += count
        self.moves.append(Move(sku, count, day, note))

    def ship(self, sku: str, count: int, day: date, note: str = "") -> None:
        item = self.items[sku]
        if count > item.quantity:
            raise ValueError(f"only {item.quantity} of {sku} in stock")
        item.quantity -= count
        self.moves.append(Move(sku, -count, day, note))

    def total_value(self) -> float:
        return sum(item.value() for item in self.items.values())

    def low_stock(self, threshold: int) -> List[Item]:
        low = [item for item in self.items.values() if item.quantity < threshold]
        return sorted(low, key=lambda item: item.quantity)

    def moves_for(self, sku: str) -> List[Move]:
        return [move for move in self.moves if move.sku == sku]

    def tagged(self, tag: str) -> List[Item]:
        return [item for item in self.items.values() if tag in item.tags]


def monthly_report(inventory: Inventory, year: int, month: int) -> Dict[str, int]:
    """Net quantity change per sku for one month."""
    report: Dict[str, int] = {}
    for move in inventory.moves:
        if move.day.year == year and move.day.month == month:
            report[move.sku] = report.get(move.sku, 0) + move.delta
    return report


def format_report(report: Dict[str, int]) -> str:
    lines = []
    for sku in sorted(report):
        delta = report[sku]
        sign = "+" if delta >= 0 else ""
        lines.append(f"{sku:<12}{sign}{delta}")
    return "\n".join(lines)


if __name__ == "__main__":
    inv = Inventory()
    inv.add_item(Item("A-100", "bolt", 0.25, tags=["hardware"]))
    inv.add_item(Item("B-200", "lamp", 19.5, tags=["lighting"]))
    inv.receive("A-100", 500, date(2024, 3, 1), "first delivery")
    inv.receive("B-200", 20, date(2024, 3, 2))
    inv.ship("A-100", 120, date(2024, 3, 9), "order 17")
    print(format_report(monthly_report(inv, 2024, 3)))
    print(f"total value: {inv.total_value():.2f}")
