"""How often the equations written in distilled explanations are arithmetically right (a diagnostic of the study).

An equation is a run of numbers joined by + - * / × ÷ followed by "=" and a number ("73 + 35 + 20 = 128"); it is
right when the left side, evaluated, equals the right side. Other statements are not read. Usage:

    python bench/explanation_arithmetic.py <distill.jsonl>[:<column>] ... --out <file.json>
"""

import argparse
import ast
import json
import operator
import re
from pathlib import Path

EQUATION = re.compile(r"((?:\d[\d,]*(?:\.\d+)?\s*[-+*/×÷]\s*)+\d[\d,]*(?:\.\d+)?)\s*=\s*\$?(\d[\d,]*(?:\.\d+)?)")
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate(expression: str) -> float:
    """The value of a +-*/ expression of numbers (no other syntax is accepted)."""
    def walk(node):
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        raise ValueError(expression)
    return walk(ast.parse(expression.replace(",", "").replace("×", "*").replace("÷", "/"), mode="eval").body)


def check(text: str) -> tuple[int, int]:
    """(right, wrong) equations in ``text``."""
    right = wrong = 0
    for left, result in EQUATION.findall(text):
        try:
            value = evaluate(left)
        except (ValueError, ZeroDivisionError, SyntaxError):
            continue
        target = float(result.replace(",", ""))
        if abs(value - target) <= 1e-6 * max(1.0, abs(target)):
            right += 1
        else:
            wrong += 1
    return right, wrong


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="distill.jsonl[:column] (column: explanation, the default)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    results = {}
    for spec in args.files:
        path, _, column = spec.partition(":")
        rows = [json.loads(line) for line in Path(path).open() if line.strip()]
        counts = [check(row[column or "explanation"]) for row in rows]
        right, wrong = sum(c[0] for c in counts), sum(c[1] for c in counts)
        results[spec] = {"rows": len(rows), "equations": right + wrong, "wrong": wrong,
                         "wrong_frac": wrong / max(1, right + wrong),
                         "rows_with_a_wrong_equation": sum(c[1] > 0 for c in counts),
                         "equations_per_row": (right + wrong) / max(1, len(rows))}
        print(f"{spec}: {wrong} of {right + wrong} equations wrong ({results[spec]['wrong_frac']:.1%}); "
              f"{results[spec]['rows_with_a_wrong_equation']} of {len(rows)} rows hold a wrong one")
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
