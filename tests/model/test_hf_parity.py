"""Our Pre-LN model transplanted into transformers' LLaMA / Qwen3 gives the same logits."""

import dataclasses

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import pytest

from tests import helpers

torch = helpers.required("torch")
transformers = helpers.required("transformers")

from configs.base import get_config  # noqa: E402
from depthbench_jax.errors import ConfigError  # noqa: E402
from depthbench_jax.model import hf  # noqa: E402
from depthbench_jax.model.config import model_config_from  # noqa: E402
from depthbench_jax.model.transformer import Transformer, abstract_params  # noqa: E402


def tiny_cfg(**overrides):
  m = get_config().model
  m.vocab_size, m.d_model, m.n_layers, m.n_heads = 101, 64, 2, 4
  m.remat_policy = "none"
  m.rope_theta = 5000.0
  m.norm_eps = 1e-5
  for k, v in overrides.items():
    setattr(m, k, v)
  return model_config_from(m)


def random_params(cfg, seed=0):
  """Random params of the model's own shapes, drawn in numpy (no init compile).

  Norm gains are ``1 + noise`` so a swapped or dropped norm shows up in the logits.
  """
  rng = np.random.RandomState(seed)
  shapes = nn.unbox(abstract_params(cfg))

  def draw(path, leaf):
    if jax.tree_util.keystr(path).endswith("['scale']"):
      return (1.0 + 0.1 * rng.randn(*leaf.shape)).astype(np.float32)
    return (0.1 * rng.randn(*leaf.shape)).astype(np.float32)

  return jax.tree_util.tree_map_with_path(draw, shapes)


TOKENS = np.random.RandomState(0).randint(0, 101, size=(2, 13)).astype(np.int32)


def ours(cfg, params):
  return np.asarray(jax.jit(Transformer(cfg).apply)({"params": params}, TOKENS))


def theirs(model):
  with torch.no_grad():
    return model(torch.from_numpy(TOKENS.astype(np.int64))).logits.numpy()


CASES = {
    "llama_untied": dict(),
    "llama_gqa_tied_headdim": dict(n_kv_heads=2, head_dim=32, tie_embeddings=True),
    "qwen3_gqa_qknorm_tied": dict(n_kv_heads=2, qk_norm=True, head_dim=24, tie_embeddings=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_transplant_logits_match(case):
  cfg = tiny_cfg(**CASES[case])
  params = random_params(cfg)
  model = hf.to_hf_model(params, cfg)
  expected = "Qwen3ForCausalLM" if cfg.qk_norm else "LlamaForCausalLM"
  assert type(model).__name__ == expected
  np.testing.assert_allclose(theirs(model), ours(cfg, params), atol=1e-4, rtol=0)


@pytest.mark.parametrize("case", ["llama_untied", "qwen3_gqa_qknorm_tied"])
def test_state_dict_roundtrip(case):
  cfg = tiny_cfg(**CASES[case])
  params = random_params(cfg)
  back = hf.from_hf_state_dict(hf.to_hf_state_dict(params, cfg), cfg)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), params, back)


@pytest.mark.parametrize("case", ["llama_untied", "qwen3_gqa_qknorm_tied"])
def test_export_loads_with_auto_model(tmp_path, case):
  cfg = tiny_cfg(**CASES[case])
  params = random_params(cfg)

  class Tok:
    name, vocab_size, eos_id = "byte", 101, 100

  hf.export_hf(params, cfg, str(tmp_path), tokenizer=Tok())
  assert (tmp_path / "model.safetensors").exists() and (tmp_path / "config.json").exists()
  # The weights as readable as the config (safetensors' temp file made them 0600).
  mode = lambda name: (tmp_path / name).stat().st_mode & 0o777
  assert mode("model.safetensors") == mode("config.json")
  model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).float().eval()
  assert model.config.rms_norm_eps == cfg.norm_eps
  # The tokenizer's eos in both configs: tools that read either stop generating at it.
  assert (model.config.eos_token_id, model.config.bos_token_id) == (100, 100)
  generation = transformers.GenerationConfig.from_pretrained(str(tmp_path))
  assert (generation.eos_token_id, generation.bos_token_id) == (100, 100)
  np.testing.assert_allclose(theirs(model), ours(cfg, params), atol=1e-4, rtol=0)


def test_unsupported_designs_raise_clear_errors():
  cfg = tiny_cfg(qk_norm=True)
  with pytest.raises(ConfigError, match="qk_norm=True is not expressible in LlamaForCausalLM"):
    hf.hf_config(cfg, "llama")
  other = dataclasses.replace(  # a design HF cannot express
      tiny_cfg(), residual=ml_collections.FrozenConfigDict({"name": "hc"}))
  with pytest.raises(ConfigError, match=r"config.model.residual.name='hc'.*allowed: preln"):
    hf.check_exportable(other)


def test_gpt2_tokenizer_files_encode_like_ours(tmp_path):
  try:
    from depthbench_jax.data.tokenizer import get_tokenizer
    ours_tok = get_tokenizer("gpt2")
  except Exception as e:  # pylint: disable=broad-except
    pytest.skip(f"gpt2 tokenizer unavailable: {e}")
  assert hf.save_hf_tokenizer(ours_tok, str(tmp_path))
  theirs_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  # No "<|endoftext|>" in the text: ours encodes it as plain text, HF as the special token.
  text = ("Hello world, naïve café 1234567 it's we'll  two  spaces\n\ttabs\r\n"
          "def f(x):\n    return x ** 2  # 数学 émoji 🙂")
  assert theirs_tok.encode(text) == ours_tok.encode(text)
  assert theirs_tok.eos_token_id == ours_tok.eos_id == 50256
  assert theirs_tok.decode(ours_tok.encode(text)) == text


def test_hf_config_carries_our_constants():
  """hf_config copies every shape and constant from ours, including the ones no logit shows
  (position limit, init std), and refuses Qwen3 without QK-norm (Qwen3 always normalises)."""
  cfg = tiny_cfg(n_kv_heads=2, head_dim=24, max_seq_len=77, init_std=0.037)
  config = hf.hf_config(cfg)
  assert type(config).__name__ == "LlamaConfig"
  assert (config.vocab_size, config.hidden_size, config.intermediate_size) == (
      101, 64, cfg.ffn_dim)
  assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
          config.head_dim) == (2, 4, 2, 24)
  assert config.max_position_embeddings == 77
  assert config.initializer_range == 0.037
  assert config.rms_norm_eps == 1e-5 and config.tie_word_embeddings is False
  with pytest.raises(ConfigError, match="qk_norm=False is not expressible in Qwen3ForCausalLM"):
    hf.hf_config(cfg, "qwen3")
  with pytest.raises(ConfigError, match="hf arch='gpt2'; allowed: llama, qwen3"):
    hf.check_exportable(cfg, "gpt2")
  # A width n_heads does not divide, with an explicit head_dim: ours takes it, LlamaConfig's
  # validator raised its own error from inside transformers.
  with pytest.raises(ConfigError, match=r"^config.model.d_model=72 is not a multiple of "
                                        r"n_heads=16, which LlamaConfig refuses"):
    hf.hf_config(tiny_cfg(d_model=72, n_heads=16, head_dim=8))


def test_bfloat16_export_stores_bfloat16_and_other_dtypes_are_refused(tmp_path):
  """dtype='bfloat16' writes bf16 tensors (our fp32 weights rounded); the generation config pads
  with eos and depthbench_export.json names the arch and dtype; 'float16' is one clear error."""
  import json
  from safetensors import safe_open
  cfg = tiny_cfg(**CASES["qwen3_gqa_qknorm_tied"])
  params = random_params(cfg)

  class Tok:
    name, vocab_size, eos_id = "byte", 101, 100

  hf.export_hf(params, cfg, str(tmp_path), tokenizer=Tok(), dtype="bfloat16", step=40)
  want = hf.to_hf_state_dict(params, cfg)
  with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
    assert sorted(f.keys()) == sorted(want)
    for name in ("model.embed_tokens.weight", "model.layers.1.self_attn.q_norm.weight"):
      got = f.get_tensor(name)
      assert got.dtype == torch.bfloat16, name
      np.testing.assert_array_equal(
          got.float().numpy(), torch.from_numpy(want[name]).to(torch.bfloat16).float().numpy())
  assert transformers.GenerationConfig.from_pretrained(str(tmp_path)).pad_token_id == 100
  with open(tmp_path / "depthbench_export.json") as f:
    assert json.load(f) == {"design": "preln", "arch": "qwen3", "dtype": "bfloat16",
                            "step": 40, "tokenizer": "byte"}
  with pytest.raises(ConfigError, match="export dtype='float16'; allowed: float32, bfloat16"):
    hf.export_hf(params, cfg, str(tmp_path / "f16"), dtype="float16")
  assert not (tmp_path / "f16").exists()
