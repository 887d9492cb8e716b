// What the kernels take from torch: tensors, two factories and at::parallel_for, and pybind11
// with torch's tensor casters. Not <torch/extension.h>: its whole C++ frontend took ~60 s to
// compile in every file (2-vCPU Zen 3), these headers ~19 s.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;
