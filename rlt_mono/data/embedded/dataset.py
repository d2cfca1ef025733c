"""A small synthetic reasoning dataset that ships with the package (no download needed).

Each row is a multi-step arithmetic word problem (shopping, distances, sharing, ages, orchards) with
small integers. The columns are the ones RLT reads from custom data: ``question``, a short
``solution`` ("The answer is 42.") and a ``reasoning_trace`` whose steps are equations
("3 * 4 = 12.") that a checker can verify. Generation is deterministic in ``seed`` and uses only a
private ``random.Random``, never the global RNG.

Usage::

    rows = generate_rows(num_rows=2000, seed=0)
    write_jsonl(rows, "embedded.jsonl")
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from pathlib import Path

from rlt_mono.runs.atomic_write import write_text

NAMES = ("Mia", "Noah", "Ava", "Liam", "Zoe", "Omar", "Lena", "Ravi", "Sara", "Theo", "Yuki", "Ines")
ITEMS = ("apples", "marbles", "stickers", "cookies", "pencils", "shells", "cards", "stamps")
SHOP_GOODS = (("notebooks", "pens"), ("apples", "pears"), ("shirts", "socks"), ("books", "maps"))

# A template draws numbers from ``rng`` and returns (question, steps, answer); every step is a
# sentence ending in an equation "a op b = c." whose result feeds the next step.
Problem = tuple[str, list[str], int]


def _shopping(rng: random.Random) -> Problem:
    """Cost of two kinds of goods, optionally the change from a bill (3-4 steps)."""
    name = rng.choice(NAMES)
    first, second = rng.choice(SHOP_GOODS)
    count_a, price_a = rng.randint(2, 9), rng.randint(2, 9)
    count_b, price_b = rng.randint(2, 9), rng.randint(2, 9)
    cost_a, cost_b = count_a * price_a, count_b * price_b
    total = cost_a + cost_b
    question = (
        f"{name} buys {count_a} {first} at {price_a} dollars each and {count_b} {second} at {price_b} dollars each."
    )
    steps = [
        f"The {first} cost {count_a} * {price_a} = {cost_a}.",
        f"The {second} cost {count_b} * {price_b} = {cost_b}.",
        f"Together they cost {cost_a} + {cost_b} = {total}.",
    ]
    if rng.random() < 0.5:
        return question + " How many dollars does she spend in total?", steps, total
    bill = rng.choice([b for b in (50, 100, 200) if b > total])
    steps.append(f"The change is {bill} - {total} = {bill - total}.")
    return question + f" She pays with a {bill}-dollar bill. How much change does she get?", steps, bill - total


def _distance(rng: random.Random) -> Problem:
    """Total distance of a two-leg trip, optionally what is left of a route (3-4 steps)."""
    speed_a, hours_a = rng.randint(3, 20), rng.randint(2, 6)
    speed_b, hours_b = rng.randint(3, 20), rng.randint(2, 6)
    leg_a, leg_b = speed_a * hours_a, speed_b * hours_b
    total = leg_a + leg_b
    question = (
        f"A cyclist rides at {speed_a} km per hour for {hours_a} hours, then at {speed_b} km per hour "
        f"for {hours_b} hours."
    )
    steps = [
        f"The first part is {speed_a} * {hours_a} = {leg_a} km.",
        f"The second part is {speed_b} * {hours_b} = {leg_b} km.",
        f"In total the cyclist rides {leg_a} + {leg_b} = {total} km.",
    ]
    if rng.random() < 0.5:
        return question + " How many km does the cyclist ride in total?", steps, total
    route = total + rng.randint(5, 60)
    steps.append(f"The distance left is {route} - {total} = {route - total} km.")
    return question + f" The route is {route} km long. How many km are left?", steps, route - total


def _sharing(rng: random.Random) -> Problem:
    """Items gathered then shared equally, optionally some eaten per share (2-3 steps)."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    friends, share = rng.randint(2, 9), rng.randint(3, 12)
    total = friends * share
    owned = rng.randint(1, total - 1)
    found = total - owned
    question = f"{name} has {owned} {item} and finds {found} more, then shares them equally among {friends} friends."
    steps = [
        f"{name} has {owned} + {found} = {total} {item}.",
        f"Each friend gets {total} / {friends} = {share}.",
    ]
    if rng.random() < 0.5:
        return question + f" How many {item} does each friend get?", steps, share
    lost = rng.randint(1, share - 1)
    steps.append(f"Each friend keeps {share} - {lost} = {share - lost}.")
    return question + f" Each friend gives away {lost}. How many {item} does each friend keep?", steps, share - lost


def _ages(rng: random.Random) -> Problem:
    """Ages linked by a difference, a factor and a number of years (3 steps)."""
    name = rng.choice(NAMES)
    age, gap = rng.randint(2, 12), rng.randint(1, 8)
    factor, years = rng.randint(2, 4), rng.randint(2, 15)
    sister = age + gap
    parent = sister * factor
    question = (
        f"{name} is {age} years old. {name}'s sister is {gap} years older. Their mother is {factor} times "
        f"as old as the sister. How old will the mother be in {years} years?"
    )
    steps = [
        f"The sister is {age} + {gap} = {sister}.",
        f"The mother is {sister} * {factor} = {parent}.",
        f"In {years} years she will be {parent} + {years} = {parent + years}.",
    ]
    return question, steps, parent + years


def _orchard(rng: random.Random) -> Problem:
    """Trees planted in rows, some lost, some replanted (3 steps)."""
    rows, per_row = rng.randint(2, 9), rng.randint(3, 12)
    planted = rows * per_row
    lost = rng.randint(1, planted - 1)
    extra = rng.randint(1, 20)
    question = (
        f"A farmer plants {rows} rows of {per_row} trees. {lost} trees die, and then the farmer plants "
        f"{extra} new trees. How many trees are there now?"
    )
    steps = [
        f"The farmer plants {rows} * {per_row} = {planted} trees.",
        f"After the loss there are {planted} - {lost} = {planted - lost}.",
        f"With the new trees there are {planted - lost} + {extra} = {planted - lost + extra}.",
    ]
    return question, steps, planted - lost + extra


TEMPLATES: tuple[Callable[[random.Random], Problem], ...] = (_shopping, _distance, _sharing, _ages, _orchard)


def generate_rows(num_rows: int = 2000, seed: int = 0) -> list[dict[str, str]]:
    """Generate ``num_rows`` arithmetic word problems, deterministic in ``seed``.

    Returns rows ``{"question", "solution", "reasoning_trace", "answer"}``; the solution is
    ``"The answer is N."`` and the trace is 2-4 equation sentences followed by that same sentence.
    """
    if num_rows < 0:
        raise ValueError(f"num_rows must be >= 0, got {num_rows}")
    rng = random.Random(seed)
    rows = []
    for _ in range(num_rows):
        question, steps, answer = rng.choice(TEMPLATES)(rng)
        solution = f"The answer is {answer}."
        rows.append({"question": question, "solution": solution, "reasoning_trace": " ".join([*steps, solution]),
                     "answer": str(answer)})
    return rows


def write_jsonl(rows: Iterable[dict[str, str]], path: str | Path) -> Path:
    """Write ``rows`` to ``path`` as JSON lines (UTF-8, one object per line) and return the path."""
    path = Path(path)
    write_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return path
