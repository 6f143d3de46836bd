#!/usr/bin/env python3
"""Writes tests/dist/train/data/layer_decay_fixture.json: for ConvNeXt-T, -S and -B, every parameter's layer id,
lr scale and weight-decay decision as the official ConvNeXt code (facebookresearch/ConvNeXt) assigns them
under --layer_decay, keyed by the parameter's timm name (the names convnext_zero uses).

The official rule is `get_num_layer_for_convnext` in the repository's optim_factory.py, applied to the names
of its own model (models/convnext.py: downsample_layers.i, stages.i.j, norm, head); the lr scale of layer i is
`layer_decay ** (num_layers + 1 - i)` with num_layers = 12 (main.py), and a parameter decays unless it is 1-D
or named *.bias (get_parameter_groups). With --official PATH/optim_factory.py the function is taken from that
file itself (only the function is compiled, so timm and torch are not needed) and checked against the
transcription below on every name; without it the transcription alone is used. No torch or timm is needed:
the official parameter names and ranks follow from the depths.

    python3 tools/make_layer_decay_fixture.py [--official ConvNeXt/optim_factory.py] [out.json]
"""
import argparse
import ast
import json

MODELS = {  # timm's / the official definitions
    "tiny": ([3, 3, 9, 3], [96, 192, 384, 768]),
    "small": ([3, 3, 27, 3], [96, 192, 384, 768]),
    "base": ([3, 3, 27, 3], [128, 256, 512, 1024]),
}
NUM_LAYERS = 12  # main.py: "convnext layers divided into 12 parts"
DECAYS = [0.7, 0.8]  # TRAINING.md's fine-tuning values


def layer_of(name):
    """The official numbering, transcribed: stem 0; stage 0 -> 1; stage 1 and its downsample -> 2; stage 2's
    downsample -> 3 and its blocks in threes from 3; stage 3 and its downsample -> 12; anything else -> 13."""
    parts = name.split(".")
    if parts[0] == "downsample_layers":
        stage = int(parts[1])
        return {0: 0, 1: 2, 2: 3, 3: NUM_LAYERS}[stage]
    if parts[0] == "stages":
        stage, block = int(parts[1]), int(parts[2])
        if stage < 2:
            return stage + 1
        return 3 + block // 3 if stage == 2 else NUM_LAYERS
    return NUM_LAYERS + 1


def official_function(path):
    """get_num_layer_for_convnext compiled from the official file alone (its imports need timm)."""
    tree = ast.parse(open(path).read(), path)
    fn = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_num_layer_for_convnext"]
    if not fn:
        raise SystemExit(f"{path}: no get_num_layer_for_convnext")
    scope = {}
    exec(compile(ast.Module(body=fn, type_ignores=[]), path, "exec"), scope)
    return scope["get_num_layer_for_convnext"]


def official_params(depths):
    """(official name, timm name, ndim) of every parameter of the official model."""
    out = [("downsample_layers.0.0.weight", "stem.0.weight", 4), ("downsample_layers.0.0.bias", "stem.0.bias", 1),
           ("downsample_layers.0.1.weight", "stem.1.weight", 1), ("downsample_layers.0.1.bias", "stem.1.bias", 1)]
    for i, depth in enumerate(depths):
        if i > 0:
            d, t = f"downsample_layers.{i}", f"stages.{i}.downsample"
            out += [(f"{d}.0.weight", f"{t}.0.weight", 1), (f"{d}.0.bias", f"{t}.0.bias", 1),
                    (f"{d}.1.weight", f"{t}.1.weight", 4), (f"{d}.1.bias", f"{t}.1.bias", 1)]
        for j in range(depth):
            o, t = f"stages.{i}.{j}", f"stages.{i}.blocks.{j}"
            out.append((f"{o}.gamma", f"{t}.gamma", 1))
            for official, timm_name, ndim in (("dwconv", "conv_dw", 4), ("norm", "norm", 1),
                                              ("pwconv1", "mlp.fc1", 2), ("pwconv2", "mlp.fc2", 2)):
                out += [(f"{o}.{official}.weight", f"{t}.{timm_name}.weight", ndim),
                        (f"{o}.{official}.bias", f"{t}.{timm_name}.bias", 1)]
    out += [("norm.weight", "head.norm.weight", 1), ("norm.bias", "head.norm.bias", 1),
            ("head.weight", "head.fc.weight", 2), ("head.bias", "head.fc.bias", 1)]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default="tests/dist/train/data/layer_decay_fixture.json")
    ap.add_argument("--official", help="facebookresearch/ConvNeXt's optim_factory.py")
    args = ap.parse_args()
    number = layer_of
    if args.official:
        number = official_function(args.official)
    fixture = {"source": "official optim_factory.py" if args.official else "transcription of the official rule",
               "num_layers": NUM_LAYERS,
               "lr_scales": {str(d): [d ** (NUM_LAYERS + 1 - i) for i in range(NUM_LAYERS + 2)] for d in DECAYS},
               "models": {}}
    for model, (depths, _dims) in MODELS.items():
        params = []  # [timm name, official name, layer id, decays]
        for official, timm_name, ndim in official_params(depths):
            layer = number(official)
            if layer != layer_of(official):
                raise SystemExit(f"{official}: the official function says {layer}, the transcription "
                                 f"{layer_of(official)}")
            decays = not (ndim == 1 or official.endswith(".bias"))
            params.append([timm_name, official, layer, decays])
        fixture["models"][model] = {"depths": depths, "params": params}
    with open(args.out, "w") as f:  # one parameter a line: small, and diffs read well
        text = json.dumps(fixture, indent=1, sort_keys=True)
        f.write(text.replace(",\n     ", ", ").replace("[\n     ", "[").replace("\n    ]", "]") + "\n")
    print(f"{args.out}: {sum(len(m['params']) for m in fixture['models'].values())} parameters "
          f"({fixture['source']})")


if __name__ == "__main__":
    main()
