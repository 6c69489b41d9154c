"""How the catalogs compare model and system names."""

from __future__ import annotations

import re


def normalize_name(name: str) -> str:
    """Key for case- and punctuation-insensitive lookup: 'GPT OSS 120B' == 'gpt-oss-120b' == 'GPT_OSS_120B'."""
    return re.sub(r"[\s\-_.()/]+", "", name.lower())
