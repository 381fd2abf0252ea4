/* An empty shared object, built under the names of PyTorch's and CuPy's CUDA
 * libraries (tests/shim/shim.mk): prog_runtime's `framework` scenario loads
 * one, and the shim's exit hints (shim/hints.c) see its name. */
int fake_framework_marker;
