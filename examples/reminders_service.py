"""The Tickwheel side of `examples/faust_app.py`: workers that keep the app's timer book.

    tickwheel worker --service examples.reminders_service:service

Imports no faust: the workers need only Tickwheel. `REMINDERS_CONTEXT` names the context
(the tests give each run one of its own).
"""

from __future__ import annotations

import os

from app import Service, timer_book

CONTEXT = os.environ.get("REMINDERS_CONTEXT", "reminders")
BOOK = "order-timers"
"""`<context>.order-timers/<order id>`: the timers of one order, decided by the workers."""
TARGET = "order"
"""`<context>.order/<order id>`: where the timers fire, read by the faust app."""

service = Service(aggregates=(timer_book(CONTEXT, BOOK),))
