#!/usr/bin/env python3
"""Writes tests/optim/data/optim_fixture.json: a few ConvNeXt-like parameters, three steps of gradients and
learning rates, and the parameters (and optimizer state) that torch.optim.AdamW and torch.optim.SGD produce
after each step, with timm's weight-decay rule for the parameter groups. f32 values are written as the exact
decimal of the f32, so the C++ test reads back the very same floats.

Usage: python3 tools/make_optim_fixture.py [out.json]
"""
import json
import sys

import torch

PARAMS = [  # (name, shape): names and ranks like ConvNeXt's
    ("stem.0.weight", (4, 3, 2, 2)),
    ("stem.0.bias", (4,)),
    ("stages.0.blocks.0.gamma", (4,)),
    ("head.fc.weight", (3, 4)),
    ("head.fc.bias", (3,)),
]
LRS = [1e-3, 2e-3, 5e-4]
WEIGHT_DECAY = 0.05  # AdamW, decoupled
SGD_WEIGHT_DECAY = 1e-4  # SGD, coupled


def decays(name, p):  # timm.optim.param_groups_weight_decay
    return not (p.ndim <= 1 or name.endswith(".bias"))


def groups(params, wd):
    return [
        {"params": [p for n, p in params if decays(n, p)], "weight_decay": wd},
        {"params": [p for n, p in params if not decays(n, p)], "weight_decay": 0.0},
    ]


def flat(ts):
    return [float(x) for t in ts for x in t.detach().reshape(-1).tolist()]


def run(make_opt, init, grads, state_keys):
    params = [(n, t.clone().requires_grad_(True)) for n, t in init]
    opt = make_opt(params)
    expected = []
    for step, lr in enumerate(LRS):
        for g in opt.param_groups:
            g["lr"] = lr
        for (_, p), g in zip(params, grads[step]):
            p.grad = g.clone()
        opt.step()
        expected.append([flat([p]) for _, p in params])
    state = {k: [flat([opt.state[p][k]]) for _, p in params] for k in state_keys}
    return {"expected": expected, "state": state}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/optim/data/optim_fixture.json"
    gen = torch.Generator().manual_seed(1234)
    init = [(n, torch.randn(s, generator=gen, dtype=torch.float32) * 0.5) for n, s in PARAMS]
    grads = [[torch.randn(s, generator=gen, dtype=torch.float32) * 0.1 for _, s in PARAMS] for _ in LRS]
    betas, eps = (0.9, 0.999), 1e-8
    fixture = {
        "generator": "tools/make_optim_fixture.py, torch " + torch.__version__,
        "params": [{"name": n, "shape": list(s), "value": flat([t])} for (n, s), (_, t) in zip(PARAMS, init)],
        "grads": [[flat([g]) for g in step] for step in grads],
        "lrs": LRS,
        "adamw": {
            "weight_decay": WEIGHT_DECAY, "beta1": betas[0], "beta2": betas[1], "eps": eps,
            **run(lambda ps: torch.optim.AdamW(groups(ps, WEIGHT_DECAY), lr=LRS[0], betas=betas, eps=eps,
                                               foreach=False),
                  init, grads, ["exp_avg", "exp_avg_sq"]),
        },
    }
    for key, nesterov in (("sgd", False), ("sgd_nesterov", True)):
        fixture[key] = {
            "weight_decay": SGD_WEIGHT_DECAY, "momentum": 0.9, "nesterov": nesterov,
            **run(lambda ps: torch.optim.SGD(groups(ps, SGD_WEIGHT_DECAY), lr=LRS[0], momentum=0.9,
                                             nesterov=nesterov, foreach=False),
                  init, grads, ["momentum_buffer"]),
        }
    with open(out, "w") as f:  # one line per top-level key: small diffs when regenerated
        items = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in fixture.items()]
        f.write("{\n" + ",\n".join(items) + "\n}\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
