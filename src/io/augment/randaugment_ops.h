// RandAugment's image operations on 8-bit RGB images, one function per op, each with the arithmetic of the
// PIL call timm makes for it (timm/data/auto_augment.py), so that our output equals timm's to the level.
//
// Note [PIL's arithmetic]: timm's ops are PIL calls on uint8 images; to give the model the pixels timm gives
// it, each op here repeats PIL's own steps and rounding rather than an idealised formula:
//  - the lookup-table ops (AutoContrast, Equalize, Invert, Posterize, Solarize, SolarizeAdd) build PIL's
//    tables, with its integer and double arithmetic;
//  - Color, Contrast, Brightness and Sharpness are Image.blend(degenerate, image, factor): factor as a C
//    float, out = degenerate + factor * (image - degenerate) in float, truncated and clamped to [0, 255]; the
//    degenerate images are PIL's: grey from L = (19595 R + 38470 G + 7471 B + 2^15) >> 16, the mean of that
//    grey rounded, black, and the 3x3 SMOOTH filter (weights 1/13 and 5/13 as floats, summed row by row from
//    the bottom row up with a 0.5 offset, truncated; the border rows and columns copied);
//  - Rotate, ShearX/Y and TranslateX/YRel are Image.transform(AFFINE) with PIL's generic transform: each
//    output pixel centre (x + 0.5, y + 0.5) mapped by the inverse matrix in double, points outside [0, W) x
//    [0, H) left at the fill colour, else PIL's bilinear (truncated) or bicubic (a = -1, clamped, truncated)
//    filter with its edge clamping. Rotate's matrix is PIL's: the angle taken modulo 360, cos and sin
//    rounded to 15 decimals, about the centre (W/2, H/2).
// These files are compiled with -ffp-contract=off (src/io/CMakeLists.txt): PIL's C and Python round after
// every multiply and add, and a fused multiply-add would move results across an integer boundary.
#pragma once

#include <array>
#include <cstdint>

#include "io/augment/image_transform.h"
#include "io/image/image.h"

namespace cz {

using Rgb = std::array<uint8_t, 3>;

// Colour ops. img: 8-bit RGB, any size; modified in place.
void auto_contrast(Image& img);            // ImageOps.autocontrast: each channel stretched to [0, 255]
void equalize(Image& img);                 // ImageOps.equalize: each channel's histogram flattened
void invert(Image& img);                   // 255 - v
void posterize(Image& img, int bits);      // keep the `bits` high bits, 0..8 (0: black)
void solarize(Image& img, int threshold);  // v >= threshold becomes 255 - v; threshold 0..256
void solarize_add(Image& img, int add, int threshold = 128);  // v < threshold becomes min(255, v + add)
void color(Image& img, double factor);                        // ImageEnhance.Color: 0 grey, 1 the image
void contrast(Image& img, double factor);    // ImageEnhance.Contrast: 0 the mean grey, 1 the image
void brightness(Image& img, double factor);  // ImageEnhance.Brightness: 0 black, 1 the image
void sharpness(Image& img, double factor);   // ImageEnhance.Sharpness: 0 smoothed, 1 the image, 2 sharper

// Geometric ops: the output has the input's size; pixels whose source falls outside the image are `fill`.
// `resample` is the filter (timm passes the crop's interpolation to every op).
void rotate(Image& img, double degrees, Interpolation resample, Rgb fill);      // counter-clockwise, as PIL
void shear_x(Image& img, double factor, Interpolation resample, Rgb fill);      // source x = x + factor * y
void shear_y(Image& img, double factor, Interpolation resample, Rgb fill);      // source y = y + factor * x
void translate_x(Image& img, double pixels, Interpolation resample, Rgb fill);  // source x = x + pixels
void translate_y(Image& img, double pixels, Interpolation resample, Rgb fill);  // source y = y + pixels

// PIL's Image.transform(size, AFFINE, m): output pixel (x, y) reads the source at (m0 X + m1 Y + m2,
// m3 X + m4 Y + m5), X = x + 0.5, Y = y + 0.5 (the other ops' common step; exposed for tests).
void affine(Image& img, const std::array<double, 6>& m, Interpolation resample, Rgb fill);

}  // namespace cz
