"""Chakra-compatible execution graphs: the `.et` wire format, the in-memory graph and the PyTorch
trace converter. Depends on no other package of lumos-sim."""
from chakra_schema.errors import TraceInputError
from chakra_schema.graph import (CommType, EdgeKind, ExecutionGraph, GraphBuilder, GraphError, NodeType,
                                 OpKind, Resource, ResourceKind, Step)

__all__ = ["CommType", "EdgeKind", "ExecutionGraph", "GraphBuilder", "GraphError", "NodeType", "OpKind",
           "Resource", "ResourceKind", "Step", "TraceInputError"]
