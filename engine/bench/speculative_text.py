"""The chats of ``folio bench speculative``, fixed texts so every run and side answers the
same prompt: a code edit (a short Python file pasted whole, asked back with one variable
renamed: a reply that should copy most of its prompt) and free prose (a question whose
answer repeats nothing of it)."""

from __future__ import annotations

CODE = '''import csv
from dataclasses import dataclass


@dataclass
class Order:
    customer: str
    amount: float
    paid: bool


def load_orders(path):
    orders = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            paid = row["paid"].strip().lower() == "yes"
            orders.append(Order(row["customer"], float(row["amount"]), paid))
    return orders


def unpaid_total(orders):
    total = 0.0
    for order in orders:
        if not order.paid:
            total += order.amount
    return total


def report(path):
    orders = load_orders(path)
    print(f"{len(orders)} orders, {unpaid_total(orders):.2f} unpaid")
'''

CODE_EDIT = ("Here is my Python file:\n\n```python\n" + CODE + "```\n\nRename the variable "
             "`total` to `running_sum` everywhere and give me the whole file back, with no "
             "explanation.")

PROSE = ("What should a first-time visitor know before hiking in the mountains in autumn? "
         "Give practical advice in a few short paragraphs.")

CHATS = {"code": CODE_EDIT, "prose": PROSE}
