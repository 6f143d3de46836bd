#!/usr/bin/env python3
"""Checks --dump-batches files (layout: src/io/data/batch_dump.h) for run_mix_tests.sh. Exit 0 when every check
holds; prints what it measured.

  check_mix_dump.py stats MIXED.h5 UNMIXED.h5
      MIXED from a run with Mixup/CutMix, UNMIXED from the same run without: every row's pixels are its own
      and its partner's unmixed pixels as its lam and box say (bit for bit, in f32 as timm computes), its
      target is timm's mixup_target of the two labels, rows sum to 1, lam is 1 - box area / image area for
      CutMix rows, and the lams of the Mixup rows follow Beta(a, a).
  check_mix_dump.py same A.h5 B1.h5 [B2.h5 ...]
      The rows of A and of the Bs together are the same images, targets and mixing, position by position
      (several ranks' files against one rank's).
  check_mix_dump.py pairs A.h5 GROUP
      Every image is paired with the image mirrored within its group of GROUP consecutive positions.
  check_mix_dump.py from_step A.h5 B.h5 STEP
      A's rows from step STEP on equal B's (a resumed run against the uninterrupted one).
"""
import sys

import h5py
import numpy as np

ROW_KEYS = ["images", "labels", "sources", "targets", "mix_sources", "lams", "cutmix", "boxes"]


def load(path):
    with h5py.File(path, "r") as f:
        d = {k: f[k][()] for k in f.keys()}
        d["attrs"] = dict(f.attrs)
    return d


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def by_position(d):
    key = d["epochs"] * (1 << 40) + d["positions"]
    if len(np.unique(key)) != len(key):
        fail("a position appears twice in one dump")
    return {int(k): i for i, k in enumerate(key)}


def stats(mixed_path, unmixed_path):
    m, u = load(mixed_path), load(unmixed_path)
    if int(m["attrs"]["mixing"]) != 1 or "targets" in u:
        fail("expected a mixed and an unmixed dump")
    if not np.array_equal(m["sources"], u["sources"]) or not np.array_equal(m["positions"], u["positions"]):
        fail("the two runs did not read the same images in the same order")
    k, s, mode = int(m["attrs"]["num_classes"]), float(m["attrs"]["label_smoothing"]), m["attrs"]["mix_mode"]
    if isinstance(mode, bytes):
        mode = mode.decode()
    index = {int(src): i for i, src in enumerate(u["sources"])}  # one epoch: each source once
    x, size = u["images"], int(m["attrs"]["image_size"])
    off = np.float32(s / k)
    on = np.float32(1.0 - s + s / k)
    worst_sum, n_mix, n_cut = 0.0, 0, 0
    mix_lams = []
    for i in range(len(m["lams"])):
        lam, own = m["lams"][i], x[index[int(m["sources"][i])]]
        other = x[index[int(m["mix_sources"][i])]]
        if mode == "batch":
            L, M = np.float32(lam), np.float32(1.0 - lam)
        else:
            L = np.float32(lam)
            M = np.float32(np.float32(1.0) - L)
        y0, y1, x0, x1 = (int(v) for v in m["boxes"][i])
        if m["cutmix"][i]:
            n_cut += 1
            want = own.copy()
            want[y0:y1, x0:x1] = other[y0:y1, x0:x1]
            if lam != 1.0 - (y1 - y0) * (x1 - x0) / float(size * size) and mode == "batch":
                fail(f"row {i}: CutMix lam {lam} is not 1 - box area / image area")
            if mode != "batch" and lam != np.float32(1.0 - (y1 - y0) * (x1 - x0) / float(size * size)):
                fail(f"row {i}: CutMix lam {lam} is not f32(1 - box area / image area)")
        elif lam != 1.0:
            n_mix += 1
            mix_lams.append(lam)
            want = (own * L).astype(np.float32) + (other * M).astype(np.float32)
        else:
            want = own
        if not np.array_equal(m["images"][i].view(np.uint32), want.astype(np.float32).view(np.uint32)):
            fail(f"row {i}: pixels are not the unmixed images combined as recorded "
                 f"(largest difference {np.abs(m['images'][i] - want).max()})")
        y1h = np.full(k, off, np.float32)
        y2h = np.full(k, off, np.float32)
        y1h[int(m["labels"][i])] = on
        y2h[int(u["labels"][index[int(m["mix_sources"][i])]])] = on
        t = (y1h * L).astype(np.float32) + (y2h * M).astype(np.float32)
        if not np.array_equal(m["targets"][i].view(np.uint32), t.view(np.uint32)):
            fail(f"row {i}: target {m['targets'][i]} is not timm's mixup_target {t}")
        worst_sum = max(worst_sum, abs(float(m["targets"][i].astype(np.float64).sum()) - 1.0))
    if worst_sum > 1e-6:
        fail(f"a target row sums to 1 +- {worst_sum}")
    rows = len(m["lams"])
    print(f"{rows} rows: {n_mix} Mixup, {n_cut} CutMix, {rows - n_mix - n_cut} unmixed; target rows sum to 1 "
          f"within {worst_sum:.2e}")
    if mode == "batch":
        return  # one lam per micro-batch: too few for a distribution check (test_mixup checks the draws)
    a = float(m["attrs"]["mixup"])
    lams = np.array(mix_lams)
    mean, var, want_var = lams.mean(), lams.var(), 1.0 / (4 * (2 * a + 1))
    print(f"Mixup lam mean {mean:.4f} var {var:.4f} over {len(lams)} rows (Beta({a}, {a}): 0.5, {want_var:.4f})")
    se = np.sqrt(want_var / len(lams))
    if abs(mean - 0.5) > 4 * se or abs(var - want_var) > 0.25 * want_var:
        fail("the Mixup lams do not follow Beta(a, a)")


def same(a_path, b_paths):
    a = load(a_path)
    bs = [load(p) for p in b_paths]
    ia = by_position(a)
    seen = 0
    for b in bs:
        for key, j in by_position(b).items():
            if key not in ia:
                fail(f"{b_paths} hold a position {key} that {a_path} lacks")
            i = ia[key]
            for k in ROW_KEYS:
                if k in a and not np.array_equal(np.asarray(a[k][i]), np.asarray(b[k][j])):
                    fail(f"position {key}: '{k}' differs")
            seen += 1
    if seen != len(ia):
        fail(f"{seen} rows in the Bs against {len(ia)} in A")
    print(f"{seen} rows equal position by position, bit for bit")


def pairs(a_path, group):
    a = load(a_path)
    src_at = {int(p): int(s) for p, s in zip(a["positions"], a["sources"])}
    for p, ms in zip(a["positions"], a["mix_sources"]):
        g0 = int(p) // group * group
        mirror = g0 + group - 1 - (int(p) - g0)
        if src_at[mirror] != int(ms):
            fail(f"position {p} is mixed with source {ms}, not with position {mirror}'s")
    print(f"{len(a['positions'])} rows paired within groups of {group}")


def from_step(a_path, b_path, step):
    a, b = load(a_path), load(b_path)
    ka = np.nonzero(a["steps"] >= step)[0]
    kb = np.nonzero(b["steps"] >= step)[0]
    if len(ka) == 0 or len(ka) != len(kb):
        fail(f"{len(ka)} rows from step {step} in A, {len(kb)} in B")
    for k in ROW_KEYS + ["positions", "steps"]:
        if k in a and not np.array_equal(a[k][ka], b[k][kb]):
            fail(f"'{k}' differs from step {step} on")
    print(f"{len(ka)} rows from step {step} on equal bit for bit")


def main():
    cmd = sys.argv[1]
    if cmd == "stats":
        stats(sys.argv[2], sys.argv[3])
    elif cmd == "same":
        same(sys.argv[2], sys.argv[3:])
    elif cmd == "pairs":
        pairs(sys.argv[2], int(sys.argv[3]))
    elif cmd == "from_step":
        from_step(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        fail(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
