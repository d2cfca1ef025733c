"""Embedded test assets: a synthetic reasoning dataset, a tiny teacher/student pair built locally, and the
``embedded:teacher`` / ``embedded:student`` model-path scheme that names the pair in configs."""

from rlt_mono.data.embedded.dataset import generate_rows, write_jsonl
from rlt_mono.data.embedded.model_paths import EMBEDDED_PREFIX, embedded_model_path, is_embedded
from rlt_mono.data.embedded.tiny_models import TinyPair, build_tiny_pair

__all__ = ["EMBEDDED_PREFIX", "TinyPair", "build_tiny_pair", "embedded_model_path", "generate_rows", "is_embedded",
           "write_jsonl"]
