"""Warm starts kept in results/ at a size the repository can carry (issue 52, item 6).

A warm-start cache entry (gspo_jax/rl/warmstart.py: <entry>/params, an orbax checkpoint of the
float32 parameters, and <entry>/meta.json) is kept as one file, <kept>/<entry name>.npz.xz: the
parameters' bytes split into byte planes (the exponent bytes of similar floats compress well),
xz-compressed, with meta.json and the SHA-256 of the parameters (``digest``: every leaf's path,
dtype, shape and bytes). Unpacking writes the entry back and refuses it when the digest differs:
runs from the unpacked entry start from the very numbers the recorded runs started from, so they
reproduce them as a run on the same machine does.

    python experiments/warmstart_store.py round  <cache entry>           # bfloat16 values, in place
    python experiments/warmstart_store.py pack   <cache entry> <kept>    # -> <kept>/<name>.npz.xz
    python experiments/warmstart_store.py unpack <kept file> <cache entry>
    python experiments/warmstart_store.py verify <kept file> <cache entry>

Two precisions (docs/results.md, "How warm starts are kept"):

- float32: lossless, about 0.84 of the orbax folder's size;
- bfloat16: the high half of each float32 only (about a third of the size), allowed only for an
  entry whose values are bfloat16 numbers already: ``round`` rewrites a fresh entry so, before
  its first RL run; its runs then start from the rounded base, and the kept file unpacks to it
  exactly. Packing an entry that was not rounded at bfloat16 is refused (its runs started from
  values the file could not give back).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import shutil
import sys

import numpy as np

SUFFIX = ".npz.xz"
PRECISIONS = ("float32", "bfloat16")


def _checkpointer():
    import orbax.checkpoint as ocp

    return ocp.StandardCheckpointer()


def read_params(entry: str) -> dict[str, np.ndarray]:
    """{"embed": [V, D], "layers/attn/k_proj": [L, D, K, H], ...}: the entry's parameters,
    flattened to '/'-joined paths (sorted), as float32 numpy arrays."""
    tree = _checkpointer().restore(os.path.abspath(os.path.join(entry, "params")))
    out: dict[str, np.ndarray] = {}

    def walk(prefix: str, node) -> None:
        if isinstance(node, dict):
            for k in sorted(node):
                walk(f"{prefix}/{k}" if prefix else str(k), node[k])
        else:
            out[prefix] = np.asarray(node, dtype=np.float32)

    walk("", tree)
    return out


def write_params(entry: str, params: dict[str, np.ndarray], meta: dict) -> None:
    """Writes ``params`` (flat, as read_params gives them) and ``meta`` as the cache entry
    ``entry`` (written aside and renamed into place, as the library writes its entries)."""
    tree: dict = {}
    for path, value in params.items():
        node = tree
        *parents, leaf = path.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    tmp = os.path.abspath(entry) + ".unpacking"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    checkpointer = _checkpointer()
    checkpointer.save(os.path.join(tmp, "params"), tree, force=True)
    checkpointer.wait_until_finished()
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    if os.path.exists(entry):
        shutil.rmtree(entry)
    os.replace(tmp, entry)


def digest(params: dict[str, np.ndarray]) -> str:
    """SHA-256 (hex) of every leaf's path, dtype, shape and bytes, in path order."""
    h = hashlib.sha256()
    for path in sorted(params):
        v = np.ascontiguousarray(params[path])
        h.update(f"{path}|{v.dtype.str}|{v.shape}|".encode())
        h.update(v.tobytes())
    return h.hexdigest()


def _planes(value: np.ndarray, precision: str) -> np.ndarray:
    """[bytes per value, n] uint8: each float32's bytes as planes (little-endian), bfloat16: the
    two high bytes only."""
    raw = np.ascontiguousarray(value, dtype="<f4").view(np.uint8).reshape(-1, 4)
    return np.ascontiguousarray((raw[:, 2:] if precision == "bfloat16" else raw).T)


def _from_planes(planes: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    raw = np.zeros((planes.shape[1], 4), np.uint8)
    raw[:, 4 - planes.shape[0] :] = planes.T
    return raw.reshape(-1).view("<f4").reshape(shape).astype(np.float32)


def is_bfloat16(params: dict[str, np.ndarray]) -> bool:
    """Every value is a bfloat16 number (its float32's low 16 bits are zero)."""
    return all(
        not np.any(np.ascontiguousarray(v, "<f4").view(np.uint32) & 0xFFFF) for v in params.values()
    )


def round_entry(entry: str) -> str:
    """Rewrites the cache entry's parameters rounded to bfloat16 (to nearest, ties to even),
    stored as float32, and notes it in meta.json; returns the new digest. Do it once, before the
    entry's first RL run: runs made from the unrounded values are not reproduced by it."""
    import ml_dtypes

    params = read_params(entry)
    rounded = {k: v.astype(ml_dtypes.bfloat16).astype(np.float32) for k, v in params.items()}
    with open(os.path.join(entry, "meta.json")) as f:
        meta = json.load(f)
    meta["rounded_to"] = "bfloat16"
    meta["params_sha256"] = digest(rounded)
    write_params(entry, rounded, meta)
    return meta["params_sha256"]


def pack(entry: str, kept: str, precision: str = "float32") -> str:
    """Keeps the cache entry as <kept>/<entry name>.npz.xz at ``precision``; returns its path.
    ValueError, naming the fix, for bfloat16 on an entry whose values are not bfloat16."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {PRECISIONS}")
    params = read_params(entry)
    if precision == "bfloat16" and not is_bfloat16(params):
        raise ValueError(
            f"{entry} holds float32 values that bfloat16 cannot give back: keep it as float32, "
            "or round it (warmstart_store.py round) before its first RL run"
        )
    with open(os.path.join(entry, "meta.json")) as f:
        meta = json.load(f)
    header = {"precision": precision, "sha256": digest(params), "meta": meta}
    header["shapes"] = {k: list(v.shape) for k, v in params.items()}
    buf = io.BytesIO()
    arrays = {f"p:{k}": _planes(v, precision) for k, v in params.items()}
    np.savez(buf, header=np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays)
    os.makedirs(kept, exist_ok=True)
    path = os.path.join(kept, os.path.basename(os.path.normpath(entry)) + SUFFIX)
    with open(path + ".tmp", "wb") as f:
        f.write(lzma.compress(buf.getvalue(), preset=9))
    os.replace(path + ".tmp", path)
    return path


def read_kept(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """(header: precision, sha256, meta, shapes; the parameters) of a kept file; ValueError
    naming the file when the parameters' digest is not the one it was packed with."""
    with open(path, "rb") as f:
        data = np.load(io.BytesIO(lzma.decompress(f.read())))
    header = json.loads(bytes(data["header"]).decode())
    params = {k: _from_planes(data[f"p:{k}"], tuple(s)) for k, s in header["shapes"].items()}
    if digest(params) != header["sha256"]:
        raise ValueError(f"{path}: its parameters' SHA-256 differs from the packed one; repack it")
    return header, params


def unpack(path: str, entry: str) -> str:
    """Writes the kept file back as the cache entry ``entry``; returns the digest."""
    header, params = read_kept(path)
    write_params(entry, params, header["meta"])
    return header["sha256"]


def verify(path: str, entry: str) -> bool:
    """The cache entry holds exactly the parameters the kept file holds (equal digests)."""
    return digest(read_params(entry)) == read_kept(path)[0]["sha256"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("round", "pack", "unpack", "verify"))
    p.add_argument("paths", nargs="+")
    p.add_argument("--precision", default="float32", choices=PRECISIONS)
    args = p.parse_args(argv)
    if args.command == "round":
        print(round_entry(args.paths[0]))
    elif args.command == "pack":
        print(pack(args.paths[0], args.paths[1], args.precision))
    elif args.command == "unpack":
        print(unpack(args.paths[0], args.paths[1]))
    else:
        same = verify(args.paths[0], args.paths[1])
        print("same parameters" if same else "DIFFERENT parameters")
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
