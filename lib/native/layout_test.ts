// Tests for the C struct layouts: an oracle C program compiled against native/include/kvrelay.h
// fills kvr_model_params / kvr_tensor_desc with known values and dumps their bytes; our DataView
// encoders must produce the same bytes. Also checks sizes and the NUL-separated path list.

import assert from "node:assert/strict";
import { encodeModelParams, encodePaths, encodeTensorTable } from "./layout.ts";
import { parseModelConfig, type WeightEntry } from "../model/mod.ts";

const header = new URL("../../native/include/kvrelay.h", import.meta.url).pathname;

const ORACLE = `
#include <stdio.h>
#include "kvrelay.h"
int main(void) {
  kvr_model_params p = {0};
  p.arch = KVR_ARCH_QWEN2; p.vocab_size = 1000; p.hidden_size = 256; p.intermediate_size = 512;
  p.num_layers = 3; p.num_heads = 8; p.num_kv_heads = 2; p.head_dim = 32;
  p.rms_norm_eps = 1e-5f; p.rope_theta = 500000.0f; p.rope_scaling = KVR_ROPE_LLAMA3;
  p.rope_factor = 8.0f; p.rope_low_freq_factor = 1.0f; p.rope_high_freq_factor = 4.0f;
  p.rope_original_max_position = 8192; p.tie_word_embeddings = 1; p.attention_bias = 1;
  p.mlp_bias = 0; p.kv_dtype = KVR_DTYPE_BF16; p.n_threads = 3;
  p.backend = KVR_BACKEND_CUDA; p.device = 5; p.weights = KVR_WEIGHTS_Q8;
  p.cpu_kernel = KVR_CPU_KERNEL_AVXVNNI;
  kvr_tensor_desc d[2] = {{0}};
  d[0].role = KVR_T_K_BIAS; d[0].layer = 2; d[0].file_index = 1; d[0].dtype = KVR_DTYPE_F16;
  d[0].ndim = 1; d[0].shape[0] = 64; d[0].shape[1] = 1; d[0].offset = 123456789012ull; d[0].nbytes = 128;
  d[1].role = KVR_T_EMBED; d[1].layer = 0; d[1].file_index = 0; d[1].dtype = KVR_DTYPE_BF16;
  d[1].ndim = 2; d[1].shape[0] = 1000; d[1].shape[1] = 256; d[1].offset = 8; d[1].nbytes = 512000;
  printf("%zu %zu\\n", sizeof p, sizeof d[0]);
  const unsigned char* b = (const unsigned char*)&p;
  for (size_t i = 0; i < sizeof p; i++) printf("%02x", b[i]);
  printf("\\n");
  b = (const unsigned char*)d;
  for (size_t i = 0; i < sizeof d; i++) printf("%02x", b[i]);
  printf("\\n");
  return 0;
}
`;

async function runOracle(): Promise<string[]> {
  const dir = await Deno.makeTempDir({ prefix: "kvr-layout-" });
  try {
    await Deno.writeTextFile(`${dir}/oracle.c`, ORACLE);
    const incDir = header.slice(0, header.lastIndexOf("/"));
    const cc = await new Deno.Command("cc", {
      args: ["-std=c11", "-I", incDir, "-o", `${dir}/oracle`, `${dir}/oracle.c`],
      stderr: "piped",
    }).output();
    if (!cc.success) throw new Error(new TextDecoder().decode(cc.stderr));
    const run = await new Deno.Command(`${dir}/oracle`, { stdout: "piped" }).output();
    return new TextDecoder().decode(run.stdout).trim().split("\n");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

const hex = (b: Uint8Array) => Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");

Deno.test("`encodeModelParams()` and `encodeTensorTable()` match the C compiler's struct bytes", async () => {
  const [sizes, paramsHex, tableHex] = await runOracle();
  assert.equal(sizes, "96 64");
  const config = parseModelConfig({
    architectures: ["Qwen2ForCausalLM"],
    vocab_size: 1000,
    hidden_size: 256,
    intermediate_size: 512,
    num_hidden_layers: 3,
    num_attention_heads: 8,
    num_key_value_heads: 2,
    head_dim: 32,
    rms_norm_eps: 1e-5,
    rope_theta: 500000,
    rope_scaling: {
      rope_type: "llama3",
      factor: 8,
      low_freq_factor: 1,
      high_freq_factor: 4,
      original_max_position_embeddings: 8192,
    },
    tie_word_embeddings: true,
  });
  assert.equal(hex(encodeModelParams(config, "bf16", 3, "cuda", 5, "q8", "avxvnni")), paramsHex);
  const entries: WeightEntry[] = [
    {
      role: "k_bias",
      layer: 2,
      tensor: {
        name: "b",
        dtype: "F16",
        shape: [64],
        file: "/b",
        offset: 123456789012,
        nbytes: 128,
      },
    },
    {
      role: "embed",
      layer: 0,
      tensor: {
        name: "e",
        dtype: "BF16",
        shape: [1000, 256],
        file: "/a",
        offset: 8,
        nbytes: 512000,
      },
    },
  ];
  assert.equal(hex(encodeTensorTable(entries, ["/a", "/b"])), tableHex);
  assert.throws(() => encodeTensorTable(entries, ["/a"]), /file "\/b" is not in the path list/);
});

Deno.test("`encodePaths()` writes NUL-terminated UTF-8 paths back to back", () => {
  const bytes = encodePaths(["/a/ü", "/b"]);
  assert.deepEqual([...bytes], [0x2f, 0x61, 0x2f, 0xc3, 0xbc, 0, 0x2f, 0x62, 0]);
  assert.throws(() => encodePaths(["/a\0b"]), TypeError);
});
