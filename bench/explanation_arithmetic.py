"""How often the equations written in distilled explanations are arithmetically right (a diagnostic of the study).

Equations are read and checked by ``rlt_mono.study.arithmetic.check`` (its docstring says what counts). Usage:

    python bench/explanation_arithmetic.py <distill.jsonl>[:<column>] ... --out <file.json>
"""

import argparse
import json
from pathlib import Path

from rlt_mono.runs.atomic_write import write_json
from rlt_mono.study.arithmetic import check


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
    write_json(Path(args.out), results, indent=1)


if __name__ == "__main__":
    main()
