#!/usr/bin/env python3
"""The tensor-core Q4_K decode product (src/engine/ops/cuda/qgemv_mma.cuh) emulated lane by lane, against ggml's Q4_K
dequantization: the staging of x into pairs and sums, each lane's A and B registers as the kernel builds them, the
mma.sync m16n8k16 products placed by the PTX ISA's fragment layouts (A: a_i at row g + 8 (i / 2 % 2), column
2t + i % 2 + 8 (i / 4); B: b_i at row 2t + i % 2 + 8 (i / 2), column g; C: c_i at row g + 8 (i / 2), column
2t + i % 2), the scale fold, the shuffles and the split over warps. It checks the kernel's index math where no GPU
is at hand; it says nothing of the hardware (f64 here where the tensor cores sum in f32, so the match is exact).

    python3 tools/q4k_mma_emulate.py [SEED]      (needs numpy)
"""
import numpy as np, struct, sys
rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)

def f16(v): return np.float16(v)
def bf16_round(x):
    b = np.asarray(x, np.float32).view(np.uint32)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return b.view(np.float32)

def make_rows(n, k):
    blocks = k // 256
    data = bytearray()
    for r in range(n):
        for b in range(blocks):
            d = np.float16(rng.uniform(0.001, 0.01)); dmin = np.float16(rng.uniform(0.0, 0.01))
            data += struct.pack('<ee', d, dmin)
            data += bytes(rng.integers(0, 256, 12, dtype=np.uint8))
            data += bytes(rng.integers(0, 256, 128, dtype=np.uint8))
    return bytes(data)

def scale_min(q, j):
    if j < 4: return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)

def dequant(data, n, k):
    W = np.zeros((n, k))
    rb = k // 256 * 144
    for r in range(n):
        for b in range(k // 256):
            blk = data[r * rb + b * 144: r * rb + (b + 1) * 144]
            d, dmin = struct.unpack('<ee', blk[:4]); sc = blk[4:16]; qs = blk[16:]
            for i in range(256):
                g, high, l = i // 64, (i % 64) // 32, i % 32
                s, m = scale_min(sc, 2 * g + high)
                q = qs[32 * g + l]; q = (q >> 4) if high else (q & 0xF)
                W[r, 256 * b + i] = float(d) * s * q - float(dmin) * m
    return W

def u32(bs, off): return struct.unpack_from('<I', bs, off)[0]
def bf16_pair(w):  # two bf16 in a u32 -> floats (low, high)
    lo = np.array([(w & 0xFFFF) << 16], np.uint32).view(np.float32)[0]
    hi = np.array([(w >> 16) << 16], np.uint32).view(np.float32)[0]
    return float(lo), float(hi)
def perm(a, b, sel):
    src = struct.pack('<II', a, b); out = bytes(src[(sel >> (4 * i)) & 7] for i in range(4))
    return struct.unpack('<I', out)[0]

def kernel(x_bits, data, n, k, split):
    # staging
    subs = k // 32
    pairs = [0] * (k // 2); sums = [0.0] * subs
    for s in range(subs):
        nat = [x_bits[32 * s + 2 * i] | (x_bits[32 * s + 2 * i + 1] << 16) for i in range(16)]
        sums[s] = float(np.float32(sum(sum(bf16_pair(v)) for v in nat)))
        for c in range(4):
            a, b, e, f = nat[4 * c: 4 * c + 4]
            pairs[16 * s + 4 * c: 16 * s + 4 * c + 4] = [perm(a, b, 0x5410), perm(a, b, 0x7632), perm(e, f, 0x5410), perm(e, f, 0x7632)]
    zeros = [0] * 16
    blocks = k // 256; rb = blocks * 144
    y = [None] * n
    tiles = (n + 15) // 16
    for tile in range(tiles):
        row0 = tile * 16
        partial = {}
        for warp in range(split):
            acc = {}
            # per lane registers
            lanes = [(lane >> 2, lane & 3) for lane in range(32)]
            for lane in range(32): acc[lane] = [0.0, 0.0]
            for b in range(warp, blocks, split):
                C = np.zeros((16, 8))
                A_regs = {}; B_regs = {}
                for lane, (g, t) in enumerate(lanes):
                    ra = min(row0 + g, n - 1) * rb + b * 144; rbb = min(row0 + g + 8, n - 1) * rb + b * 144
                    shift = 4 * (t & 1); group = 16 + 32 * (t >> 1)
                    qa = [u32(data, ra + group + 4 * i) for i in range(8)] + [u32(data, ra + group + 64 + 4 * i) for i in range(8)]
                    qb = [u32(data, rbb + group + 4 * i) for i in range(8)] + [u32(data, rbb + group + 64 + 4 * i) for i in range(8)]
                    x0 = pairs[16 * (8 * b + t): 16 * (8 * b + t) + 16] if g == t else zeros
                    x1 = pairs[16 * (8 * b + t + 4): 16 * (8 * b + t + 4) + 16] if g == t + 4 else zeros
                    for i in range(16):
                        m = i >> 1; sh = shift + 8 * (i & 1)
                        cv = lambda w: ((w >> sh) & 0x000F000F) | 0x43004300
                        A_regs[lane, i] = [cv(qa[m]), cv(qb[m]), cv(qa[8 + m]), cv(qb[8 + m])]
                        B_regs[lane, i] = [x0[i], x1[i]]
                for i in range(16):
                    A = np.zeros((16, 16)); B = np.zeros((16, 8))
                    for lane, (g, t) in enumerate(lanes):
                        a = A_regs[lane, i]
                        for idx in range(8):
                            reg = a[idx // 2]; val = bf16_pair(reg)[idx % 2]
                            row = g + 8 * ((idx // 2) % 2); col = t * 2 + (idx % 2) + 8 * (idx // 4)
                            A[row, col] = val
                        bb = B_regs[lane, i]
                        for idx in range(4):
                            val = bf16_pair(bb[idx // 2])[idx % 2]
                            B[t * 2 + (idx % 2) + 8 * (idx // 2), g] = val
                    C += A @ B
                for lane, (g, t) in enumerate(lanes):
                    c = [C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1]]
                    x0s, x1s = sums[8 * b + 2 * t], sums[8 * b + 2 * t + 1]
                    for which, (c0, c1, r) in enumerate([(c[0], c[1], row0 + g), (c[2], c[3], row0 + g + 8)]):
                        off = min(r, n - 1) * rb + b * 144
                        hx, hy, hz, hw = [u32(data, off + 4 * i) for i in range(4)]
                        d = float(np.frombuffer(struct.pack('<H', hx & 0xFFFF), np.float16)[0])
                        dmin = float(np.frombuffer(struct.pack('<H', hx >> 16), np.float16)[0])
                        sc = (hy & 0x3F3F3F3F) if t < 2 else ((hw & 0x0F0F0F0F) | ((hy >> 2) & 0x30303030))
                        mn = (hz & 0x3F3F3F3F) if t < 2 else (((hw >> 4) & 0x0F0F0F0F) | ((hz >> 2) & 0x30303030))
                        e = 2 * (t & 1)
                        byte = lambda w, e: (w >> (8 * e)) & 0xFF
                        ds0, ds1 = d * byte(sc, e), d * byte(sc, e + 1)
                        dm0, dm1 = dmin * byte(mn, e), dmin * byte(mn, e + 1)
                        acc[lane][which] += ds0 * c0 + ds1 * c1 - (128 * ds0 + dm0) * x0s - (128 * ds1 + dm1) * x1s
            # shuffle-reduce over t
            for lane, (g, t) in enumerate(lanes):
                if t == 0:
                    tot = [sum(acc[g * 4 + tt][w] for tt in range(4)) for w in range(2)]
                    partial[warp, g] = tot[0]; partial[warp, g + 8] = tot[1]
        for r in range(16):
            if row0 + r < n: y[row0 + r] = sum(partial[w, r] for w in range(split))
    return np.array(y)

for (n, k, split) in [(20, 256, 4), (33, 512, 1), (16, 1024, 4)]:
    data = make_rows(n, k)
    x = bf16_round(rng.standard_normal(k).astype(np.float32))
    x_bits = [int(v) >> 16 for v in x.view(np.uint32)]
    W = dequant(data, n, k)
    want = W @ x.astype(np.float64)
    got = kernel(x_bits, data, n, k, split)
    err = np.abs(got - want).max() / np.abs(want).max()
    print(f"rows {n} k {k} split {split}: max relative error {err:.1e}")
    assert err < 1e-9, err
print('OK')
