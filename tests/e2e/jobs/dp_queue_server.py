"""A small DP inference server: a router feeding three spawned workers over queues
(not rankscope's example; written the way another team would).

Each worker says RANK_ID=0 in a world of 1; the router starts them in reverse order of
their data-parallel index (VLLM_DP_RANK), a second apart. Workers record with a bare
PrecisionDebugger() -- or their own config file when OWN_CONFIG names a worker.
"""
import json
import multiprocessing as mp
import os
import sys
import time


def worker(dp, inbox, outbox, out_dir, own_config, drift):
    os.environ.update(RANK_ID="0", LOCAL_RANK="0", WORLD_SIZE="1", VLLM_DP_RANK=str(dp), VLLM_DP_SIZE="3")
    import mindspore as ms
    import numpy as np
    from mindspore import nn

    from rankscope import PrecisionDebugger

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(7)
    net = nn.SequentialCell([nn.Dense(8, 16), nn.Tanh(), nn.Dense(16, 4)])
    if drift:
        w = net[2].weight
        w.set_data(w + ms.Tensor(np.full(w.shape, 1e-3, np.float32)))
    dbg = PrecisionDebugger(config_path=own_config) if own_config else PrecisionDebugger()
    dbg.start(net)
    while (req := inbox.get()) is not None:
        out = net(ms.Tensor(np.asarray(req, np.float32)))
        dbg.step()
        outbox.put((dp, float(out.sum())))
    dbg.stop()
    with open(os.path.join(out_dir, f"worker{dp}.json"), "w") as f:
        json.dump({"pid": os.getpid(), "dp": dp}, f)


def main():
    out_dir, n = sys.argv[1], 3
    own_dp = int(os.environ.get("OWN_CONFIG_DP", "-1"))
    drift_dp = int(os.environ.get("DRIFT_DP", "-1"))
    ctx = mp.get_context("spawn")
    outbox = ctx.Queue()
    inboxes, procs = {}, []
    for dp in reversed(range(n)):
        inboxes[dp] = ctx.Queue()
        p = ctx.Process(target=worker, args=(dp, inboxes[dp], outbox, out_dir,
                                             os.environ.get("OWN_CONFIG") if dp == own_dp else None,
                                             dp == drift_dp))
        p.start()
        procs.append(p)
        time.sleep(1.0)
    for r in range(3):
        batch = [[(i + r) / 10.0 for i in range(8)] for _ in range(2)]
        for q in inboxes.values():
            q.put(batch)
        print(sorted(outbox.get(timeout=300) for _ in range(n)), flush=True)
    for q in inboxes.values():
        q.put(None)
    for p in procs:
        p.join(120)
    sys.exit(max(p.exitcode or 0 for p in procs))


if __name__ == "__main__":
    main()
