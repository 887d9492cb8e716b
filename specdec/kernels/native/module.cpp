// The one extension module this folder builds: each kernel file registers its functions, and
// the files compile side by side (ninja runs one compiler per file), where three modules
// built one after another took ~3 minutes of a first run on 2 cores.

#include <pybind11/pybind11.h>

void register_bf16_gemv(pybind11::module_& m);
void register_q4_gemv(pybind11::module_& m);
void register_decode_stack(pybind11::module_& m);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  register_bf16_gemv(m);
  register_q4_gemv(m);
  register_decode_stack(m);
}
