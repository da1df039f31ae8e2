"""mosaic_target_cute.host_launch reads the launch a CuTe DSL host function makes (grid, block, dynamic shared
memory, cluster) from its LLVM IR, the ``cudaLaunchConfig_t`` it fills for ``cudaLaunchKernelEx``: constants only,
one launch per configuration, and nothing for a launch whose fields are not constants. (The lowerings of real files
-- quack's GEMM with its 2 x 1 cluster, flash-attn's forward -- check it end to end.)"""

from mosaic_target_cute.host_launch import HostLaunch, read_launches

CFG = "!llvm.struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)>"
ATTR = "!llvm.struct<(i32, array<4 x i8>, array<64 x i8>)>"
DIM3 = "!llvm.struct<(i32, i32, i32)>"


def host(grid=("%g", "%one", "%one"), cluster=True) -> str:
    lines = ["  llvm.func @host(%arg0: !llvm.ptr) {",
             "    %g = llvm.mlir.constant(66 : i32) : i32", "    %one = llvm.mlir.constant(1 : i32) : i32",
             "    %t = llvm.mlir.constant(384 : i32) : i32", "    %smem = llvm.mlir.constant(230400 : i64) : i64",
             "    %two = llvm.mlir.constant(2 : i32) : i32", "    %id = llvm.mlir.constant(4 : i32) : i32"]
    for i, v in enumerate(grid):
        lines += [f"    %gp{i} = llvm.getelementptr %cfg[0, 0, {i}] : (!llvm.ptr) -> !llvm.ptr, {CFG}",
                  f"    llvm.store {v}, %gp{i} : i32, !llvm.ptr"]
    for i, v in enumerate(("%t", "%one", "%one")):
        lines += [f"    %bp{i} = llvm.getelementptr %cfg[0, 1, {i}] : (!llvm.ptr) -> !llvm.ptr, {CFG}",
                  f"    llvm.store {v}, %bp{i} : i32, !llvm.ptr"]
    lines += [f"    %sp = llvm.getelementptr %cfg[0, 2] : (!llvm.ptr) -> !llvm.ptr, {CFG}",
              "    llvm.store %smem, %sp : i64, !llvm.ptr"]
    if cluster:
        lines += [f"    %e = llvm.getelementptr %attrs[%one] : (!llvm.ptr, i32) -> !llvm.ptr, {ATTR}",
                  f"    %eid = llvm.getelementptr %e[0, 0] : (!llvm.ptr) -> !llvm.ptr, {ATTR}",
                  "    llvm.store %id, %eid : i32, !llvm.ptr",
                  f"    %ev = llvm.getelementptr %e[0, 2] : (!llvm.ptr) -> !llvm.ptr, {ATTR}"]
        for i, v in enumerate(("%two", "%one", "%one")):
            lines += [f"    %c{i} = llvm.getelementptr %ev[0, {i}] : (!llvm.ptr) -> !llvm.ptr, {DIM3}",
                      f"    llvm.store {v}, %c{i} : i32, !llvm.ptr"]
    return "\n".join([*lines, "  }"])


def test_a_constant_launch_with_a_cluster_attribute():
    assert read_launches(host()) == [HostLaunch((66, 1, 1), (384, 1, 1), (2, 1, 1), 230400)]


def test_no_cluster_attribute_is_one_cta_per_cluster():
    assert read_launches(host(cluster=False)) == [HostLaunch((66, 1, 1), (384, 1, 1), (1, 1, 1), 230400)]


def test_a_launch_whose_grid_is_computed_at_run_time_is_left_out():
    assert read_launches(host(grid=("%arg1", "%one", "%one"))) == []
    assert read_launches("module {}") == []
