// The architecture's layer recipe, described once: which optional steps every layer takes,
// derived from the validated params and tensor table by the neutral loader (model_load.cpp) and
// read by both backends — their loaders (which tensors to pack or upload) and their layer loops
// (cpu/batch_forward.cpp forward_stages, cuda/batch_step.cpp run_group) — so neither re-derives it
// from the arch enum or from which weights happen to be present.
//
// Not fields, because every supported architecture does them the same way: pre-norm RMSNorm
// before attention and before the MLP; rotate-half RoPE on q and k with ModelGeometry::inv_freq
// (the scaling kind is folded into the frequencies); SwiGLU, SiLU(gate) · up; the residual adds;
// the final norm and lm_head. Every layer has the same recipe (no per-layer variants such as
// sliding windows: docs/native.md "Not supported"), so one plan serves every layer.
#pragma once

namespace kvr {

struct LayerPlan {
  bool qk_norm = false;          // Qwen3: RMSNorm of each q and k head (over head_dim) before RoPE
  bool qkv_bias = false;         // q/k/v projection biases (attention_bias)
  bool o_bias = false;           // o_proj bias (attention_bias and listed: Llama's, not Qwen2's)
  bool mlp_bias = false;         // gate/up/down projection biases
  bool tied_embeddings = false;  // the lm_head is the embedding table (no lm_head tensor)
};

}  // namespace kvr
