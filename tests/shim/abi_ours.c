/* The values as shim/cuda_abi.h has them (see abi_list.h). */
#include "../../shim/cuda_abi.h"
#include "abi_list.h"
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
#define X(v) (long)(v),
const long ps_abi_ours[] = {PS_ABI_VALUES(X)};
#undef X
#define X(v) #v,
const char *const ps_abi_names[] = {PS_ABI_VALUES(X)};
