// Fused edge attention (edge_attention.cpp): what the module's bindings in band_attention.cpp
// need of it.
#pragma once

#include <torch/extension.h>

// Adds edge_forward and edge_backward to the Python module m.
void bind_edge_attention(pybind11::module& m);
