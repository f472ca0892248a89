"""Issue #30 on the GPU machine: a real PyTorch inference loop whose cache fragments until a
large request fails (the fit of the next large request must warn before it does).

  python3 serve.py [--pool-gib 7] [--seconds 225] [--requests N] [--seed 7] [--release random|fifo]

A Llama-style causal LM built from `LlamaConfig` with random weights (nothing to download):
16 layers, hidden 2048, 4 KV heads, vocabulary 32,000, about 1.1 B parameters in bf16. All of
the device's free memory but --pool-gib goes to a ballast tensor that stays live (the weights
of a larger model, in effect), so the loop reaches the device's end in minutes, not hours.
Then requests come, paced at --rate a second, each drawn from its own index and --seed (the
control replays the same requests):
  - a chat turn: batch 1, 2 or 4, prompt 128 to 2048 tokens; the prefill scores every
    prompt position (float32 logits of all of them, as a server that returns the prompt's
    scores does: 16 MiB to 1 GiB in one block), then 2 to 8 tokens are decoded into a
    growing KV cache (transformers' DynamicCache); the session's cache is kept for 1 to 60
    more requests (released out of order; --release fifo: each kept 30, the mean, so they
    end in the order they began), one session in 16 kept for good (the long tail);
  - at request --large-at and every --large-every after: a long document scored (batch
    4 x 4096 tokens, no cache kept, as a scoring endpoint does): 2 GiB of float32 logits in
    one block, its largest allocation by far.
Prints JSON lines: "start" (model, ballast, pool), "req" every 10th request (PyTorch's
numbers), "large" for each long document served, and at the end "oom" (the request index,
PyTorch's message) or "done". Exit 1 after an OOM, 0 when the requests or seconds run out.
"""

import argparse
import json
import os
import random
import time

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

GiB = 1 << 30
MiB = 1 << 20
VOCAB = 32000

ap = argparse.ArgumentParser()
ap.add_argument("--pool-gib", type=float, default=7.0)
ap.add_argument("--seconds", type=float, default=225.0)
ap.add_argument("--requests", type=int, default=1 << 30)
ap.add_argument("--seed", type=int, default=7)
ap.add_argument("--rate", type=float, default=2.5)
ap.add_argument("--large-at", type=int, default=40)
ap.add_argument("--large-every", type=int, default=200)
ap.add_argument("--release", choices=("random", "fifo"), default="random")
args = ap.parse_args()
t0 = time.monotonic()


def out(kind, **kw):
    kw.update(kind=kind, pid=os.getpid(), t=round(time.monotonic() - t0, 3), wall=time.time())
    print(json.dumps(kw), flush=True)


def numbers():
    st = torch.cuda.memory_stats()
    free, _ = torch.cuda.mem_get_info()
    return dict(reserved=st["reserved_bytes.all.current"], allocated=st["allocated_bytes.all.current"],
                inactive_split=st.get("inactive_split_bytes.all.current", 0), device_free=free)


config = LlamaConfig(vocab_size=VOCAB, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                     num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=8192)
torch.manual_seed(args.seed)
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = LlamaForCausalLM(config).eval()
torch.set_default_dtype(torch.float32)
params = sum(p.numel() for p in model.parameters())
# The output projection in float32, for the prompt scores (kept, like the weights).
w32 = model.lm_head.weight.float()
free, total = torch.cuda.mem_get_info()
ballast_bytes = int(max(free - args.pool_gib * GiB, 0)) // (2 * MiB) * (2 * MiB)
ballast = torch.empty(ballast_bytes, dtype=torch.uint8, device="cuda")
out("start", params=params, ballast=ballast_bytes, pool=int(args.pool_gib * GiB), total=total,
    alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), release=args.release, **numbers())


def request(i):
    """Request i's shape, from its index alone."""
    r = random.Random(args.seed * 1_000_003 + i)
    large = i == args.large_at or (i > args.large_at and (i - args.large_at) % args.large_every == 0)
    if large:
        return dict(large=True, batch=4, prompt=4096, decode=0, keep=0, forever=False, seed=r.randrange(1 << 30))
    return dict(large=False, batch=r.choice((1, 2, 4)), prompt=r.randint(128, 2048), decode=r.randint(2, 8),
                keep=r.randint(1, 60), forever=r.randrange(16) == 0, seed=r.randrange(1 << 30))


@torch.inference_mode()
def serve(q):
    g = torch.Generator(device="cuda").manual_seed(q["seed"])
    ids = torch.randint(0, VOCAB, (q["batch"], q["prompt"]), device="cuda", generator=g)
    cache = None
    if not q["large"]:
        try:
            cache = DynamicCache(config=config)
        except TypeError:  # transformers before 4.56 takes no config
            cache = DynamicCache()
    hidden = model.model(input_ids=ids, past_key_values=cache, use_cache=cache is not None).last_hidden_state
    # Every prompt position scored in float32: one block of batch x prompt x vocabulary.
    logits = torch.nn.functional.linear(hidden.float(), w32)
    token = logits[:, -1:].argmax(-1)
    best = logits.amax(-1)
    del hidden, logits, best
    for _ in range(q["decode"]):
        logits = model(input_ids=token, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        token = logits[:, -1:].argmax(-1)
    return cache


sessions = {}  # request index -> (cache, released after this request index or None)
served = 0
i = 0
while i < args.requests and time.monotonic() - t0 < args.seconds:
    slot = t0 + 15.0 + i / args.rate  # 15 s for the agent's first samples, then paced
    now = time.monotonic()
    if slot > now:
        time.sleep(slot - now)
    q = request(i)
    try:
        cache = serve(q)
    except torch.OutOfMemoryError as e:
        torch.cuda.synchronize()
        out("oom", index=i, large=q["large"], batch=q["batch"], prompt=q["prompt"],
            message=str(e).splitlines()[0][:400], **numbers())
        raise SystemExit(1)
    if cache is not None:
        keep = q["keep"] if args.release == "random" else 30
        sessions[i] = (cache, None if q["forever"] else i + keep)
    for k in [k for k, (_, until) in sessions.items() if until is not None and until <= i]:
        del sessions[k]
    served += 1
    if q["large"]:
        out("large", index=i, **numbers())
    elif i % 10 == 0:
        out("req", index=i, sessions=len(sessions), **numbers())
    i += 1
out("done", requests=served, **numbers())
