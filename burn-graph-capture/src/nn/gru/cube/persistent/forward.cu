// The GRU forward recurrence in one launch (Burn's formulation, the reset gate applied to
// the hidden projection with its bias). Block `blockIdx.x` owns hidden units
// [j0, j0 + UNITS): their three gate columns of W_h stay in shared memory for the whole
// sequence. Per step, warp `w` takes batch rows w, w + WARPS, ...: its lanes split the dot
// products of h_{t-1}[b] with the block's columns, the warp adds them up, and lane u
// updates unit j0 + u. The blocks meet after each step, since step t + 1 reads every unit
// of h_t.
//
// Outputs as the plain recurrence (gru/recurrence.rs) writes them: states
// [TIME + 1, BATCH, HIDDEN] (the initial state at index 0) and what the backward reads,
// [TIME, BATCH, 4H]: z, r, n and the new gate's hidden projection h W_hn + b_hn.

#define XP_AT(b, t, c) ((offset_t)(b) * XP_S0 + (offset_t)(t) * XP_S1 + (offset_t)(c) * XP_S2)
#define ST_AT(t, b, j) ((offset_t)(t) * ST_S0 + (offset_t)(b) * ST_S1 + (offset_t)(j) * ST_S2)
#define GA_AT(t, b, c) ((offset_t)(t) * GA_S0 + (offset_t)(b) * GA_S1 + (offset_t)(c) * GA_S2)
#define H_ROUNDS ((HIDDEN + 31) / 32)

extern "C" __global__ void __launch_bounds__(THREADS, 1)
gru_persistent_forward(const float* __restrict__ xp, const float* __restrict__ wh,
                       const float* __restrict__ bh, const float* __restrict__ h0,
                       float* states, float* __restrict__ gates, unsigned int* counter) {
    // w[(u * 3 + g) * HIDDEN + k] = W_h[k, g * HIDDEN + j0 + u]: lanes read along k.
    __shared__ float w[UNITS * 3 * HIDDEN];
    const int j0 = blockIdx.x * UNITS;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    for (int index = threadIdx.x; index < UNITS * 3 * HIDDEN; index += THREADS) {
        const int k = index % HIDDEN;
        const int column = index / HIDDEN;
        const int j = j0 + column / 3;
        const int gate = column % 3;
        w[index] = j < HIDDEN
            ? wh[(offset_t)k * WH_S0 + (offset_t)(gate * HIDDEN + j) * WH_S1]
            : 0.0f;
    }
    __syncthreads();

    for (int t = 0; t < TIME; ++t) {
        for (int b = warp; b < BATCH; b += WARPS) {
            float p[UNITS * 3];
#pragma unroll
            for (int n = 0; n < UNITS * 3; ++n) {
                p[n] = 0.0f;
            }
#pragma unroll
            for (int round = 0; round < H_ROUNDS; ++round) {
                const int k = round * 32 + lane;
                if (k < HIDDEN) {
                    // h_t of other blocks: read from L2 (`__ldcg`), never a stale L1 line.
                    const float h = t == 0
                        ? h0[(offset_t)b * H0_S0 + (offset_t)k * H0_S1]
                        : __ldcg(states + ST_AT(t, b, k));
#pragma unroll
                    for (int n = 0; n < UNITS * 3; ++n) {
                        p[n] += h * w[n * HIDDEN + k];
                    }
                }
            }
            rnn_warp_sum<UNITS * 3>(p);
#pragma unroll
            for (int u = 0; u < UNITS; ++u) {
                const int j = j0 + u;
                if (lane == u && j < HIDDEN) {
                    const float hn = p[u * 3 + 2] + bh[(offset_t)(2 * HIDDEN + j) * BH_S0];
                    const float z = rnn_sigmoid(xp[XP_AT(b, t, j)] +
                                                (p[u * 3 + 0] + bh[(offset_t)j * BH_S0]));
                    const float r = rnn_sigmoid(xp[XP_AT(b, t, HIDDEN + j)] +
                                                (p[u * 3 + 1] + bh[(offset_t)(HIDDEN + j) * BH_S0]));
                    const float n = tanhf(xp[XP_AT(b, t, 2 * HIDDEN + j)] + r * hn);
                    float h_prev;
                    if (t == 0) {
                        h_prev = h0[(offset_t)b * H0_S0 + (offset_t)j * H0_S1];
                        states[ST_AT(0, b, j)] = h_prev;
                    } else {
                        // Written by this thread at step t - 1.
                        h_prev = states[ST_AT(t, b, j)];
                    }
                    states[ST_AT(t + 1, b, j)] = n * (1.0f - z) + z * h_prev;
                    gates[GA_AT(t, b, j)] = z;
                    gates[GA_AT(t, b, HIDDEN + j)] = r;
                    gates[GA_AT(t, b, 2 * HIDDEN + j)] = n;
                    gates[GA_AT(t, b, 3 * HIDDEN + j)] = hn;
                }
            }
        }
        if (t + 1 < TIME) {
            rnn_grid_sync(counter, t + 1);
        }
    }
}
