"""What the bench scripts share: a convnext_zero run's JSON-lines log read back, the learning studies' outcome
of a run and their permutation test, and the dated folder under bench/results/ a script writes into."""
import datetime
import itertools
import json
import os
import statistics
import subprocess
import sys

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def dated_results(topic):
    """bench/results/<topic>-<today, YYYY-MM-DD>: one folder per dated run (bench/results/README.md)."""
    return os.path.join(RESULTS, f"{topic}-{datetime.date.today().isoformat()}")


def run_or_exit(cmd, **kw):
    """Runs cmd, its output captured; exits with the command, its stdout and stderr when it fails."""
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
    return out


def log_records(log, split="train"):
    """The records of a --log file (JSON lines) whose "split" is `split`, in the file's order."""
    with open(log) as f:
        return [r for r in map(json.loads, f) if r.get("split") == split]


def learning_outcome(log):
    """A learning run's per-step training losses, and its last evaluation's top-1 and loss (None if none)."""
    losses, top1, eval_loss = [], None, None
    with open(log) as f:
        for line in f:
            r = json.loads(line)
            if r.get("split") == "eval":
                top1, eval_loss = r.get("top1"), r.get("loss")
            elif r.get("split") == "train":
                losses.append(r["loss"])
    return losses, top1, eval_loss


def permutation_p(a, b):
    """Two-sided exact permutation test of mean(a) - mean(b)."""
    pooled, k = a + b, len(a)
    observed = abs(statistics.mean(a) - statistics.mean(b))
    hits = total = 0
    for idx in itertools.combinations(range(len(pooled)), k):
        chosen = set(idx)
        x = [pooled[i] for i in idx]
        y = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        total += 1
        hits += abs(statistics.mean(x) - statistics.mean(y)) >= observed - 1e-12
    return hits / total


def add_torch_heap_flag(ap):
    """--torch-heap-like-ours, for the scripts that time PyTorch beside us."""
    ap.add_argument("--torch-heap-like-ours", action="store_true",
                    help="also time PyTorch under the glibc heap settings our CPU backend makes (Note [Freed heap "
                         "memory stays mapped]): the part of the ratio that is the heap, not the kernels")
