"""The model sizes this project names: plain GPTConfig values, which train.py's --model picks from
and model.py's command prints with their parameters, FLOPs per token and training memory
(scaling.py's count_params and count_flops_per_token). nanoGPT, likewise, keeps its run configs
beside the model rather than in it.

Depends on model.py (GPTConfig).
"""

from model import GPTConfig

# The GPU sizes' vocabulary and context: GPT-2's 50,257 tokens padded to a multiple of 64, 1,024
GPT2_VOCAB_AND_CONTEXT = dict(vocab_size=50304, block_size=1024)

PRESETS: dict[str, GPTConfig] = {
    # The CPU sizes keep the default vocab_size, 4,096 (the tokenizer data.py trains).
    # The default CPU run: trains to a visibly falling loss in a few minutes on 2 cores.
    "tiny": GPTConfig(block_size=128, n_layer=4, n_head=4, n_kv_head=2, n_embd=128),
    # The scaling sweep: non-embedding parameters about 4x apart, small enough to train on a CPU.
    "sweep-1": GPTConfig(block_size=128, n_layer=2, n_head=2, n_kv_head=2, n_embd=64),
    "sweep-2": GPTConfig(block_size=128, n_layer=4, n_head=4, n_kv_head=4, n_embd=96),
    "sweep-3": GPTConfig(block_size=128, n_layer=4, n_head=6, n_kv_head=6, n_embd=192),
    "sweep-4": GPTConfig(block_size=128, n_layer=8, n_head=8, n_kv_head=8, n_embd=256),
    "10m": GPTConfig(vocab_size=8192, block_size=256, n_layer=6, n_head=6, n_kv_head=2, n_embd=384),
    # GPU sizes. 124m and 350m have GPT-2 small/medium shapes (SwiGLU at 8/3 C matches GPT-2's 4C
    # MLP in size).
    "124m": GPTConfig(**GPT2_VOCAB_AND_CONTEXT, n_layer=12, n_head=12, n_kv_head=12, n_embd=768),
    "350m": GPTConfig(**GPT2_VOCAB_AND_CONTEXT, n_layer=24, n_head=16, n_kv_head=16, n_embd=1024),
    # Llama-3.2-1B's shape (GQA 32/8, FFN 8192) with the GPT-2 vocabulary, twice the context.
    "1b": GPTConfig(
        vocab_size=50304,
        block_size=2048,
        n_layer=16,
        n_head=32,
        n_kv_head=8,
        n_embd=2048,
        ffn_hidden=8192,
        rope_theta=500000.0,
    ),
}
