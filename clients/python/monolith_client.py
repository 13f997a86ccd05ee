#!/usr/bin/python3
"""monolith_client.py - an example client of a Monolith-C serving replica in Python.

It calls monolith.v1.Serving/Predict and /Lookup with the stubs that the build generates from
proto/ (protoc with gRPC's Python plugin: build/<flavour>/python), over Debian's
python3-grpcio. Nothing about the wire is written by hand here.

    monolith_client.py --addr HOST:PORT predict --user FID[,FID...] \\
        --candidate ITEM=FID[,FID...] [--candidate ...] [--request-id ID]
    monolith_client.py --addr HOST:PORT lookup FID [FID...]

A FID is SLOT:VALUE (VALUE < 2^48) or a 64-bit number (decimal or 0x hex), as for the
`monolith` tool. predict prints {"scores": [...], "sparse_version": N, "dense_version": N},
and for a multi-task model (T > 1 tasks) each candidate's T scores too, after the scores
(task 0's): {"scores": [...], "task_scores": [[t0, t1, ...], ...], "tasks": T, ...}; lookup
prints one {"fid", "slot", "value", "found", "embedding"} object per line. Exit status:
0 success, 1 the call failed (its gRPC status and message on stderr), 2 bad usage.

--stubs DIR (or MONOLITH_PY_STUBS) names the generated stubs' folder; by default the release
build's, beside this repository's checkout.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_STUBS = os.path.join(HERE, "..", "..", "build", "release", "python")

FID_VALUE_BITS = 48


def parse_fid(text):
    """SLOT:VALUE or a 64-bit number -> the fid (slot << 48 | value)."""
    if ":" in text:
        slot, value = text.split(":", 1)
        slot, value = int(slot, 10), int(value, 10)
        if not 0 <= slot <= 0xFFFF or not 0 <= value < (1 << FID_VALUE_BITS):
            raise ValueError(text)
        return (slot << FID_VALUE_BITS) | value
    fid = int(text, 0)
    if not 0 <= fid < (1 << 64):
        raise ValueError(text)
    return fid


def slot_of(fid):
    return fid >> FID_VALUE_BITS


class Client:
    """A channel to one serving replica and its two calls."""

    def __init__(self, addr, stubs=None, timeout_s=10.0):
        stubs = stubs or os.environ.get("MONOLITH_PY_STUBS") or DEFAULT_STUBS
        if not os.path.isfile(os.path.join(stubs, "monolith", "v1", "serving_pb2.py")):
            raise FileNotFoundError(
                "no generated stubs in %s: build the project (scripts/build.sh release), "
                "or pass --stubs" % stubs)
        if stubs not in sys.path:
            sys.path.insert(0, stubs)
        import grpc  # Debian: python3-grpcio
        from monolith.v1 import example_pb2, ps_pb2, serving_pb2, serving_pb2_grpc

        self.grpc = grpc
        self.example_pb2, self.ps_pb2, self.serving_pb2 = example_pb2, ps_pb2, serving_pb2
        self.timeout_s = timeout_s
        self.channel = grpc.insecure_channel(addr)
        self.stub = serving_pb2_grpc.ServingStub(self.channel)

    def close(self):
        self.channel.close()

    def _slot_fids(self, fids):
        """fids grouped by slot, in the order each slot first appears."""
        order, by_slot = [], {}
        for fid in fids:
            s = slot_of(fid)
            if s not in by_slot:
                by_slot[s] = []
                order.append(s)
            by_slot[s].append(fid)
        return [self.example_pb2.SlotFids(slot=s, fids=by_slot[s]) for s in order]

    def predict_response(self, user_fids, candidates, request_id=""):
        """candidates: [(item_id, [fid, ...]), ...] -> the PredictResponse."""
        req = self.serving_pb2.PredictRequest(
            request_id=request_id,
            user=self._slot_fids(user_fids),
            candidates=[self.serving_pb2.Candidate(item_id=item, item=self._slot_fids(fids))
                        for item, fids in candidates])
        return self.stub.Predict(req, timeout=self.timeout_s)

    def predict(self, user_fids, candidates, request_id=""):
        """candidates: [(item_id, [fid, ...]), ...] -> (scores, sparse_version, dense_version)."""
        resp = self.predict_response(user_fids, candidates, request_id)
        return list(resp.scores), resp.sparse_version, resp.dense_version

    @staticmethod
    def task_scores(resp):
        """A multi-task model's scores, one list of T per candidate ([n x T] on the wire,
        candidate-major); None for a one-task model (tasks 0, task_scores empty)."""
        t, flat = resp.tasks, list(resp.task_scores)
        if t <= 1:
            return None
        if len(flat) != len(resp.scores) * t:
            raise ValueError("malformed PredictResponse: %d task scores for %d candidates of "
                             "%d tasks" % (len(flat), len(resp.scores), t))
        return [flat[i * t:(i + 1) * t] for i in range(len(resp.scores))]

    def lookup(self, fids):
        """-> (found flags, embeddings: one list of floats per fid). The answer packs the
        embeddings without their widths, so the ids go in one call per slot (one width)."""
        found, embs = [False] * len(fids), [None] * len(fids)
        by_slot = {}
        for i, fid in enumerate(fids):
            by_slot.setdefault(slot_of(fid), []).append(i)
        for idx in by_slot.values():
            ids = [fids[i] for i in idx]
            resp = self.stub.Lookup(self.ps_pb2.LookupRequest(fids=ids, train=False),
                                    timeout=self.timeout_s)
            values = list(resp.values)
            if len(resp.found) != len(ids) or len(values) % len(ids):
                raise ValueError("malformed LookupResponse: %d found flags and %d values for "
                                 "%d ids" % (len(resp.found), len(values), len(ids)))
            dim = len(values) // len(ids)
            for k, i in enumerate(idx):
                found[i] = bool(resp.found[k])
                embs[i] = values[k * dim:(k + 1) * dim]
        return found, embs


def main(argv=None):
    ap = argparse.ArgumentParser(description="a Python client of monolith-serving")
    ap.add_argument("--addr", required=True, help="HOST:PORT of a serving replica")
    ap.add_argument("--stubs", help="the generated stubs' folder (build/<flavour>/python)")
    ap.add_argument("--timeout-s", type=float, default=10.0)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("predict")
    p.add_argument("--user", required=True, help="FID[,FID...]")
    p.add_argument("--candidate", action="append", required=True, help="ITEM=FID[,FID...]")
    p.add_argument("--request-id", default="")
    lk = sub.add_parser("lookup")
    lk.add_argument("fid", nargs="+")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "predict":
            user = [parse_fid(f) for f in args.user.split(",")]
            cands = []
            for c in args.candidate:
                item, _, fids = c.partition("=")
                if not fids:
                    raise ValueError(c)
                cands.append((int(item, 10), [parse_fid(f) for f in fids.split(",")]))
        else:
            fids = [parse_fid(f) for f in args.fid]
    except ValueError as e:
        print("monolith_client: not a fid or candidate: %s" % e, file=sys.stderr)
        return 2
    try:
        client = Client(args.addr, args.stubs, args.timeout_s)
    except (FileNotFoundError, ImportError) as e:
        print("monolith_client: %s" % e, file=sys.stderr)
        return 2
    try:
        if args.cmd == "predict":
            resp = client.predict_response(user, cands, args.request_id)
            out = {"scores": list(resp.scores)}
            tasks = client.task_scores(resp)
            if tasks is not None:
                out["task_scores"], out["tasks"] = tasks, resp.tasks
            out["sparse_version"], out["dense_version"] = resp.sparse_version, resp.dense_version
            print(json.dumps(out))
        else:
            found, embs = client.lookup(fids)
            for fid, f, e in zip(fids, found, embs):
                print(json.dumps({"fid": "0x%016x" % fid, "slot": slot_of(fid),
                                  "value": fid & ((1 << FID_VALUE_BITS) - 1),
                                  "found": bool(f), "embedding": e}))
    except client.grpc.RpcError as e:
        print("monolith_client: %s: %s: %s" % (args.cmd, e.code().name, e.details()),
              file=sys.stderr)
        return 1
    except ValueError as e:
        print("monolith_client: %s: %s" % (args.cmd, e), file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
