// A C ABI over hipBLASLt's C++ extension API (hipblaslt-ext.hpp), for the ctypes driver.
//
// hipBLASLt's C API lists algos only through its heuristic (at most what is asked, and not
// every solution of the type) and cannot rebuild an algo from a stored index; the C++
// extension can (getAllAlgos, getAlgosFromIndex, matmulIsAlgoSupported, and the kernel
// name of an algo). This file exposes those, and nothing else, as extern "C" functions:
// no C++ type and no exception crosses the boundary. Every function returns a
// hipblasStatus_t; results are hipblasLtMatmulHeuristicResult_t arrays the caller owns,
// filled up to `capacity`, with the whole count in `*total` (call again, larger, when
// *total > capacity). Nothing here makes a handle: hipblasLtCreate ends a process that has
// no HIP device, so the caller passes the handle it made after its own device check.
//
// Built at first use by backends/rocm/hipblaslt_ext.py with the system C++ compiler
// against the headers of the library it will run with (never required: without it the
// heuristic path stays).

#include <hipblaslt/hipblaslt-ext.hpp>
#include <hipblaslt/hipblaslt-version.h>

#include <cstddef>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

// The sizes the ctypes side reads these structs with (backends/lt/abi.py, hipBLASLt >= 0.3).
static_assert(sizeof(hipblasLtMatmulAlgo_t) == 24, "hipblasLtMatmulAlgo_t is 24 bytes");
static_assert(sizeof(hipblasLtMatmulHeuristicResult_t) == 56, "a heuristic result is 56 bytes");

#define SHIM_ABI 1
#define SHIM_HEADER_VERSION \
    (HIPBLASLT_VERSION_MAJOR * 100000 + HIPBLASLT_VERSION_MINOR * 100 + HIPBLASLT_VERSION_PATCH)
// getKernelNameFromAlgo / getSolutionNameFromAlgo: the builder compiles with them first and,
// where these headers do not declare them (older releases), again with
// -DSHIM_HAS_KERNEL_NAME=0.
#ifndef SHIM_HAS_KERNEL_NAME
#define SHIM_HAS_KERNEL_NAME 1
#endif

namespace
{
    int copy_results(const std::vector<hipblasLtMatmulHeuristicResult_t>& found,
                     hipblasLtMatmulHeuristicResult_t*                    results,
                     int                                                  capacity,
                     int*                                                 total)
    {
        *total  = static_cast<int>(found.size());
        int put = *total < capacity ? *total : capacity;
        if(put > 0 && results != nullptr)
            std::memcpy(results, found.data(), sizeof(found[0]) * static_cast<size_t>(put));
        return HIPBLAS_STATUS_SUCCESS;
    }

    using NameOf = std::string (*)(hipblasLtHandle_t, hipblasLtMatmulAlgo_t&);

    int copy_text(const std::string& text, char* buf, size_t size, size_t* needed);

    // One of the name functions into the caller's buffer; NOT_SUPPORTED without one.
    int copy_name(
        NameOf name_of, void* handle, hipblasLtMatmulAlgo_t* algo, char* buf, size_t size, size_t* needed)
    {
        *needed = 0;
        if(name_of == nullptr)
            return HIPBLAS_STATUS_NOT_SUPPORTED;
        try
        {
            return copy_text(name_of(static_cast<hipblasLtHandle_t>(handle), *algo), buf, size, needed);
        }
        catch(...)
        {
            *needed = 0;
            return HIPBLAS_STATUS_INTERNAL_ERROR;
        }
    }

    int copy_text(const std::string& text, char* buf, size_t size, size_t* needed)
    {
        *needed = text.size() + 1;
        if(buf != nullptr && size > 0)
        {
            size_t put = text.size() < size - 1 ? text.size() : size - 1;
            std::memcpy(buf, text.data(), put);
            buf[put] = '\0';
        }
        return HIPBLAS_STATUS_SUCCESS;
    }
}

extern "C" {

int unimatmul_hipblaslt_ext_abi(void)
{
    return SHIM_ABI;
}

int unimatmul_hipblaslt_ext_header_version(void)
{
    return SHIM_HEADER_VERSION;
}

int unimatmul_hipblaslt_ext_has_kernel_name(void)
{
    return SHIM_HAS_KERNEL_NAME;
}

int unimatmul_hipblaslt_get_all_algos(void*                             handle,
                                      int                               gemm_type,
                                      int                               op_a,
                                      int                               op_b,
                                      int                               type_a,
                                      int                               type_b,
                                      int                               type_c,
                                      int                               type_d,
                                      int                               compute,
                                      hipblasLtMatmulHeuristicResult_t* results,
                                      int                               capacity,
                                      int*                              total)
{
    try
    {
        std::vector<hipblasLtMatmulHeuristicResult_t> found;
        hipblasStatus_t status
            = hipblaslt_ext::getAllAlgos(static_cast<hipblasLtHandle_t>(handle),
                                         static_cast<hipblaslt_ext::GemmType>(gemm_type),
                                         static_cast<hipblasOperation_t>(op_a),
                                         static_cast<hipblasOperation_t>(op_b),
                                         static_cast<hipDataType>(type_a),
                                         static_cast<hipDataType>(type_b),
                                         static_cast<hipDataType>(type_c),
                                         static_cast<hipDataType>(type_d),
                                         static_cast<hipblasComputeType_t>(compute),
                                         found);
        if(status != HIPBLAS_STATUS_SUCCESS)
        {
            *total = 0;
            return status;
        }
        return copy_results(found, results, capacity, total);
    }
    catch(...)
    {
        *total = 0;
        return HIPBLAS_STATUS_INTERNAL_ERROR;
    }
}

int unimatmul_hipblaslt_algos_from_index(void*                             handle,
                                         const int*                        indices,
                                         int                               count,
                                         hipblasLtMatmulHeuristicResult_t* results,
                                         int                               capacity,
                                         int*                              total)
{
    try
    {
        std::vector<int> wanted(indices, indices + (count > 0 ? count : 0));
        std::vector<hipblasLtMatmulHeuristicResult_t> found;
        hipblasStatus_t                               status = hipblaslt_ext::getAlgosFromIndex(
            static_cast<hipblasLtHandle_t>(handle), wanted, found);
        // INVALID_VALUE: every index is out of range; the others may leave some found.
        copy_results(found, results, capacity, total);
        return status;
    }
    catch(...)
    {
        *total = 0;
        return HIPBLAS_STATUS_INTERNAL_ERROR;
    }
}

int unimatmul_hipblaslt_is_algo_supported(void*                  handle,
                                          void*                  desc,
                                          const void*            alpha,
                                          void*                  a,
                                          void*                  b,
                                          const void*            beta,
                                          void*                  c,
                                          void*                  d,
                                          hipblasLtMatmulAlgo_t* algo,
                                          size_t*                workspace)
{
    try
    {
        size_t need   = 0;
        auto   status = hipblaslt_ext::matmulIsAlgoSupported(
            static_cast<hipblasLtHandle_t>(handle),
            static_cast<hipblasLtMatmulDesc_t>(desc),
            alpha,
            static_cast<hipblasLtMatrixLayout_t>(a),
            static_cast<hipblasLtMatrixLayout_t>(b),
            beta,
            static_cast<hipblasLtMatrixLayout_t>(c),
            static_cast<hipblasLtMatrixLayout_t>(d),
            *algo,
            need);
        *workspace = need;
        return status;
    }
    catch(...)
    {
        return HIPBLAS_STATUS_INTERNAL_ERROR;
    }
}

int unimatmul_hipblaslt_kernel_name(
    void* handle, hipblasLtMatmulAlgo_t* algo, char* buf, size_t size, size_t* needed)
{
#if SHIM_HAS_KERNEL_NAME
    return copy_name(hipblaslt_ext::getKernelNameFromAlgo, handle, algo, buf, size, needed);
#else
    return copy_name(nullptr, handle, algo, buf, size, needed);
#endif
}

// The solution's name: its kernel's name plus the solution's own parameters (GSU and the
// like), unique where kernel names are not (many solutions share one kernel).
int unimatmul_hipblaslt_solution_name(
    void* handle, hipblasLtMatmulAlgo_t* algo, char* buf, size_t size, size_t* needed)
{
#if SHIM_HAS_KERNEL_NAME
    return copy_name(hipblaslt_ext::getSolutionNameFromAlgo, handle, algo, buf, size, needed);
#else
    return copy_name(nullptr, handle, algo, buf, size, needed);
#endif
}

} // extern "C"
