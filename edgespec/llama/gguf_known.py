"""What the bundled llama.cpp knows: architectures, their graph constraints, BPE pre-tokenizers. Data for
`edgespec.llama.gguf_rules`.

Taken from the llama.cpp source vendored by llama-cpp-python 0.3.36 (src/llama-arch.cpp, src/llama-model.cpp,
src/models/*.cpp, src/llama-vocab.cpp). A newer llama-cpp-python may add names; until these sets are refreshed such
files are refused with a clear line rather than risked.
"""

from __future__ import annotations


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Every architecture llama_model_load_from_file builds a model for (LLM_ARCH_NAMES that llama_model_mapping
# handles). Not included: "clip" (a vision projector, refused as a main model) and "gptj" (named, never built).
KNOWN = _names(
    """
    afmoe apertus arcee arctic arwkv7 baichuan bailingmoe bailingmoe2 bailingmoe3 bert bitnet bloom chameleon
    chatglm codeshell cogvlm cohere2 cohere2moe command-r dbrx deci deepseek deepseek2 deepseek2-ocr deepseek32
    deepseek4 dflash dots1 dots3note dream eagle3 ernie4_5 ernie4_5-moe eurobert exaone exaone-moe exaone4 falcon
    falcon-h1 gemma gemma-embedding gemma2 gemma3 gemma3n gemma4 gemma4-assistant glm-dsa glm4 glm4moe glm5-next
    gpt-oss gpt2 gptneox granite granite_swa granitehybrid granitemoe graniteswitch grok grovemoe hrm_text
    hunyuan-dense hunyuan-moe hunyuan_vl hy_v3 hy_v4 internlm2 jais jais2 jamba jina-bert-v2 jina-bert-v3 kimi-k3
    kimi-linear laguna lfm2 lfm2moe llada llada-moe llama llama-embed llama4 maincoder mamba mamba2 maple mellum
    mimo2 minicpm minicpm3 minimax-01 minimax-m2 minimax-m3 mistral3 mistral4 modern-bert mpt muse-glimmer nanbeige
    nemotron nemotron_h nemotron_h_moe neo-bert nomic-bert nomic-bert-moe olmo olmo2 olmoe openelm orion paddleocr
    pangu-embedded phi2 phi3 phimoe plamo plamo2 plamo3 plm pockettts qwen qwen2 qwen2moe qwen2vl qwen3 qwen35
    qwen35moe qwen3moe qwen3next qwen3tts qwen3vl qwen3vlmoe qwen4exp refact rnd1 rwkv6 rwkv6qwen2 rwkv7 seed_oss
    smallthinker smollm3 spark2_5 stablelm starcoder starcoder2 step35 t5 t5encoder talkie wavtokenizer-dec xverse
    """
)

# Architectures refused whatever the file holds: the reason, for the error line.
REFUSED = {
    "clip": "is a vision projector (an --mmproj file), not a language model",
    "gptj": "is named by llama.cpp but not implemented",
    # src/llama-graph.cpp: GGML_ASSERT(!cross->seq_ids_enc.empty() && "llama_encode must be called first")
    "t5": "is an encoder-decoder model; llama.cpp aborts when it decodes without llama_encode",
}

# Tensors a loader marks optional but the graph uses unconditionally: build_pos_bias (src/llama-graph.cpp)
# reads layer 0's relative position bias, a NULL tensor there segfaults.
GRAPH_NEEDS = {"t5encoder": ("enc.blk.0.attn_rel_b.weight",)}

# Graph builders that GGML_ASSERT(n_embd_head == n_rot): the rotary dimension must be the whole key head.
FULL_ROTARY = _names(
    """
    apertus arcee arctic baichuan chameleon codeshell cogvlm cohere2moe dbrx deci deepseek dots1 dream ernie4_5
    ernie4_5-moe exaone exaone-moe exaone4 falcon granite granite_swa graniteswitch grok grovemoe hunyuan-moe
    hunyuan_vl hy_v3 internlm2 jais2 llada llada-moe llama llama4 maincoder mellum minimax-01 minimax-m2 mistral3
    nemotron olmo olmo2 olmoe orion paddleocr pangu-embedded plamo pockettts qwen2 qwen2moe qwen2vl qwen3 qwen3moe
    qwen3vl qwen3vlmoe rnd1 seed_oss smallthinker smollm3 starcoder2 talkie xverse
    """
)

# Graph builders that GGML_ASSERT(n_embd_head_v == n_embd_head_k): key and value heads must be the same size.
EQUAL_HEAD_SIZES = _names(
    """
    afmoe apertus arcee arctic baichuan bailingmoe2 bert bitnet bloom chameleon chatglm codeshell cogvlm cohere2
    cohere2moe command-r dbrx deci deepseek deepseek4 dflash dots1 dream eagle3 ernie4_5 ernie4_5-moe eurobert
    exaone falcon glm4 glm4moe gpt2 gptneox granite granite_swa granitehybrid graniteswitch grok grovemoe
    hunyuan-moe hunyuan_vl hy_v3 internlm2 jais jais2 laguna llada llada-moe llama llama4 maincoder mellum
    minimax-01 minimax-m2 minimax-m3 mistral3 modern-bert mpt muse-glimmer nanbeige nemotron nemotron_h
    nemotron_h_moe neo-bert olmo olmo2 olmoe openelm orion paddleocr pangu-embedded phi2 phi3 plamo pockettts qwen
    qwen2 qwen2moe qwen2vl qwen3 qwen35 qwen35moe qwen3moe qwen3next qwen3vl qwen3vlmoe qwen4exp refact rnd1
    seed_oss smallthinker smollm3 spark2_5 stablelm starcoder starcoder2 t5 xverse
    """
)

# Tensor loaders that GGML_ASSERT(n_expert > 0 && n_expert_used > 0): mixture-of-experts only.
EXPERTS_REQUIRED = _names("bailingmoe2 glm4moe grovemoe llada-moe smallthinker")

# Multi-section rotary embeddings (M-RoPE / interleaved M-RoPE): ggml's rope kernel asserts that one of the first
# three of `{arch}.rope.dimension_sections` is positive.
MROPE = _names("paddleocr qwen2vl qwen35 qwen35moe qwen3tts qwen3vl qwen3vlmoe qwen4exp")

# The BPE pre-tokenizers llama_vocab::impl::load knows (tokenizer.ggml.pre); any other name is refused.
PRE_TOKENIZERS = _names(
    """
    a.x-4.0 afmoe bailingmoe bailingmoe2 bloom chameleon chatglm-bpe codeshell cohere2moe command-r dbrx
    deepseek-coder deepseek-llm deepseek-r1-qwen deepseek-v3 default exaone exaone-moe exaone4 f2llmv2 falcon
    falcon-h1 falcon3 gemma4 gigachat glm4 glm5 gpt-2 gpt-4o gpt3-finnish granite-docling granite-embed-multi-311m
    granite-embed-multi-97m grok-2 hunyuan hunyuan-dense hy_v4 jais jais-2 jina-de jina-es jina-v1-en jina-v2-code
    jina-v2-de jina-v2-es jina-v5-nano joyai-llm kanana2 kimi-k2 kormo laguna lfm2 llada-moe llama-bpe llama-v3
    llama3 llama4 megrez mellum mellum2 midm-2.0 minerva-7b minicpm5 minimax-m2 modern-bert mpt olmo phi-2 pixtral
    poro-chat qwen2 qwen35 refact roberta-bpe sarvam-moe seed-coder smaug-bpe smollm solar-open spark2_5 stablelm2
    starcoder superbpe talkie tekken tiny_aya trillion ufakzeka viking whitespace youtu
    """
)

# Loaders that size each layer's key/value projections from that layer's own head count. Every other
# architecture sizes them from layer 0 while the KV cache follows the per-layer counts, so a per-layer
# `{arch}.attention.head_count_kv` that varies trips ggml_set_rows' GGML_ASSERT.
PER_LAYER_KV_HEADS = _names(
    """
    deci gemma4 glm5-next granitehybrid jamba kimi-k3 kimi-linear laguna lfm2 lfm2moe mimo2 nemotron_h openelm plamo2
    plamo3 spark2_5 step35
    """
)

# llm_arch_is_recurrent / llm_arch_is_hybrid: layers without attention (zero key/value heads) are normal here.
RECURRENT_OR_HYBRID = _names(
    """
    arwkv7 bailingmoe3 deepseek4 falcon-h1 glm5-next granitehybrid jamba kimi-k3 kimi-linear lfm2 lfm2moe mamba mamba2
    minimax-01 nemotron_h nemotron_h_moe plamo2 qwen35 qwen35moe qwen3next qwen4exp rwkv6 rwkv6qwen2 rwkv7
    """
)
