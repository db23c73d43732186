"""Hugging Face parity: our params <-> ``LlamaForCausalLM`` / ``Qwen3ForCausalLM`` state dicts.

Only the Pre-LN family is expressible in those classes (``x <- x + F(RMSNorm(x))`` with a final
RMSNorm). The mapping, per layer ``l`` (our scanned layout has a leading layer axis ``L``):

```
ours                                             HF (``model.`` prefix)                 shape
embed/embedding                      [V,d]       embed_tokens.weight                    [V,d]
layers/self_attn/q_proj/kernel[l]    [d,H,hd]    layers.l.self_attn.q_proj.weight       [H*hd,d]
layers/self_attn/{k,v}_proj/kernel[l][d,K,hd]    layers.l.self_attn.{k,v}_proj.weight   [K*hd,d]
layers/self_attn/o_proj/kernel[l]    [H,hd,d]    layers.l.self_attn.o_proj.weight       [d,H*hd]
layers/self_attn/{q,k}_norm/scale[l] [hd]        layers.l.self_attn.{q,k}_norm.weight   [hd] Qwen3
layers/mlp/{gate,up}_proj/kernel[l]  [d,F]       layers.l.mlp.{gate,up}_proj.weight     [F,d]
layers/mlp/down_proj/kernel[l]       [F,d]       layers.l.mlp.down_proj.weight          [d,F]
layers/residual/input_layernorm/scale[l]         layers.l.input_layernorm.weight        [d]
layers/residual/post_attention_layernorm/scale[l] layers.l.post_attention_layernorm.weight [d]
residual_io/final_norm/scale         [d]         norm.weight                            [d]
lm_head/kernel (untied only)         [d,V]       lm_head.weight (no prefix)             [V,d]
```

The math agrees term by term: RMSNorm ``x * rsqrt(mean(x^2) + eps) * w`` in fp32 with
``rms_norm_eps = config.model.norm_eps``; RoPE in the ``rotate_half`` layout with
``rope_theta``; attention scale ``head_dim^-0.5``; SwiGLU ``down(silu(gate x) * up x)``.
Architecture: ``qk_norm=True`` needs Qwen3 (LLaMA has no QK-norm), ``qk_norm=False`` needs LLaMA
(Qwen3 always normalises q and k). Both take GQA, an explicit ``head_dim`` and tied embeddings;
LLaMA's config only with ``d_model`` a multiple of ``n_heads``.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import flax.linen as nn
import jax
import numpy as np

from depthbench_jax.errors import ConfigError
from depthbench_jax.model.config import ModelConfig
from depthbench_jax.model.transformer import stack_layers

# Residual designs whose math is exactly HF LLaMA/Qwen3's.
HF_DESIGNS = ("preln",)
ARCHS = ("llama", "qwen3")


def missing_packages() -> list[str]:
  """What ``export_hf`` imports and this install lacks (``setup.py``'s test extra), found
  without importing either."""
  import importlib.util
  return [m for m in ("transformers", "safetensors") if importlib.util.find_spec(m) is None]


def check_exportable(cfg: ModelConfig, arch: str | None = None) -> str:
  """Raises ConfigError unless ``cfg`` is expressible in HF; returns the architecture name."""
  if cfg.design not in HF_DESIGNS:
    raise ConfigError(
        f"config.model.residual.name={cfg.design!r} has no Hugging Face LLaMA/Qwen3 equivalent; "
        f"allowed: {', '.join(HF_DESIGNS)}")
  if arch is None:
    arch = "qwen3" if cfg.qk_norm else "llama"
  if arch not in ARCHS:
    raise ConfigError(f"hf arch={arch!r}; allowed: {', '.join(ARCHS)}")
  if arch == "llama" and cfg.qk_norm:
    raise ConfigError("config.model.qk_norm=True is not expressible in LlamaForCausalLM; "
                      "allowed: arch='qwen3' (or qk_norm=False)")
  if arch == "llama" and cfg.d_model % cfg.n_heads:   # LlamaConfig's own validator refuses it
    raise ConfigError(
        f"config.model.d_model={cfg.d_model} is not a multiple of n_heads={cfg.n_heads}, which "
        f"LlamaConfig refuses (even with an explicit head_dim); allowed: d_model a multiple of "
        f"n_heads, or arch='qwen3' with qk_norm=True")
  if arch == "qwen3" and not cfg.qk_norm:
    raise ConfigError("config.model.qk_norm=False is not expressible in Qwen3ForCausalLM "
                      "(it always normalises q and k); allowed: arch='llama' (or qk_norm=True)")
  return arch


def hf_config(cfg: ModelConfig, arch: str | None = None, *, bos_token_id: int | None = None,
              eos_token_id: int | None = None, torch_dtype: str = "float32"):
  """A ``transformers`` LlamaConfig / Qwen3Config with exactly our shapes and constants."""
  import transformers  # pylint: disable=g-import-not-at-top

  arch = check_exportable(cfg, arch)
  common = dict(
      vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn_dim,
      num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
      num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, hidden_act="silu",
      max_position_embeddings=cfg.max_seq_len, initializer_range=cfg.init_std,
      rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings,
      rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
      attention_bias=False, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
      pad_token_id=None, dtype=torch_dtype)
  if arch == "llama":
    return transformers.LlamaConfig(mlp_bias=False, architectures=["LlamaForCausalLM"], **common)
  return transformers.Qwen3Config(use_sliding_window=False, sliding_window=None,
                                  max_window_layers=cfg.n_layers,
                                  architectures=["Qwen3ForCausalLM"], **common)


def _stacked(params: Any, cfg: ModelConfig) -> Any:
  params = nn.unbox(params)
  if "layers" not in params and "layers_0" in params:
    params = stack_layers(params, cfg.n_layers)
  return params


def to_hf_state_dict(params: Any, cfg: ModelConfig,
                     arch: str | None = None) -> dict[str, np.ndarray]:
  """Our params (scanned or unrolled layout) -> ``{hf_name: float32 numpy array}``."""
  arch = check_exportable(cfg, arch)
  p = jax.tree.map(lambda a: np.asarray(a, np.float32), _stacked(params, cfg))
  d, h, kv, hd = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
  attn, mlp, res = p["layers"]["self_attn"], p["layers"]["mlp"], p["layers"]["residual"]
  out = {"model.embed_tokens.weight": p["embed"]["embedding"],
         "model.norm.weight": p["residual_io"]["final_norm"]["scale"]}
  for l in range(cfg.n_layers):
    pre = f"model.layers.{l}."
    out[pre + "self_attn.q_proj.weight"] = attn["q_proj"]["kernel"][l].reshape(d, h * hd).T
    out[pre + "self_attn.k_proj.weight"] = attn["k_proj"]["kernel"][l].reshape(d, kv * hd).T
    out[pre + "self_attn.v_proj.weight"] = attn["v_proj"]["kernel"][l].reshape(d, kv * hd).T
    out[pre + "self_attn.o_proj.weight"] = attn["o_proj"]["kernel"][l].reshape(h * hd, d).T
    if arch == "qwen3":
      out[pre + "self_attn.q_norm.weight"] = attn["q_norm"]["scale"][l]
      out[pre + "self_attn.k_norm.weight"] = attn["k_norm"]["scale"][l]
    for name in ("gate_proj", "up_proj", "down_proj"):
      out[pre + f"mlp.{name}.weight"] = mlp[name]["kernel"][l].T
    out[pre + "input_layernorm.weight"] = res["input_layernorm"]["scale"][l]
    out[pre + "post_attention_layernorm.weight"] = res["post_attention_layernorm"]["scale"][l]
  if not cfg.tie_embeddings:
    out["lm_head.weight"] = p["lm_head"]["kernel"].T
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


def from_hf_state_dict(state_dict: Mapping[str, Any], cfg: ModelConfig,
                       arch: str | None = None) -> dict:
  """``{hf_name: tensor}`` -> our params in the scanned layout (float32 numpy leaves).

  Accepts torch tensors or arrays; a tied checkpoint may omit ``lm_head.weight``.
  """
  arch = check_exportable(cfg, arch)
  arr = lambda k: np.asarray(
      state_dict[k].detach().float().cpu().numpy() if hasattr(state_dict[k], "detach")
      else state_dict[k], np.float32)
  d, h, kv, hd = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
  layer = lambda suffix: [arr(f"model.layers.{l}.{suffix}") for l in range(cfg.n_layers)]
  stack = lambda xs: np.stack(xs)
  proj = lambda name, shape: {"kernel": stack(
      [w.T.reshape(shape) for w in layer(f"self_attn.{name}.weight")])}
  attn = {"q_proj": proj("q_proj", (d, h, hd)), "k_proj": proj("k_proj", (d, kv, hd)),
          "v_proj": proj("v_proj", (d, kv, hd)), "o_proj": proj("o_proj", (h, hd, d))}
  if arch == "qwen3":
    attn["q_norm"] = {"scale": stack(layer("self_attn.q_norm.weight"))}
    attn["k_norm"] = {"scale": stack(layer("self_attn.k_norm.weight"))}
  params = {
      "embed": {"embedding": arr("model.embed_tokens.weight")},
      "layers": {
          "self_attn": attn,
          "mlp": {n: {"kernel": stack([w.T for w in layer(f"mlp.{n}.weight")])}
                  for n in ("gate_proj", "up_proj", "down_proj")},
          "residual": {n: {"scale": stack(layer(f"{n}.weight"))}
                       for n in ("input_layernorm", "post_attention_layernorm")},
      },
      "residual_io": {"final_norm": {"scale": arr("model.norm.weight")}},
  }
  if not cfg.tie_embeddings:
    params["lm_head"] = {"kernel": arr("lm_head.weight").T.copy()}
  return params


def to_hf_model(params: Any, cfg: ModelConfig, arch: str | None = None):
  """A torch ``LlamaForCausalLM`` / ``Qwen3ForCausalLM`` (fp32, eval mode) holding our weights."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  config = hf_config(cfg, arch)
  cls = {"llama": transformers.LlamaForCausalLM,
         "qwen3": transformers.Qwen3ForCausalLM}[check_exportable(cfg, arch)]
  model = cls(config).float().eval()
  state = {k: torch.from_numpy(v.copy()) for k, v in to_hf_state_dict(params, cfg, arch).items()}
  missing, unexpected = model.load_state_dict(state, strict=False)
  missing = [k for k in missing if not (cfg.tie_embeddings and k == "lm_head.weight")]
  if missing or unexpected:
    raise ValueError(f"HF state dict mismatch: missing={missing} unexpected={unexpected}")
  if cfg.tie_embeddings:
    model.tie_weights()
  return model


_TOKENIZER_NOTE = """# Tokenizer

This checkpoint was trained with the depthbench_jax tokenizer {name!r} (vocab_size={vocab},
eos_id={eos}). {detail}
Load the model with `transformers.AutoModelForCausalLM.from_pretrained(this_dir)`; tokenize with
`depthbench_jax.data.tokenizer.get_tokenizer({name!r})` (or the files here, when present).
For lm-eval-harness: `lm_eval --model hf --model_args pretrained=this_dir` when tokenizer.json is
here, else add `,tokenizer=TOK` with TOK a Hugging Face tokenizer of the same vocabulary.
"""


def save_hf_tokenizer(tokenizer: Any, out_dir: str) -> bool:
  """Writes ``tokenizer.json`` + ``tokenizer_config.json`` for the GPT-2 BPE tokenizer.

  Built offline from the same local merge table our tokenizer reads (transformers'
  ``TikTokenConverter`` rebuilds the BPE merges from the ranks; ``<|endoftext|>`` = 50256 is
  eos/bos/unk). Returns False (nothing written) for tokenizers without an HF equivalent.
  """
  if getattr(tokenizer, "name", None) != "gpt2":
    return False
  from transformers import PreTrainedTokenizerFast  # pylint: disable=g-import-not-at-top
  from transformers import convert_slow_tokenizer  # pylint: disable=g-import-not-at-top

  from depthbench_jax.data import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top

  eos = tok_lib.GPT2_EOS
  converted = convert_slow_tokenizer.TikTokenConverter(
      vocab_file=tok_lib.gpt2_bpe_path(), pattern=tok_lib.GPT2_SPLIT_PATTERN,
      extra_special_tokens=[eos]).converted()
  PreTrainedTokenizerFast(tokenizer_object=converted, eos_token=eos, bos_token=eos,
                          unk_token=eos, model_max_length=int(1e30)).save_pretrained(out_dir)
  return True


def export_hf(params: Any, cfg: ModelConfig, out_dir: str, arch: str | None = None, *,
              tokenizer: Any = None, dtype: str = "float32", step: int | None = None) -> str:
  """Writes ``model.safetensors`` + ``config.json`` (+ ``generation_config.json``, tokenizer note).

  ``tokenizer``: a depthbench tokenizer (``.name``, ``.vocab_size``, ``.eos_id``) or None; its
  eos id goes into the config and a ``TOKENIZER.md`` says how to tokenize; for 'gpt2' the HF
  tokenizer files are written too (``save_hf_tokenizer``), so ``AutoTokenizer`` and
  lm-eval-harness load the directory as is. ``dtype``:
  'float32' or 'bfloat16' (stored weights; needs torch for bfloat16). Returns ``out_dir``.
  """
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top

  arch = check_exportable(cfg, arch)
  if dtype not in ("float32", "bfloat16"):
    raise ConfigError(f"export dtype={dtype!r}; allowed: float32, bfloat16")
  eos = getattr(tokenizer, "eos_id", None)
  config = hf_config(cfg, arch, bos_token_id=eos, eos_token_id=eos, torch_dtype=dtype)
  state = to_hf_state_dict(params, cfg, arch)
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, "model.safetensors")
  if dtype == "float32":
    save_file(state, path, metadata={"format": "pt"})
  else:
    import torch  # pylint: disable=g-import-not-at-top
    from safetensors.torch import save_file as save_torch  # pylint: disable=g-import-not-at-top
    save_torch({k: torch.from_numpy(v).to(torch.bfloat16) for k, v in state.items()}, path,
               metadata={"format": "pt"})
  # safetensors writes through a private temp file (mode 0600); the export's other files get
  # the umask's mode, and on a shared results dir others could not read the weights.
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(path, 0o666 & ~umask)
  config.save_pretrained(out_dir)
  import transformers  # pylint: disable=g-import-not-at-top
  transformers.GenerationConfig(bos_token_id=eos, eos_token_id=eos,
                                pad_token_id=eos).save_pretrained(out_dir)
  if tokenizer is not None:
    detail = ("GPT-2 BPE (tiktoken r50k_base), `<|endoftext|>` = 50256 = eos; tokenizer.json here "
              "is the same BPE (AutoTokenizer.from_pretrained(this_dir))."
              if save_hf_tokenizer(tokenizer, out_dir) else "No Hugging Face tokenizer file.")
    with open(os.path.join(out_dir, "TOKENIZER.md"), "w") as f:
      f.write(_TOKENIZER_NOTE.format(name=tokenizer.name, vocab=tokenizer.vocab_size,
                                     eos=tokenizer.eos_id, detail=detail))
  with open(os.path.join(out_dir, "depthbench_export.json"), "w") as f:
    json.dump({"design": cfg.design, "arch": arch, "dtype": dtype, "step": step,
               "tokenizer": getattr(tokenizer, "name", None)}, f, indent=2)
  return out_dir
