"""PyTorch op names that the trace readers and the hardware models both recognise. A module of its own, with
no imports beyond `re`, so that the models can use it without loading the trace readers."""
from __future__ import annotations

import re

# PyTorch convolution ops (not prims::convert_element_type and other 'conv'-named ops): the compute model
# reads their stride / padding / dilation / groups from the traced values (replay/hardware/conv_args.py)
CONVOLUTION_OP = re.compile(r"(^|::)_?(conv\d|convolution|cudnn_conv|mkldnn_conv|miopen_conv|conv_depthwise|"
                            r"slow_conv|thnn_conv|conv_transpose)", re.I)
# PyTorch's fused attention ops (SDPA and the flash / memory-efficient / cuDNN kernels' entry points): the
# compute model reads is_causal and a variable-length batch's max_q / max_k from the traced values
# (replay/hardware/attention_args.py)
ATTENTION_OP = re.compile(r"(^|::)(scaled_dot_product_attention|_scaled_dot_product_\w*attention\w*|"
                          r"_flash_attention_\w+|_efficient_attention_\w+|_cudnn_attention_\w+)$", re.I)


def keeps_values(op_name: str) -> bool:
    """Whether the trace readers keep an op's traced argument values: only for the ops whose values the
    compute model reads (a trace records them for every op; kept for all they would dwarf the graph)."""
    return bool(CONVOLUTION_OP.search(op_name) or ATTENTION_OP.search(op_name))
