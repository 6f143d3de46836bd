#!/usr/bin/env python3
"""Builds the CMYK JPEG fixtures of tests/io/test_cmyk.cpp and PIL's RGB decode of each.

Two small Adobe CMYK JPEGs of the same smooth picture (every channel varies, black included), stored inverted
as Adobe software and PIL store them (a stored 255 is no ink):

  cmyk_adobe.jpg      written by PIL: Adobe APP14 marker, transform 0 (plain CMYK)
  ycck_adobe.jpg      written by libjpeg-turbo's TurboJPEG (through ctypes) from CMYK samples: transform 2 (YCCK)

and beside each, `<name>_pil.png`: `Image.open(jpg).convert("RGB")`, losslessly, which is what torchvision and
timm train on. The test decodes the JPEGs with convnext_zero's decoder and compares with the PNGs. Needs PIL and
libturbojpeg (Debian: python3-pil, libturbojpeg0); not part of the build.

    /usr/bin/python3 tools/make_cmyk_fixtures.py tests/data
"""
import argparse
import ctypes
import ctypes.util
import math
import os

from PIL import Image

WIDTH, HEIGHT = 24, 16


def ink_picture():
    """Ink amounts (0: none, 255: full) varying smoothly in every channel, as bytes C, M, Y, K per pixel."""
    out = bytearray()
    for y in range(HEIGHT):
        for x in range(WIDTH):
            u, v = x / (WIDTH - 1), y / (HEIGHT - 1)
            c = 255 * u
            m = 255 * v
            ye = 127.5 + 127.5 * math.sin(6.0 * u + 3.0 * v)
            k = 200 * (1 - u) * v
            out += bytes(int(round(min(255.0, max(0.0, t)))) for t in (c, m, ye, k))
    return bytes(out)


def adobe_stored(ink):
    """Adobe's (and PIL's) polarity: the file holds 255 - ink."""
    return bytes(255 - b for b in ink)


def write_ycck(path, stored):
    """TurboJPEG compresses CMYK samples as YCCK (Adobe transform 2), storing the samples it is given."""
    lib = ctypes.CDLL(ctypes.util.find_library("turbojpeg") or "libturbojpeg.so.0")
    lib.tjInitCompress.restype = ctypes.c_void_p
    lib.tjCompress2.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_ulong),
                                ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.tjFree.argtypes = [ctypes.c_void_p]
    lib.tjDestroy.argtypes = [ctypes.c_void_p]
    tjpf_cmyk, tjsamp_444 = 11, 0
    handle = lib.tjInitCompress()
    buf, size = ctypes.c_void_p(), ctypes.c_ulong(0)
    rc = lib.tjCompress2(handle, stored, WIDTH, 0, HEIGHT, tjpf_cmyk, ctypes.byref(buf), ctypes.byref(size),
                         tjsamp_444, 95, 0)
    assert rc == 0, "tjCompress2 failed"
    data = ctypes.string_at(buf, size.value)
    lib.tjFree(buf)
    lib.tjDestroy(handle)
    with open(path, "wb") as f:
        f.write(data)


def adobe_transform(path):
    data = open(path, "rb").read()
    i = data.find(b"\xff\xee")  # APP14: length (2 bytes), "Adobe", version, flags0, flags1, transform
    assert i >= 0 and data[i + 4:i + 9] == b"Adobe", f"{path}: no Adobe APP14 marker"
    return data[i + 15]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    args = ap.parse_args()
    ink = ink_picture()
    cmyk = os.path.join(args.out_dir, "cmyk_adobe.jpg")
    # PIL's CMYK mode holds ink; its JPEG writer stores it inverted (raw mode "CMYK;I").
    Image.frombytes("CMYK", (WIDTH, HEIGHT), ink).save(cmyk, "JPEG", quality=95, subsampling=0)
    ycck = os.path.join(args.out_dir, "ycck_adobe.jpg")
    write_ycck(ycck, adobe_stored(ink))
    for path, transform in ((cmyk, 0), (ycck, 2)):
        assert adobe_transform(path) == transform, f"{path}: Adobe transform {adobe_transform(path)}"
        im = Image.open(path)
        assert im.mode == "CMYK", f"{path}: PIL reads mode {im.mode}"
        png = path[:-4] + "_pil.png"
        im.convert("RGB").save(png)
        print(f"{path}: {os.path.getsize(path)} bytes, Adobe transform {transform}; PIL's RGB in {png}")


if __name__ == "__main__":
    main()
