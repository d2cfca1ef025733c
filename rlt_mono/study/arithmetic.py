"""Equations written in an explanation, checked: how many are arithmetically right.

An equation is a run of numbers joined by ``+ - * / × ÷`` followed by ``=`` and a number (``73 + 35 + 20 = 128``,
``4 × 3 = $12``); it is right when the left side, evaluated, equals the right side within a relative 1e-6. Other
statements (words, units, percentages, a number written with its own ``$`` inside the left side) are not read, so a
text with no equation has none wrong.

The RLT reward scores how likely the student finds the solution after the explanation; the teacher is shown that
solution, so it can state the answer right after wrong steps, and the reward cannot see them (docs/STUDY.md). The
distill stage's ``selection: best_correct`` uses ``check`` to prefer samples whose equations are all right.
"""

from __future__ import annotations

import ast
import operator
import re

EQUATION = re.compile(r"((?:\d[\d,]*(?:\.\d+)?\s*[-+*/×÷]\s*)+\d[\d,]*(?:\.\d+)?)\s*=\s*\$?(\d[\d,]*(?:\.\d+)?)")
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate(expression: str) -> float:
    """The value of a ``+ - * /`` expression of numbers (``×``, ``÷`` and thousands commas accepted).

    Raises:
        ValueError: any other syntax.
        ZeroDivisionError: a division by zero.
    """
    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        raise ValueError(expression)
    text = expression.replace(",", "").replace("×", "*").replace("÷", "/")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as err:
        raise ValueError(expression) from err
    return walk(tree.body)


def check(text: str) -> tuple[int, int]:
    """``(right, wrong)``: the equations of ``text`` whose left side equals / does not equal the right side. An
    equation whose left side cannot be evaluated (a division by zero) is neither."""
    right = wrong = 0
    for left, result in EQUATION.findall(text):
        try:
            value = evaluate(left)
        except (ValueError, ZeroDivisionError):
            continue
        target = float(result.replace(",", ""))
        if abs(value - target) <= 1e-6 * max(1.0, abs(target)):
            right += 1
        else:
            wrong += 1
    return right, wrong
