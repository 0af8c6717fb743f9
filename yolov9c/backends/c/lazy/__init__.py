"""Lazy activations of the c backend, one concept per file:
    nodes.py      the node types (BNAct, RepAct, Plain, Image, Sum, Cat, Spatial) and LeafIndex
    evaluator.py  computing a node's value (Evaluator, materialise)
    grads.py      accumulating the leaves' gradients (Grads, SharedGrad)
The names below are the package's interface for backends/c (layers, conv, pgi, segment).
Test: python -m pytest -q tests/backends/test_backend_c.py
"""

from yolov9c.backends.c.lazy.evaluator import (Evaluator, backward_reads, materialise, materialise_any,
                                               memory_format_of, natural_dtype)
from yolov9c.backends.c.lazy.grads import Grads, SharedGrad
from yolov9c.backends.c.lazy.nodes import BNAct, Cat, Image, LeafIndex, Node, Plain, RepAct, Spatial, Sum

__all__ = ["BNAct", "Cat", "Evaluator", "Grads", "Image", "LeafIndex", "Node", "Plain", "RepAct", "SharedGrad",
           "Spatial", "Sum", "backward_reads", "materialise", "materialise_any", "memory_format_of",
           "natural_dtype"]
