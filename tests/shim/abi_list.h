/* Every constant shim/cuda_abi.h writes out, checked against the real CUDA
 * headers by tests/shim/abi_check.c (X(name) expands to the value). */
#include <stddef.h>
#define PS_ABI_VALUES(X)                                                             \
    X(CUDA_SUCCESS) X(CUDA_ERROR_INVALID_VALUE) X(CUDA_ERROR_OUT_OF_MEMORY)           \
    X(CUDA_ERROR_NOT_INITIALIZED) X(CUDA_ERROR_DEINITIALIZED) X(CUDA_ERROR_INVALID_CONTEXT) X(CUDA_ERROR_CONTEXT_IS_DESTROYED) \
    X(CUDA_ERROR_NOT_FOUND) X(CUDA_ERROR_NOT_READY) X(CUDA_ERROR_NOT_SUPPORTED) X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) \
    X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED) X(cudaErrorHostMemoryAlreadyRegistered) X(cudaErrorHostMemoryNotRegistered)       \
    X(CU_STREAM_NON_BLOCKING) X(CU_EVENT_DISABLE_TIMING) X(CU_STREAM_CAPTURE_STATUS_NONE) \
    X(CU_STREAM_CAPTURE_MODE_RELAXED) X(CU_MEM_ATTACH_GLOBAL) X(CU_GET_PROC_ADDRESS_DEFAULT) \
    X(CU_GET_PROC_ADDRESS_LEGACY_STREAM) X(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) \
    X(CU_GET_PROC_ADDRESS_SUCCESS) X(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)            \
    X(cudaSuccess) X(cudaErrorInvalidValue) X(cudaErrorMemoryAllocation) X(cudaErrorNotReady) \
    X(cudaStreamNonBlocking)                                                           \
    X((long)(uintptr_t)CU_STREAM_LEGACY) X((long)(uintptr_t)CU_STREAM_PER_THREAD)     \
    X((long)sizeof(CUipcMemHandle)) X((long)sizeof(CUuuid)) X((long)sizeof(cudaIpcMemHandle_t)) X((long)sizeof(CUdeviceptr)) \
    X(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) X(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) X(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) \
    X(CU_MEM_ALLOCATION_TYPE_PINNED) X(CU_MEM_LOCATION_TYPE_DEVICE) X(CU_MEM_LOCATION_TYPE_HOST) X(CU_MEM_ACCESS_FLAGS_PROT_READWRITE) \
    X(CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) X((long)sizeof(CUmemAllocationProp)) \
    X((long)offsetof(CUmemAllocationProp, location)) X((long)offsetof(CUmemAllocationProp, allocFlags)) \
    X((long)sizeof(CUmemAccessDesc)) X((long)sizeof(CUmemGenericAllocationHandle))     \
    X(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) X(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) \
    X(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) X((long)offsetof(CUmemAllocationProp, requestedHandleTypes)) \
    X(CU_POINTER_ATTRIBUTE_CONTEXT) X(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) X(CU_POINTER_ATTRIBUTE_RANGE_SIZE) \
    X(CU_POINTER_ATTRIBUTE_BUFFER_ID) X(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE) X(CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES) \
    X(CU_MEMORYTYPE_HOST) X(CU_MEMORYTYPE_DEVICE) X(CU_MEMORYTYPE_ARRAY) X(CU_MEMORYTYPE_UNIFIED)       \
    X((long)sizeof(CUDA_MEMCPY2D)) X((long)offsetof(CUDA_MEMCPY2D, srcMemoryType))                       \
    X((long)offsetof(CUDA_MEMCPY2D, srcDevice)) X((long)offsetof(CUDA_MEMCPY2D, dstMemoryType))          \
    X((long)offsetof(CUDA_MEMCPY2D, dstDevice)) X((long)sizeof(CUDA_MEMCPY3D))                           \
    X((long)offsetof(CUDA_MEMCPY3D, srcMemoryType)) X((long)offsetof(CUDA_MEMCPY3D, srcDevice))          \
    X((long)offsetof(CUDA_MEMCPY3D, dstMemoryType)) X((long)offsetof(CUDA_MEMCPY3D, dstDevice))
