#!/usr/bin/env python
"""Choose an ANN library for the semantic-cache vector index, by measurement.

Workload modelled: 384-dim L2-normalised float32 embeddings (all-MiniLM-L6-v2
shape), inner-product (== cosine) metric, the index grows ONE insert at a time
(a cache), queries are single vectors, top-k = 4, and the cache-hit decision is
taken on the top-1 score.

Candidates: numpy exact, faiss IndexFlatIP (exact), faiss IndexHNSWFlat,
hnswlib, usearch (f32 / f16 / i8).  Everything runs on ONE thread.

Usage:  python docs/records/2026-11-29-ann-choice.py [--sizes 1000,10000,100000] [--queries 1000]
        (needs: pip install usearch faiss-cpu hnswlib — not dependencies of continuum)
Writes docs/results/ann-choice.json and docs/results/ann-choice.txt.
"""

from __future__ import annotations

import os

# one thread everywhere, set before numpy / faiss load their thread pools
for _v in (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
):
    os.environ[_v] = "1"

import argparse
import importlib.metadata as md
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import faiss
import hnswlib
import numpy as np
from usearch.index import Index as UIndex

try:
    from threadpoolctl import threadpool_info, threadpool_limits
except ImportError:  # pragma: no cover
    threadpool_limits = None
    threadpool_info = None

faiss.omp_set_num_threads(1)

DIM = 384
K = 4
SEED = 20240607
M_CONN = 16  # HNSW graph degree (M / connectivity) for every HNSW candidate
EF_CONSTRUCTION = 128
EF_SEARCH = 64
HIT_THRESHOLD = 0.85  # illustrative cache-hit threshold for the decision-agreement metric
ONE_AT_A_TIME_CAP_S = 240.0  # if a one-at-a-time build exceeds this, the rest goes in as a batch

REPO = Path(__file__).resolve().parents[1]
OUT_DIR = REPO / "docs" / "results"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- data


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def make_data(n: int, n_queries: int, seed: int):
    """Clustered, anisotropic-ish data on the unit sphere.

    Two levels: 50 "topics", up to 2,000 "intents" (cluster centres) around the topics
    (centre-centre cosine within a topic ~0.4), points = centre + gaussian noise whose
    per-point scale varies, so that a stored point's nearest-neighbour cosine is spread
    over roughly 0.6-0.95.  The number of centres is min(2000, n // 10) so that small
    indexes are not all singletons (N=1k: 100 centres, 10k: 1000, 100k: 2000).
    Queries: half near-duplicates of random stored points (cosine ~0.9 to that point),
    half fresh points from the same generator.
    """
    rng = np.random.default_rng(seed + n)
    n_topics = 50
    n_centers = min(2000, max(n // 10, 50))
    topics = _unit(rng.standard_normal((n_topics, DIM)))
    c_topic = rng.integers(0, n_topics, n_centers)
    centers = _unit(topics[c_topic] + 1.2 * rng.standard_normal((n_centers, DIM)) / np.sqrt(DIM))

    def points(m: int) -> np.ndarray:
        c = rng.integers(0, n_centers, m)
        scale = rng.uniform(0.35, 0.9, m)[:, None]
        return _unit(centers[c] + scale * rng.standard_normal((m, DIM)) / np.sqrt(DIM))

    X = points(n)
    n_dup = n_queries // 2
    src = rng.integers(0, n, n_dup)
    # noise norm s gives cos ~ 1/sqrt(1+s^2); s=0.484 -> ~0.9
    dup = _unit(X[src] + 0.484 * rng.standard_normal((n_dup, DIM)) / np.sqrt(DIM))
    fresh = points(n_queries - n_dup)
    Q = np.concatenate([dup, fresh]).astype(np.float32)
    is_dup = np.zeros(n_queries, bool)
    is_dup[:n_dup] = True
    return np.ascontiguousarray(X), np.ascontiguousarray(Q), is_dup, n_centers


def exact_topk(X: np.ndarray, Q: np.ndarray, k: int):
    """Ground truth in float64 (row ids and similarities), chunked."""
    ids = np.empty((len(Q), k), np.int64)
    sims = np.empty((len(Q), k), np.float64)
    Xd = X.astype(np.float64)
    for s in range(0, len(Q), 250):
        S = Q[s : s + 250].astype(np.float64) @ Xd.T
        part = np.argpartition(-S, k - 1, axis=1)[:, :k]
        ps = np.take_along_axis(S, part, 1)
        o = np.argsort(-ps, axis=1)
        ids[s : s + 250] = np.take_along_axis(part, o, 1)
        sims[s : s + 250] = np.take_along_axis(ps, o, 1)
    return ids, sims


def nn_cos_stats(X: np.ndarray, sample: int = 1000, seed: int = 0):
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(X), min(sample, len(X)), replace=False)
    S = X[idx] @ X.T
    S[np.arange(len(idx)), idx] = -np.inf
    nn = S.max(1)
    return {f"p{p}": round(float(np.percentile(nn, p)), 3) for p in (10, 50, 90)}


# --------------------------------------------------------------------------- candidates
# Each candidate: add(key, vec) one at a time, add_batch(keys, X), search(q) -> (ids, sims),
# memory_bytes(), save(dir) -> path, load(path) -> new candidate, remove(key) -> note str.


class NumpyExact:
    name = "numpy-exact"
    params = "matrix @ q + argpartition; capacity doubling buffer"

    def __init__(self):
        self.buf = np.empty((1024, DIM), np.float32)
        self.keys = np.empty(1024, np.int64)
        self.n = 0

    def _grow(self, need):
        if need > len(self.buf):
            cap = max(need, 2 * len(self.buf))
            nb = np.empty((cap, DIM), np.float32)
            nb[: self.n] = self.buf[: self.n]
            nk = np.empty(cap, np.int64)
            nk[: self.n] = self.keys[: self.n]
            self.buf, self.keys = nb, nk

    def add(self, key, v):
        self._grow(self.n + 1)
        self.buf[self.n] = v
        self.keys[self.n] = key
        self.n += 1

    def add_batch(self, keys, X):
        self._grow(self.n + len(X))
        self.buf[self.n : self.n + len(X)] = X
        self.keys[self.n : self.n + len(X)] = keys
        self.n += len(X)

    def search(self, q):
        s = self.buf[: self.n] @ q
        if self.n > K:
            part = np.argpartition(s, self.n - K)[self.n - K :]
        else:
            part = np.arange(self.n)
        o = part[np.argsort(-s[part])]
        return self.keys[o], s[o]

    def memory_bytes(self):
        return int(self.n * (DIM * 4 + 8))  # used rows (buffer capacity may be up to 2x)

    def save(self, d):
        p = os.path.join(d, "np.npz")
        np.savez(p, X=self.buf[: self.n], keys=self.keys[: self.n])
        return p

    def load(self, p):
        z = np.load(p)
        c = NumpyExact()
        c.add_batch(z["keys"], z["X"])
        return c

    def remove(self, key):
        i = int(np.flatnonzero(self.keys[: self.n] == key)[0])
        last = self.n - 1
        self.buf[i] = self.buf[last]
        self.keys[i] = self.keys[last]
        self.n -= 1
        return "yes (swap-with-last, user code)"


class FaissFlat:
    name = "faiss-FlatIP"
    params = "IndexIDMap(IndexFlatIP), exact"

    def __init__(self, index=None):
        self.ix = index if index is not None else faiss.IndexIDMap(faiss.IndexFlatIP(DIM))

    def add(self, key, v):
        self.ix.add_with_ids(v[None, :], np.array([key], np.int64))

    def add_batch(self, keys, X):
        self.ix.add_with_ids(X, np.asarray(keys, np.int64))

    def search(self, q):
        D, I = self.ix.search(q[None, :], K)
        return I[0], D[0]

    def memory_bytes(self):
        return len(faiss.serialize_index(self.ix))

    def save(self, d):
        p = os.path.join(d, "flat.faiss")
        faiss.write_index(self.ix, p)
        return p

    def load(self, p):
        return FaissFlat(faiss.read_index(p))

    def remove(self, key):
        self.ix.remove_ids(np.array([key], np.int64))
        return "yes (remove_ids, O(N) compaction)"


class FaissHNSW:
    name = "faiss-HNSWFlat"
    params = f"M={M_CONN} efC={EF_CONSTRUCTION} efS={EF_SEARCH} METRIC_INNER_PRODUCT"

    def __init__(self, index=None):
        if index is None:
            index = faiss.IndexHNSWFlat(DIM, M_CONN, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = EF_CONSTRUCTION
        index.hnsw.efSearch = EF_SEARCH
        self.ix = index

    def set_ef(self, ef):
        self.ix.hnsw.efSearch = ef

    def add(self, key, v):  # faiss HNSW has sequential ids only; key == position
        self.ix.add(v[None, :])

    def add_batch(self, keys, X):
        self.ix.add(X)

    def search(self, q):
        D, I = self.ix.search(q[None, :], K)
        return I[0], D[0]

    def memory_bytes(self):
        return len(faiss.serialize_index(self.ix))

    def save(self, d):
        p = os.path.join(d, "hnsw.faiss")
        faiss.write_index(self.ix, p)
        return p

    def load(self, p):
        return FaissHNSW(faiss.read_index(p))

    def remove(self, key):
        try:
            self.ix.remove_ids(np.array([key], np.int64))
        except RuntimeError as e:
            msg = (
                "not implemented"
                if "not implemented" in str(e)
                else str(e).strip().splitlines()[-1][:60]
            )
            return f"no (remove_ids: {msg})"
        return "yes"


class Hnswlib:
    def __init__(self, index=None, M=M_CONN):
        self.M = M
        self.name = "hnswlib" if M == M_CONN else f"hnswlib-M{M}"
        self.params = f"space=ip M={M} efC={EF_CONSTRUCTION} ef={EF_SEARCH}; resize_index x2"
        if index is None:
            index = hnswlib.Index(space="ip", dim=DIM)
            index.init_index(
                max_elements=1024,
                ef_construction=EF_CONSTRUCTION,
                M=M,
                random_seed=SEED,
                allow_replace_deleted=True,
            )
        index.set_ef(EF_SEARCH)  # ef is not persisted by save_index
        index.set_num_threads(1)
        self.ix = index

    def _grow(self, need):
        cap = self.ix.get_max_elements()
        if need > cap:
            self.ix.resize_index(max(need, 2 * cap))

    def set_ef(self, ef):
        self.ix.set_ef(ef)

    def add(self, key, v):
        self._grow(self.ix.get_current_count() + 1)
        self.ix.add_items(v[None, :], [key], num_threads=1)

    def add_batch(self, keys, X):
        self._grow(self.ix.get_current_count() + len(X))
        self.ix.add_items(X, keys, num_threads=1)

    def search(self, q):
        L, D = self.ix.knn_query(q, k=K, num_threads=1)
        return L[0].astype(np.int64), 1.0 - D[0]

    def memory_bytes(self):
        with tempfile.TemporaryDirectory() as d:
            return os.path.getsize(self.save(d))

    def save(self, d):
        p = os.path.join(d, "hnswlib.bin")
        self.ix.save_index(p)
        return p

    def load(self, p):
        ix = hnswlib.Index(space="ip", dim=DIM)
        ix.load_index(p, max_elements=self.ix.get_max_elements(), allow_replace_deleted=True)
        return Hnswlib(ix, self.M)

    def remove(self, key):
        self.ix.mark_deleted(key)
        return "soft (mark_deleted; slot reused via replace_deleted)"


class USearch:
    name = "usearch"

    def __init__(self, dtype="f32", index=None):
        self.dtype = dtype
        # i8 quantisation is only scaled correctly for the 'cos' metric (with 'ip' it
        # returns raw integer dot products); for unit vectors cos == ip anyway.
        self.metric = "cos" if dtype == "i8" else "ip"
        self.name = f"usearch-{dtype}"
        self.params = (
            f"metric={self.metric} connectivity={M_CONN} expansion_add={EF_CONSTRUCTION} "
            f"expansion_search={EF_SEARCH}"
        )
        self.ix = (
            index
            if index is not None
            else UIndex(
                ndim=DIM,
                metric=self.metric,
                dtype=dtype,
                connectivity=M_CONN,
                expansion_add=EF_CONSTRUCTION,
                expansion_search=EF_SEARCH,
            )
        )

    def set_ef(self, ef):
        self.ix.expansion_search = ef

    def add(self, key, v):
        self.ix.add(key, v, threads=1)

    def add_batch(self, keys, X):
        self.ix.add(np.asarray(keys, np.uint64), X, threads=1)

    def search(self, q):
        m = self.ix.search(q, K, threads=1)
        return m.keys.astype(np.int64), 1.0 - m.distances

    def memory_bytes(self):
        return int(self.ix.memory_usage)

    def save(self, d):
        p = os.path.join(d, f"usearch-{self.dtype}.usearch")
        self.ix.save(p)
        return p

    def load(self, p):
        return USearch(self.dtype, UIndex.restore(p))

    def remove(self, key):
        self.ix.remove(key)
        return "yes (remove; node tombstoned, compact optional)"


def candidates(n):
    extra = [("hnswlib-M32", lambda: Hnswlib(M=32))] if n >= 100000 else []
    return extra + [
        ("numpy-exact", NumpyExact),
        ("faiss-FlatIP", FaissFlat),
        ("faiss-HNSWFlat", FaissHNSW),
        ("hnswlib", Hnswlib),
        ("usearch-f32", lambda: USearch("f32")),
        ("usearch-f16", lambda: USearch("f16")),
        ("usearch-i8", lambda: USearch("i8")),
    ]


# --------------------------------------------------------------------------- measurement


def run_queries(c, Q):
    n = len(Q)
    ids = np.full((n, K), -1, np.int64)
    sims = np.full((n, K), np.nan)
    lat = np.empty(n)
    pc = time.perf_counter_ns
    for i in range(n):
        q = Q[i]
        t0 = pc()
        I, S = c.search(q)
        lat[i] = (pc() - t0) / 1e3
        m = min(K, len(I))
        ids[i, :m] = I[:m]
        sims[i, :m] = S[:m]
    return ids, sims, lat


def build_one_at_a_time(c, X, cap_s):
    t0 = time.perf_counter()
    n = len(X)
    step = max(n // 10, 1000)
    done = n
    for i in range(n):
        c.add(i, X[i])
        if (i + 1) % step == 0:
            el = time.perf_counter() - t0
            log(f"      {c.name}: {i + 1}/{n} inserted, {el:.1f}s")
            if el > cap_s and i + 1 < n:
                done = i + 1
                break
    t_one = time.perf_counter() - t0
    info = {"build_one_at_a_time_s": round(t_one, 3), "one_at_a_time_inserted": done}
    if done < n:
        t1 = time.perf_counter()
        c.add_batch(np.arange(done, n), X[done:])
        info["rest_batch_added_s"] = round(time.perf_counter() - t1, 3)
        info["note"] = (
            f"one-at-a-time capped at {cap_s:.0f}s after {done} inserts; "
            f"remaining {n - done} added as a batch"
        )
    info["insert_us_mean"] = round(t_one / done * 1e6, 2)
    return info


def accuracy(ids, sims, lat, is_dup, gt_ids, gt_sims):
    top1 = ids[:, 0] == gt_ids[:, 0]
    return {
        "p50_us": round(float(np.percentile(lat, 50)), 1),
        "p99_us": round(float(np.percentile(lat, 99)), 1),
        "recall@1": round(float(top1.mean()), 4),
        "recall@1_dup": round(float(top1[is_dup].mean()), 4),
        "hit_decision_mismatch": int(
            ((sims[:, 0] >= HIT_THRESHOLD) != (gt_sims[:, 0] >= HIT_THRESHOLD)).sum()
        ),
    }


def measure(name, factory, X, Q, is_dup, gt_ids, gt_sims, batch_compare, ef_sweep=()):
    n = len(X)
    log(f"   [{name}] building N={n} one at a time ...")
    c = factory()
    info = {"name": name, "params": c.params}
    info.update(build_one_at_a_time(c, X, ONE_AT_A_TIME_CAP_S))

    if batch_compare:
        c2 = factory()
        t0 = time.perf_counter()
        c2.add_batch(np.arange(n), X)
        info["build_batch_s"] = round(time.perf_counter() - t0, 3)
        del c2

    ids, sims, lat = run_queries(c, Q)
    # warm-up effects: report on the full run (1000 queries), after one warm-up pass
    ids, sims, lat = run_queries(c, Q)
    info["p50_us"] = round(float(np.percentile(lat, 50)), 1)
    info["p99_us"] = round(float(np.percentile(lat, 99)), 1)
    info["mean_us"] = round(float(lat.mean()), 1)

    top1 = ids[:, 0] == gt_ids[:, 0]
    info["recall@1"] = round(float(top1.mean()), 4)
    info["recall@4"] = round(
        float(np.mean([len(set(a) & set(b)) / K for a, b in zip(ids, gt_ids)])), 4
    )
    info["recall@1_dup"] = round(float(top1[is_dup].mean()), 4)
    info["recall@1_fresh"] = round(float(top1[~is_dup].mean()), 4)
    err = np.abs(sims[:, 0] - gt_sims[:, 0])
    info["top1_score_equal_dup"] = round(float((err[is_dup] <= 1e-5).mean()), 4)
    info["top1_score_maxerr_dup"] = float(f"{err[is_dup].max():.3g}")
    info["top1_score_maxerr_all"] = float(f"{err.max():.3g}")
    hit = sims[:, 0] >= HIT_THRESHOLD
    hit_gt = gt_sims[:, 0] >= HIT_THRESHOLD
    info["hit_decision_mismatch"] = int((hit != hit_gt).sum())
    info["memory_bytes"] = c.memory_bytes()

    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        p = c.save(d)
        info["save_s"] = round(time.perf_counter() - t0, 4)
        info["file_bytes"] = os.path.getsize(p)
        t0 = time.perf_counter()
        c3 = c.load(p)
        info["load_s"] = round(time.perf_counter() - t0, 4)
        ids3, sims3, _ = run_queries(c3, Q)
        info["load_identical"] = bool(np.array_equal(ids3, ids) and np.array_equal(sims3, sims))
        del c3

    if ef_sweep and hasattr(c, "set_ef"):
        info["ef_sweep"] = {}
        for ef in ef_sweep:
            c.set_ef(ef)
            run_queries(c, Q[:100])
            info["ef_sweep"][ef] = accuracy(*run_queries(c, Q), is_dup, gt_ids, gt_sims)
            log(f"   [{name}] ef={ef}: {info['ef_sweep'][ef]}")
        c.set_ef(EF_SEARCH)

    # removal: remove the exact top-1 of query 0 and check it no longer comes back
    victim = int(gt_ids[0, 0])
    try:
        note = c.remove(victim)
        if note.startswith("no"):
            info["removal"] = note
        else:
            I, _ = c.search(Q[0])
            info["removal"] = (
                note if victim not in set(I.tolist()) else note + " BUT still returned"
            )
    except Exception as e:
        info["removal"] = f"no ({type(e).__name__}: {str(e)[:60]})"
    log(
        f"   [{name}] build {info['build_one_at_a_time_s']}s p50 {info['p50_us']}us "
        f"p99 {info['p99_us']}us r@1 {info['recall@1']} r@4 {info['recall@4']}"
    )
    return info


def exact_latency_sweep(sizes, n_queries, seed):
    """p50 latency of the two exact candidates at intermediate N (crossover search)."""
    X, Q, _, _ = make_data(max(sizes), n_queries, seed)
    out = []
    for n in sizes:
        row = {"N": n}
        for name, factory in (("numpy-exact", NumpyExact), ("faiss-FlatIP", FaissFlat)):
            c = factory()
            c.add_batch(np.arange(n), X[:n])
            run_queries(c, Q[:50])
            _, _, lat = run_queries(c, Q)
            row[name + "_p50_us"] = round(float(np.percentile(lat, 50)), 1)
            row[name + "_p99_us"] = round(float(np.percentile(lat, 99)), 1)
        log(f"   exact sweep N={n}: {row}")
        out.append(row)
    return out


# --------------------------------------------------------------------------- report


def machine_info():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    fl = set(line.split(":", 1)[1].split())
                    flags = " ".join(
                        x
                        for x in (
                            "avx2",
                            "fma",
                            "avx512f",
                            "avx512bw",
                            "avx512_vnni",
                            "avx512_bf16",
                            "avx512_fp16",
                        )
                        if x in fl
                    )
                    break
    except OSError:
        pass
    vers = {}
    for p in ("numpy", "faiss-cpu", "hnswlib", "usearch"):
        try:
            vers[p] = md.version(p)
        except md.PackageNotFoundError:
            vers[p] = "?"
    blas = []
    if threadpool_info is not None:
        blas = [f"{d.get('internal_api')}:{d.get('num_threads')}" for d in threadpool_info()]
    try:
        accel = {
            dt: UIndex(
                ndim=DIM, metric="cos" if dt == "i8" else "ip", dtype=dt
            ).hardware_acceleration
            for dt in ("f32", "f16", "i8")
        }
    except Exception:
        accel = {}
    return {
        "cpu": cpu,
        "usearch_simd": accel,
        "cpu_flags": flags,
        "logical_cpus": os.cpu_count(),
        "threads_used": 1,
        "python": platform.python_version(),
        "versions": vers,
        "threadpools": blas,
    }


def fmt_bytes(b):
    for u in ("B", "KB", "MB", "GB"):
        if b < 1024 or u == "GB":
            return f"{b:.0f}{u}" if u == "B" else f"{b:.1f}{u}"
        b /= 1024


COLS = [
    ("candidate", lambda r: r["name"], "<"),
    (
        "build1x1 s",
        lambda r: f"{r['build_one_at_a_time_s']:.2f}" + ("*" if "note" in r else ""),
        ">",
    ),
    ("ins us", lambda r: f"{r['insert_us_mean']:.0f}", ">"),
    ("batch s", lambda r: f"{r['build_batch_s']:.2f}" if "build_batch_s" in r else "-", ">"),
    ("p50 us", lambda r: f"{r['p50_us']:.0f}", ">"),
    ("p99 us", lambda r: f"{r['p99_us']:.0f}", ">"),
    ("R@1", lambda r: f"{r['recall@1']:.3f}", ">"),
    ("R@4", lambda r: f"{r['recall@4']:.3f}", ">"),
    ("R@1dup", lambda r: f"{r['recall@1_dup']:.3f}", ">"),
    ("top1=exact(dup)", lambda r: f"{r['top1_score_equal_dup']:.3f}", ">"),
    ("maxerr", lambda r: f"{r['top1_score_maxerr_all']:.1e}", ">"),
    ("hitΔ", lambda r: str(r["hit_decision_mismatch"]), ">"),
    ("mem", lambda r: fmt_bytes(r["memory_bytes"]), ">"),
    ("file", lambda r: fmt_bytes(r["file_bytes"]), ">"),
    ("save ms", lambda r: f"{r['save_s'] * 1e3:.1f}", ">"),
    ("load ms", lambda r: f"{r['load_s'] * 1e3:.1f}", ">"),
    ("load==", lambda r: "yes" if r["load_identical"] else "NO", ">"),
    ("remove", lambda r: r["removal"].split(" ")[0], "<"),
]


def table(rows):
    cells = [[f(r) for _, f, _ in COLS] for r in rows]
    w = [max(len(h), *(len(c[i]) for c in cells)) for i, (h, _, _) in enumerate(COLS)]

    def line(vals):
        return "  ".join(
            v.ljust(w[i]) if COLS[i][2] == "<" else v.rjust(w[i]) for i, v in enumerate(vals)
        )

    out = [line([h for h, _, _ in COLS]), line(["-" * x for x in w])]
    out += [line(c) for c in cells]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument(
        "--sweep",
        default="2000,5000,20000,30000,50000,70000,100000",
        help="intermediate N for the exact-latency crossover sweep ('' to skip)",
    )
    ap.add_argument("--out", default=str(OUT_DIR))
    ap.add_argument(
        "--batch-compare-min-n",
        type=int,
        default=100000,
        help="also time a single batch add at N >= this",
    )
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]

    if threadpool_limits is not None:
        threadpool_limits(1)
    mach = machine_info()
    log(f"machine: {mach}")
    t_start = time.perf_counter()
    results = {
        "machine": mach,
        "seed": SEED,
        "dim": DIM,
        "k": K,
        "queries": args.queries,
        "hnsw_params": {"M": M_CONN, "ef_construction": EF_CONSTRUCTION, "ef_search": EF_SEARCH},
        "hit_threshold": HIT_THRESHOLD,
        "one_at_a_time_cap_s": ONE_AT_A_TIME_CAP_S,
        "runs": [],
    }

    for n in sizes:
        log(f"== N={n}: generating data")
        X, Q, is_dup, n_centers = make_data(n, args.queries, SEED)
        gt_ids, gt_sims = exact_topk(X, Q, K)
        data = {
            "n_centers": n_centers,
            "stored_nn_cos": nn_cos_stats(X),
            "query_top1_cos_dup": {
                f"p{p}": round(float(np.percentile(gt_sims[is_dup, 0], p)), 3) for p in (10, 50, 90)
            },
            "query_top1_cos_fresh": {
                f"p{p}": round(float(np.percentile(gt_sims[~is_dup, 0], p)), 3)
                for p in (10, 50, 90)
            },
        }
        log(f"   data: {data}")
        rows = []
        for name, factory in candidates(n):
            rows.append(
                measure(
                    name,
                    factory,
                    X,
                    Q,
                    is_dup,
                    gt_ids,
                    gt_sims,
                    batch_compare=n >= args.batch_compare_min_n,
                    ef_sweep=(64, 128, 256) if n == max(sizes) else (),
                )
            )
        results["runs"].append({"N": n, "data": data, "rows": rows})

    sweep_sizes = [int(s) for s in args.sweep.split(",") if s]
    if sweep_sizes:
        log("== exact latency sweep")
        results["exact_sweep"] = exact_latency_sweep(sweep_sizes, args.queries, SEED)
    results["total_runtime_s"] = round(time.perf_counter() - t_start, 1)

    # ------------------------------------------------------------------ text report
    v = mach["versions"]
    txt = [
        "ANN choice for the semantic-cache index (docs/records/2026-11-29-ann-choice.py)",
        f"machine: {mach['cpu']} [{mach['cpu_flags']}], {mach['logical_cpus']} logical CPUs; "
        f"threads used: 1 (build and query); python {mach['python']}",
        f"usearch SIMD kernels: {mach['usearch_simd']}",
        f"versions: numpy {v['numpy']}, faiss-cpu {v['faiss-cpu']}, hnswlib {v['hnswlib']}, usearch {v['usearch']}",
        f"workload: dim={DIM}, unit vectors, inner product, k={K}, {args.queries} single-vector queries "
        f"(half near-duplicates cos~0.9, half fresh), seed {SEED}",
        f"HNSW params (all): M/connectivity={M_CONN}, ef_construction/expansion_add={EF_CONSTRUCTION}, "
        f"ef_search/expansion_search={EF_SEARCH}",
        "columns: build1x1 = build inserting one vector per call (* = capped, rest batch-added); "
        "ins us = mean per insert; batch s = one batch add of all N (only at large N);",
        "  p50/p99 = single-query latency; R@1/R@4 = recall vs exact (float64); R@1dup = recall@1 on near-dup queries;",
        "  top1=exact(dup) = share of near-dup queries whose top-1 score is within 1e-5 of exact; maxerr = max |top-1 score - exact|;",
        f"  hitΔ = queries whose hit/miss decision at threshold {HIT_THRESHOLD} differs from exact; "
        "mem = index bytes (usearch memory_usage incl. reserved capacity, faiss serialized,",
        "  hnswlib file, numpy used rows); file = saved file size;",
        "  load== = loaded index returns identical ids+scores; remove = supports deletion",
        "",
    ]
    for run in results["runs"]:
        d = run["data"]
        txt.append(
            f"N = {run['N']:,}  (centres {d['n_centers']}, stored NN cos p10/p50/p90 = "
            f"{d['stored_nn_cos']['p10']}/{d['stored_nn_cos']['p50']}/{d['stored_nn_cos']['p90']}; "
            f"query top-1 cos dup p50 {d['query_top1_cos_dup']['p50']}, fresh p50 {d['query_top1_cos_fresh']['p50']})"
        )
        txt.append(table(run["rows"]))
        for r in run["rows"]:
            if "note" in r:
                txt.append(f"  * {r['name']}: {r['note']}")
        txt.append("")
    last = results["runs"][-1]
    sw = [r for r in last["rows"] if "ef_sweep" in r]
    if sw:
        txt.append(
            f"ef_search sweep at N = {last['N']:,} (same built index; p50/p99 us, R@1, R@1dup, hitΔ):"
        )
        txt.append(
            f"{'candidate':<16}" + "".join(f"{'ef=' + str(ef):>32}" for ef in sw[0]["ef_sweep"])
        )
        for r in sw:
            txt.append(
                f"{r['name']:<16}"
                + "".join(
                    f"{a['p50_us']:>7.0f}/{a['p99_us']:<5.0f} {a['recall@1']:.3f} {a['recall@1_dup']:.3f} {a['hit_decision_mismatch']:>3}".rjust(
                        32
                    )
                    for a in r["ef_sweep"].values()
                )
            )
        txt.append("")
    txt.append(
        "removal details: "
        + "; ".join(f"{r['name']}: {r['removal']}" for r in results["runs"][-1]["rows"])
    )
    if "exact_sweep" in results:
        txt.append("")
        txt.append("exact search p50 / p99 latency (us, 1 thread) vs N:")
        txt.append(
            f"{'N':>8}  {'numpy p50':>10}  {'numpy p99':>10}  {'faissFlat p50':>13}  {'faissFlat p99':>13}"
        )
        for r in results["exact_sweep"]:
            txt.append(
                f"{r['N']:>8}  {r['numpy-exact_p50_us']:>10.0f}  {r['numpy-exact_p99_us']:>10.0f}  "
                f"{r['faiss-FlatIP_p50_us']:>13.0f}  {r['faiss-FlatIP_p99_us']:>13.0f}"
            )
    txt.append("")
    txt.append(f"total runtime: {results['total_runtime_s']} s")
    text = "\n".join(txt)
    print(text)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ann-choice.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "ann-choice.txt").write_text(text + "\n")
    log(f"wrote {out / 'ann-choice.json'} and {out / 'ann-choice.txt'}")


if __name__ == "__main__":
    main()
