// unimatmul's native routing kernels: the cached call of a routed torch matrix product
// without Python.
//
// The Python kernels (routing.py) cost ~6 us of host time per call before they do any
// work, so a routed model that is bound by host time ran slower than PyTorch. These
// kernels take their place at the dispatch keys that they serve: a key of the operands
// (shapes, strides, dtypes, devices, alignment, the mode, TF32) finds an entry in a
// table, and the entry says what to do:
//   DEFAULT  PyTorch's own kernel, through the out= form (which unimatmul never takes over);
//   LT       one cuBLASLt/hipBLASLt call, from descriptors, an algo and a workspace that
//            Python built once (the same call the Python LtRunner makes);
//   PYTHON   the Python kernel (padded candidates, CPU backends, addmm's full-C form).
// A key not in the table goes to the Python kernel, which decides (or tunes) and puts an
// entry here. Python reaches these kernels through the unimatmul_native::slow_* ops,
// whose implementations are the Python kernels.
//
// No cuBLASLt or hipBLASLt header is needed: Python hands over the addresses of
// the library's matmul and descriptor-attribute functions, whose C signatures are the
// same in both libraries (all handles are opaque pointers there).

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/baddbmm_cpu_dispatch.h>
#include <ATen/ops/bmm_cpu_dispatch.h>
#include <ATen/ops/empty_cpu_dispatch.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#ifdef UMM_WITH_CUDA
#include <ATen/Context.h>
#include <ATen/ops/addmm_cuda_dispatch.h>
#include <ATen/ops/baddbmm_cuda_dispatch.h>
#include <ATen/ops/bmm_cuda_dispatch.h>
#include <ATen/ops/empty_cuda_dispatch.h>
#include <ATen/ops/mm_cuda_dispatch.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

enum Op : int64_t { MM = 0, BMM = 1, ADDMM = 2, BADDBMM = 3 };
enum Kind : int { DEFAULT = 0, LT = 1, PYTHON = 2, PADDED = 3, ONEDNN = 4 };
enum Form : int { PLAIN = 0, BIAS = 1 };
constexpr int64_t MODE_OFF = 0;

// cublasLtMatmul / hipblasLtMatmul, and their MatmulDescSetAttribute.
using MatmulFn = int (*)(void*, void*, const void*, const void*, void*, const void*, void*, const void*,
                         const void*, void*, void*, void*, const void*, void*, size_t, void*);
using SetAttrFn = int (*)(void*, int, const void*, size_t);
// dnnl_memory_set_data_handle, dnnl_primitive_execute, dnnl_stream_wait (oneDNN 3.x C API).
using DnnlSetHandleFn = int (*)(void*, void*);
using DnnlExecuteFn = int (*)(void*, void*, int, const void*);
using DnnlWaitFn = int (*)(void*);

constexpr int KEY_WORDS = 24;
using Key = std::array<int64_t, KEY_WORDS>;

struct KeyHash {
  size_t operator()(const Key& key) const noexcept {
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (int64_t word : key) {
      h ^= static_cast<uint64_t>(word) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    }
    return static_cast<size_t>(h);
  }
};

struct Entry {
  std::atomic<int> kind{DEFAULT};
  int64_t id = 0;
  std::atomic<int64_t> calls{0};
  std::string label;
  std::vector<int64_t> out_shape;
  int form = PLAIN;
  // LT
  MatmulFn matmul = nullptr;
  SetAttrFn set_attr = nullptr;
  int bias_attr = 0;
  void* handle = nullptr;
  void* desc = nullptr;
  void* adesc = nullptr;
  void* bdesc = nullptr;
  void* cdesc = nullptr;
  void* workspace = nullptr;
  size_t workspace_size = 0;
  intptr_t stream = 0;
  int scale_bytes = 4;
  alignas(16) unsigned char algo[128] = {};
  // The library reads alpha and beta from host memory during the call, and the bias
  // address lives in the descriptor: one call at a time per entry.
  std::mutex lock;
  double alpha_d = 1.0, beta_d = 0.0;
  float alpha_f = 1.0f, beta_f = 0.0f;
  const void* bias_ptr = nullptr;
  // PADDED: the Lt call runs on aligned copies (PaddedRunner in Python): the operands are
  // copied into the top-left corner (the view) of zeroed buffers, the product is written
  // to the C buffer when there is one, and its corner is copied into the output.
  bool padded = false;
  at::Tensor a_buf, a_view, b_buf, b_view, c_buf, c_view;
  bool a_first = false, b_first = false;  // a batch-broadcast operand: its first matrix is copied
  // ONEDNN: a oneDNN matmul primitive of the entry's own, on the caller's memory.
  DnnlSetHandleFn dnnl_set_handle = nullptr;
  DnnlExecuteFn dnnl_execute = nullptr;
  DnnlWaitFn dnnl_wait = nullptr;
  void* dnnl_prim = nullptr;
  void* dnnl_stream = nullptr;
  int dnnl_nargs = 0;
  const void* dnnl_args = nullptr;
  void* dnnl_mem[4] = {nullptr, nullptr, nullptr, nullptr};  // src, weights, dst, bias
  float* dnnl_alpha = nullptr;
};

struct State {
  std::shared_mutex table_lock;
  std::unordered_map<Key, std::shared_ptr<Entry>, KeyHash> table;
  std::atomic<int64_t> mode{1};         // the environment's mode, as a code from Python
  std::atomic<int64_t> python_only{0};  // mode() blocks open anywhere: every call to Python
  std::mutex install_lock;
  std::vector<std::unique_ptr<torch::Library>> libraries;
};

State& state() {
  static State* s = new State();  // never destroyed: kernels may run during interpreter exit
  return *s;
}

thread_local bool busy = false;  // set while the Selector decides on this thread

inline int64_t pack(const at::Tensor& t) {
  const auto address = reinterpret_cast<uintptr_t>(t.data_ptr());
  const c10::Device device = t.device();
  return static_cast<int64_t>(t.scalar_type()) | (static_cast<int64_t>(t.dim()) << 8) |
         (static_cast<int64_t>(address & 15) << 16) | (static_cast<int64_t>(t.is_neg()) << 20) |
         (static_cast<int64_t>(t.is_conj()) << 21) | (static_cast<int64_t>(device.index() + 1) << 24) |
         (static_cast<int64_t>(device.type()) << 40);
}

// Writes one operand into the key; false when it has more dimensions than a key holds
// (such a call goes to Python, which passes it to PyTorch's kernel).
inline bool put_operand(Key& key, int& i, const at::Tensor& t) {
  const int64_t dim = t.dim();
  if (dim > 3) {
    return false;
  }
  key[i++] = pack(t);
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  for (int64_t d = 0; d < 3; ++d) {
    key[i++] = d < dim ? sizes[d] : -1;
    key[i++] = d < dim ? strides[d] : -1;
  }
  return true;
}

inline int64_t head(int64_t op, const at::Tensor& a) {
  int64_t tf32 = 0;
#ifdef UMM_WITH_CUDA
  if (a.is_cuda()) {
    tf32 = at::globalContext().allowTF32CuBLAS() ? 1 : 0;
  }
#endif
  return op | (state().mode.load(std::memory_order_relaxed) << 8) | (tf32 << 16);
}

bool make_key(Key& key, int64_t op, const at::Tensor* c, const at::Tensor& a, const at::Tensor& b,
              bool beta_zero, bool beta_one) {
  key.fill(0);
  int i = 0;
  key[i++] = head(op, a) | (static_cast<int64_t>(beta_zero) << 20) | (static_cast<int64_t>(beta_one) << 21);
  if (!put_operand(key, i, a) || !put_operand(key, i, b)) {
    return false;
  }
  if (c != nullptr && !put_operand(key, i, *c)) {
    return false;
  }
  return true;
}

std::shared_ptr<Entry> find(const Key& key) {
  State& s = state();
  std::shared_lock<std::shared_mutex> guard(s.table_lock);
  auto it = s.table.find(key);
  return it == s.table.end() ? nullptr : it->second;
}

// --- PyTorch's own kernels ------------------------------------------------------------------
// Called directly (at::cpu::mm, at::cuda::mm: the functions PyTorch registered at these
// keys, which the dispatcher would have called), not through the dispatcher again: the
// Default path then costs a table lookup more than PyTorch's own call, and cannot
// recurse into these kernels.

template <bool GPU>
at::Tensor default_product(int64_t op, const at::Tensor& a, const at::Tensor& b) {
#ifdef UMM_WITH_CUDA
  if constexpr (GPU) {
    return op == MM ? at::cuda::mm(a, b) : at::cuda::bmm(a, b);
  }
#endif
  return op == MM ? at::cpu::mm(a, b) : at::cpu::bmm(a, b);
}

template <bool GPU>
at::Tensor default_accumulate(int64_t op, const at::Tensor& c, const at::Tensor& a, const at::Tensor& b,
                              const c10::Scalar& beta, const c10::Scalar& alpha) {
#ifdef UMM_WITH_CUDA
  if constexpr (GPU) {
    return op == ADDMM ? at::cuda::addmm(c, a, b, beta, alpha) : at::cuda::baddbmm(c, a, b, beta, alpha);
  }
#endif
  return op == ADDMM ? at::cpu::addmm(c, a, b, beta, alpha) : at::cpu::baddbmm(c, a, b, beta, alpha);
}

// --- the Python kernels, through the slow ops ---------------------------------------------

using ProductFn = at::Tensor(const at::Tensor&, const at::Tensor&);
using AccumulateFn = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const c10::Scalar&,
                                const c10::Scalar&);

at::Tensor slow_product(int64_t op, const at::Tensor& a, const at::Tensor& b) {
  static auto mm = c10::Dispatcher::singleton().findSchemaOrThrow("unimatmul_native::slow_mm", "").typed<ProductFn>();
  static auto bmm =
      c10::Dispatcher::singleton().findSchemaOrThrow("unimatmul_native::slow_bmm", "").typed<ProductFn>();
  return op == MM ? mm.call(a, b) : bmm.call(a, b);
}

at::Tensor slow_accumulate(int64_t op, const at::Tensor& c, const at::Tensor& a, const at::Tensor& b,
                           const c10::Scalar& beta, const c10::Scalar& alpha) {
  static auto addmm =
      c10::Dispatcher::singleton().findSchemaOrThrow("unimatmul_native::slow_addmm", "").typed<AccumulateFn>();
  static auto baddbmm =
      c10::Dispatcher::singleton().findSchemaOrThrow("unimatmul_native::slow_baddbmm", "").typed<AccumulateFn>();
  return op == ADDMM ? addmm.call(c, a, b, beta, alpha) : baddbmm.call(c, a, b, beta, alpha);
}

// --- the library call -----------------------------------------------------------------------

// Runs an LT entry; an undefined tensor when it cannot run here (another stream than
// the one its workspace belongs to, or the library refused): the caller goes to Python.
at::Tensor run_lt(Entry& e, const at::Tensor& a, const at::Tensor& b, const at::Tensor* bias, double alpha) {
#ifdef UMM_WITH_CUDA
  void* stream = c10::cuda::getCurrentCUDAStream(a.device().index()).stream();
  if (reinterpret_cast<intptr_t>(stream) != e.stream) {
    return at::Tensor();
  }
  at::Tensor out = at::cuda::empty(e.out_shape, a.options());
  void* d = out.data_ptr();
  const void* a_ptr = a.data_ptr();
  const void* b_ptr = b.data_ptr();
  int status = 0;
  {
    // For PADDED, one call at a time enqueues its copy-in, product and copy-out: two
    // threads on one stream must not interleave their copies into the same buffers.
    std::lock_guard<std::mutex> guard(e.lock);
    if (e.padded) {
      if (e.a_buf.defined()) {
        e.a_view.copy_(e.a_first && a.dim() == 3 ? a.select(0, 0) : a);
        a_ptr = e.a_buf.data_ptr();
      }
      if (e.b_buf.defined()) {
        e.b_view.copy_(e.b_first && b.dim() == 3 ? b.select(0, 0) : b);
        b_ptr = e.b_buf.data_ptr();
      }
      if (e.c_buf.defined()) {
        d = e.c_buf.data_ptr();
      }
    }
    const void* alpha_ptr;
    const void* beta_ptr;
    if (e.scale_bytes == 8) {
      e.alpha_d = alpha;
      e.beta_d = 0.0;
      alpha_ptr = &e.alpha_d;
      beta_ptr = &e.beta_d;
    } else {
      e.alpha_f = static_cast<float>(alpha);
      e.beta_f = 0.0f;
      alpha_ptr = &e.alpha_f;
      beta_ptr = &e.beta_f;
    }
    if (bias != nullptr) {
      const void* bias_ptr = bias->data_ptr();
      if (bias_ptr != e.bias_ptr) {
        status = e.set_attr(e.desc, e.bias_attr, &bias_ptr, sizeof(bias_ptr));
        e.bias_ptr = status == 0 ? bias_ptr : nullptr;
      }
    }
    if (status == 0) {
      // The caller's B goes in as the library's A (row-major C = A @ B is column-major
      // C^T = B^T @ A^T), as in the Python LtRunner.
      status = e.matmul(e.handle, e.desc, alpha_ptr, b_ptr, e.adesc, a_ptr, e.bdesc, beta_ptr, d, e.cdesc, d,
                        e.cdesc, e.algo, e.workspace, e.workspace_size, stream);
    }
    if (status == 0 && e.padded && e.c_buf.defined()) {
      out.copy_(e.c_view);
    }
  }
  if (status != 0) {
    e.kind.store(PYTHON, std::memory_order_relaxed);  // the Python kernel reports and falls back
    return at::Tensor();
  }
  return out;
#else
  (void)e;
  (void)a;
  (void)b;
  (void)bias;
  (void)alpha;
  return at::Tensor();
#endif
}

// Runs a ONEDNN entry on the caller's memory (what MatmulPrimitive.execute does in
// Python); an undefined tensor when it cannot (alpha != 1 without a runtime alpha, a
// bias the primitive lacks, or oneDNN refused): the caller goes to Python.
at::Tensor run_onednn(Entry& e, const at::Tensor& a, const at::Tensor& b, const at::Tensor* bias, double alpha) {
  if ((alpha != 1.0 && e.dnnl_alpha == nullptr) || ((bias != nullptr) != (e.dnnl_mem[3] != nullptr))) {
    return at::Tensor();
  }
  at::Tensor out = at::cpu::empty(e.out_shape, a.options());
  int status = 0;
  {
    std::lock_guard<std::mutex> guard(e.lock);
    status |= e.dnnl_set_handle(e.dnnl_mem[0], a.data_ptr());
    status |= e.dnnl_set_handle(e.dnnl_mem[1], b.data_ptr());
    status |= e.dnnl_set_handle(e.dnnl_mem[2], out.data_ptr());
    if (bias != nullptr) {
      status |= e.dnnl_set_handle(e.dnnl_mem[3], bias->data_ptr());
    }
    if (e.dnnl_alpha != nullptr) {
      *e.dnnl_alpha = static_cast<float>(alpha);
    }
    if (status == 0) {
      status = e.dnnl_execute(e.dnnl_prim, e.dnnl_stream, e.dnnl_nargs, e.dnnl_args);
    }
    if (status == 0) {
      status = e.dnnl_wait(e.dnnl_stream);
    }
  }
  if (status != 0) {
    e.kind.store(PYTHON, std::memory_order_relaxed);  // the Python kernel reports and falls back
    return at::Tensor();
  }
  return out;
}

// Runs a backend kernel entry (LT, PADDED, ONEDNN) and counts the call; an undefined
// tensor when it could not run here (the caller goes to Python, which counts it).
at::Tensor run_kernel(Entry& e, int kind, const at::Tensor& a, const at::Tensor& b, const at::Tensor* bias,
                      double alpha) {
  at::Tensor out = kind == ONEDNN ? run_onednn(e, a, b, bias, alpha) : run_lt(e, a, b, bias, alpha);
  if (out.defined()) {
    e.calls.fetch_add(1, std::memory_order_relaxed);
  }
  return out;
}

// --- the kernels ----------------------------------------------------------------------------

template <int64_t OP, bool GPU>
at::Tensor product(const at::Tensor& a, const at::Tensor& b) {
  State& s = state();
  if (busy || s.mode.load(std::memory_order_relaxed) == MODE_OFF) {
    return default_product<GPU>(OP, a, b);
  }
  Key key;
  if (s.python_only.load(std::memory_order_relaxed) != 0 || !make_key(key, OP, nullptr, a, b, false, false)) {
    return slow_product(OP, a, b);
  }
  std::shared_ptr<Entry> entry = find(key);
  if (!entry) {
    return slow_product(OP, a, b);
  }
  const int kind = entry->kind.load(std::memory_order_relaxed);
  if (kind == DEFAULT) {
    entry->calls.fetch_add(1, std::memory_order_relaxed);
    RECORD_USER_SCOPE(entry->label.c_str());
    return default_product<GPU>(OP, a, b);
  }
  if (kind != PYTHON) {
    RECORD_USER_SCOPE(entry->label.c_str());
    at::Tensor out = run_kernel(*entry, kind, a, b, nullptr, 1.0);
    if (out.defined()) {
      return out;
    }
  }
  return slow_product(OP, a, b);
}

template <int64_t OP, bool GPU>
at::Tensor accumulate(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, const c10::Scalar& beta,
                      const c10::Scalar& alpha) {
  State& s = state();
  if (busy || s.mode.load(std::memory_order_relaxed) == MODE_OFF) {
    return default_accumulate<GPU>(OP, c, a, b, beta, alpha);
  }
  Key key;
  const bool complex = beta.isComplex() || alpha.isComplex();
  if (complex || s.python_only.load(std::memory_order_relaxed) != 0 ||
      !make_key(key, OP, &c, a, b, beta.equal(0), beta.equal(1))) {
    return slow_accumulate(OP, c, a, b, beta, alpha);
  }
  std::shared_ptr<Entry> entry = find(key);
  if (!entry) {
    return slow_accumulate(OP, c, a, b, beta, alpha);
  }
  const int kind = entry->kind.load(std::memory_order_relaxed);
  if (kind == DEFAULT) {
    entry->calls.fetch_add(1, std::memory_order_relaxed);
    RECORD_USER_SCOPE(entry->label.c_str());
    return default_accumulate<GPU>(OP, c, a, b, beta, alpha);
  }
  if (kind != PYTHON) {
    RECORD_USER_SCOPE(entry->label.c_str());
    at::Tensor out = run_kernel(*entry, kind, a, b, entry->form == BIAS ? &c : nullptr, alpha.toDouble());
    if (out.defined()) {
      return out;
    }
  }
  return slow_accumulate(OP, c, a, b, beta, alpha);
}

// --- control, from Python -------------------------------------------------------------------

bool built_with_cuda() {
#ifdef UMM_WITH_CUDA
  return true;
#else
  return false;
#endif
}

// PyTorch warns (once per process) when a kernel replaces another: that is the point here.
class Quiet : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

// The four kernels at one dispatch key, in a Library whose destruction takes them away.
template <bool GPU>
std::unique_ptr<torch::Library> kernels_at(c10::DispatchKey key) {
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", key, __FILE__, __LINE__);
  lib->impl("mm", TORCH_FN((product<MM, GPU>)));
  lib->impl("bmm", TORCH_FN((product<BMM, GPU>)));
  lib->impl("addmm", TORCH_FN((accumulate<ADDMM, GPU>)));
  lib->impl("baddbmm", TORCH_FN((accumulate<BADDBMM, GPU>)));
  return lib;
}

void install(bool cpu, bool cuda) {
  State& s = state();
  std::lock_guard<std::mutex> guard(s.install_lock);
  if (!s.libraries.empty()) {
    return;
  }
  Quiet quiet;
  c10::WarningUtils::WarningHandlerGuard quiet_guard(&quiet);
  TORCH_CHECK(!cuda || built_with_cuda(), "unimatmul_native.install: the CUDA key needs the GPU build");
  if (cpu) {
    s.libraries.push_back(kernels_at<false>(c10::DispatchKey::CPU));
  }
#ifdef UMM_WITH_CUDA
  if (cuda) {
    s.libraries.push_back(kernels_at<true>(c10::DispatchKey::CUDA));
  }
#endif
}

void uninstall() {
  State& s = state();
  std::lock_guard<std::mutex> guard(s.install_lock);
  s.libraries.clear();
}

bool installed() {
  State& s = state();
  std::lock_guard<std::mutex> guard(s.install_lock);
  return !s.libraries.empty();
}

void configure(int64_t mode, int64_t python_only) {
  state().mode.store(mode, std::memory_order_relaxed);
  state().python_only.store(python_only, std::memory_order_relaxed);
}

void set_busy(bool on) {
  busy = on;
}

// Puts the entry for the key that these operands make. lt holds, for kinds LT and PADDED:
// the matmul and set-attribute function addresses, the bias attribute, handle, descriptor,
// the three layouts, workspace address and size, stream, scale bytes, then the algo's
// bytes as words. For PADDED, buffers holds the A, B and C buffers and their corner views
// (None where that operand is not copied), and flags (a_first, b_first).
void put(int64_t op, const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& c, bool beta_zero,
         bool beta_one, int64_t kind, int64_t id, c10::string_view label, c10::IntArrayRef out_shape, int64_t form,
         c10::IntArrayRef lt, const c10::List<std::optional<at::Tensor>>& buffers, c10::IntArrayRef flags) {
  Key key;
  const at::Tensor* cp = c.has_value() ? &*c : nullptr;
  TORCH_CHECK(op >= MM && op <= BADDBMM, "unimatmul_native.put: unknown op ", op);
  TORCH_CHECK(make_key(key, op, cp, a, b, beta_zero, beta_one), "unimatmul_native.put: operands of more than 3-D");
  TORCH_CHECK(kind >= DEFAULT && kind <= ONEDNN, "unimatmul_native.put: unknown kind ", kind);
  auto entry = std::make_shared<Entry>();
  entry->kind.store(static_cast<int>(kind));
  entry->id = id;
  entry->label = std::string(label);
  entry->out_shape = out_shape.vec();
  entry->form = static_cast<int>(form);
  if (kind == LT || kind == PADDED) {
    TORCH_CHECK(built_with_cuda(), "unimatmul_native.put: an LT entry needs the GPU build");
    constexpr int fixed = 12;
    TORCH_CHECK(lt.size() > fixed && lt.size() - fixed <= sizeof(entry->algo) / 8,
                "unimatmul_native.put: LT data of ", lt.size(), " words");
    entry->matmul = reinterpret_cast<MatmulFn>(static_cast<intptr_t>(lt[0]));
    entry->set_attr = reinterpret_cast<SetAttrFn>(static_cast<intptr_t>(lt[1]));
    entry->bias_attr = static_cast<int>(lt[2]);
    entry->handle = reinterpret_cast<void*>(static_cast<intptr_t>(lt[3]));
    entry->desc = reinterpret_cast<void*>(static_cast<intptr_t>(lt[4]));
    entry->adesc = reinterpret_cast<void*>(static_cast<intptr_t>(lt[5]));
    entry->bdesc = reinterpret_cast<void*>(static_cast<intptr_t>(lt[6]));
    entry->cdesc = reinterpret_cast<void*>(static_cast<intptr_t>(lt[7]));
    entry->workspace = reinterpret_cast<void*>(static_cast<intptr_t>(lt[8]));
    entry->workspace_size = static_cast<size_t>(lt[9]);
    entry->stream = static_cast<intptr_t>(lt[10]);
    entry->scale_bytes = static_cast<int>(lt[11]);
    TORCH_CHECK(entry->matmul != nullptr && entry->desc != nullptr, "unimatmul_native.put: null LT function");
    TORCH_CHECK(entry->scale_bytes == 4 || entry->scale_bytes == 8, "unimatmul_native.put: scale of ",
                entry->scale_bytes, " bytes");
    for (size_t w = fixed; w < lt.size(); ++w) {
      const int64_t word = lt[w];
      std::memcpy(entry->algo + 8 * (w - fixed), &word, 8);
    }
  }
  if (kind == PADDED) {
    TORCH_CHECK(buffers.size() == 6 && flags.size() == 2, "unimatmul_native.put: PADDED needs 6 buffers, 2 flags");
    at::Tensor* slots[6] = {&entry->a_buf, &entry->a_view, &entry->b_buf,
                            &entry->b_view, &entry->c_buf, &entry->c_view};
    for (size_t i = 0; i < 6; ++i) {
      const std::optional<at::Tensor> t = buffers.get(i);
      if (t.has_value()) {
        *slots[i] = *t;
      }
    }
    entry->padded = true;
    entry->a_first = flags[0] != 0;
    entry->b_first = flags[1] != 0;
  }
  if (kind == ONEDNN) {
    TORCH_CHECK(lt.size() == 12, "unimatmul_native.put: a ONEDNN entry takes 12 words, not ", lt.size());
    TORCH_CHECK(a.device().is_cpu(), "unimatmul_native.put: a ONEDNN entry is for CPU tensors");
    auto ptr = [&](size_t i) { return reinterpret_cast<void*>(static_cast<intptr_t>(lt[i])); };
    entry->dnnl_set_handle = reinterpret_cast<DnnlSetHandleFn>(ptr(0));
    entry->dnnl_execute = reinterpret_cast<DnnlExecuteFn>(ptr(1));
    entry->dnnl_wait = reinterpret_cast<DnnlWaitFn>(ptr(2));
    entry->dnnl_prim = ptr(3);
    entry->dnnl_stream = ptr(4);
    entry->dnnl_nargs = static_cast<int>(lt[5]);
    entry->dnnl_args = ptr(6);
    for (size_t i = 0; i < 4; ++i) {
      entry->dnnl_mem[i] = ptr(7 + i);
    }
    entry->dnnl_alpha = static_cast<float*>(ptr(11));
    TORCH_CHECK(entry->dnnl_set_handle && entry->dnnl_execute && entry->dnnl_wait && entry->dnnl_prim &&
                    entry->dnnl_mem[0] && entry->dnnl_mem[1] && entry->dnnl_mem[2],
                "unimatmul_native.put: a null oneDNN handle");
  }
  State& s = state();
  std::unique_lock<std::shared_mutex> guard(s.table_lock);
  s.table[key] = std::move(entry);
}

// Empties the table; the calls each entry counted, as (id, calls) pairs.
std::vector<int64_t> clear() {
  State& s = state();
  std::unique_lock<std::shared_mutex> guard(s.table_lock);
  std::vector<int64_t> out;
  for (auto& [key, entry] : s.table) {
    out.push_back(entry->id);
    out.push_back(entry->calls.load());
  }
  s.table.clear();
  return out;
}

// (id, calls) pairs of the live entries; with reset, the counts start again at zero.
std::vector<int64_t> counts(bool reset) {
  State& s = state();
  std::shared_lock<std::shared_mutex> guard(s.table_lock);
  std::vector<int64_t> out;
  for (auto& [key, entry] : s.table) {
    out.push_back(entry->id);
    out.push_back(reset ? entry->calls.exchange(0) : entry->calls.load());
  }
  return out;
}

int64_t size() {
  State& s = state();
  std::shared_lock<std::shared_mutex> guard(s.table_lock);
  return static_cast<int64_t>(s.table.size());
}

}  // namespace

TORCH_LIBRARY(unimatmul_native, m) {
  m.def("slow_mm(Tensor a, Tensor b) -> Tensor");
  m.def("slow_bmm(Tensor a, Tensor b) -> Tensor");
  m.def("slow_addmm(Tensor c, Tensor a, Tensor b, Scalar beta, Scalar alpha) -> Tensor");
  m.def("slow_baddbmm(Tensor c, Tensor a, Tensor b, Scalar beta, Scalar alpha) -> Tensor");
  m.def("install(bool cpu, bool cuda) -> ()", &install);
  m.def("uninstall() -> ()", &uninstall);
  m.def("installed() -> bool", &installed);
  m.def("configure(int mode, int python_only) -> ()", &configure);
  m.def("set_busy(bool on) -> ()", &set_busy);
  m.def(
      "put(int op, Tensor a, Tensor b, Tensor? c, bool beta_zero, bool beta_one, int kind, int id, str label, "
      "int[] out_shape, int form, int[] lt, Tensor?[] buffers, int[] flags) -> ()",
      &put);
  m.def("clear() -> int[]", &clear);
  m.def("counts(bool reset) -> int[]", &counts);
  m.def("size() -> int", &size);
}
