/* The values as the CUDA toolkit's headers have them (see abi_list.h). */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "abi_list.h"
#define X(v) (long)(v),
const long ps_abi_cuda[] = {PS_ABI_VALUES(X)};
