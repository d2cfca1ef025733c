"""The ``embedded:`` model-path scheme: ``embedded:teacher`` and ``embedded:student`` name the tiny pair built
locally (``build_tiny_pair``), so a config can point at it without knowing its cache folder."""

from __future__ import annotations

from rlt_mono.config import ConfigError
from rlt_mono.data.embedded.tiny_models import build_tiny_pair

EMBEDDED_PREFIX = "embedded:"
EMBEDDED_ROLES = ("teacher", "student")


def is_embedded(name_or_path: str) -> bool:
    return name_or_path.startswith(EMBEDDED_PREFIX)


def embedded_model_path(name_or_path: str, key: str) -> str:
    """The folder of the embedded model ``name_or_path`` names (the pair is built on first use).

    Raises:
        ConfigError: ``name_or_path`` names no embedded model (``key`` is the config key it came from).
    """
    role = name_or_path.removeprefix(EMBEDDED_PREFIX)
    if role not in EMBEDDED_ROLES:
        raise ConfigError(f"{key}={name_or_path!r} is not an embedded model; use embedded:teacher or "
                          "embedded:student")
    pair = build_tiny_pair()
    return str(pair.teacher_path if role == "teacher" else pair.student_path)
