// A float32 matrix transposed (transpose.cpp): what the module's bindings in band_attention.cpp
// need of it.
#pragma once

#include <torch/extension.h>

// Adds transpose to the Python module m.
void bind_transpose(pybind11::module& m);
