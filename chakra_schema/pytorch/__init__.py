"""PyTorch traces -> ExecutionGraph: Execution Trace parser (execution_trace), ET-only graphs (et_graph),
Kineto parser and graph (kineto, kineto_graph), ET <-> Kineto linking (linker), and the top level that
finds the inputs of every rank and writes `.et` files (converter)."""
from chakra_schema.pytorch.converter import RankInputs, convert, convert_rank, discover_inputs
from chakra_schema.pytorch.et_graph import execution_trace_to_graph
from chakra_schema.pytorch.execution_trace import ExecutionTrace, load_execution_trace
from chakra_schema.pytorch.linker import LinkReport, link, link_with_report

__all__ = ["ExecutionTrace", "LinkReport", "RankInputs", "convert", "convert_rank", "discover_inputs",
           "execution_trace_to_graph", "link", "link_with_report", "load_execution_trace"]
