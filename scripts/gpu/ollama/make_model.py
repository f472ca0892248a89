#!/usr/bin/env python3
"""A small llama-architecture GGUF with random weights, sized to known MiB (issue #12).

    python3 make_model.py OUT.gguf LAYERS [SEED]

n_embd 2048, 16 heads of 128, 8 KV heads, n_ff 8192, vocab 32768, F16 weights, trained context
262,144 so that a large num_ctx is not capped. Per layer: q 8 MiB, k 4, v 4, o 8, gate/up/down
32 each (120 MiB) plus two f32 norms (8 KiB each); output 128 MiB and token_embd 128 MiB (ollama
keeps the token embedding on the CPU). KV cache, F16: 2 x 8 x 128 x 2 B = 4 KiB per token per
layer. The tokenizer is a SentencePiece-style vocabulary (control, byte and plain pieces); the
text it generates is noise, what matters is the memory.
"""
import sys

import numpy as np
import gguf

N_EMBD, N_HEAD, N_HEAD_KV, N_FF, VOCAB, CTX = 2048, 16, 8, 8192, 32768, 262144
HEAD_DIM = N_EMBD // N_HEAD


def vocab():
    toks, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [2, 3, 3]
    for b in range(256):
        toks.append(f"<0x{b:02X}>"); scores.append(0.0); types.append(6)
    seen = set(toks)
    chars = [chr(c) for c in range(0x21, 0x7F)]
    pieces = ["\u2581"] + chars + ["\u2581" + c for c in chars]
    i = 0
    while len(toks) < VOCAB:
        if i < len(pieces):
            p = pieces[i]
        else:
            n = i - len(pieces)
            p = "\u2581" + chars[n % 94] + chars[(n // 94) % 94] + (chars[n // (94 * 94)] if n >= 94 * 94 else "")
        i += 1
        if p in seen:
            continue
        seen.add(p); toks.append(p); scores.append(-float(len(toks))); types.append(1)
    return toks, scores, types


def main():
    out, layers = sys.argv[1], int(sys.argv[2])
    rng = np.random.default_rng(int(sys.argv[3]) if len(sys.argv) > 3 else 12)
    w = gguf.GGUFWriter(out, "llama")
    w.add_name(f"vramhook-random-{layers}l")
    w.add_context_length(CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(layers)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    toks, scores, types = vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    def mat(rows, cols):  # numpy shape (rows, cols) = ggml ne (cols, rows)
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    ones = np.ones(N_EMBD, dtype=np.float32)
    w.add_tensor("token_embd.weight", mat(VOCAB, N_EMBD))
    for i in range(layers):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", ones)
        w.add_tensor(b + "attn_q.weight", mat(N_EMBD, N_EMBD))
        w.add_tensor(b + "attn_k.weight", mat(N_HEAD_KV * HEAD_DIM, N_EMBD))
        w.add_tensor(b + "attn_v.weight", mat(N_HEAD_KV * HEAD_DIM, N_EMBD))
        w.add_tensor(b + "attn_output.weight", mat(N_EMBD, N_EMBD))
        w.add_tensor(b + "ffn_norm.weight", ones)
        w.add_tensor(b + "ffn_gate.weight", mat(N_FF, N_EMBD))
        w.add_tensor(b + "ffn_up.weight", mat(N_FF, N_EMBD))
        w.add_tensor(b + "ffn_down.weight", mat(N_EMBD, N_FF))
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", mat(VOCAB, N_EMBD))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
