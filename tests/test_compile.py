"""train.compile: the program's train and eval steps compiled for a TPU topology or NVIDIA GPUs
on this CPU.

The compiling tests need libtpu (requirements-tpu.txt) or jax's CUDA plugin
(requirements-gpu.txt) and skip without them; the error tests run everywhere (libtpu or the
plugin is hidden from them where it is installed).
"""

import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys

import jax
import pytest

from configs import default, lm_kjv_llama, transformer_base
from flax_transformer import functional, sharding
from train import tasks
from train.aot import compile_costs, traced_costs
from train.aot.compile_lib import abstract_batch
from train.config import config_lib
from train.config.sections import DataConfig
from train.formats import sources
from train.program import loop as train_lib

REPO = pathlib.Path(__file__).resolve().parent.parent
needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="needs libtpu (the TPU compiler): pip install -r requirements-tpu.txt",
)
JSON_KEYS = {
    "topology",
    "chip",
    "num_chips",
    "mesh",
    "params",
    "bytes_per_chip",
    "hbm_bytes",
    "fits",
    "xla_flops",
    "model_flops",
    "bytes_accessed",
    "kernel_bytes_per_chip",
    "step_time_lower_bound_s",
    "mfu_ceiling",
    "collectives",
    "compile_s",
    "not_checked",
}
# A decoder of 2 unrolled layers (XLA's cost analysis then counts every layer), on a
# (data 2, fsdp 2) mesh of a v5e:2x2 slice.
TINY = (
    "--config=configs/lm_kjv_llama.py",
    "--config.model.d_model=64",
    "--config.model.d_ff=128",
    "--config.model.num_layers=2",
    "--config.max_len=64",
    "--config.batch_size=8",
    "--config.mesh_shape=(2,2,1)",
)


def _compile(*args, pythonpath=str(REPO)):
    return subprocess.run(
        [sys.executable, "-m", "train.compile", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": pythonpath},
        timeout=600,
    )


def _error_line(result, after_progress=False) -> str:
    """The one error line of stderr: all of it, or the last line after progress lines."""
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors == lines[-1:] and (after_progress or len(lines) == 1), result.stderr
    return errors[0]


@pytest.fixture(scope="module")
def tiny_v5e(tmp_path_factory):
    out = tmp_path_factory.mktemp("compile") / "tiny.json"
    result = _compile(*TINY, "--topology=v5e:2x2", f"--json={out}")
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text()), result.stdout


@pytest.mark.slow  # compiles a train step for a TPU topology
@needs_libtpu
def test_json_has_the_figures_of_the_compiled_train_step(tiny_v5e):
    report, stdout = tiny_v5e
    assert set(report) == JSON_KEYS
    assert report["topology"] == "v5e:2x2" and report["chip"] == "TPU v5 lite"
    assert report["num_chips"] == 4
    assert report["mesh"] == {"data": 2, "fsdp": 2, "tensor": 1}
    assert report["fits"] is True and "fits: yes" in stdout
    sizes = report["bytes_per_chip"]
    assert set(sizes) == {"arguments", "outputs", "temp", "code", "total"}
    assert 0 < sizes["total"] <= sum(v for k, v in sizes.items() if k != "total")
    assert sizes["total"] < report["hbm_bytes"] == 16 * 2**30
    assert report["bytes_accessed"] > 0 and report["compile_s"] > 0
    assert report["not_checked"] == []  # libtpu compiles what a TPU runs
    assert report["step_time_lower_bound_s"] > 0 and 0 < report["mfu_ceiling"] <= 1


@needs_libtpu
def test_parameter_count_and_flops_match_the_model(tiny_v5e):
    report, _ = tiny_v5e
    config = lm_kjv_llama.get_config()
    config.model.update(d_model=64, d_ff=128, num_layers=2)
    config.max_len = 64
    task = tasks.get_task(config.task)
    model = task.make_model(config_lib.model_config(config, config.vocab_size))
    shapes = jax.eval_shape(model.init, jax.random.key(0), *task.init_inputs())
    assert report["params"] == sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))
    assert report["model_flops"] == compile_costs.model_flops(model, [(8, 64)])
    # XLA counts every product, elementwise op and the optimizer; the formula matrix products.
    assert 0.8 < report["model_flops"] / report["xla_flops"] <= 1.0


@needs_libtpu
def test_collectives_of_a_data_and_fsdp_step(tiny_v5e):
    report, stdout = tiny_v5e
    found = report["collectives"]
    assert set(found) == set(compile_costs.COLLECTIVES)
    # fsdp-split parameters are gathered for the forward pass, and their gradients summed
    # into each chip's shard by reduce-scatters (libtpu's all-reduce-scatter fusions); the
    # gradients of the unsplit norm scales are all-reduced.
    assert found["all-gather"]["count"] >= 1 and found["all-gather"]["bytes"] > 0
    assert found["reduce-scatter"]["count"] >= 1 and found["reduce-scatter"]["bytes"] > 0
    assert found["all-reduce"]["count"] >= 1 and found["all-reduce"]["bytes"] > 0
    assert "all-reduce" in stdout and "https://cloud.google.com/tpu/docs/v5e" in stdout


@needs_libtpu
def test_a_step_that_does_not_fit_exits_1_with_one_line(tmp_path):
    # Float32 logits of 512 x 2048 tokens over a 4000-piece vocabulary: 4 GiB per chip for
    # each copy the loss keeps, more than a v5e's 16 GiB.
    out = tmp_path / "big.json"
    result = _compile(
        "--config=configs/lm_kjv_llama.py",
        "--config.model.d_model=64",
        "--config.model.d_ff=128",
        "--config.model.num_layers=1",
        "--config.max_len=2048",
        "--config.batch_size=512",
        "--topology=v5e:2x2",
        f"--json={out}",
    )
    assert result.returncode == 1, result.stderr
    line = _error_line(result, after_progress=True)
    assert line.startswith("error: v5e:2x2: does not fit: ")
    assert "--config.mesh_shape" in line and "remat" in line and "batch_size" in line
    report = json.loads(out.read_text())
    assert set(report) == JSON_KEYS and report["fits"] is False


@needs_libtpu
def test_a_shape_libtpu_rejects_is_a_usage_error():
    result = _compile("--topology=v5e:3x3")
    assert result.returncode == 2
    line = _error_line(result, after_progress=True)
    assert "--topology=v5e:3x3: libtpu cannot build it" in line


@pytest.mark.parametrize("topology", ["v9:2x2", "v5e", "tpu-v5e-16"])
def test_unknown_topology_is_one_line_with_examples(topology):
    result = _compile(f"--topology={topology}")
    assert result.returncode == 2
    line = _error_line(result)
    assert f"--topology={topology}:" in line and "v5e:16x16" in line and "v4:2x2x2" in line


@pytest.mark.parametrize(
    ("flags", "topology", "fix"),
    [
        # llama_1b.py's splash attention, a TPU kernel, on GPUs (once blamed on the mesh).
        (["--config=configs/llama_1b.py"], "h100:1x8", "cudnn (cuDNN flash attention) or xla"),
        (
            ["--config=configs/lm_kjv_llama.py", "--config.model.attention_impl=cudnn"],
            "v5e:2x2",
            "splash (Pallas flash attention) or xla",
        ),
    ],
)
def test_an_attention_kernel_the_chips_cannot_run_is_refused_up_front(flags, topology, fix):
    """Before libtpu or the CUDA plugin loads (so this runs without either): one line naming
    the field and the fix."""
    result = _compile(*flags, f"--topology={topology}")
    assert result.returncode == 2
    line = _error_line(result)
    assert line.startswith("error: --config.model.attention_impl=")
    assert topology in line and line.endswith(f"; set --config.model.attention_impl={fix}")


def test_a_step_that_cannot_be_traced_names_the_field_behind_it():
    from train.aot.compile_lib import _trace_error

    placement = (
        "Sharding spec ('fsdp',) implies that array axis 0 is partitioned 4 times, but does "
        "not evenly divide the dimension size 6. Got shape: (6,)"
    )
    assert _trace_error(placement).startswith(
        "--config.mesh_shape: the step cannot be placed on this mesh (Sharding spec"
    )
    kernel = (
        "MultiHeadAttention: attention_impl='splash' needs query and key lengths that are "
        "multiples of 128 (its TPU tiles), got T=64, S=64; pad the sequences"
    )
    assert _trace_error(kernel) == f"--config.model.attention_impl: {kernel}"
    # Anything else is passed on as it is, blaming no field it cannot know.
    assert _trace_error("MultiHeadAttention: x_q has 3 axes\njax's detail") == (
        "MultiHeadAttention: x_q has 3 axes"
    )


@pytest.mark.parametrize(
    ("package", "topology", "says", "requirements"),
    [
        ("libtpu", "v5e:2x2", "needs libtpu", "requirements-tpu.txt"),
        ("jax_cuda12_plugin", "h100:1x8", "CUDA plugin", "requirements-gpu.txt"),
    ],
)
def test_without_the_compiler_one_line_says_what_to_install(
    tmp_path, package, topology, says, requirements
):
    hidden = tmp_path / package  # shadows an installed libtpu or CUDA plugin
    hidden.mkdir()
    (hidden / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    result = _compile(f"--topology={topology}", pythonpath=f"{tmp_path}:{REPO}")
    assert result.returncode == 2
    line = _error_line(result)
    assert says in line and line.endswith(f"; pip install -r {requirements}")


def test_abstract_batch_has_the_batcher_shapes():
    config = transformer_base.get_config()
    mesh = sharding.make_mesh(-1, 1, 1)
    task = tasks.get_task(config.task)
    data = DataConfig.from_config(config)
    train = abstract_batch(data, task, mesh, evaluation=False)
    evaluate = abstract_batch(data, task, mesh, evaluation=True)
    rows = config.tokens_per_batch // config.max_len  # 96 rows of 256 tokens
    assert {k: v.shape for k, v in train.items()} == {
        k: (rows, 256) for k in ("src", "tgt_in", "tgt_out", "src_segment_ids", "tgt_segment_ids")
    }
    assert set(evaluate) == {"src", "tgt_in", "tgt_out"}  # validation is not packed
    assert all(v.sharding == sharding.batch_sharding(mesh) for v in train.values())


# A module in XLA's HLO text format: a while loop of 6 iterations whose body gathers (in two
# pieces of one collective, as TPU's asynchronous collective fusions split it) and
# (asynchronously) sums, and a reduce-scatter after it.
LOOP_HLO = """HloModule loop

%piece (param_0: f32[8]) -> f32[16] {
  %param_0 = f32[8]{0} parameter(0)
  ROOT %all-gather.4 = f32[16]{0} all-gather(%param_0), channel_id=1, dimensions={0}
}

%cond (p.0: (s32[], f32[8])) -> pred[] {
  %p.0 = (s32[], f32[8]{0}) parameter(0)
  %i.0 = s32[] get-tuple-element(%p.0), index=0
  %n = s32[] constant(6)
  ROOT %lt = pred[] compare(%i.0, %n), direction=LT
}

%body (p.1: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p.1 = (s32[], f32[8]{0}) parameter(0)
  %x = f32[8]{0} get-tuple-element(%p.1), index=1
  %all-gather.1 = f32[16]{0} all-gather(%x), channel_id=1, replica_groups={{0,1}}, dimensions={0}
  %fusion.5 = f32[16]{0} fusion(%x), kind=kCustom, calls=%piece
  %all-reduce-start.2 = f32[8]{0} all-reduce-start(%x), channel_id=2, to_apply=%sum
  %all-reduce-done.2 = f32[8]{0} all-reduce-done(%all-reduce-start.2)
  ROOT %t.1 = (s32[], f32[8]{0}) tuple(%i.1, %all-reduce-done.2)
}

ENTRY %main (a: f32[8]) -> bf16[4,2] {
  %a = f32[8]{0} parameter(0)
  %w = (s32[], f32[8]{0}) while(%t.0), condition=%cond, body=%body
  ROOT %reduce-scatter.3 = bf16[4,2]{1,0} reduce-scatter(%b), channel_id=3, dimensions={0}
}
"""


def test_collectives_count_once_per_loop_iteration():
    found, exact = compile_costs.collectives(LOOP_HLO)
    assert exact
    assert found["all-gather"] == {"count": 6, "bytes": 6 * 16 * 4}
    assert found["all-reduce"] == {"count": 6, "bytes": 6 * 8 * 4}  # -done only: not twice
    assert found["reduce-scatter"] == {"count": 1, "bytes": 4 * 2 * 2}
    assert found["all-to-all"] == found["collective-permute"] == {"count": 0, "bytes": 0}
    # XLA's own loops (e.g. a matmul split into steps with collective-permutes) count in u32.
    unsigned, exact = compile_costs.collectives(
        LOOP_HLO.replace("s32[] constant", "u32[] constant")
    )
    assert exact and unsigned == found
    unknown, exact = compile_costs.collectives(LOOP_HLO.replace("direction=LT", "direction=NE"))
    assert not exact and unknown["all-gather"]["count"] == 1


# libtpu's form of a reduce-scatter over 4 chips: a fusion computation named
# all-reduce-scatter.N, an all-reduce of the whole array, then this chip's slice.
TPU_REDUCE_SCATTER_HLO = """HloModule rs

%add (x: bf16[], y: bf16[]) -> bf16[] {
  %x = bf16[] parameter(0)
  %y = bf16[] parameter(1)
  ROOT %s = bf16[] add(%x, %y)
}

%all-reduce-scatter.6 (input.6: bf16[64,32]) -> bf16[16,32] {
  %input.6 = bf16[64,32]{1,0} parameter(0)
  %ar = bf16[64,32]{1,0} all-reduce(%input.6), channel_id=7, to_apply=%add
  %p = u32[] partition-id()
  %c = u32[] constant(16)
  %m = u32[] multiply(%p, %c)
  %z = u32[] constant(0)
  ROOT %ds = bf16[16,32]{1,0} dynamic-slice(%ar, %m, %z), dynamic_slice_sizes={16,32}
}

ENTRY %main (g: bf16[64,32], n: f32[8]) -> (bf16[16,32], f32[8]) {
  %g = bf16[64,32]{1,0} parameter(0)
  %n = f32[8]{0} parameter(1)
  %fusion.16 = bf16[16,32]{1,0} fusion(%g), kind=kCustom, calls=%all-reduce-scatter.6
  %all-reduce.3 = f32[8]{0} all-reduce(%n), channel_id=3, to_apply=%add
  ROOT %t = (bf16[16,32]{1,0}, f32[8]{0}) tuple(%fusion.16, %all-reduce.3)
}
"""


def test_tpu_reduce_scatter_fusions_count_as_reduce_scatters():
    found, exact = compile_costs.collectives(TPU_REDUCE_SCATTER_HLO)
    assert exact
    # The shard it leaves on each chip, not the whole array that the fused all-reduce names.
    assert found["reduce-scatter"] == {"count": 1, "bytes": 16 * 32 * 2}
    assert found["all-reduce"] == {"count": 1, "bytes": 8 * 4}
    # The same all-reduce outside such a fusion stays an all-reduce of the whole array.
    plain, _ = compile_costs.collectives(
        TPU_REDUCE_SCATTER_HLO.replace("all-reduce-scatter.6", "fused_computation.6")
    )
    assert plain["reduce-scatter"]["count"] == 0
    assert plain["all-reduce"] == {"count": 2, "bytes": 64 * 32 * 2 + 8 * 4}


# 8 x 32 rows fit one block of the loss; 32 x 32 take two (the head recomputed).
@pytest.mark.parametrize(
    "name, batch_size", [("default", 8), ("lm_kjv_llama", 8), ("lm_kjv_llama", 32)]
)
def test_model_formula_equals_the_traced_matrix_products(name, batch_size):
    # Tracing only (no compile): the formula counts what the step's dot_generals compute,
    # layers scanned or not; remat adds the recomputed forward of each layer.
    config = {"default": default, "lm_kjv_llama": lm_kjv_llama}[name].get_config()
    config.update(max_len=32, bucket_lengths=(), batch_size=batch_size, tokens_per_batch=0)
    config.max_decode_len = 0
    # Muon's Newton-Schulz products are the optimizer's, not the model's.
    config.optimizer.name = "adam"
    task = tasks.get_task(config.task)
    mesh = sharding.make_mesh(-1, 1, 1)
    counts = {}
    for scan, remat in [(False, False), (True, False), (True, True)]:
        config.model.update(d_model=32, num_heads=4, d_ff=64, num_layers=2)
        config.model.update(scan_layers=scan, remat=remat)
        experiment = config_lib.validate_config(config)
        program = train_lib.build_program(experiment, task, mesh, 100, unk_id=3)
        batch = abstract_batch(experiment.data, task, mesh, evaluation=False)
        traced = program.train_step.trace(program.state_shapes, batch)
        shapes = [batch[k].shape for k in task.model_inputs]
        formula = compile_costs.model_flops(program.model, shapes)
        # Past one block of rows the loss applies the head block by block and recomputes
        # its forward in the backward pass rather than keep the logits
        # (`blocked_cross_entropy`): one more forward of the head, which the formula (like
        # remat's recomputation) leaves out. One block (B x T <= DEFAULT_BLOCK_ROWS) keeps
        # the logits and computes the formula's products alone.
        cfg = program.model.config
        rows = math.prod(shapes[-1])
        head_again = 2 * rows * cfg.d_model * cfg.output_vocab_size
        if rows <= functional.DEFAULT_BLOCK_ROWS:
            head_again = 0
        traced_flops = traced_costs.traced_matmul_flops(traced.jaxpr)
        counts[scan, remat] = (traced_flops - head_again, formula)
    assert counts[False, False][0] == counts[False, False][1]
    assert counts[True, False] == counts[False, False]
    remat, formula = counts[True, True]
    assert formula < remat < 4 / 3 * formula  # the layers' forward again, not the logits


@needs_libtpu
@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["(2,2,1)", "(1,2,2)"])
def test_the_splash_kernel_compiles_into_the_train_step(tmp_path, mesh):
    """attention_impl=splash: the Pallas kernel is in the compiled TPU program, sharded by
    the mesh (data+fsdp, or fsdp+tensor over heads), and the xla path is not."""
    hlo = tmp_path / "step.hlo"
    result = _compile(
        *(flag for flag in TINY if not flag.startswith("--config.mesh_shape=")),
        "--config.max_len=128",
        "--config.model.attention_impl=splash",
        f"--config.mesh_shape={mesh}",
        "--topology=v5e:2x2",
        f"--hlo={hlo}",
    )
    assert result.returncode == 0, result.stderr
    text = hlo.read_text()
    # The forward kernel and the two backward kernels (dq, dkv) of each layer.
    assert text.count("tpu_custom_call") >= 3, text.count("tpu_custom_call")


# --- NVIDIA GPUs, compiled without a GPU by jax's CUDA plugin (requirements-gpu.txt) ---


def _cuda_plugin() -> bool:
    return (
        importlib.util.find_spec("jax_cuda12_plugin") is not None
        and importlib.util.find_spec("jax_plugins") is not None
        and importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    )


needs_cuda_plugin = pytest.mark.skipif(
    not _cuda_plugin(),
    reason="needs jax's CUDA plugin (XLA's GPU compiler): pip install -r requirements-gpu.txt",
)
# TINY in bf16 with cuDNN attention, on a data-parallel pair of H100s.
TINY_GPU = (
    *(flag for flag in TINY if not flag.startswith("--config.mesh_shape=")),
    "--config.mesh_shape=(2,1,1)",
    "--config.model.dtype=bfloat16",
    "--config.model.attention_impl=cudnn",
    "--topology=h100:1x2",
)


@pytest.fixture(scope="module")
def tiny_h100(tmp_path_factory):
    out = tmp_path_factory.mktemp("compile") / "tiny_h100.json"
    hlo = out.with_suffix(".hlo")
    result = _compile(*TINY_GPU, f"--json={out}", f"--hlo={hlo}")
    assert result.returncode == 0, result.stderr
    assert not [line for line in result.stderr.splitlines() if "cudart_stub" in line]
    return json.loads(out.read_text()), result.stdout, hlo.read_text()


@pytest.mark.slow  # compiles a train step for two GPUs (about a minute on 2 cores)
@needs_cuda_plugin
def test_gpu_report_has_the_tpu_report_keys(tiny_h100):
    report, stdout, hlo = tiny_h100
    assert set(report) == JSON_KEYS
    assert report["topology"] == "h100:1x2" and report["chip"] == "NVIDIA H100 80GB HBM3"
    assert report["num_chips"] == 2 and report["mesh"] == {"data": 2, "fsdp": 1, "tensor": 1}
    assert report["fits"] is True and report["hbm_bytes"] == compile_costs.GPUS["h100"].hbm_bytes
    assert 0 < report["bytes_per_chip"]["total"] < report["hbm_bytes"]
    # XLA has no cost analysis for GPU executables: the bound comes from the traced step.
    assert report["xla_flops"] is None and report["bytes_accessed"] is None
    assert report["step_time_lower_bound_s"] > 0 and report["mfu_ceiling"] > 0
    # The ceiling may pass 1 here: the model formula counts the causal mask's upper half,
    # which cuDNN skips (and the bound leaves out); this tiny model is mostly attention.
    peak = compile_costs.GPUS["h100"].peak_flops
    bound = report["step_time_lower_bound_s"] * report["num_chips"] * peak
    assert report["model_flops"] / bound == pytest.approx(report["mfu_ceiling"])
    assert report["collectives"]["all-reduce"]["count"] >= 1  # gradients over data
    assert "__cudnn$fmha" in hlo  # the cuDNN attention kernels are in the program
    assert any("cuDNN" in what for what in report["not_checked"])
    assert any("autotuning" in what for what in report["not_checked"])
    assert "https://www.nvidia.com/en-us/data-center/h100/" in stdout and "NVLink" in stdout


@needs_cuda_plugin
def test_cudnn_attention_flops_are_counted_from_its_shapes():
    """Tracing only: cuDNN's kernels hide their matrix products from `dot_general`; they are
    counted from the kernels' shapes (q k^T and weights v forward, five products backward,
    causal masks halved), so the traced count is the formula's less the difference."""
    from train.aot import compile_lib

    config = lm_kjv_llama.get_config()
    config.model.update(d_model=64, d_ff=128, num_layers=2)
    config.model.update(attention_impl="cudnn", dtype="bfloat16")
    config.update(max_len=64, batch_size=8)
    experiment = config_lib.validate_config(config)
    devices = compile_lib.topology_devices("h100:1x1", compile_costs.GPUS["h100"])
    mesh = train_lib.make_mesh((1, 1, 1), devices)
    task = tasks.get_task(experiment.data.task)
    program = train_lib.build_program(experiment, task, mesh, 4000, unk_id=3)
    batch = abstract_batch(experiment.data, task, mesh, evaluation=False)
    with compile_lib._cudnn_version_assumed():
        traced = program.train_step.trace(program.state_shapes, batch)
    formula = compile_costs.model_flops(program.model, [(8, 64)])
    # Per layer and B*N*T*S*H (8 rows, 4 heads, 64 x 64, width 16): the formula's 2 * 6, the
    # kernels' 2 * 7 halved by the causal mask.
    per_layer = 8 * 4 * 64 * 64 * 16
    assert traced_costs.traced_matmul_flops(traced.jaxpr) == formula - 2 * (12 - 7) * per_layer


@pytest.mark.parametrize(
    ("name", "expected"), [("h100:1x8", "1x1x8"), ("h100:2x8", "1x2x8"), ("a100:1x1", "1x1x1")]
)
def test_gpu_topology_names_hosts_and_gpus(name, expected):
    assert compile_costs.gpu_topology(name) == expected
    assert compile_costs.chip_of(name).is_gpu


@pytest.mark.parametrize("key", sorted(compile_costs.GPUS))
def test_gpu_memory_is_that_of_the_target_config(key):
    chip = compile_costs.GPUS[key]
    text = (REPO / "train" / "aot" / "gpu_specs" / chip.target_config).read_text()
    assert f"device_memory_size: {int(chip.hbm_bytes)}\n" in text
    assert f'device_description_str: "{chip.device_kind}"' in text


@pytest.mark.parametrize("topology", ["h100:8", "h100:0x8", "h300:1x8"])
def test_unknown_gpu_topology_is_one_line_with_examples(topology):
    result = _compile(f"--topology={topology}")
    assert result.returncode == 2
    assert "h100:1x8" in _error_line(result)


def test_gpu_topologies_refuse_another_jax_platform():
    result = subprocess.run(
        [sys.executable, "-m", "train.compile", "--topology=h100:1x8"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cuda"},
        timeout=600,
    )
    assert result.returncode == 2
    assert "JAX_PLATFORMS=cuda" in _error_line(result) and "JAX_PLATFORMS=cpu" in result.stderr


@needs_libtpu
def test_init_from_compiles_the_pretrained_models_shapes(tmp_path):
    # Shapes only: the directory's config decides the model; no weight is read.
    pytest.importorskip("transformers")
    from train.tiny_pretrained import write_tiny_model

    texts = ["In the beginning God created the heaven and the earth."] * 20
    model_dir = write_tiny_model(tmp_path / "llama", "llama", texts=texts, vocab_size=300)
    out = tmp_path / "report.json"
    result = _compile(
        "--config=configs/finetune_gpt2.py",
        f"--config.init_from={model_dir}",
        "--config.max_len=64",
        "--config.batch_size=8",
        "--topology=v5e:2x2",
        f"--json={out}",
    )
    assert result.returncode == 0, result.stderr
    source = sources.read_source(model_dir)
    model = tasks.get_task("lm").make_model(source.model)
    shapes = jax.eval_shape(model.init, jax.random.key(0), *tasks.get_task("lm").init_inputs())
    params = sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))
    assert json.loads(out.read_text())["params"] == params
