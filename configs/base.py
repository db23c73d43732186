"""Defaults for every field of the one config schema (DEVELOPERS.md). Other configs start here.

``get_config()`` returns a small fp32 CPU model on the embedded corpus; suites override shapes,
data and the recipe.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.name = "base"

  c.model = m = ml_collections.ConfigDict()
  m.vocab_size = 50257            # >= the tokenizer's vocab: 50257 GPT-2 BPE, 257 bytes.
  m.d_model = 128
  m.n_layers = 4
  m.n_heads = 4
  m.n_kv_heads = ml_collections.FieldReference(None, field_type=int)  # None = MHA.
  m.head_dim = ml_collections.FieldReference(None, field_type=int)    # None = d_model / n_heads.
  m.ffn_dim = ml_collections.FieldReference(None, field_type=int)     # None = SwiGLU 8/3 rule.
  m.ffn_multiple_of = 64
  m.qk_norm = False
  m.tie_embeddings = False
  m.rope_theta = 10000.0
  m.max_seq_len = 4096
  m.norm_eps = 1e-6
  m.init_std = 0.02
  m.scan_layers = True
  m.remat_policy = "nothing_saveable"
  m.dtype = "float32"              # compute dtype; 'bfloat16' on accelerators.
  m.param_dtype = "float32"
  m.attention_kernel = "xla"       # 'fused' = cuDNN flash attention on GPU (bf16); 'xla' elsewhere.
  m.stream_dtype = "compute"       # the residual state between layers: 'compute' | 'float32'.
  m.residual = ml_collections.ConfigDict({"name": "preln"})

  c.data = d = ml_collections.ConfigDict()
  d.source = "embedded"            # 'embedded' | 'parquet' | 'tfds'
  d.path = ""                      # parquet glob/dir for 'parquet'; data_dir for 'tfds'.
  d.tfds_name = ""
  d.tokenizer = "gpt2"
  d.seq_len = 128
  d.global_batch_size = 8
  d.seed = 0                       # train window order (shuffle); not the init, not val.
  d.val_batches = 4
  d.worker_count = 0
  d.cache_dir = ""                 # '' = $DEPTHBENCH_CACHE_DIR, else ~/.cache/depthbench_jax

  # Training recipe (flat, as in nanodo / flax examples).
  c.steps = 100                    # -1 = tokens_per_param * params / tokens_per_step.
  c.tokens_per_param = 20.0
  c.budget_design = ""             # '' = budget from the run's own params; 'preln' = from Pre-LN's.
  c.lr = 3e-3
  # int steps; a float in (0, 1) = fraction of steps. Untyped, so a flag may give either.
  c.warmup_steps = ml_collections.FieldReference(10, field_type=object)
  c.min_lr_ratio = 0.1
  c.b1 = 0.9
  c.b2 = 0.95
  c.weight_decay = 0.1
  c.grad_clip = 1.0
  c.grad_accum_steps = 1           # microbatches per step: same gradient, 1/N of the activations.
  c.eval_every = 50                # periodic val loss; 0 = the final one only (always logged).
  c.eval_batches = 4               # val batches per periodic eval (0 = all); the final reads all.
  c.log_every = 10
  c.tensorboard = True             # TensorBoard events in workdir/tensorboard (training's process
                                   # 0, evaluate); False: the progress lines and metrics.jsonl
                                   # only, and no TensorFlow import (clu's writer: ~5 s a start).
  c.peak_flops_per_device = 0.0    # FLOP/s for MFU; 0 = by device kind (train/loop.PEAK_FLOPS).
  c.checkpoint_every = 50
  c.keep_checkpoints = 2
  c.async_checkpointing = True     # orbax writes a checkpoint while the next steps run.
  c.seed = 0                       # params init key; not the data order (data.seed).

  # Layer diagnostics (depthbench_jax/diagnostics): in training every `every` steps (0 = off) on
  # the first `batch_size` rows of the first validation batch; post hoc by diagnose.py.
  c.diagnostics = g = ml_collections.ConfigDict()
  g.every = 0
  g.batch_size = 2
  g.thresholds = (0.45, 0.15)      # (causal, permutation): the paper's share thresholds
  g.curve_points = 101             # share curves over linspace(0, max(1, threshold, top score))
  g.causal_reduction = "mean"      # over tokens: 'mean' (spec) | 'max' (Csordas et al.)
  g.causal_skip = "zero_update"    # layer s's sublayer outputs := 0 (spec) | 'absent' (Csordas)
  g.causal_chunk = 0               # gated networks per vmapped batch; 0 = one at a time
  g.permutation_chunk = 8          # swap orders per vmapped batch; 0 = one at a time
  g.permutation_pairs = "all"      # 'all' i<j (full heatmap) | 'late' (only the share's pairs)
  g.dead_threshold = 0.05          # Block AttnRes: own-block weight below this = dead layer

  # Divergence (train/summary.py DivergenceGuard, checked on every step's loss): a non-finite
  # loss or gradient, or from step `min_steps` on a loss above `spike_factor` x the best so far
  # (0 = off), stops the run as 'diverged'; no checkpoint past the last good step is written.
  # With skip_nonfinite_steps a non-finite step leaves the state untouched instead, and only
  # more than `max_skipped_steps` of them in a row count as divergence.
  c.divergence = v = ml_collections.ConfigDict()
  v.spike_factor = 4.0
  v.min_steps = 20
  v.max_skipped_steps = 20
  c.skip_nonfinite_steps = False

  # Iso-parameter check (train/config_check.py): with iso_target_params > 0, the shape's
  # Pre-LN-backbone `iso_count` ('total' | 'non_embedding') must be within iso_tolerance of it.
  c.iso_target_params = 0.0
  c.iso_count = "total"
  c.iso_tolerance = 0.02

  # Test-only fault injection. nan_at_step = k > 0 puts an out-of-vocabulary token in step k's
  # batch: the embedding lookup yields NaN (jnp.take's fill mode), so that step's loss and
  # gradients are NaN, as in a numerical blow-up. 0 = off.
  c.debug = ml_collections.ConfigDict({"nan_at_step": 0})

  # Post-hoc evals (depthbench_jax/evaluate.py): where the eval sets are when --eval_data_dir is
  # not given; '' = ~/.cache/depthbench_jax/evals.
  c.evals = ml_collections.ConfigDict({"data_dir": ""})

  c.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1})
  return c
