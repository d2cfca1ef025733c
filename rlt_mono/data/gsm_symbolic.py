"""GSM-Symbolic word problems (``data=gsm_symbolic``): GSM8K-style templates from the ``reasoning-gym`` package.

reasoning-gym (Apache-2.0) ships one generator function per GSM8K-derived template (``generate_<t>(rng,
difficulty)`` in ``reasoning_gym/arithmetic/gsm_symbolic/generators_*.py``); each returns a question, its answer and
a GSM8K-style step-by-step solution ``answer_cot`` whose last line is ``#### N``. This module uses those generators
and nothing else of the package:

- **How the package is depended on.** ``import reasoning_gym`` imports every task family and needs all 29 declared
  dependencies; the two generator modules need only the standard library and ``reasoning_gym.utils``. So the pinned
  wheel is fetched once with ``pip download --no-deps`` into the rlt_mono cache (like CHAMP), checked against its
  sha256, and the generator modules are imported from the wheel (Python imports from a zip on its path) under
  placeholder parent packages, so the package's ``__init__`` files never run. Nothing is installed.
- **Which templates.** The package's own list of usable templates (85 of 100; the rest it marks as needing fixes)
  minus the ones whose items are wrong often enough to mislead a student (``FLAWED_TEMPLATES``). Each item is also
  checked: its ``#### N`` line must equal its answer, which must be a whole number (a flawed item is dropped and
  counted, never silently kept).
- **Which items.** Item ``k`` of template ``t`` is drawn from ``Random(f"gsm_symbolic/{seed}/{t}/{k}")``: a
  function of the data seed, the template and the index only, so a dataset with more items per template extends a
  smaller one, and two seeds share no draw (the package's own ``Random(seed + i)`` makes seeds that differ by less
  than the size share items). Rows are de-duplicated by question text.
- **Columns** (docs/METHOD.md, "GSM-Symbolic"): ``question`` the problem; ``reasoning_trace`` the step lines of
  ``answer_cot`` (what the teacher learns to write in SFT, and what the raw-trace student arm trains on);
  ``solution`` what the teacher is shown, what the student must produce after the explanation and what the RLT
  reward scores: with ``solution="worked"`` (the RLT mapping) the whole worked solution, the step lines then
  ``"The answer is N."``; with ``solution="answer"`` (an ablation) ``"The answer is N."`` alone; ``answer`` ``N``;
  ``template`` the template number (the held-out split, stratified caps, and intervals over templates).
"""

from __future__ import annotations

import importlib
import logging
import re
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from random import Random

from rlt_mono.data.sources import DataSourceError, pypi_wheel

logger = logging.getLogger(__name__)

REQUIREMENT = "reasoning-gym==0.1.25"
WHEEL = "reasoning_gym-0.1.25-py3-none-any.whl"
SHA256 = "7f17a3eddb13c015d7d4a755ed576a061df889faf9468bcc2cca334ebe9e0435"
# The package's generator modules and the parent packages they are imported under (placeholders: their __init__
# files import every task family).
GENERATOR_MODULES = ("generators_00_49", "generators_50_99")
PACKAGE = "reasoning_gym.arithmetic.gsm_symbolic"
PARENTS = ("reasoning_gym", "reasoning_gym.arithmetic", PACKAGE)
# Templates reasoning-gym 0.1.25 lists as needing fixes (tasks_need_fix in gsm_symbolic.py): never generated.
NEEDS_FIX = (32, 35, 37, 61, 63, 65, 74, 76, 77, 79, 86, 87, 90, 97, 98)
# Usable by the package, left out here: 2, 3, 4, 75 and 99 cut some intermediate results to integers (in 99 the
# final answer is then wrong), 27 has non-integer money answers, 24 produced an age of -1.
FLAWED_TEMPLATES = (2, 3, 4, 24, 27, 75, 99)
DIFFICULTY = 1.0
# What the solution column holds (module docstring): the worked solution, or its answer line alone.
SOLUTIONS = ("worked", "answer")
_FINAL_LINE = re.compile(r"^####\s*(-?[\d,]*\.?\d+)\s*$")

_generators: dict[int, Callable] | None = None


def generators(cache_dir: Path) -> dict[int, Callable]:
    """Template number -> reasoning-gym's generator function, for every template this module uses."""
    global _generators
    if _generators is None:
        wheel = pypi_wheel(cache_dir, REQUIREMENT, WHEEL, SHA256, "gsm_symbolic")
        start = time.perf_counter()
        _generators = _import_generators(wheel)
        logger.debug("gsm_symbolic: imported %d generators from %s in %.2f s", len(_generators), wheel.name,
                     time.perf_counter() - start)
    return _generators


def _import_generators(wheel: Path) -> dict[int, Callable]:
    """The generator functions, imported from the wheel under placeholder parents; ``sys.modules`` is left as it
    was (the functions keep their own module globals)."""
    saved = {name: sys.modules.get(name) for name in (*PARENTS, "reasoning_gym.utils",
                                                       *(f"{PACKAGE}.{m}" for m in GENERATOR_MODULES))}
    root = f"{wheel}/reasoning_gym"
    try:
        for name in PARENTS:
            placeholder = types.ModuleType(name)
            placeholder.__path__ = [f"{root}/{name.partition('.')[2].replace('.', '/')}".rstrip("/")]
            sys.modules[name] = placeholder
        found = {}
        for module_name in GENERATOR_MODULES:
            module = importlib.import_module(f"{PACKAGE}.{module_name}")
            found |= {int(name.removeprefix("generate_")): getattr(module, name) for name in dir(module)
                      if name.startswith("generate_") and name.removeprefix("generate_").isdigit()}
    except (ImportError, OSError) as err:
        raise DataSourceError(f"data.source=gsm_symbolic: cannot import the generators from {wheel} ({err}): delete "
                              "it and run again to download it afresh") from None
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return {t: fn for t, fn in found.items() if t not in NEEDS_FIX and t not in FLAWED_TEMPLATES}


def item_row(item: dict, template: int, solution: str = "worked") -> dict | None:
    """An item mapped onto rlt_mono's columns (module docstring), or None when its arithmetic does not check."""
    lines = item["metadata"]["answer_cot"].strip().split("\n")
    final = _FINAL_LINE.match(lines[-1].strip())
    try:
        answer = float(str(item["answer"]).replace(",", ""))
    except ValueError:
        return None
    if final is None or float(final.group(1).replace(",", "")) != answer or not answer.is_integer():
        return None
    steps = "\n".join(line.rstrip() for line in lines[:-1]).strip()
    if not steps:
        return None
    number = str(int(answer))
    answer_line = f"The answer is {number}."
    return {"question": item["question"].strip(), "reasoning_trace": steps,
            "solution": f"{steps}\n{answer_line}" if solution == "worked" else answer_line, "answer": number,
            "template": template}


def generate_rows(cache_dir: Path, per_template: int, seed: int, solution: str = "worked") -> list[dict]:
    """``per_template`` items of every template (module docstring), in template then index order, de-duplicated by
    question text; items whose arithmetic does not check are dropped and counted in the log."""
    if solution not in SOLUTIONS:
        raise ValueError(f"solution must be one of {SOLUTIONS}, got {solution!r}")
    rows, seen, flawed, duplicates = [], set(), 0, 0
    templates = sorted(generators(cache_dir).items())
    start = last_report = time.monotonic()
    for done, (template, generate) in enumerate(templates, start=1):
        if time.monotonic() - last_report > 10:
            last_report = time.monotonic()
            logger.info("data: gsm_symbolic: %d of %d templates generated (%.0f s)", done - 1, len(templates),
                        last_report - start)
        for k in range(per_template):
            row = item_row(generate(Random(f"gsm_symbolic/{seed}/{template}/{k}"), DIFFICULTY), template, solution)
            if row is None:
                flawed += 1
                continue
            key = " ".join(row["question"].split())
            if key in seen:
                duplicates += 1
                continue
            seen.add(key)
            rows.append(row)
    logger.info("data: gsm_symbolic: %d rows from %d templates x %d items (seed %d; %d duplicate questions and %d "
                "items whose arithmetic does not check dropped)", len(rows), len(generators(cache_dir)),
                per_template, seed, duplicates, flawed)
    return rows

