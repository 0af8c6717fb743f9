"""Byte units of every memory figure in the package, tools and benchmarks: binary, as torch reports memory.

    from yolov9c.units import GIB, MIB
    reserved_gib = torch.cuda.memory_reserved() / GIB

A card sold as "8 GB" holds 8e9 bytes (memory_plan.parse_size reads '8GB' so); every figure printed here is GiB.
Test: python -m pytest -q tests/package/test_units.py
"""

MIB = 2 ** 20
GIB = 2 ** 30
