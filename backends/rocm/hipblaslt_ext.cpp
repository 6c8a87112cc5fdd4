// A C ABI over hipBLASLt's C++ extension API (hipblaslt-ext.hpp), for the ctypes driver.
//
// hipBLASLt's C API lists algos only through its heuristic (at most what is asked, and not
// every solution of the type) and cannot rebuild an algo from a stored index; the C++
// extension can (getAllAlgos, getAlgosFromIndex, matmulIsAlgoSupported, and the kernel
// name of an algo). It also has the only grouped GEMM (hipblaslt_ext::GroupedGemm: G
// GEMMs of one type in one launch). This file exposes those, and nothing else, as extern
// "C" functions: no C++ type and no exception crosses the boundary (a GroupedGemm is an
// opaque pointer the caller destroys). Every function returns a
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
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

// The sizes the ctypes side reads these structs with (backends/lt/abi.py, hipBLASLt >= 0.3).
static_assert(sizeof(hipblasLtMatmulAlgo_t) == 24, "hipblasLtMatmulAlgo_t is 24 bytes");
static_assert(sizeof(hipblasLtMatmulHeuristicResult_t) == 56, "a heuristic result is 56 bytes");

#define SHIM_ABI 2
#define SHIM_HEADER_VERSION \
    (HIPBLASLT_VERSION_MAJOR * 100000 + HIPBLASLT_VERSION_MINOR * 100 + HIPBLASLT_VERSION_PATCH)
// getKernelNameFromAlgo / getSolutionNameFromAlgo: the builder compiles with them first and,
// where these headers do not declare them (older releases), again with
// -DSHIM_HAS_KERNEL_NAME=0.
#ifndef SHIM_HAS_KERNEL_NAME
#define SHIM_HAS_KERNEL_NAME 1
#endif
// GroupedGemm with the setProblem form that takes leading dimensions (SHIM_HAS_GROUPED), and
// its device-side per-group arguments (UserArguments, getDefaultValueForDeviceUserArguments,
// run(userArgs, stream): SHIM_HAS_USER_ARGS). The builder turns them off, in that order,
// where the headers lack them.
#ifndef SHIM_HAS_GROUPED
#define SHIM_HAS_GROUPED 1
#endif
#ifndef SHIM_HAS_USER_ARGS
#define SHIM_HAS_USER_ARGS SHIM_HAS_GROUPED
#endif
#if SHIM_HAS_USER_ARGS && !SHIM_HAS_GROUPED
#error "SHIM_HAS_USER_ARGS needs SHIM_HAS_GROUPED"
#endif
// unimatmul_hipblaslt_ext_grouped: 0 none, 1 the host form, 2 the host and the user-args forms.
#define SHIM_GROUPED_LEVEL (SHIM_HAS_GROUPED + SHIM_HAS_USER_ARGS)
// The fields of UserArguments whose offsets unimatmul_hipblaslt_grouped_user_args_layout
// reports, in this order (the binder compares them with its own ctypes struct).
#define SHIM_USER_ARGS_FIELDS 16

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

#if SHIM_HAS_GROUPED
    // A GroupedGemm and the alpha / beta scalars its inputs point at, owned together.
    struct Grouped
    {
        Grouped(hipblasLtHandle_t handle, const hipblaslt_ext::GemmProblemType& type, size_t scale_bytes, size_t groups)
            : gemm(handle,
                   type.getOpA(),
                   type.getOpB(),
                   type.getTypeA(),
                   type.getTypeB(),
                   type.getTypeC(),
                   type.getTypeD(),
                   type.getTypeCompute())
            , scales(2 * groups * scale_bytes)
            , groups(groups)
        {
        }
        hipblaslt_ext::GroupedGemm gemm;
        std::vector<unsigned char> scales; // alpha of every group, then beta of every group
        size_t                     groups;
    };
#endif

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

// --- grouped GEMM --------------------------------------------------------------------------
// G column-major GEMMs D_g = alpha_g * op(A_g) op(B_g) + beta_g * C_g of one type (batch 1),
// m/n/k and leading dimensions per group, as hipBLASLt's own BLAS convention has them.
// The algos of the type are getAllAlgos(GROUPED_GEMM, ...) (unimatmul_hipblaslt_get_all_algos
// with gemm_type 2); this instance checks them against its problem and runs the chosen one.

int unimatmul_hipblaslt_ext_grouped(void)
{
    return SHIM_GROUPED_LEVEL;
}

// Set up a GroupedGemm for `groups` problems (arrays of that length; alpha and beta hold
// `groups` scalars of `scale_bytes` each, copied). *out: the instance, for the functions
// below and unimatmul_hipblaslt_grouped_destroy; null on any error.
int unimatmul_hipblaslt_grouped_create(void*          handle,
                                       int            op_a,
                                       int            op_b,
                                       int            type_a,
                                       int            type_b,
                                       int            type_c,
                                       int            type_d,
                                       int            compute,
                                       int            groups,
                                       const int64_t* m,
                                       const int64_t* n,
                                       const int64_t* k,
                                       const int64_t* lda,
                                       const int64_t* ldb,
                                       const int64_t* ldc,
                                       const int64_t* ldd,
                                       void* const*   a,
                                       void* const*   b,
                                       void* const*   c,
                                       void* const*   d,
                                       const void*    alpha,
                                       const void*    beta,
                                       size_t         scale_bytes,
                                       size_t         max_workspace,
                                       void**         out)
{
    *out = nullptr;
#if SHIM_HAS_GROUPED
    if(groups <= 0 || scale_bytes == 0 || scale_bytes > 16)
        return HIPBLAS_STATUS_INVALID_VALUE;
    try
    {
        size_t count = static_cast<size_t>(groups);
        hipblaslt_ext::GemmProblemType type{static_cast<hipblasOperation_t>(op_a),
                                            static_cast<hipblasOperation_t>(op_b),
                                            static_cast<hipDataType>(type_a),
                                            static_cast<hipDataType>(type_b),
                                            static_cast<hipDataType>(type_c),
                                            static_cast<hipDataType>(type_d),
                                            static_cast<hipblasComputeType_t>(compute)};
        auto made = std::make_unique<Grouped>(static_cast<hipblasLtHandle_t>(handle), type, scale_bytes, count);
        std::memcpy(made->scales.data(), alpha, count * scale_bytes);
        std::memcpy(made->scales.data() + count * scale_bytes, beta, count * scale_bytes);
        std::vector<int64_t> vm(m, m + count), vn(n, n + count), vk(k, k + count);
        std::vector<int64_t> va(lda, lda + count), vb(ldb, ldb + count);
        std::vector<int64_t> vc(ldc, ldc + count), vd(ldd, ldd + count);
        std::vector<int64_t> batch(count, 1), sa(count), sb(count), sc(count), sd(count);
        std::vector<hipblaslt_ext::GemmEpilogue> epilogue(count);
        std::vector<hipblaslt_ext::GemmInputs>   inputs(count);
        for(size_t i = 0; i < count; i++)
        {
            // Batch strides of a batch of one: the matrix's own extent (never read).
            sa[i] = va[i] * (op_a == HIPBLAS_OP_N ? vk[i] : vm[i]);
            sb[i] = vb[i] * (op_b == HIPBLAS_OP_N ? vn[i] : vk[i]);
            sc[i] = vc[i] * vn[i];
            sd[i] = vd[i] * vn[i];
            inputs[i].setA(a[i]);
            inputs[i].setB(b[i]);
            inputs[i].setC(c[i]);
            inputs[i].setD(d[i]);
            inputs[i].setAlpha(made->scales.data() + i * scale_bytes);
            inputs[i].setBeta(made->scales.data() + (count + i) * scale_bytes);
        }
        made->gemm.setMaxWorkspaceBytes(max_workspace);
        hipblasStatus_t status = made->gemm.setProblem(
            vm, vn, vk, batch, va, vb, vc, vd, sa, sb, sc, sd, epilogue, inputs, type);
        if(status != HIPBLAS_STATUS_SUCCESS)
            return status;
        *out = made.release();
        return HIPBLAS_STATUS_SUCCESS;
    }
    catch(...)
    {
        return HIPBLAS_STATUS_INTERNAL_ERROR;
    }
#else
    return HIPBLAS_STATUS_NOT_SUPPORTED;
#endif
}

int unimatmul_hipblaslt_grouped_destroy(void* grouped)
{
#if SHIM_HAS_GROUPED
    try
    {
        delete static_cast<Grouped*>(grouped);
        return HIPBLAS_STATUS_SUCCESS;
    }
    catch(...)
    {
        return HIPBLAS_STATUS_INTERNAL_ERROR;
    }
#else
    return grouped == nullptr ? HIPBLAS_STATUS_SUCCESS : HIPBLAS_STATUS_NOT_SUPPORTED;
#endif
}

// Whether `algo` (of getAllAlgos' grouped list) supports this instance's problem; the
// library writes the problem into *algo and the workspace it needs into *workspace.
int unimatmul_hipblaslt_grouped_is_algo_supported(void*                  grouped,
                                                  hipblasLtMatmulAlgo_t* algo,
                                                  size_t*                workspace)
{
    *workspace = 0;
#if SHIM_HAS_GROUPED
    try
    {
        size_t need   = 0;
        auto   status = static_cast<Grouped*>(grouped)->gemm.isAlgoSupported(*algo, need);
        *workspace    = need;
        return status;
    }
    catch(...)
    {
        return HIPBLAS_STATUS_INTERNAL_ERROR;
    }
#else
    return HIPBLAS_STATUS_NOT_SUPPORTED;
#endif
}

// Build the kernel arguments for `algo` (again whenever the algo changes). `workspace`: a
// device buffer of at least what the support check said, 16-byte aligned (or null for 0).
int unimatmul_hipblaslt_grouped_initialize(void*                        grouped,
                                           const hipblasLtMatmulAlgo_t* algo,
                                           void*                        workspace,
                                           int                          use_user_args,
                                           void*                        stream)
{
#if SHIM_HAS_GROUPED
    try
    {
        return static_cast<Grouped*>(grouped)->gemm.initialize(
            *algo, workspace, use_user_args != 0, static_cast<hipStream_t>(stream));
    }
    catch(...)
    {
        return HIPBLAS_STATUS_INTERNAL_ERROR;
    }
#else
    return HIPBLAS_STATUS_NOT_SUPPORTED;
#endif
}

// Run with the host-side problem given at creation (its pointers and sizes).
int unimatmul_hipblaslt_grouped_run(void* grouped, void* stream)
{
#if SHIM_HAS_GROUPED
    try
    {
        return static_cast<Grouped*>(grouped)->gemm.run(static_cast<hipStream_t>(stream));
    }
    catch(...)
    {
        return HIPBLAS_STATUS_INTERNAL_ERROR;
    }
#else
    return HIPBLAS_STATUS_NOT_SUPPORTED;
#endif
}

// sizeof(UserArguments), then the offsets of m, n, batch, k, d, c, a, b, strideD1, strideD2,
// strideC1, strideC2, strideA1, strideA2, strideB1, strideB2, alpha, beta, into `out`
// (up to `capacity`); returns how many there are (0: no user-args form here).
int unimatmul_hipblaslt_grouped_user_args_layout(int* out, int capacity)
{
#if SHIM_HAS_USER_ARGS
    using U = hipblaslt_ext::UserArguments;
    const int layout[] = {
        static_cast<int>(sizeof(U)),           static_cast<int>(offsetof(U, m)),
        static_cast<int>(offsetof(U, n)),        static_cast<int>(offsetof(U, batch)),
        static_cast<int>(offsetof(U, k)),        static_cast<int>(offsetof(U, d)),
        static_cast<int>(offsetof(U, c)),        static_cast<int>(offsetof(U, a)),
        static_cast<int>(offsetof(U, b)),        static_cast<int>(offsetof(U, strideD1)),
        static_cast<int>(offsetof(U, strideD2)), static_cast<int>(offsetof(U, strideC1)),
        static_cast<int>(offsetof(U, strideC2)), static_cast<int>(offsetof(U, strideA1)),
        static_cast<int>(offsetof(U, strideA2)), static_cast<int>(offsetof(U, strideB1)),
        static_cast<int>(offsetof(U, strideB2)), static_cast<int>(offsetof(U, alpha)),
        static_cast<int>(offsetof(U, beta)),
    };
    static_assert(sizeof(layout) / sizeof(layout[0]) == SHIM_USER_ARGS_FIELDS + 3,
                  "sizeof and the offsets of 18 fields");
    int count = static_cast<int>(sizeof(layout) / sizeof(layout[0]));
    for(int i = 0; i < count && i < capacity; i++)
        out[i] = layout[i];
    return count;
#else
    (void)out;
    (void)capacity;
    return 0;
#endif
}

// The instance's problem as device-side arguments, one UserArguments per group, into host
// memory the caller owns (groups * sizeof(UserArguments) bytes): the template the caller
// edits (sizes, pointers) and copies to the device for unimatmul_hipblaslt_grouped_run_user_args.
int unimatmul_hipblaslt_grouped_default_user_args(void* grouped, void* host_args)
{
#if SHIM_HAS_USER_ARGS
    try
    {
        return static_cast<Grouped*>(grouped)->gemm.getDefaultValueForDeviceUserArguments(host_args);
    }
    catch(...)
    {
        return HIPBLAS_STATUS_INTERNAL_ERROR;
    }
#else
    (void)grouped;
    (void)host_args;
    return HIPBLAS_STATUS_NOT_SUPPORTED;
#endif
}

// Run with per-group arguments the GPU reads from `device_args` (16-byte aligned device
// memory, groups * sizeof(UserArguments)): sizes and pointers may change between runs with
// no host work, within the problem given at creation (the launch is sized from it).
int unimatmul_hipblaslt_grouped_run_user_args(void* grouped, void* device_args, void* stream)
{
#if SHIM_HAS_USER_ARGS
    try
    {
        return static_cast<Grouped*>(grouped)->gemm.run(device_args, static_cast<hipStream_t>(stream));
    }
    catch(...)
    {
        return HIPBLAS_STATUS_INTERNAL_ERROR;
    }
#else
    (void)grouped;
    (void)device_args;
    (void)stream;
    return HIPBLAS_STATUS_NOT_SUPPORTED;
#endif
}

} // extern "C"
