#!/usr/bin/env python3
"""pytorch_deepfm.py - the PyTorch baseline trainer_bench prints beside its own step.

A plain PyTorch DeepFM with the shapes and optimizers of trainer_bench's warm phase: 26
slots, dim 16, MLP 256-128 (ReLU, no output bias, one global bias), batch 512, one id per
slot and example drawn Zipf(1.05) over 1M ids per slot. All slots live in one pre-sized
table (26 x 1M rows) whose rows hold the embedding and, as an extra column, the slot's
first-order weight: one sparse lookup and one sparse Adagrad step per batch (lr 0.05,
initial accumulator 0.1, eps 1e-8, as the trainer's slots), Adam on the dense parameters
(lr 0.001), mean log loss. New rows start U(-0.01, 0.01), their first-order weight 0.

As trainer_bench: batches are made before the clock starts, an untimed warm-up pass of as
many batches first, then the timed pass; one thread (torch.set_num_threads(1)), or with
--threads N that many intra-op threads (the BLAS stays at one: see below). Prints one JSON
object: examples_per_s (wall clock, median of --reps), cpu_examples_per_s (by the
process's CPU time), min, max and the versions. Exit status 3 when torch is missing (the
message on stderr), 2 for bad arguments.
"""
import argparse
import json
import os
import sys
import time

SLOTS, DIM, IDS_PER_SLOT = 26, 16, 1000000


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=300000, help="timed examples per rep")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="PyTorch's intra-op threads")
    a = ap.parse_args()
    if a.batch < 1 or a.examples < a.batch or not 1 <= a.reps <= 15 or not 1 <= a.threads <= 64:
        ap.error("need 1 <= batch <= examples, 1 <= reps <= 15 and 1 <= threads <= 64")
    # Set before numpy and torch load. torch.set_num_threads() alone leaves the BLAS that
    # Debian's torch links (OpenBLAS) starting a thread per core: with one thread asked for,
    # measured twice the CPU time of the wall time. With two (this 2-core machine, 300k
    # examples): intra-op threads 2 and the BLAS at 1 made 45.6k/s, the BLAS at 2 and
    # intra-op 1 34.0k/s, both at 2 (PyTorch's default here) 19.7k/s, where one thread made
    # 46.8k/s; so --threads sets the intra-op threads and keeps the BLAS at one.
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    for v in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[v] = "1"
    try:
        import numpy as np
        import torch
        from torch import nn
    except ImportError as e:
        print(f"pytorch_deepfm: {e} (Debian: apt-get install python3-torch)", file=sys.stderr)
        return 3
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)

    # Zipf(1.05) ranks in [0, 1M) by inversion of the exact CDF (the trainer's sampler draws
    # the same distribution by rejection-inversion).
    cdf = np.cumsum(1.0 / np.arange(1, IDS_PER_SLOT + 1, dtype=np.float64) ** 1.05)
    cdf /= cdf[-1]
    offsets = np.arange(SLOTS, dtype=np.int64) * IDS_PER_SLOT

    nb = a.examples // a.batch

    def batches(count):
        out = []
        for _ in range(count):
            ranks = np.minimum(np.searchsorted(cdf, rng.random((a.batch, SLOTS))),
                               IDS_PER_SLOT - 1)
            ids = torch.from_numpy(ranks.astype(np.int64) + offsets)
            y = torch.from_numpy((rng.random(a.batch) < 0.1).astype(np.float32))
            out.append((ids, y))
        return out

    class DeepFM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(SLOTS * IDS_PER_SLOT, DIM + 1, sparse=True)
            with torch.no_grad():
                self.emb.weight.uniform_(-0.01, 0.01)
                self.emb.weight[:, DIM] = 0
            self.b0 = nn.Parameter(torch.zeros(1))
            self.mlp = nn.Sequential(nn.Linear(SLOTS * DIM, 256), nn.ReLU(),
                                     nn.Linear(256, 128), nn.ReLU(),
                                     nn.Linear(128, 1, bias=False))
            for m in self.mlp:
                if isinstance(m, nn.Linear):
                    nn.init.xavier_uniform_(m.weight)
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)

        def forward(self, ids):
            rows = self.emb(ids)  # [n, S, d + 1]
            e, w1 = rows[..., :DIM], rows[..., DIM]
            s = e.sum(1)
            fm = 0.5 * (s * s - (e * e).sum(1)).sum(1)
            deep = self.mlp(e.reshape(ids.shape[0], SLOTS * DIM)).squeeze(1)
            return self.b0 + w1.sum(1) + fm + deep

    rates, cpu_rates = [], []
    for _ in range(a.reps):
        model = DeepFM()
        sparse = torch.optim.Adagrad(model.emb.parameters(), lr=0.05,
                                     initial_accumulator_value=0.1, eps=1e-8)
        dense = torch.optim.Adam([model.b0, *model.mlp.parameters()], lr=0.001)
        loss_fn = nn.BCEWithLogitsLoss()

        def train(bs):
            for ids, y in bs:
                sparse.zero_grad(set_to_none=True)
                dense.zero_grad(set_to_none=True)
                loss_fn(model(ids), y).backward()
                sparse.step()
                dense.step()

        train(batches(nb))  # warm-up, untimed
        timed = batches(nb)
        t0, c0 = time.perf_counter(), time.process_time()
        train(timed)
        sec, cpu = time.perf_counter() - t0, time.process_time() - c0
        rates.append(nb * a.batch / sec)
        cpu_rates.append(nb * a.batch / cpu)
        del model, sparse, dense
    rates.sort()
    cpu_rates.sort()
    print(json.dumps({
        "examples_per_s": rates[len(rates) // 2],
        "cpu_examples_per_s": cpu_rates[len(cpu_rates) // 2],
        "min": rates[0], "max": rates[-1], "reps": a.reps,
        "examples": nb * a.batch, "batch": a.batch, "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
