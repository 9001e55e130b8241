"""kernellab asm: PTX, SASS and resource usage of our kernels (CUDA ones without a GPU)."""

from __future__ import annotations

import json

import pytest
import torch

import kernellab
from kernellab.inspect import asm

HAS_CUDA = torch.cuda.is_available()
HAS_CUOBJDUMP = asm.find_tool("cuobjdump") is not None


def test_backend_filters_follow_the_naming_contract():
    names = ["gelu_fwd_f32", "gelu_fwd_x1_f32", "gelu_fwd_v1_f32", "gelu_fwd_bf16", "gelu_bwd_v1_bf16"]
    cuda = asm.cuda_backend_filter("cuda", "f32")
    v1 = asm.cuda_backend_filter("cuda_v1", None)
    assert [n for n in names if cuda(n)] == ["gelu_fwd_f32", "gelu_fwd_x1_f32"]
    assert [n for n in names if v1(n)] == ["gelu_fwd_v1_f32", "gelu_bwd_v1_bf16"]


def test_parsers_on_small_samples():
    ptx = (
        ".visible .entry a(\n ld.global.nc.v4.u32 {%r1,%r2,%r3,%r4}, [%rd1];\n}\n"
        ".visible .entry b(\n ld.local.u32 %r1, [%rd2];\n}"
    )
    parts = asm.split_ptx(ptx)
    assert list(parts) == ["a", "b"]
    res = asm.parse_res_usage(
        "Resource usage:\n Function a:\n  REG:40 STACK:0 SHARED:1024 LOCAL:8 CONSTANT[0]:552\n"
    )
    assert res == {"a": {"REG": 40, "STACK": 0, "SHARED": 1024, "LOCAL": 8}}
    sass = asm.split_sass(
        "\t\tFunction : a\n        /*0000*/   LDG.E.128 R4, desc[UR4][R2.64] ;   /* 0x0000 */\n"
        "                                                  /* 0x000fe2 */\n"
        "        /*0010*/   STL [R1], R4 ;   /* 0x0001 */\n"
    )
    assert list(sass) == ["a"] and len(sass["a"].splitlines()) == 2
    c = asm.count_instructions(parts["a"] + parts["b"], sass["a"])
    assert c["ptx_ld_global_v4"] == 1 and c["ptx_local"] == 1 and c["LDG_128"] == 1 and c["LDL_STL"] == 1


def test_tma_and_cp_async_copies_are_counted():
    # Hopper's bulk tile copies and cp.async's 16-byte global -> shared copies are how the
    # tensor-core kernels read memory: counted, not reported as "no 16-byte global loads"
    ptx = (
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%r1], [%rd1, {%r2, %r3}], [%r4];\n"
        "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%rd2, {%r5, %r6}], [%r7];\n"
        "cp.async.cg.shared.global [%r364], [%rd1536], 16, %r365;\n"
        "cp.async.ca.shared.global [%r1], [%rd2], 4;\n"
    )
    sass = (
        "/*0100*/ UTMALDG.2D [UR8], [UR4] ;\n/*0110*/ UTMASTG.2D [UR4], [UR8] ;\n"
        "/*0120*/ UTMAREDG.2D.ADD [UR4], [UR8] ;\n/*0130*/ UTMACCTL.PF [UR4] ;\n"
        "/*0140*/ LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;\n/*0150*/ LDGSTS.E [R1], desc[UR4][R2.64] ;\n"
    )
    c = asm.count_instructions(ptx, sass)
    assert (c["ptx_tma"], c["TMA"], c["ptx_cp_async_16"], c["LDGSTS_128"]) == (2, 3, 1, 1)


def test_alias_backends_show_the_kernels_they_launch_on_each_arch():
    # matmul's cuda runs v7 (fp32) and, at 16 bits, v15 on sm_90 but v9 elsewhere; attention's
    # cuda runs cuda_v7's forward and its backward variant with the pre / post kernels
    from kernellab.ops.attention import cuda_sm90 as cs
    from kernellab.ops.attention import cuda_sm90_bwd as cb
    from kernellab.ops.matmul import cuda as mc

    mm = kernellab.get("matmul", "cuda").module
    assert asm.cuda_parts(mm, "sm_90", "cuda") == [(mc.MODULE, ("cuda_v7",)), (mc.MODULE_SM90, ("cuda_v15",))]
    assert asm.cuda_parts(mm, "sm_80", "cuda") == [(mc.MODULE, ("cuda_v7", "cuda_v9"))]
    assert asm.cuda_parts(mm, "sm_90", "cuda_v3") == [(mc.MODULE, ("cuda_v3",))]
    at = kernellab.get("attention", "cuda").module
    assert asm.cuda_parts(at, "sm_90", "cuda") == [
        (cs.MODULE, ("cuda_v7",)), (cb.MODULE, (f"cuda_{cb.CUDA_VARIANT}", "cuda"))
    ]  # fmt: skip
    v8 = [(cs.MODULE, ("cuda_v7",)), (cb.MODULE, ("cuda_v8", "cuda"))]
    assert asm.cuda_parts(at, "sm_90", "cuda_v8") == v8


def test_matmul_cuda_report_on_sm90_is_v15_at_16_bits_and_v7_in_fp32():
    mm = kernellab.get("matmul", "cuda").module
    half, _ = asm.cuda_report(mm, "sm_90", "cuda", "bf16", "mk_kn")
    assert half and all(k.name.startswith("matmul_v15_") for k in half)
    assert all(k.counts["ptx_tma"] > 0 and "wgmma" in k.ptx for k in half)
    fp32, note = asm.cuda_report(mm, "sm_90", "cuda", "f32")
    assert [k.name for k in fp32] == ["matmul_v7_f32"], note


@pytest.mark.parametrize("op", ["gelu", "add"])
def test_vectorized_cuda_kernels_use_16_byte_accesses_and_no_local_memory(op):
    """16-byte accesses in every vectorized kernel; 8-byte ones in the w8 kernels (two-input
    16-bit tensors at large sizes, see common.cuh map2_vec8)."""
    impl = kernellab.get(op, "cuda")
    kernels, note = asm.cuda_report(impl.module, "sm_90", "cuda", "bf16")
    assert kernels and all(k.name.endswith("_bf16") and "_v1_" not in k.name for k in kernels)
    assert any("_w8_" in k.name for k in kernels)
    for k in kernels:
        w8 = "_w8_" in k.name
        assert k.counts["ptx_ld_global_v2" if w8 else "ptx_ld_global_v4"] >= 1, k.name
        assert k.counts["ptx_local"] == 0, k.name
        if HAS_CUOBJDUMP:
            assert not note, note
            assert k.registers and k.registers > 0 and k.local_bytes == 0
            assert k.counts["LDG_64" if w8 else "LDG_128"] >= 1 and k.counts["LDL_STL"] == 0, k.name


def test_v1_kernels_have_no_vector_loads():
    kernels, _ = asm.cuda_report(kernellab.get("gelu", "cuda_v1").module, "sm_80", "cuda_v1", "f32")
    assert {k.name for k in kernels} == {"gelu_fwd_v1_f32", "gelu_bwd_v1_f32"}
    assert all(k.counts["ptx_ld_global_v4"] == 0 for k in kernels)


def test_asm_cli_cuda(cli_run, tmp_path):
    js = tmp_path / "a.json"
    code, out = cli_run(
        "asm", "gelu", "-b", "cuda", "--kernel", "fwd_f32$", "--ptx", "--arch", "sm_90", "--json", str(js)
    )
    assert code == 0, out
    assert "gelu_fwd_f32: 16-byte global loads" in out
    assert ".entry gelu_fwd_f32" in out
    rows = json.loads(js.read_text())
    assert [r["name"] for r in rows] == ["gelu_fwd_f32"] and "ld.global" in rows[0]["ptx"]


@pytest.mark.parametrize(
    "argv, code_, msg",
    [
        (["asm", "gelu", "-b", "manual"], 1, "no kernel source of ours"),
        (["asm", "gelu", "-b", "cuda", "--kernel", "nothing_like_this"], 1, "no kernel matched"),
        (["asm", "gelu", "-b", "cuda", "--dtype", "fp8"], 2, "not understood"),
        (["asm", "gelu", "-b", "nope"], 2, "no backend 'nope'"),
        (["asm", "nope", "-b", "cuda"], 2, "unknown op"),
    ],
)
def test_asm_cli_refusals(cli_run, argv, code_, msg):
    code, out = cli_run(*argv)
    assert code == code_ and msg in out


@pytest.mark.parametrize("op, n_kernels", [("gelu", 2), ("add", 1), ("softmax", 2)])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_triton_kernels_compile_ahead_of_time_with_16_byte_accesses(op, n_kernels, dtype):
    # No GPU needed: triton.compile for a GPUTarget, specialized as our launches are
    # (16-byte aligned pointers), so the code is the code that runs.
    kernels, note = asm.triton_report(kernellab.get(op, "triton"), dtype, "sm_90")
    assert len(kernels) == n_kernels, note
    for k in kernels:
        assert k.counts["ptx_ld_global_v4"] >= 1 and k.counts["ptx_local"] == 0, k.name
        if HAS_CUOBJDUMP:
            assert k.registers and k.counts["LDG_128"] >= 1


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "add_rms_norm"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_triton_norm_kernels_all_compile_ahead_of_time(op, dtype):
    # the forward (2-D or row kernel), the partials backward and the one-launch backward:
    # a constexpr the launcher passes and the spec lacks fails the compile, and the report
    # then lists fewer kernels
    kernels, note = asm.triton_report(kernellab.get(op, "triton"), dtype, "sm_90")
    assert len(kernels) == 3, note
    fwd = [k for k in kernels if "fwd" in k.name]
    assert len(fwd) == 1 and fwd[0].counts["ptx_ld_global_v4"] >= 1, note


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype, elem", [("fp32", 4), ("bf16", 2)])
def test_triton_norm_backward_compiles_as_its_plan_launches_it(op, dtype, elem):
    # The partials backward for many 4096-wide rows, compiled with the warps its launch plan
    # gives it: a spec with other warps (4 instead of fp32's 16) reported 255 registers and
    # spills that the launched kernel does not have. As launched it keeps all in registers.
    import re

    from kernellab.ops.norm_kernels import triton_kernels as tk

    kernels, note = asm.triton_report(kernellab.get(op, "triton"), dtype, "sm_90")
    (bwd,) = [k for k in kernels if k.name == "_norm_bwd_kernel"]
    (threads,) = re.findall(r"\.reqntid (\d+)", bwd.ptx)
    assert int(threads) == 32 * tk._bwd_warps(4096, elem=elem), note
    if HAS_CUOBJDUMP:
        assert bwd.stack_bytes == 0 and bwd.counts["LDL_STL"] == 0, (bwd.registers, bwd.counts)


def test_asm_cli_triton(cli_run):
    code, out = cli_run("asm", "gelu", "-b", "triton", "--dtype", "fp16", "--arch", "sm_80", "--sass")
    assert code == 0, out
    assert "_gelu_fwd_kernel: 16-byte global loads" in out
    if HAS_CUOBJDUMP:
        assert "SASS _gelu_fwd_kernel" in out and "LDG.E.128" in out


@pytest.mark.gpu
def test_gpu_asm_triton_reads_what_triton_compiled():
    # A length divisible by 16: Triton specializes on it and can vectorize the masked
    # accesses (with an odd length the mask's constancy is 1 and the loads are scalar).
    kernels, note = asm.triton_artifacts("gelu", (3 * 4096,), "fp16")
    assert kernels, note
    assert any(k.counts["ptx_ld_global_v4"] >= 1 for k in kernels)
    assert all(k.registers for k in kernels) or "cuobjdump" in note
