"""Embedded test assets: a synthetic reasoning dataset and a tiny teacher/student pair built locally."""

from rlt_mono.embedded.dataset import generate_rows, write_jsonl
from rlt_mono.embedded.tiny_models import TinyPair, build_tiny_pair

__all__ = ["TinyPair", "build_tiny_pair", "generate_rows", "write_jsonl"]
