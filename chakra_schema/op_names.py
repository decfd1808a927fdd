"""PyTorch op names that the trace readers and the hardware models both recognise. A module of its own, with
no imports beyond `re`, so that the models can use it without loading the trace readers."""
from __future__ import annotations

import re

# PyTorch convolution ops (not prims::convert_element_type and other 'conv'-named ops): the only ops whose
# traced argument values the readers keep, for their stride / padding / dilation / groups (the compute
# model reads them: replay/hardware/conv_args.py)
CONVOLUTION_OP = re.compile(r"(^|::)_?(conv\d|convolution|cudnn_conv|mkldnn_conv|miopen_conv|conv_depthwise|"
                            r"slow_conv|thnn_conv|conv_transpose)", re.I)
