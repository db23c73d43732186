"""Under FSDP every device holds only its own rows' activations: a step's temporaries on a
(data 1, fsdp 2) mesh are those of a (data 2, fsdp 1) mesh, not of the whole batch.

Without ``model.transformer.batch_sharded`` XLA's propagation took the fsdp-sharded ``embed``
axis of the weights for the activations and every device computed the whole batch: the 1.6B
suite's train step on 16 devices held 383 GiB of temporaries per device (XLA:CPU). Each test
is one subprocess on 2 fake CPU devices; the first compiles the eval step (forward only), which
takes half the time of the train step and shows the same (1.86x the data-parallel temporaries before, 1.05x after; the
train step's: 1.59x, 0.97x).

The AttnRes designs' source buffers [S,B,T,d] lost the split in the train step: Full AttnRes's
buffer stack ran on the whole batch with the buffer sharded on ``d`` (its scans' carries took
the weights' ``embed`` sharding), and every depth read's backward (``base._depth_attend``'s
``dq``, which flattened ``S x B x T``) all-gathered the whole buffer, under data parallelism
too; HC's ``rms_projection`` weight gradient merged its streams into the tokens the same way.
Checked for every registered design on the compiled per-device HLO of its gradient: no array
may keep the global batch next to the sequence axis.
"""

import json
import re
import subprocess
import sys

import pytest

from tests import helpers

_SCRIPT = """
import json
import jax, jax.numpy as jnp
from depthbench_jax.model.config import model_config_from
from depthbench_jax.train import jitted, sharding
from tests.helpers import tiny_config

out = {}
for data, fsdp in ((2, 1), (1, 2)):
  c = tiny_config(**{"model.d_model": 64, "model.ffn_dim": 128, "data.seq_len": 128,
                     "data.global_batch_size": 8, "mesh.data": data, "mesh.fsdp": fsdp})
  compiled = jitted.jitted_steps(c, model_config_from(c.model), sharding.make_mesh(c.mesh), 10)
  batch = {"tokens": jax.ShapeDtypeStruct((8, 129), jnp.int32)}
  memory = compiled.eval_fn.lower(compiled.abstract_state.params, batch).compile().memory_analysis()
  out[f"{data}x{fsdp}"] = {"temp": memory.temp_size_in_bytes,
                           "argument": memory.argument_size_in_bytes}
print(json.dumps(out))
"""


def test_fsdp_keeps_only_its_rows_activations():
  proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=helpers.ROOT, capture_output=True,
                        text=True, env=helpers.subprocess_env(devices=2), timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  dp, fsdp = out["2x1"], out["1x2"]
  # FSDP halves the params, which data parallelism replicates...
  assert fsdp["argument"] < 0.6 * dp["argument"], out
  # ...and its temporaries are one device's rows, as under data parallelism (within 25%: the
  # gathered weights differ), not the whole batch's.
  assert fsdp["temp"] < 1.25 * dp["temp"], out


_WHOLE_BATCH_SCRIPT = """
import json
import flax.linen as nn
import jax, jax.numpy as jnp
from depthbench_jax.model.config import model_config_from
from depthbench_jax.model.transformer import Transformer
from depthbench_jax.residual import registry
from depthbench_jax.train import sharding, step
from tests.helpers import tiny_config

c = tiny_config(**{"model.d_model": 64, "model.ffn_dim": 128, "data.seq_len": 128,
                   "data.global_batch_size": 12, "mesh.data": 1, "mesh.fsdp": 2})
mesh = sharding.make_mesh(c.mesh)
models, params, shardings = {}, {}, {}
# Every design as jitted_steps builds it; Full AttnRes at 8 layers, whose 17-slot depth reads
# run over the buffer in chunks (base.slot_pieces); Block AttnRes at 5 layers in 4 blocks (at
# 2 layers each sublayer is its own block: no block open across layers, no partial sum read).
for key, design, n_layers, own in [(d, d, c.model.n_layers, {}) for d in registry.names()] + [
    ("attnres_full_17_slots", "attnres_full", 8, {}),
    ("attnres_block_partial_sums", "attnres_block", 5, {"n_blocks": 4})]:
  c.model.residual, c.model.n_layers = {"name": design, **own}, n_layers
  models[key] = model = Transformer(model_config_from(c.model), mesh=mesh)
  boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 128), jnp.int32)))
  params[key] = nn.unbox(boxed["params"])
  shardings[key] = sharding.logical_shardings(boxed["params"], mesh)

def grads(params, tokens):
  out = {}
  for design, model in models.items():
    with jax.named_scope(design):
      out[design] = step.loss_and_grads(params[design], model, tokens)
  return out

repl = sharding.replicated(mesh)
fn = jax.jit(grads, in_shardings=(shardings, sharding.batch_sharding(mesh)),
             out_shardings={d: (repl, s) for d, s in shardings.items()})
tokens = jax.ShapeDtypeStruct((12, 129), jnp.int32)
print(json.dumps(fn.lower(params, tokens).compile().as_text()))
"""


@pytest.fixture(scope="module")
def gradient_hlo():
  """The per-device HLO of every registered design's loss and gradient (the train step less
  its AdamW update, elementwise on the params) on a (data 1, fsdp 2) mesh, 12 x 128 tokens:
  one program under one ``named_scope`` per design, one subprocess, 2 fake CPU devices."""
  proc = subprocess.run([sys.executable, "-c", _WHOLE_BATCH_SCRIPT], cwd=helpers.ROOT,
                        capture_output=True, text=True, env=helpers.subprocess_env(devices=2),
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # its fixture compiles 12 gradients in one program: ~30 s on 2 cores
def test_fsdp_gradient_holds_no_whole_batch_array(gradient_hlo):
  """Each device's rows are 6 of the 12: an array with a 12 before a 128, anywhere in its shape
  (attention runs heads-major: [12,2,1,128,32]), the 12 x 128 tokens merged (1536), or the 4
  streams merged into the rows (48, then 128) is the whole batch (before the fixes: Full
  AttnRes's buffer f32[5,12,128,32] sharded on d, Block's f32[5,12,128,64], HC's projection
  cotangent f32[4,12,128,6] with the streams merged into the tokens). The first pattern once
  needed the 12 and the 128 side by side, so a whole-batch attention array passed."""
  from depthbench_jax.residual import registry
  hlo = gradient_hlo
  missing = [d for d in (*registry.names(), "attnres_full_17_slots",
                         "attnres_block_partial_sums") if f"/{d}/" not in hlo]
  assert not missing, f"designs not in the compiled program: {missing}"
  assert re.search(r"\[(?:\d+,)*6,128[,\]]", hlo), "the rows' arrays are not in the HLO"
  assert re.search(r"\[6,2,1,128,32\]", hlo), "the rows' heads-major attention is not in it"
  whole_batch = re.compile(r"\w+\[(?:\d+,)*(?:12,(?:\d+,)*128|1536|48,(?:\d+,)*128)(?:,\d+)*\]")
  whole = {}
  for line in hlo.splitlines():
    shapes = whole_batch.findall(line)
    if shapes:
      scope = re.search(r'op_name="[^/"]*/(\w+)/', line)
      whole.setdefault(scope.group(1) if scope else "?", set()).update(shapes)
  assert not whole, f"whole-batch arrays in the FSDP gradient, by design: {whole}"


_ACCUM_SCRIPT = """
import json
import jax, jax.numpy as jnp
from depthbench_jax.model.config import model_config_from
from depthbench_jax.train import jitted, sharding
from tests.helpers import tiny_config

out = {}
for k in (1, 4):
  c = tiny_config(**{"data.seq_len": 64, "data.global_batch_size": 16, "mesh.data": 1,
                     "mesh.fsdp": 2, "grad_accum_steps": k})
  compiled = jitted.jitted_steps(c, model_config_from(c.model), sharding.make_mesh(c.mesh), 10)
  batch = {"tokens": jax.ShapeDtypeStruct((16, 65), jnp.int32)}
  memory = compiled.step_fn.lower(compiled.abstract_state, batch).compile().memory_analysis()
  out[k] = memory.temp_size_in_bytes
print(json.dumps(out))
"""


def test_gradient_accumulation_holds_one_microbatchs_activations():
  """config.grad_accum_steps = 4 on an fsdp mesh: the train step's temporaries are about a
  quarter of the whole batch's (measured 0.28x; the gradient sum and the weights' gathers do
  not shrink), which is what lets a 1M-token step fit on fewer devices."""
  proc = subprocess.run([sys.executable, "-c", _ACCUM_SCRIPT], cwd=helpers.ROOT,
                        capture_output=True, text=True, env=helpers.subprocess_env(devices=2),
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["4"] < 0.45 * out["1"], out
