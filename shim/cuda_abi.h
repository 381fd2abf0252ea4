/* The few CUDA types and constants the shim needs, written out so the
 * library builds without the CUDA toolkit and never pulls libcudart in.
 * Every value here is checked against the real cuda.h/cuda_runtime_api.h
 * by tests/shim/abi_check.c when the toolkit is present. */
#ifndef PS_CUDA_ABI_H
#define PS_CUDA_ABI_H

#include <stddef.h>
#include <stdint.h>

/* ---- driver API (cuda.h) ---- */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef uint64_t cuuint64_t;
typedef int CUdriverProcAddressQueryResult;
typedef struct { char reserved[64]; } CUipcMemHandle;
typedef int CUstreamCaptureStatus;
typedef int CUstreamCaptureMode;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphEdgeData_st CUgraphEdgeData;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUarray_st *CUarray;
typedef struct CUuuid_st { char bytes[16]; } CUuuid; /* a device's UUID (cuDeviceGetUuid) */
/* Virtual memory management (cuMemCreate & co.) */
typedef struct {
    int type; /* CUmemLocationType */
    int id;
} CUmemLocation;
typedef struct {
    int type;                 /* CUmemAllocationType */
    int requestedHandleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
typedef struct {
    CUmemLocation location;
    int flags; /* CUmemAccess_flags */
} CUmemAccessDesc;
/* Arrays (cuArrayCreate & co.): the shim only passes their descriptors on
 * (the out-of-memory retry, hooks_driver.c), so their layout stays CUDA's. */
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUDA_ARRAY_DESCRIPTOR_st CUDA_ARRAY_DESCRIPTOR;
typedef struct CUDA_ARRAY3D_DESCRIPTOR_st CUDA_ARRAY3D_DESCRIPTOR;

/* Copies of two and three dimensions (cuMemcpy2D*, cuMemcpy3D*): the shim
 * reads only the memory types and device pointers (copy_order.c). */
typedef struct {
    size_t srcXInBytes, srcY;
    int srcMemoryType; /* CUmemorytype */
    const void *srcHost;
    CUdeviceptr srcDevice;
    CUarray srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    CUarray dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;
typedef struct {
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    CUarray srcArray;
    void *reserved0;
    size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    CUarray dstArray;
    void *reserved1;
    size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D;
#define CU_POINTER_ATTRIBUTE_CONTEXT 1
#define CU_POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define CU_POINTER_ATTRIBUTE_RANGE_SIZE 12
#define CU_POINTER_ATTRIBUTE_BUFFER_ID 7
#define CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE 10
#define CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES 14
#define CU_MEMORYTYPE_HOST 0x01
#define CU_MEMORYTYPE_DEVICE 0x02
#define CU_MEMORYTYPE_ARRAY 0x03
#define CU_MEMORYTYPE_UNIFIED 0x04

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_DEINITIALIZED 4
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_CONTEXT_IS_DESTROYED 709
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED 713

#define CU_STREAM_NON_BLOCKING 0x1
#define CU_EVENT_DISABLE_TIMING 0x2
#define CU_STREAM_CAPTURE_STATUS_NONE 0
#define CU_STREAM_CAPTURE_MODE_RELAXED 2
#define CU_MEM_ATTACH_GLOBAL 0x1
#define CUDA_ERROR_STREAM_CAPTURE_IMPLICIT 906
#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define CU_STREAM_CAPTURE_MODE_GLOBAL 0
#define CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1
#define CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED 704
#define CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 102
#define CU_MEM_ALLOCATION_TYPE_PINNED 0x1
#define CU_MEM_LOCATION_TYPE_DEVICE 0x1
#define CU_MEM_LOCATION_TYPE_HOST 0x2
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 0x3
#define CU_MEM_ALLOC_GRANULARITY_RECOMMENDED 0x1
#define CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED 103
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 0x1
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1

#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM (1 << 0)
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (1 << 1)
#define CU_GET_PROC_ADDRESS_SUCCESS 0
#define CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND 1

/* ---- runtime API (cuda_runtime_api.h) ---- */
typedef int cudaError_t;
typedef CUstream cudaStream_t;
typedef struct { char reserved[64]; } cudaIpcMemHandle_t;
typedef int cudaStreamCaptureStatus;

#define cudaSuccess 0
#define cudaErrorInvalidValue 1
#define cudaErrorMemoryAllocation 2
#define cudaErrorNotReady 600
#define cudaErrorHostMemoryAlreadyRegistered 712
#define cudaErrorHostMemoryNotRegistered 713
#define cudaErrorStreamCaptureUnsupported 900
#define cudaStreamNonBlocking 0x1

#endif
