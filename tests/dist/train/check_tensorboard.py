#!/usr/bin/env python3
"""Reads a --tensorboard folder back and checks it against the run's --log.

  check_tensorboard.py DIR LOG.jsonl FILES

DIR must hold FILES event files. Every record is decoded twice: by this script's own reader (the record
framing and both masked CRC-32Cs checked, the Event and Summary messages parsed from the protobuf wire format)
and, where the `tensorboard` package is installed, by TensorBoard's own EventAccumulator, as TensorBoard's
server reads them; both must give the same scalars, and those must equal the JSON log's values (as float32).
Without the package (it is on PyPI only, not in Debian) the own reader's result is checked alone, and the
script says so."""
import glob
import json
import math
import os
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    v = shift = 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def fields(buf):
    """(field number, wire type, value) of a message; value is bytes for length-delimited fields."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        elif wt == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        else:
            raise ValueError(f"wire type {wt}")
        yield num, wt, v


def own_read(path):
    """[(step, tag, value)] of one event file, and its file_version."""
    data = open(path, "rb").read()
    i, out, version = 0, [], None
    while i < len(data):
        header = data[i:i + 8]
        (length,) = struct.unpack("<Q", header)
        (hcrc,) = struct.unpack("<I", data[i + 8:i + 12])
        assert hcrc == masked(header), f"{path}: bad length CRC at byte {i}"
        body = data[i + 12:i + 12 + length]
        (dcrc,) = struct.unpack("<I", data[i + 12 + length:i + 16 + length])
        assert dcrc == masked(body), f"{path}: bad data CRC at byte {i}"
        i += 16 + length
        step = 0
        values = []
        for num, wt, v in fields(body):
            if num == 2:
                step = v
            elif num == 3:
                version = v.decode()
            elif num == 5:
                for n2, _, val in fields(v):
                    assert n2 == 1
                    tag, simple = None, None
                    for n3, _, x in fields(val):
                        if n3 == 1:
                            tag = x.decode()
                        elif n3 == 2:
                            (simple,) = struct.unpack("<f", x)
                    assert simple is not None, f"{path}: {tag} has no simple_value (a 0 left out?)"
                    values.append((tag, simple))
        out += [(step, t, s) for t, s in values]
    assert i == len(data), f"{path}: trailing bytes"
    return out, version


def main():
    folder, log, want_files = sys.argv[1], sys.argv[2], int(sys.argv[3])
    files = sorted(glob.glob(os.path.join(folder, "*tfevents*")))
    assert len(files) == want_files, f"{folder}: {len(files)} event files, expected {want_files}: {files}"
    own = {}
    for f in files:
        scalars, version = own_read(f)
        assert version == "brain.Event:2", f"{f}: file_version {version!r}"
        for step, tag, value in scalars:
            own[(tag, step)] = value
    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError:
        print("check_tensorboard: the tensorboard package is not installed (pip install tensorboard): "
              "checked with this script's own reader only")
    else:
        acc = event_accumulator.EventAccumulator(folder, size_guidance={"scalars": 0})
        acc.Reload()
        theirs = {(tag, e.step): e.value for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)}
        assert theirs.keys() == own.keys(), f"TensorBoard read {sorted(set(theirs) ^ set(own))} differently"
        for k, v in theirs.items():
            assert v == own[k], f"{k}: TensorBoard read {v}, own reader {own[k]}"
        print(f"check_tensorboard: TensorBoard's EventAccumulator read {len(theirs)} scalars "
              f"({len(acc.Tags()['scalars'])} tags), as the own reader did")
    records = [json.loads(line) for line in open(log)]
    compared = 0
    for r in records:
        split = r.get("split")
        if split not in ("train", "eval"):
            continue
        for key, value in r.items():
            if key in ("step", "epoch", "stage", "t", "split") or isinstance(value, bool) or \
                    not isinstance(value, (int, float)):
                continue
            tag = f"{split}/{key}"
            assert (tag, r["step"]) in own, f"{tag} at step {r['step']} missing from {folder}"
            got, want = own[(tag, r["step"])], struct.unpack("<f", struct.pack("<f", value))[0]
            assert got == want or math.isclose(got, want, rel_tol=1e-6), f"{tag} @ {r['step']}: {got} vs {want}"
            compared += 1
        if split == "train" and r.get("comm_s", 0) > 0:
            hidden = max(0.0, 1 - r["comm_exposed_s"] / r["comm_s"])
            got = own[("train/comm_hidden", r["step"])]
            assert math.isclose(got, hidden, rel_tol=1e-6, abs_tol=1e-7), f"comm_hidden {got} vs {hidden}"
            compared += 1
    tags = {t for t, _ in own}
    for need in sys.argv[4:]:
        assert need in tags, f"no {need} among {sorted(tags)}"
    steps = [r["step"] for r in records if r.get("split") == "train"]
    print(f"check_tensorboard: {compared} values of {len(steps)} train steps and the evaluations equal the log's")


main()
