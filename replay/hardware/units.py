"""Human sizes: '1GiB', '64MB', '8', '1e9', '512 KiB' -> bytes."""
from __future__ import annotations

import re

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2, "gi": 1024**3, "gib": 1024**3,
    "ti": 1024**4, "tib": 1024**4,
}
MAX_SIZE = float(1 << 50)   # 1 PiB: far beyond any buffer, small enough for exact float arithmetic
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.I)


def parse_size(text: str | int | float) -> int:
    """Bytes from '1GiB' (binary), '64MB' (decimal), '8', '1e9'. Raises ValueError with the text."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if not 0 <= text < MAX_SIZE:
            raise ValueError(f"size {text} is not in [0, 1 PiB)")
        return int(text)
    m = _SIZE.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot parse size '{text}' (examples: 8, 1e9, 64MB, 1GiB)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not value < MAX_SIZE:   # also catches 1e400 (inf)
        raise ValueError(f"size '{text}' is more than the 1 PiB the models accept")
    return int(round(value))
