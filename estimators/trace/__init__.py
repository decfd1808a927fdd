"""Trace what-if: a recorded job (Chakra `.et` or PyTorch traces) with edits applied before the replay.

- `evaluate`: the edits (scale compute / communication, drop ops, change ranks) and the replay.
- `balance`: which ranks hold the job back and what balancing them would buy.
- `whatif`: the registration of the `trace` what-if.
"""
