// Autograd nodes in C++ for the norms' CUDA kernels (norms.cu, loaded by NVRTC in Python).
//
// Why: a Python autograd.Function costs its forward's frame and, in the backward, the GIL
// taken on autograd's device thread. At tiny shapes that host time is the whole call: an
// RMSNorm forward+backward of 64x256 took 1.29x PyTorch's per call in a plain loop even with
// nothing but our two launches inside a bare Python node. Here the node, its saved tensors and
// its backward live in C++; Python only finds the kernels and the launch shape once per
// (shape, dtype, device) and passes them in as a plan.
//
// The kernels are launched with the driver's cuLaunchKernel, found at run time in
// libcuda.so.1 (no CUDA headers or libraries at build time: this builds against a CPU-only
// torch too), on torch's current stream of the tensors' device.
//
// Plan (int64 values, built by kernellab/ops/norm_kernels/cuda_kernels.py):
//   [0] forward CUfunction   [1] forward grid   [2] forward block   [3] forward threads per row
//   [4] backward CUfunction  [5] backward grid  [6] backward block  [7] backward threads per row
//   [8] partial rows of dw and db (one per backward block)
//   [9] partial-sum CUfunction (0: torch's sum, then the cast)   [10] its grid (256 threads a block)
// The kernels are norms.cu's v2 entry points (rms_ / ln_fwd_p<P>_<dtype>, rms_ / ln_bwd_p<P>_<dtype>)
// and its partial-row sum (norm_psum_<dtype>, for 16-bit weights):
//   fwd(x, w, b, y, mean, rstd, long long rows, int d, int tpr, float eps)
//   bwd(dy, x, w, mean, rstd, dx, dw_part, db_part, long long rows, int d, int tpr)
//   psum(dw_part, dw, int rows, int d)
// x, dy and w must be contiguous and 16-byte aligned (the v2 kernels read 16-byte packs):
// the forward returns an undefined tensor (None in Python: take another path) for an x or
// w that is not; the backward re-packs a dy that is not.
//
// sdpa_grad_hooks: the hooks the attention ``torch`` backend puts on SDPA's autograd node
// (ops/attention/reference.py ``_align_grad``), in C++ so that a backward runs no Python:
// a pre-hook that gives SDPA's backward an output gradient it takes (a contiguous copy of
// one with zero strides, an aligned copy of a CUDA one off a 16-byte boundary) and, on a
// fused kernel's node, a post-hook that under create_graph=True makes dq, dk and dv refuse
// a second derivative with a clear error.
//
// triton_norm: the same node around the *Triton* norm kernels (the eager path of the
// layer_norm / rms_norm ``triton`` backends; kernellab/ops/norm_kernels/triton_node.py).
// Python compiles the kernels of triton_kernels.py's per-shape plan and describes each as a
// launch block:
//   [CUfunction, grid x, grid y, grid z, threads, shared bytes, n, code_0, value_0, ...]
// one (code, value) per parameter of the compiled kernel, in order:
//   code 0-15: the address of tensor slot `code` (forward: 0 x, 1 w, 2 b, 3 y, 4 mean,
//              5 rstd; backward: 0 dy, 1 x, 2 w, 3 mean, 4 rstd, 5 dx, 6 dw_part, 7 db_part,
//              8 dw, 9 db)
//   100: an int32 `value`   101: an int64 `value`   102: eps as float32   103: a null pointer
// meta: [rms, has_bias, small, partial rows, partials in fp64]. small: the backward kernel
// writes dw and db itself; else it writes [partial rows, d] partials that the sum reduces.

#include <torch/extension.h>

#include <torch/csrc/autograd/function_hook.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace {

using LaunchFn = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                         void**, void**);
using GetCurrentFn = int (*)(void**);
using RetainFn = int (*)(void**, int);
using SetCurrentFn = int (*)(void*);
using DeviceGetFn = int (*)(int*, int);

struct Driver {
    LaunchFn launch = nullptr;
    GetCurrentFn get_current = nullptr;
    RetainFn retain = nullptr;
    SetCurrentFn set_current = nullptr;
    DeviceGetFn device_get = nullptr;
};

const Driver& driver() {
    static const Driver d = [] {
        Driver out;
        void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        TORCH_CHECK(lib != nullptr, "kernellab nodes: libcuda.so.1 cannot be loaded");
        out.launch = reinterpret_cast<LaunchFn>(dlsym(lib, "cuLaunchKernel"));
        out.get_current = reinterpret_cast<GetCurrentFn>(dlsym(lib, "cuCtxGetCurrent"));
        out.retain = reinterpret_cast<RetainFn>(dlsym(lib, "cuDevicePrimaryCtxRetain"));
        out.set_current = reinterpret_cast<SetCurrentFn>(dlsym(lib, "cuCtxSetCurrent"));
        out.device_get = reinterpret_cast<DeviceGetFn>(dlsym(lib, "cuDeviceGet"));
        TORCH_CHECK(out.launch && out.get_current && out.retain && out.set_current && out.device_get,
                    "kernellab nodes: libcuda.so.1 lacks the driver entry points it needs");
        return out;
    }();
    return d;
}

// A thread that never touched the device (an autograd device thread before its first CUDA
// call) has no current context: bind the device's primary context, as the runtime would.
// (Checked before every launch: the driver's cuLaunchKernel on such a thread crashed the
// process on an H200 rather than return CUDA_ERROR_INVALID_CONTEXT.)
void ensure_context(int device_index) {
    const Driver& d = driver();
    void* ctx = nullptr;
    if (d.get_current(&ctx) == 0 && ctx != nullptr) {
        return;
    }
    int dev = 0;
    TORCH_CHECK(d.device_get(&dev, device_index) == 0 && d.retain(&ctx, dev) == 0 && d.set_current(ctx) == 0,
                "kernellab nodes: cannot bind the primary context of cuda:", device_index);
}

void launch3(int64_t fn, unsigned gx, unsigned gy, unsigned gz, unsigned threads, unsigned shared,
             const at::Tensor& like, void** args) {
    ensure_context(like.device().index());
    void* stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(like.device()).native_handle();
    void* f = reinterpret_cast<void*>(static_cast<uintptr_t>(fn));
    const int rc = driver().launch(f, gx, gy, gz, threads, 1, 1, shared, stream, args, nullptr);
    TORCH_CHECK(rc == 0, "kernellab nodes: kernel launch failed with CUDA driver error ", rc);
}

void launch(int64_t fn, int64_t grid, int64_t block, const at::Tensor& like, void** args) {
    launch3(fn, static_cast<unsigned>(grid), 1, 1, static_cast<unsigned>(block), 0, like, args);
}

bool aligned16(const at::Tensor& t) { return (reinterpret_cast<uintptr_t>(t.data_ptr()) & 15) == 0; }

// The output gradient as the kernels read it: contiguous, 16-byte aligned, x's dtype.
at::Tensor packed_grad(const at::Tensor& dy, const at::Tensor& x) {
    if (dy.is_contiguous() && aligned16(dy) && dy.scalar_type() == x.scalar_type()) {
        return dy;
    }
    return dy.to(x.scalar_type()).clone(at::MemoryFormat::Contiguous);
}

// The fp32 partial rows of a weight (or bias) gradient -> [D] in the weight's dtype, rounded
// once: norms.cu's partial-row sum where the plan names it (plan[9]: 16-bit weights and few
// partial rows, one launch), else torch's fp32 tree sum, then the cast (each thread of the
// partial-row sum walks every row: with ~1000 rows it took longer than the backward itself).
at::Tensor reduce_partials(const at::Tensor& part, const at::Tensor& w, const std::vector<int64_t>& plan,
                           const at::Tensor& like) {
    const int64_t d = part.size(1);
    if (plan[9] == 0) {
        at::Tensor s = at::sum(part, {0});
        return s.scalar_type() == w.scalar_type() ? s : s.to(w.scalar_type());
    }
    at::Tensor out = at::empty({d}, w.options());
    void* pp = part.data_ptr();
    void* op = out.data_ptr();
    int p_rows = static_cast<int>(plan[8]);
    int n_cols = static_cast<int>(d);
    void* args[] = {&pp, &op, &p_rows, &n_cols};
    launch(plan[9], plan[10], 256, like, args);
    return out;
}

// RMSNorm (rms: no mean, no bias) and LayerNorm (no b: no bias) over the last dim. The bias
// is an optional, not an undefined tensor: autograd's apply reads every tensor argument's
// device, and an undefined one has none.
struct NormNode : public torch::autograd::Function<NormNode> {
    static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                              const std::optional<at::Tensor>& b, double eps, bool rms, std::vector<int64_t> plan) {
        const bool has_bias = b.has_value() && b->defined();
        const int64_t d = x.size(-1);
        const int64_t rows = d ? x.numel() / d : 0;
        at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
        at::Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));
        at::Tensor mean = rms ? at::Tensor() : at::empty({rows}, x.options().dtype(at::kFloat));
        void* xp = x.data_ptr();
        void* wp = w.data_ptr();
        void* bp = has_bias ? b->data_ptr() : nullptr;
        void* yp = y.data_ptr();
        void* mp = rms ? nullptr : mean.data_ptr();
        void* rp = rstd.data_ptr();
        long long n_rows = rows;
        int n_cols = static_cast<int>(d);
        int tpr = static_cast<int>(plan[3]);
        float e = static_cast<float>(eps);
        void* args[] = {&xp, &wp, &bp, &yp, &mp, &rp, &n_rows, &n_cols, &tpr, &e};
        launch(plan[0], plan[1], plan[2], x, args);
        if (rms) {
            ctx->save_for_backward({x, w, rstd});
        } else {
            ctx->save_for_backward({x, w, mean, rstd});
        }
        ctx->saved_data["plan"] = std::move(plan);
        ctx->saved_data["rms"] = rms;
        ctx->saved_data["bias"] = has_bias;
        return y;
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                    torch::autograd::variable_list grads) {
        const bool rms = ctx->saved_data["rms"].toBool();
        TORCH_CHECK(!at::GradMode::is_enabled(), "kernellab ", rms ? "rms_norm" : "layer_norm",
                    " (cuda_node): the gradient of its gradient is not implemented "
                    "(create_graph=True); use backend='triton' or 'torch' for double backward");
        auto saved = ctx->get_saved_variables();
        const at::Tensor& x = saved[0];
        const at::Tensor& w = saved[1];
        const at::Tensor mean = rms ? at::Tensor() : saved[2];
        const at::Tensor& rstd = saved[rms ? 2 : 3];
        const std::vector<int64_t> plan = ctx->saved_data["plan"].toIntVector();
        const bool has_bias = ctx->saved_data["bias"].toBool();
        const at::Tensor dy = packed_grad(grads[0], x);
        const int64_t d = x.size(-1);
        const int64_t rows = d ? x.numel() / d : 0;
        c10::DeviceGuard guard(x.device());
        at::Tensor dx = at::empty_like(x, at::MemoryFormat::Contiguous);
        at::Tensor dw_part = at::empty({plan[8], d}, x.options().dtype(at::kFloat));
        // (layer_norm's kernel writes the bias partials whether or not there is a bias)
        at::Tensor db_part = rms ? dw_part : at::empty({plan[8], d}, x.options().dtype(at::kFloat));
        void* dyp = dy.data_ptr();
        void* xp = x.data_ptr();
        void* wp = w.data_ptr();
        void* mp = rms ? nullptr : mean.data_ptr();
        void* rp = rstd.data_ptr();
        void* dxp = dx.data_ptr();
        void* pw = dw_part.data_ptr();
        void* pb = db_part.data_ptr();
        long long n_rows = rows;
        int n_cols = static_cast<int>(d);
        int tpr = static_cast<int>(plan[7]);
        void* args[] = {&dyp, &xp, &wp, &mp, &rp, &dxp, &pw, &pb, &n_rows, &n_cols, &tpr};
        launch(plan[4], plan[5], plan[6], x, args);
        at::Tensor dw = reduce_partials(dw_part, w, plan, x);
        at::Tensor db = has_bias ? reduce_partials(db_part, w, plan, x) : at::Tensor();
        return {dx, dw, db, at::Tensor(), at::Tensor(), at::Tensor()};
    }
};

void check_plan(const std::vector<int64_t>& plan, const char* op) {
    TORCH_CHECK(plan.size() == 11, "kernellab nodes: ", op, " plan has ", plan.size(), " values, expected 11");
}

// Whether the node takes these tensors: CUDA, contiguous, 16-byte aligned, one dtype and device.
bool takes(const at::Tensor& x, const at::Tensor& w) {
    return x.is_cuda() && w.is_cuda() && x.is_contiguous() && w.is_contiguous() && aligned16(x) && aligned16(w) &&
           w.scalar_type() == x.scalar_type() && w.device() == x.device();
}

// y, or an undefined tensor where the node does not take these tensors (the caller's other
// path): not CUDA, not contiguous, not 16-byte aligned, or a weight of another dtype.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, std::vector<int64_t> plan) {
    check_plan(plan, "rms_norm");
    if (!takes(x, w)) {
        return at::Tensor();
    }
    c10::DeviceGuard guard(x.device());
    return NormNode::apply(x, w, std::optional<at::Tensor>(), eps, true, std::move(plan));
}

// As rms_norm, with a bias of the weight's kind (or None).
at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, double eps,
                      std::vector<int64_t> plan) {
    check_plan(plan, "layer_norm");
    const bool has_bias = b.has_value() && b->defined();
    if (!takes(x, w) || (has_bias && !takes(*b, w))) {
        return at::Tensor();
    }
    c10::DeviceGuard guard(x.device());
    return NormNode::apply(x, w, has_bias ? b : std::optional<at::Tensor>(), eps, false, std::move(plan));
}

// ---------------------------------------------------------------- SDPA's gradient hooks

// Identity on one gradient of a fused SDPA kernel, whose backward has no derivative.
struct NoSecondDerivative : public torch::autograd::Function<NoSecondDerivative> {
    static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& g, std::string kernel) {
        ctx->saved_data["kernel"] = std::move(kernel);
        return g.view_as(g);
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                    torch::autograd::variable_list) {
        TORCH_CHECK(false, "attention/torch: double backward (a gradient of dq, dk or dv taken with "
                    "create_graph=True) is not supported: PyTorch's fused SDPA kernel (",
                    ctx->saved_data["kernel"].toStringRef(),
                    ") has no derivative of its backward. backend='manual' computes second derivatives.");
        return {at::Tensor(), at::Tensor()};
    }
};

struct FitGrad : public torch::autograd::FunctionPreHook {
    explicit FitGrad(size_t i) : i_(i) {}

    torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
        if (i_ >= grads.size() || !grads[i_].defined()) {
            return grads;
        }
        const at::Tensor& g = grads[i_];
        bool zero = false;
        for (int64_t d = 0; d < g.dim(); ++d) {
            zero = zero || (g.stride(d) == 0 && g.size(d) > 1);
        }
        const bool misaligned = g.is_cuda() && (reinterpret_cast<uintptr_t>(g.data_ptr()) & 15) != 0;
        if (!zero && !misaligned) {
            return grads;
        }
        torch::autograd::variable_list out = grads;
        out[i_] = zero ? g.contiguous() : g.clone();
        return out;
    }

    size_t i_;
};

struct RefuseSecond : public torch::autograd::FunctionPostHook {
    explicit RefuseSecond(std::string kernel) : kernel_(std::move(kernel)) {}

    torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                              const torch::autograd::variable_list&) override {
        if (!at::GradMode::is_enabled()) {  // (on only under create_graph=True)
            return outputs;
        }
        torch::autograd::variable_list out;
        out.reserve(outputs.size());
        for (const auto& g : outputs) {
            out.push_back(g.defined() ? NoSecondDerivative::apply(g, kernel_) : g);
        }
        return out;
    }

    std::string kernel_;
};

// The hooks of o's node (o: an SDPA output that requires grad): True where they were put.
bool sdpa_grad_hooks(const at::Tensor& o) {
    const auto& node = o.grad_fn();
    if (!node) {
        return false;
    }
    node->add_pre_hook(std::make_unique<FitGrad>(o.output_nr()));
    std::string name = node->name();
    if (name.rfind("ScaledDotProduct", 0) == 0) {
        const std::string suffix = "Backward0";
        if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
            name.resize(name.size() - suffix.size());
        }
        node->add_post_hook(std::make_unique<RefuseSecond>(std::move(name)));
    }
    return true;
}

// ---------------------------------------------------------------- the Triton kernels' node

constexpr int kSlots = 16;

// One launch block (see the file's head) with the tensor addresses of `slots`.
void launch_block(const std::vector<int64_t>& blk, void* const* slots, float eps, const at::Tensor& like) {
    TORCH_CHECK(blk.size() >= 7, "kernellab nodes: a launch block has ", blk.size(), " values");
    const int64_t n = blk[6];
    TORCH_CHECK(n >= 0 && static_cast<int64_t>(blk.size()) == 7 + 2 * n, "kernellab nodes: a launch block of ", n,
                " parameters has ", blk.size(), " values");
    std::vector<uint64_t> store(n, 0);
    std::vector<void*> args(n);
    for (int64_t i = 0; i < n; ++i) {
        const int64_t code = blk[7 + 2 * i], value = blk[8 + 2 * i];
        if (code >= 0 && code < kSlots) {
            store[i] = reinterpret_cast<uint64_t>(slots[code]);
        } else if (code == 100) {
            const auto v = static_cast<int32_t>(value);
            std::memcpy(&store[i], &v, sizeof v);
        } else if (code == 101) {
            std::memcpy(&store[i], &value, sizeof value);
        } else if (code == 102) {
            std::memcpy(&store[i], &eps, sizeof eps);
        } else {
            TORCH_CHECK(code == 103, "kernellab nodes: unknown parameter code ", code);
        }
        args[i] = &store[i];
    }
    launch3(blk[0], static_cast<unsigned>(blk[1]), static_cast<unsigned>(blk[2]), static_cast<unsigned>(blk[3]),
            static_cast<unsigned>(blk[4]), static_cast<unsigned>(blk[5]), like, args.data());
}

struct TritonNormNode : public torch::autograd::Function<TritonNormNode> {
    static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                              const std::optional<at::Tensor>& b, double eps, std::vector<int64_t> meta,
                              std::vector<int64_t> fwd, std::vector<int64_t> bwd, std::vector<int64_t> psum) {
        const bool rms = meta[0] != 0, has_bias = meta[1] != 0;
        const int64_t d = x.size(-1);
        const int64_t rows = d ? x.numel() / d : 0;
        at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
        at::Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));
        at::Tensor mean = rms ? rstd : at::empty({rows}, x.options().dtype(at::kFloat));
        void* slots[kSlots] = {x.data_ptr(), w.data_ptr(), has_bias ? b->data_ptr() : w.data_ptr(),
                               y.data_ptr(), mean.data_ptr(), rstd.data_ptr()};
        launch_block(fwd, slots, static_cast<float>(eps), x);
        ctx->save_for_backward({x, w, mean, rstd});
        ctx->saved_data["meta"] = std::move(meta);
        ctx->saved_data["bwd"] = std::move(bwd);
        ctx->saved_data["psum"] = std::move(psum);
        ctx->saved_data["eps"] = eps;
        return y;
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                    torch::autograd::variable_list grads) {
        const std::vector<int64_t> meta = ctx->saved_data["meta"].toIntVector();
        TORCH_CHECK(!at::GradMode::is_enabled(), "kernellab ", meta[0] ? "rms_norm" : "layer_norm",
                    " (triton): the gradient of its gradient is not implemented (create_graph=True); "
                    "use backend='torch' for double backward");
        auto saved = ctx->get_saved_variables();
        const at::Tensor &x = saved[0], &w = saved[1], &mean = saved[2], &rstd = saved[3];
        const std::vector<int64_t> bwd = ctx->saved_data["bwd"].toIntVector();
        const std::vector<int64_t> psum = ctx->saved_data["psum"].toIntVector();
        const float eps = static_cast<float>(ctx->saved_data["eps"].toDouble());
        const bool rms = meta[0] != 0, has_bias = meta[1] != 0, small = meta[2] != 0;
        const at::Tensor dy = packed_grad(grads[0], x);
        const int64_t d = x.size(-1);
        c10::DeviceGuard guard(x.device());
        at::Tensor dx = at::empty_like(x, at::MemoryFormat::Contiguous);
        at::Tensor dw = at::empty({d}, w.options());
        at::Tensor db = has_bias ? at::empty({d}, w.options()) : dw;
        at::Tensor dw_part, db_part;
        if (!small) {
            auto part = x.options().dtype(meta[4] ? at::kDouble : at::kFloat);
            dw_part = at::empty({meta[3], d}, part);
            db_part = rms ? rstd : at::empty({meta[3], d}, part);  // (rms: no bias partials)
        }
        void* slots[kSlots] = {dy.data_ptr(),   x.data_ptr(),  w.data_ptr(),  mean.data_ptr(),
                               rstd.data_ptr(), dx.data_ptr(), small ? nullptr : dw_part.data_ptr(),
                               small ? nullptr : db_part.data_ptr(), dw.data_ptr(), db.data_ptr()};
        launch_block(bwd, slots, eps, x);
        if (!small) {
            launch_block(psum, slots, eps, x);
        }
        return {dx, dw, has_bias ? db : at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
                at::Tensor()};
    }
};

// layer_norm (rms: rms_norm) through the Triton kernels of a plan; an undefined tensor where
// the node does not take these tensors (as rms_norm above).
at::Tensor triton_norm(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, double eps,
                       std::vector<int64_t> meta, std::vector<int64_t> fwd, std::vector<int64_t> bwd,
                       std::vector<int64_t> psum) {
    TORCH_CHECK(meta.size() == 5, "kernellab nodes: triton_norm meta has ", meta.size(), " values, expected 5");
    const bool has_bias = b.has_value() && b->defined();
    TORCH_CHECK(has_bias == (meta[1] != 0), "kernellab nodes: triton_norm's plan was made ",
                meta[1] ? "with" : "without", " a bias");
    if (!takes(x, w) || (has_bias && !takes(*b, w))) {
        return at::Tensor();
    }
    c10::DeviceGuard guard(x.device());
    return TritonNormNode::apply(x, w, has_bias ? b : std::optional<at::Tensor>(), eps, std::move(meta),
                                 std::move(fwd), std::move(bwd), std::move(psum));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "kernellab's autograd nodes in C++ (see kernellab/cuda/nodes.py)";
    m.def("rms_norm", &rms_norm, "RMSNorm with norms.cu's v2 kernels in a C++ autograd node",
          pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("eps"), pybind11::arg("plan"));
    m.def("layer_norm", &layer_norm, "LayerNorm with norms.cu's v2 kernels in a C++ autograd node",
          pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"), pybind11::arg("eps"),
          pybind11::arg("plan"));
    m.def("sdpa_grad_hooks", &sdpa_grad_hooks, "attention: SDPA's gradient hooks, in C++", pybind11::arg("o"));
    m.def("triton_norm", &triton_norm, "LayerNorm / RMSNorm with kernellab's Triton kernels in a C++ autograd node",
          pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"), pybind11::arg("eps"),
          pybind11::arg("meta"), pybind11::arg("fwd"), pybind11::arg("bwd"), pybind11::arg("psum"));
}
