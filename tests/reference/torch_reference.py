#!/usr/bin/env python3
"""torch_reference.py - the model's C math against PyTorch, an independent implementation.

For each case (family, slots, dim, batch, hidden layers) it runs model_dump (tests/
reference/model_dump.c: the C model with random dense parameters and inputs), rebuilds the
model in PyTorch from the dumped parameters, in float64, from the model's definition in
model/include/mt/model.h, and compares. The families:
  - deepfm: b0 + first order + FM second order + MLP;
  - dcnv2: b0 + first order + MLP over the cross layers x_(c+1) = x_0 * (x_c W_c + b_c) + x_c,
    full or low rank;
  - mmoe: per task b0[t] + first order + tower_t(sum_k g_t[k] a_k), K relu experts a_k and a
    softmax gate g_t per task; the loss is the task-weighted sum of the tasks' losses;
  - din: b0 + first order but the sequence slot's + FM(x') + MLP(x'), x' the slots' cells with the
    sequence's L keys k_j replaced by v = sum_j a_j k_j, a_j = sigmoid([q, k_j, q - k_j,
    q * k_j] Wa + ba) wa + ba_out (q the query slot's cell; the weights not normalized).
    model_dump pads example i's sequence after i % (L + 1) ids with zeros: beside the
    definition's sum over all L positions, the check is repeated with v summed over the
    sequence's ids alone (padding masked), which must agree on everything but dE of the
    padded positions (their gradient is a_j dv in the one, 0 in the other); the dumped
    parameters' names and shapes are checked against model.h's table;
and every family the weighted mean log loss and the serving correction sigmoid(logit + log r).
Compared are:
  - forward_backward's probabilities and loss, mt_model_forward's and
    mt_model_forward_serving's probabilities,
  - the gradient of every dense parameter, of E and of W1 (PyTorch's autograd),
each element to 1e-4 relative, relative to max(|reference|, 1e-2 of the tensor's largest
magnitude): a weight gradient is a sum over the batch whose terms cancel, and float32
rounding alone leaves some small elements 1e-4 off (PyTorch's own float32 computation of
trainer_bench's shape is 1.4e-4 off float64 with a floor of 1e-3). Beside each case the
same comparison of PyTorch's float32 computation is printed, for calibration. Exit 0 when
every case agrees; 1 with the worst elements named otherwise. Without torch the test fails
with the reason (scripts/setup.sh installs Debian's python3-torch).

Usage: torch_reference.py MODEL_DUMP_BINARY
"""
import json
import subprocess
import sys

TOL = 1e-4
CASES = [  # model_dump's options (family and its settings), slots, dim, batch, seed, hidden
    ([], 3, 4, 8, 1, [16, 8]),
    ([], 5, 2, 16, 2, []),
    ([], 4, 3, 6, 3, [7]),
    ([], 2, 1, 1, 4, [3, 3, 3]),
    ([], 26, 16, 64, 5, [256, 128]),  # trainer_bench's shape
    (["-t", "dcnv2", "-c", "2"], 3, 4, 8, 6, [16, 8]),
    (["-t", "dcnv2", "-c", "3", "-r", "3"], 5, 2, 16, 7, []),
    (["-t", "dcnv2", "-c", "1"], 1, 3, 2, 8, [4]),
    (["-t", "dcnv2", "-c", "3"], 26, 16, 64, 9, [256, 128]),
    (["-t", "dcnv2", "-c", "2", "-r", "32"], 26, 16, 64, 10, [256, 128]),
    (["-t", "dcnv2", "-c", "2", "-D", "3,1,5,8"], 4, 4, 12, 11, [8]),  # per-slot dims
    (["-t", "dcnv2", "-c", "3", "-r", "4", "-D", "16,4,8"], 3, 8, 16, 12, []),
    (["-t", "mmoe", "-T", "2", "-K", "3", "-H", "8"], 4, 3, 12, 13, [6, 4]),
    (["-t", "mmoe", "-T", "3", "-K", "2", "-H", "5"], 3, 2, 8, 14, []),
    (["-t", "mmoe", "-T", "2", "-K", "4", "-H", "64"], 26, 16, 64, 15, [128, 64]),
    # din: -q sequence slot, -Q query slot, -L sequence length, -A attention width. Serving
    # varies the even slots and copies row 0's odd ones: a sequence in an odd slot is then
    # row 0's, empty, in every row (a user's sequence shared by the request's candidates).
    (["-t", "din", "-q", "2", "-Q", "0", "-L", "4", "-A", "5"], 4, 3, 12, 16, [8, 4]),  # middle
    (["-t", "din", "-q", "0", "-Q", "2", "-L", "3", "-A", "6"], 4, 4, 8, 17,
     []),  # first, no hidden layer (din takes one dim: its FM term)
    (["-t", "din", "-q", "2", "-Q", "1", "-L", "1", "-A", "1"], 3, 2, 4, 18,
     [3]),  # last, L = H = 1
    (["-t", "din", "-q", "1", "-Q", "0", "-L", "6", "-A", "4"], 2, 5, 14, 19,
     [4]),  # last, odd: serving's rows share row 0's (empty) sequence
    (["-t", "din", "-q", "6", "-Q", "3", "-L", "20", "-A", "32"], 26, 16, 64, 20,
     [256, 128]),  # trainer_bench's shape with a sequence of 20
]


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError as e:
        print(f"FAIL: PyTorch missing ({e}): bash scripts/setup.sh installs python3-torch",
              file=sys.stderr)
        return 1
    torch.set_num_threads(1)
    failed = 0
    for opts, slots, dim, n, seed, hidden in CASES:
        args = [sys.argv[1]] + opts + [str(slots), str(dim), str(n), str(seed)] + \
            [str(h) for h in hidden]
        run = subprocess.run(args, capture_output=True, text=True)
        if run.returncode != 0:
            print(f"FAIL: {' '.join(args)}: exit {run.returncode}: {run.stderr.strip()}")
            failed += 1
            continue
        failed += check_case(torch, json.loads(run.stdout))
    print(f"torch reference: {len(CASES) - failed} of {len(CASES)} cases agree "
          f"(torch {torch.__version__}, tolerance {TOL} relative)")
    return 1 if failed else 0


def slot_dims(d):
    """Each slot's embedding dim (-D's, or dim for every slot)."""
    return d["dims"] or [d["dim"]] * d["slots"]


def din_input(torch, d, params, E, counts=None):
    """din's MLP input x' [n x sum_s d_s]: E_i's cells, the sequence's L keys (a cell of
    L * d) replaced by v = sum_j a_j k_j, a_j = sigmoid([q, k_j, q - k_j, q * k_j] Wa + ba)
    wa + ba_out (model.h). counts: None sums over all L positions (the definition: a zero
    key adds nothing), else example i's v sums over its first counts[i] keys only."""
    n, dims, seq = d["n"], slot_dims(d), d["seq"]
    L, sq = seq["len"], seq["slot"]
    cells = list(torch.split(E.reshape(n, -1), [w * (L if s == sq else 1)
                                                 for s, w in enumerate(dims)], dim=1))
    q = cells[seq["query"]].unsqueeze(1).expand(-1, L, -1)  # [n x L x d]
    k = cells[sq].reshape(n, L, -1)
    u = torch.sigmoid(torch.cat([q, k, q - k, q * k], dim=2) @ params["att.w"] + params["att.b"])
    a = (u @ params["att.out.w"]).squeeze(2) + params["att.out.b"]  # [n x L]
    if counts is not None:
        a = a * (torch.arange(L).unsqueeze(0) < torch.tensor(counts).unsqueeze(1)).to(a.dtype)
    cells[sq] = (a.unsqueeze(2) * k).sum(1)
    return torch.cat(cells, dim=1)


def logits(torch, d, params, E, W1, counts=None):
    """deepfm: logit_i = b0 + sum_s W1[i,s] + FM(E_i) + MLP(E_i); dcnv2: b0 + sum_s W1[i,s]
    + MLP(x_C), x_C the cross layers' output over x_0 = E_i; din: b0 + sum_(s != seq) W1[i,s]
    + FM(x'_i) + MLP(x'_i) (din_input(); counts: its padding mask); mmoe: [n x T] (model.h)."""
    n, slots, dim = d["n"], d["slots"], d["dim"]
    x0 = E.reshape(n, -1)  # the slots' dims summed (dcnv2 takes per-slot dims)
    h, fm = x0, 0.0
    first = W1.reshape(n, slots)
    if d["model"] == "deepfm":
        e = E.reshape(n, slots, dim)
        s = e.sum(1)
        fm = 0.5 * (s * s - (e * e).sum(1)).sum(1)
    elif d["model"] == "dcnv2":
        for c in range(d["cross"]):
            if d["rank"]:
                z = (h @ params[f"cross.{c}.v"]) @ params[f"cross.{c}.u"]
            else:
                z = h @ params[f"cross.{c}.w"]
            h = x0 * (z + params[f"cross.{c}.b"]) + h
    elif d["model"] == "din":  # its sequence slot has no first-order weight
        h = din_input(torch, d, params, E, counts)
        first = first[:, [s for s in range(slots) if s != d["seq"]["slot"]]]
        e = h.reshape(n, slots, dim)  # x': S cells of the one dim
        s = e.sum(1)
        fm = 0.5 * (s * s - (e * e).sum(1)).sum(1)
    elif d["model"] == "mmoe":
        # K experts relu(x We + be), T softmax gates, f_t = sum_k g_t[k] a_k, a tower per task
        T, K = d["tasks"], params["gates.b"].shape[0] // d["tasks"]
        a = torch.relu(x0 @ params["experts.w"] + params["experts.b"]).reshape(n, K, -1)
        g = torch.softmax((x0 @ params["gates.w"] + params["gates.b"]).reshape(n, T, K), dim=2)
        out = []
        for t in range(T):
            h = (g[:, t, :].unsqueeze(2) * a).sum(1)
            layer = 0
            while f"tower.{t}.{layer}.w" in params:
                h = torch.relu(h @ params[f"tower.{t}.{layer}.w"] + params[f"tower.{t}.{layer}.b"])
                layer += 1
            out.append((h @ params[f"tower.{t}.out.w"]).squeeze(1) + params["b0"][t])
        return torch.stack(out, 1) + W1.reshape(n, slots).sum(1, keepdim=True)  # [n x T]
    else:
        raise ValueError(f"no reference for model {d['model']}")
    layer = 0
    while f"mlp.{layer}.w" in params:
        h = torch.relu(h @ params[f"mlp.{layer}.w"] + params[f"mlp.{layer}.b"])
        layer += 1
    deep = (h @ params["mlp.out.w"]).squeeze(1)
    return params["b0"] + first.sum(1) + fm + deep


def reference(torch, d, dtype, masked=False):
    """The computations model_dump made, by PyTorch in dtype: float64 tensors in the
    order of compared(). masked (din): v sums over each sequence's ids alone."""
    t = lambda v: torch.tensor(v, dtype=dtype)
    n, slots, dim = d["n"], d["slots"], d["dim"]
    params = {p["name"]: t(p["values"]).reshape(p["shape"]).requires_grad_() for p in d["params"]}
    E, W1 = t(d["E"]).requires_grad_(), t(d["W1"]).requires_grad_()
    y, w = t(d["labels"]), t(d["weights"])
    counts, serving_counts = seq_counts(d) if masked else (None, None)
    logit = logits(torch, d, params, E, W1, counts)
    if d["model"] == "mmoe":  # sum over tasks of the task's weight times its mean log loss
        T = d["tasks"]
        y = y.reshape(n, T)
        loss = sum(d["task_weights"][t] * torch.nn.functional.binary_cross_entropy_with_logits(
            logit[:, t], y[:, t], weight=w, reduction="sum") for t in range(T)) / n
    else:
        loss = (torch.nn.functional.binary_cross_entropy_with_logits(
            logit, y, weight=w, reduction="sum") / n)
    loss.backward()
    p = torch.sigmoid(logit).detach()
    sv = d["serving"]
    with torch.no_grad():
        ps = torch.sigmoid(logits(torch, d, params, t(sv["E"]), t(sv["W1"]), serving_counts)
                           + torch.log(t(sv["rate"])))
    out = [p, p, loss.detach().reshape(1), ps, E.grad, W1.grad]
    return [x.detach().reshape(-1).to(torch.float64) for x in out] + \
        [params[q["name"]].grad.reshape(-1).to(torch.float64) for q in d["params"]]


def seq_counts(d):
    """din: the ids of each example's sequence, model_dump's i % (L + 1), and of each serving
    row's (row 0's, 0, where the sequence slot does not vary)."""
    L, n = d["seq"]["len"], d["n"]
    counts = [i % (L + 1) for i in range(n)]
    return counts, counts if d["serving"]["varies"][d["seq"]["slot"]] else [0] * n


def seq_offset(d):
    """din: the sequence's cell's offset in a row of E (the cells before it are one dim each)."""
    return sum(slot_dims(d)[:d["seq"]["slot"]])


def padded(torch, d):
    """din: a bool over E's elements, True in the padded keys (those past a sequence's ids)."""
    n, dims, seq = d["n"], slot_dims(d), d["seq"]
    L, dq, off = seq["len"], dims[seq["query"]], seq_offset(d)
    pad = torch.zeros(n, sum(dims) + (L - 1) * dq, dtype=torch.bool)
    for i, c in enumerate(seq_counts(d)[0]):
        pad[i, off + c * dq:off + L * dq] = True
    return pad.reshape(-1)


def din_problems(torch, d):
    """What model_dump's din dump gets wrong against model.h and its own description: the
    parameters' names and shapes ("b0", "att.w" [4d, H], "att.b" [H], "att.out.w" [H, 1],
    "att.out.b" [1], the MLP over sum_s d_s = D - (L - 1) d), E's width and its padding
    (zero keys past each sequence's ids, none before)."""
    dims, seq, hidden = slot_dims(d), d["seq"], d["hidden"]
    dq, H = dims[seq["query"]], seq["width"]
    want = [("b0", [1]), ("att.w", [4 * dq, H]), ("att.b", [H]), ("att.out.w", [H, 1]),
            ("att.out.b", [1])]
    widths = [sum(dims)] + hidden
    for layer, h in enumerate(hidden):
        want += [(f"mlp.{layer}.w", [widths[layer], h]), (f"mlp.{layer}.b", [h])]
    want.append(("mlp.out.w", [widths[-1], 1]))
    got = [(p["name"], p["shape"]) for p in d["params"]]
    problems = [] if got == want else [f"parameters {got}, model.h's table {want}"]
    E = torch.tensor(d["E"], dtype=torch.float64)
    if E.numel() != d["n"] * (sum(dims) + (seq["len"] - 1) * dq):
        return problems + [f"E has {E.numel()} floats"]
    pad = padded(torch, d)
    if bool((E[pad] != 0).any()):
        problems.append("E: a padded key is not zero")
    L, off = seq["len"], seq_offset(d)
    keys = E.reshape(d["n"], -1)[:, off:off + L * dq].reshape(d["n"], L, dq)
    for i, c in enumerate(seq_counts(d)[0]):
        if c and bool((keys[i, :c] == 0).all(1).any()):
            problems.append(f"E: example {i}'s sequence has a zero key among its {c} ids")
    return problems


def compared(d):
    """What model_dump computed: [(what, values)]."""
    sv = d["serving"]
    out = [("probs", d["probs"]), ("forward", d["forward"]), ("loss", [d["loss"]]),
           ("serving probs", sv["probs"]), ("dE", d["dE"]), ("dW1", d["dW1"])]
    return out + [(f"grad {q['name']}", q["grads"]) for q in d["params"]]


def relative(torch, got, ref):
    floor = max(float(ref.abs().max()) * 1e-2, 1e-30)
    return (got - ref).abs() / torch.clamp(ref.abs(), min=floor)


def check_case(torch, d):
    name = d["model"]
    if d["model"] == "dcnv2":
        name += f" ({d['cross']} cross layers, " + \
            (f"rank {d['rank']})" if d["rank"] else "full rank)")
    if d["model"] == "mmoe":
        name += f" ({d['tasks']} tasks weighted {d['task_weights']})"
    if d["model"] == "din":
        seq = d["seq"]
        name += f" (sequence slot {seq['slot']} of length {seq['len']}, query slot " \
            f"{seq['query']}, attention width {seq['width']})"
    name += f" slots {d['slots']} dim {d['dim']} batch {d['n']} hidden {d['hidden']}"
    if d.get("dims"):
        name += f" slot dims {d['dims']}"
    bad = din_problems(torch, d) if d["model"] == "din" else []
    if bad:  # the dump is not what the reference reads: no comparison
        print(f"FAIL: {name}: the dump")
        for b in bad:
            print(f"  {b}")
        return 1
    ref, ref32 = reference(torch, d, torch.float64), reference(torch, d, torch.float32)
    worst, worst32 = 0.0, 0.0
    for (what, c_vals), r, r32 in zip(compared(d), ref, ref32):
        c_vals = torch.tensor(c_vals, dtype=torch.float64)
        rel = relative(torch, c_vals, r)
        j = int(rel.argmax())
        worst = max(worst, float(rel[j]))
        worst32 = max(worst32, float(relative(torch, r32, r).max()))
        if float(rel[j]) > TOL:
            bad.append(f"{what}[{j}]: C {float(c_vals[j]):.9g}, torch {float(r[j]):.9g} "
                       f"(relative {float(rel[j]):.2e})")
    extra = ""
    if d["model"] == "din":  # again with the padding masked: dE but in the padded keys
        keep, worst_m = ~padded(torch, d), 0.0
        for (what, c_vals), r in zip(compared(d), reference(torch, d, torch.float64, True)):
            c_vals = torch.tensor(c_vals, dtype=torch.float64)
            if what == "dE":
                c_vals, r = c_vals[keep], r[keep]
            rel = relative(torch, c_vals, r)
            j = int(rel.argmax())
            worst_m = max(worst_m, float(rel[j]))
            if float(rel[j]) > TOL:
                bad.append(f"{what}[{j}{' unpadded' if what == 'dE' else ''}] (padding "
                           f"masked): C {float(c_vals[j]):.9g}, torch {float(r[j]):.9g} "
                           f"(relative {float(rel[j]):.2e})")
        extra = f"; padding masked {worst_m:.2e}"
    status = "FAIL" if bad else "ok"
    print(f"{status}: {name}: worst relative difference {worst:.2e} over {len(ref)} tensors"
          f"{extra} (PyTorch's own float32: {worst32:.2e})")
    for b in bad:
        print(f"  {b}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
