"""grpokit's native CPU (and CUDA-graph) decoding engine behind one boundary: the decoders, the
fused C++ kernels and their build, the packed linear layers, CUDA graphs, and the rules that pick
between these paths. README.md in this directory states its contract.

The package itself imports nothing, so importing :mod:`grpokit.native.build` (the loss's kernels
load through it) does not load the decoder.
"""
