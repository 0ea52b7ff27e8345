"""A small data-parallel inference server, written the way a team might without any
debugging tool in mind: a router process and N worker processes (multiprocessing,
spawn) behind queues. Each worker is its own one-process world -- ``RANK_ID=0``,
``LOCAL_RANK=0``, ``WORLD_SIZE=1`` -- and learns its data-parallel index the way vLLM
tells it, ``VLLM_DP_RANK``. The router sends every worker the same batches of
requests; a worker runs a prefill over the batch's prompts, then greedy decode with a
KV cache, and sends the tokens back. The router checks that the workers agree.

The model is a decoder with grouped-query attention (one K/V head shared by the query
heads), RMS norm, a gated MLP and a tied LM head; its forward takes the new token ids,
the KV cache and the position, and returns logits and the new cache.

Faults, for testing the tooling: ``SERVE_FAULT=kind:W:T:B[,kind:W:T:B...]``, worker W,
forward call T (0 = the prefill), request batch B. ``drift`` nudges a weight by 1e-3
just before that call (silent: the tokens stay the same); ``nan`` puts a NaN in a
weight just before it; ``crash`` dies (``os._exit``) inside that forward call, ``kill``
likewise by SIGKILL.

    python queue_server.py --workers 3 --batches 2 --new-tokens 4 --out results.json
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import signal
import sys
import time

VOCAB, D, HEADS, LAYERS, FF = 48, 24, 4, 2, 48
PROMPTS = [  # request batches: (batch size, prompt length) differ between batches
    [[3, 14, 15, 9, 2], [6, 5, 35, 8, 9]],
    [[27, 1, 8, 28], [18, 2, 8, 4], [45, 9, 0, 4]],
    [[11, 22, 33, 44, 5, 6], [7, 7, 7, 1, 2, 3]],
    [[40, 41, 2], [9, 8, 7]],
]


# ------------------------------------------------------------------ the model (worker side)
def build_model(fault_hook):
    import mindspore as ms
    import numpy as np
    from mindspore import Parameter, Tensor, nn, ops

    class RMSNorm(nn.Cell):
        def __init__(self):
            super().__init__()
            self.weight = Parameter(Tensor(np.ones(D, np.float32)), name="weight")

        def construct(self, x):
            return x * ops.rsqrt((x * x).mean(-1, keep_dims=True) + 1e-6) * self.weight

    class GQAttention(nn.Cell):
        def __init__(self):
            super().__init__()
            self.hd = D // HEADS
            self.q = nn.Dense(D, D, has_bias=False)
            self.kv = nn.Dense(D, 2 * self.hd, has_bias=False)
            self.o = nn.Dense(D, D, has_bias=False)

        def construct(self, x, k_cache, v_cache):
            b, t, _ = x.shape
            q = self.q(x).reshape(b, t, HEADS, self.hd).swapaxes(1, 2)
            k, v = ops.split(self.kv(x), self.hd, axis=-1)
            k = ops.cat([k_cache, k], axis=1)
            v = ops.cat([v_cache, v], axis=1)
            s = k.shape[1]
            scores = ops.matmul(q, k.expand_dims(1).swapaxes(-1, -2)) / float(np.sqrt(self.hd))
            mask = np.triu(np.ones((t, s), np.bool_), s - t + 1)
            scores = ops.masked_fill(scores, Tensor(mask), Tensor(-1e4, ms.float32))
            out = ops.matmul(ops.softmax(scores, -1), v.expand_dims(1))
            return self.o(out.swapaxes(1, 2).reshape(b, t, D)), k, v

    class GatedMLP(nn.Cell):
        def __init__(self):
            super().__init__()
            self.gate = nn.Dense(D, FF, has_bias=False)
            self.up = nn.Dense(D, FF, has_bias=False)
            self.down = nn.Dense(FF, D, has_bias=False)

        def construct(self, x):
            return self.down(ops.silu(self.gate(x)) * self.up(x))

    class Layer(nn.Cell):
        def __init__(self):
            super().__init__()
            self.norm1, self.attn, self.norm2, self.mlp = RMSNorm(), GQAttention(), RMSNorm(), GatedMLP()

        def construct(self, x, k_cache, v_cache):
            h, k, v = self.attn(self.norm1(x), k_cache, v_cache)
            x = x + h
            fault_hook()
            return x + self.mlp(self.norm2(x)), k, v

    class GQADecoder(nn.Cell):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, D)
            self.blocks = nn.CellList([Layer() for _ in range(LAYERS)])
            self.norm = RMSNorm()

        def construct(self, ids, caches, start):
            t = ids.shape[1]
            pos = Tensor(np.arange(start, start + t, dtype=np.float32)[None, :, None] / 16.0)
            x = self.embed(ids) + ops.sin(pos * Tensor(np.arange(1, D + 1, dtype=np.float32)))
            new = []
            for i, block in enumerate(self.blocks):
                x, k, v = block(x, caches[2 * i], caches[2 * i + 1])
                new += [k, v]
            logits = ops.matmul(self.norm(x), self.embed.embedding_table.T)  # tied head
            return logits, tuple(new)

    ms.set_seed(7)
    model = GQADecoder()
    model.set_train(False)
    return model


# ------------------------------------------------------------------ the worker
def worker_main(index: int, jobs, results) -> None:
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    faults = {}  # (batch, call) -> kind, for this worker
    for item in filter(None, os.environ.get("SERVE_FAULT", "").split(",")):
        kind, who, call, batch = item.split(":")
        if int(who) == index:
            faults[(int(batch), int(call))] = kind
    state = {"call": 0, "batch": 0}

    def fault_hook():  # runs inside each layer's forward
        kind = faults.get((state["batch"], state["call"]))
        if kind in ("crash", "kill"):
            print(f"worker {index}: dying inside forward call {state['call']}", file=sys.stderr, flush=True)
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3)

    model = build_model(fault_hook)
    hd = D // HEADS
    results.put(("ready", index, os.getpid()))
    while True:
        job = jobs.get()
        if job is None:
            break
        batch_no, prompts, new_tokens = job
        state["batch"] = batch_no
        ids = Tensor(np.array(prompts, np.int32))
        b = ids.shape[0]
        caches = tuple(Tensor(np.zeros((b, 0, hd), np.float32)) for _ in range(2 * LAYERS))
        out, start = [], 0
        for call in range(new_tokens):
            state["call"] = call
            kind = faults.get((batch_no, call))
            if kind in ("drift", "nan"):
                w = model.blocks[1].attn.q.weight
                value = w.asnumpy()
                value[0, 0] = np.nan if kind == "nan" else value[0, 0] + 1e-3
                w.set_data(Tensor(value))
            logits, caches = model(ids, caches, start)
            start += ids.shape[1]
            ids = Tensor(logits[:, -1, :].asnumpy().argmax(-1).astype(np.int32)[:, None])
            out.append(ids.asnumpy()[:, 0].tolist())
        results.put(("done", index, batch_no, out))


# ------------------------------------------------------------------ the router
def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--batches", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=4)
    p.add_argument("--out", default="")
    a = p.parse_args()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    queues, procs = [], []
    for i in range(a.workers):
        # every worker believes it is rank 0 of a world of 1; its DP index and the DP size
        # are vLLM's variables
        os.environ.update(RANK_ID="0", LOCAL_RANK="0", WORLD_SIZE="1", VLLM_DP_RANK=str(i),
                          VLLM_DP_SIZE=str(a.workers))
        q = ctx.Queue()
        proc = ctx.Process(target=worker_main, args=(i, q, results), name=f"dp-worker-{i}")
        proc.start()
        queues.append(q)
        procs.append(proc)
    pids: dict[int, int] = {}
    while len(pids) < a.workers:  # dispatch only once every worker has loaded its model
        _, i, pid = results.get(timeout=300)
        pids[i] = pid
    batches = PROMPTS[:a.batches]
    for n, prompts in enumerate(batches):
        for q in queues:
            q.put((n, prompts, a.new_tokens))
    tokens: dict[int, dict[int, list]] = {i: {} for i in range(a.workers)}
    expected = a.workers * len(batches)
    got, deadline = 0, time.time() + 300
    while got < expected and time.time() < deadline:
        try:
            _, i, n, out = results.get(timeout=1.0)
        except queue.Empty:
            dead = [i for i, pr in enumerate(procs) if not pr.is_alive() and len(tokens[i]) < len(batches)]
            for i in dead:  # a router keeps serving with the workers it has left
                print(f"router: worker {i} (pid {pids[i]}) died with exit code {procs[i].exitcode}", flush=True)
                expected -= len(batches) - len(tokens[i])
                tokens[i] = {n: None for n in range(len(batches))}
            continue
        tokens[i][n] = out
        got += 1
    for q in queues:
        q.put(None)
    for proc in procs:
        proc.join(timeout=60)
    alive = {i: t for i, t in tokens.items() if all(v is not None for v in t.values())}
    same = len({json.dumps(t, sort_keys=True) for t in alive.values()}) <= 1
    print(f"router: {len(alive)} of {a.workers} workers served every batch; "
          f"{'identical' if same else 'DIFFERENT'} tokens", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"pids": pids, "tokens": tokens, "exitcodes": [pr.exitcode for pr in procs]}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
