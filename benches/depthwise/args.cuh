// The argument structs of kernels/depthwise.cu as the Rust side declares them
// (src/cuda/ops/depthwise.rs), for this standalone bench.
struct DepthwiseGeom {
    unsigned c, ih, iw, oh, ow;
    int kh, kw, sh, sw, dh, dw, ph, pw;
    unsigned total, planes;
    unsigned strips, bands, items;
    unsigned div_strips[2], div_bands[2], div_c[2];
};
