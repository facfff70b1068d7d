// q and k of the packed projection, normed per head (head_norm.cpp): what the module's bindings
// in band_attention.cpp need of it.
#pragma once

#include <torch/extension.h>

// Adds qk_heads_forward and qk_heads_backward to the Python module m.
void bind_head_norm(pybind11::module& m);
