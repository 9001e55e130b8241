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

#include <torch/extension.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <dlfcn.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace {

using LaunchFn = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                         void**, void**);
using RetainFn = int (*)(void**, int);
using SetCurrentFn = int (*)(void*);
using DeviceGetFn = int (*)(int*, int);

constexpr int kInvalidContext = 201;  // CUDA_ERROR_INVALID_CONTEXT

struct Driver {
    LaunchFn launch = nullptr;
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
        out.retain = reinterpret_cast<RetainFn>(dlsym(lib, "cuDevicePrimaryCtxRetain"));
        out.set_current = reinterpret_cast<SetCurrentFn>(dlsym(lib, "cuCtxSetCurrent"));
        out.device_get = reinterpret_cast<DeviceGetFn>(dlsym(lib, "cuDeviceGet"));
        TORCH_CHECK(out.launch && out.retain && out.set_current && out.device_get,
                    "kernellab nodes: libcuda.so.1 lacks the driver entry points it needs");
        return out;
    }();
    return d;
}

// A thread that never touched the device (an autograd device thread before its first CUDA
// call) has no current context: bind the device's primary context, as the runtime would.
void bind_primary_context(int device_index) {
    const Driver& d = driver();
    int dev = 0;
    void* ctx = nullptr;
    TORCH_CHECK(d.device_get(&dev, device_index) == 0 && d.retain(&ctx, dev) == 0 && d.set_current(ctx) == 0,
                "kernellab nodes: cannot bind the primary context of cuda:", device_index);
}

void launch(int64_t fn, int64_t grid, int64_t block, const at::Tensor& like, void** args) {
    // (the caller holds a device guard of like's device: its context is current)
    void* stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(like.device()).native_handle();
    const Driver& d = driver();
    void* f = reinterpret_cast<void*>(static_cast<uintptr_t>(fn));
    auto g = static_cast<unsigned>(grid), b = static_cast<unsigned>(block);
    int rc = d.launch(f, g, 1, 1, b, 1, 1, 0, stream, args, nullptr);
    if (rc == kInvalidContext) {
        bind_primary_context(like.device().index());
        rc = d.launch(f, g, 1, 1, b, 1, 1, 0, stream, args, nullptr);
    }
    TORCH_CHECK(rc == 0, "kernellab nodes: kernel launch failed with CUDA driver error ", rc);
}

bool aligned16(const at::Tensor& t) { return (reinterpret_cast<uintptr_t>(t.data_ptr()) & 15) == 0; }

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
        at::Tensor dy = grads[0];
        if (!dy.is_contiguous() || !aligned16(dy) || dy.scalar_type() != x.scalar_type()) {
            dy = dy.to(x.scalar_type()).clone(at::MemoryFormat::Contiguous);
        }
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

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "kernellab's autograd nodes in C++ (see kernellab/cuda/nodes.py)";
    m.def("rms_norm", &rms_norm, "RMSNorm with norms.cu's v2 kernels in a C++ autograd node",
          pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("eps"), pybind11::arg("plan"));
    m.def("layer_norm", &layer_norm, "LayerNorm with norms.cu's v2 kernels in a C++ autograd node",
          pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"), pybind11::arg("eps"),
          pybind11::arg("plan"));
}
