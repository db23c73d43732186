"""Our Pre-LN model transplanted into transformers' LLaMA / Qwen3 gives the same logits."""

import dataclasses

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

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
