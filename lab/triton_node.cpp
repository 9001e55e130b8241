// Lab prototype: a C++ autograd node around kernellab's *Triton* norm kernels (layer_norm and
// rms_norm), so that an eager forward+backward costs the host what PyTorch's C++ node costs
// while the GPU runs the Triton kernels (on the H200 at 8192x768 bf16 they take 38.6 us a
// forward+backward against PyTorch's 72.2, but through the Python node ~330 us of host time
// against 187).
//
// Python (lab/triton_node.py) compiles the kernels of triton_kernels.py's per-shape plan, takes
// each one's CUfunction, launch shape and parameter list, and passes them in as "launch blocks":
//   [fn, grid x, grid y, grid z, threads, shared bytes, n, code_0, value_0, ..., code_n-1, value_n-1]
// one (code, value) per kernel parameter in order, the trailing scratch pointers included:
//   code 0-15: the address of tensor slot `code` (forward: 0 x, 1 w, 2 b, 3 y, 4 mean, 5 rstd;
//              backward: 0 dy, 1 x, 2 w, 3 mean, 4 rstd, 5 dx, 6 dw_part, 7 db_part, 8 dw, 9 db)
//   100: an int32 `value`   101: an int64 `value`   102: eps as float32   103: a null pointer
// meta: [rms, has_bias, small, partial rows, partials in fp64]. small: the backward block writes
// dw and db itself (no partials, no sum); else it writes [partial rows, d] partials that the sum
// block reduces into dw and db.
// The driver's cuLaunchKernel is found in libcuda.so.1 at run time (builds against a CPU torch).

#include <torch/extension.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

namespace {

using LaunchFn = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                         void**, void**);

LaunchFn driver_launch() {
    static const LaunchFn f = [] {
        void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        TORCH_CHECK(lib != nullptr, "triton_node: libcuda.so.1 cannot be loaded");
        auto fn = reinterpret_cast<LaunchFn>(dlsym(lib, "cuLaunchKernel"));
        TORCH_CHECK(fn != nullptr, "triton_node: libcuda.so.1 has no cuLaunchKernel");
        return fn;
    }();
    return f;
}

constexpr int kSlots = 16;

// One launch block (see the file's head) with the tensor addresses of `slots`.
void launch_block(const std::vector<int64_t>& blk, void* const* slots, float eps, const at::Tensor& like) {
    TORCH_CHECK(blk.size() >= 7, "triton_node: a launch block has ", blk.size(), " values");
    const int64_t n = blk[6];
    TORCH_CHECK(static_cast<int64_t>(blk.size()) == 7 + 2 * n, "triton_node: a launch block of ", n,
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
            const auto v = static_cast<int64_t>(value);
            std::memcpy(&store[i], &v, sizeof v);
        } else if (code == 102) {
            std::memcpy(&store[i], &eps, sizeof eps);
        } else {
            TORCH_CHECK(code == 103, "triton_node: unknown parameter code ", code);
        }
        args[i] = &store[i];
    }
    void* stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(like.device()).native_handle();
    void* fn = reinterpret_cast<void*>(static_cast<uintptr_t>(blk[0]));
    const int rc = driver_launch()(fn, static_cast<unsigned>(blk[1]), static_cast<unsigned>(blk[2]),
                                   static_cast<unsigned>(blk[3]), static_cast<unsigned>(blk[4]), 1, 1,
                                   static_cast<unsigned>(blk[5]), stream, args.data(), nullptr);
    TORCH_CHECK(rc == 0, "triton_node: kernel launch failed with CUDA driver error ", rc);
}

bool aligned16(const at::Tensor& t) { return (reinterpret_cast<uintptr_t>(t.data_ptr()) & 15) == 0; }

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
        TORCH_CHECK(!at::GradMode::is_enabled(),
                    "triton_node: the gradient of its gradient is not implemented (create_graph=True)");
        auto saved = ctx->get_saved_variables();
        const at::Tensor &x = saved[0], &w = saved[1], &mean = saved[2], &rstd = saved[3];
        const std::vector<int64_t> meta = ctx->saved_data["meta"].toIntVector();
        const std::vector<int64_t> bwd = ctx->saved_data["bwd"].toIntVector();
        const std::vector<int64_t> psum = ctx->saved_data["psum"].toIntVector();
        const float eps = static_cast<float>(ctx->saved_data["eps"].toDouble());
        const bool has_bias = meta[1] != 0, small = meta[2] != 0;
        at::Tensor dy = grads[0];
        if (!dy.is_contiguous() || !aligned16(dy) || dy.scalar_type() != x.scalar_type()) {
            dy = dy.to(x.scalar_type()).clone(at::MemoryFormat::Contiguous);
        }
        const int64_t d = x.size(-1);
        c10::DeviceGuard guard(x.device());
        at::Tensor dx = at::empty_like(x, at::MemoryFormat::Contiguous);
        at::Tensor dw = at::empty({d}, w.options());
        at::Tensor db = has_bias ? at::empty({d}, w.options()) : dw;
        at::Tensor dw_part, db_part;
        if (!small) {
            auto part = x.options().dtype(meta[4] ? at::kDouble : at::kFloat);
            dw_part = at::empty({meta[3], d}, part);
            db_part = meta[0] ? rstd : at::empty({meta[3], d}, part);  // (rms: no bias partials)
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

bool takes(const at::Tensor& x, const at::Tensor& w) {
    return x.is_cuda() && w.is_cuda() && x.is_contiguous() && w.is_contiguous() && aligned16(x) && aligned16(w) &&
           w.scalar_type() == x.scalar_type() && w.device() == x.device();
}

// y, or an undefined tensor (None in Python) where the node does not take these tensors.
at::Tensor norm(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, double eps,
                std::vector<int64_t> meta, std::vector<int64_t> fwd, std::vector<int64_t> bwd,
                std::vector<int64_t> psum) {
    TORCH_CHECK(meta.size() == 5, "triton_node: meta has ", meta.size(), " values, expected 5");
    const bool has_bias = b.has_value() && b->defined();
    TORCH_CHECK(has_bias == (meta[1] != 0), "triton_node: the plan was made ", meta[1] ? "with" : "without",
                " a bias");
    if (!takes(x, w) || (has_bias && !takes(*b, w))) {
        return at::Tensor();
    }
    c10::DeviceGuard guard(x.device());
    return TritonNormNode::apply(x, w, has_bias ? b : std::optional<at::Tensor>(), eps, std::move(meta),
                                 std::move(fwd), std::move(bwd), std::move(psum));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "lab: kernellab's Triton norm kernels in a C++ autograd node";
    m.def("norm", &norm, pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"), pybind11::arg("eps"),
          pybind11::arg("meta"), pybind11::arg("fwd"), pybind11::arg("bwd"), pybind11::arg("psum"));
}
