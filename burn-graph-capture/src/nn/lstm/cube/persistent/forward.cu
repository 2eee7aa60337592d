// The forward recurrence in one launch. Block `blockIdx.x` owns hidden units
// [j0, j0 + UNITS): their four gate columns of W_h stay in shared memory for the whole
// sequence. Per step, warp `w` takes batch rows w, w + WARPS, ...: its lanes split the
// dot products of h_{t-1}[b] with the block's columns, the warp adds them up, and lane u
// updates unit j0 + u's cell (c stays with that thread from step to step). The blocks
// meet after each step, since step t + 1 reads every unit of h_t.
//
// Outputs as the stepwise kernels write them: states [2, TIME + 1, BATCH, HIDDEN]
// (hidden, cell; the initial state at index 0) and the activated gates
// [TIME, BATCH, 4H], packed [input, forget, cell, output].

#define XP_AT(b, t, c) ((offset_t)(b) * XP_S0 + (offset_t)(t) * XP_S1 + (offset_t)(c) * XP_S2)
#define ST_AT(kind, t, b, j) \
    ((offset_t)(kind) * ST_S0 + (offset_t)(t) * ST_S1 + (offset_t)(b) * ST_S2 + (offset_t)(j) * ST_S3)
#define GA_AT(t, b, c) ((offset_t)(t) * GA_S0 + (offset_t)(b) * GA_S1 + (offset_t)(c) * GA_S2)
#define H_ROUNDS ((HIDDEN + 31) / 32)

extern "C" __global__ void __launch_bounds__(THREADS, 1)
lstm_persistent_forward(const float* __restrict__ xp, const float* __restrict__ wh,
                        const float* __restrict__ h0, const float* __restrict__ c0,
                        float* states, float* __restrict__ gates, unsigned int* counter) {
    // w[(u * 4 + g) * HIDDEN + k] = W_h[k, g * HIDDEN + j0 + u]: lanes read along k.
    __shared__ float w[UNITS * 4 * HIDDEN];
    const int j0 = blockIdx.x * UNITS;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    for (int index = threadIdx.x; index < UNITS * 4 * HIDDEN; index += THREADS) {
        const int k = index % HIDDEN;
        const int column = index / HIDDEN;
        const int j = j0 + column / 4;
        const int gate = column % 4;
        w[index] = j < HIDDEN
            ? wh[(offset_t)k * WH_S0 + (offset_t)(gate * HIDDEN + j) * WH_S1]
            : 0.0f;
    }
    __syncthreads();

    for (int t = 0; t < TIME; ++t) {
        for (int b = warp; b < BATCH; b += WARPS) {
            float z[UNITS * 4];
#pragma unroll
            for (int n = 0; n < UNITS * 4; ++n) {
                z[n] = 0.0f;
            }
#pragma unroll
            for (int round = 0; round < H_ROUNDS; ++round) {
                const int k = round * 32 + lane;
                if (k < HIDDEN) {
                    // h_t of other blocks: read from L2 (`__ldcg`), never a stale L1 line.
                    const float h = t == 0
                        ? h0[(offset_t)b * H0_S0 + (offset_t)k * H0_S1]
                        : __ldcg(states + ST_AT(0, t, b, k));
#pragma unroll
                    for (int n = 0; n < UNITS * 4; ++n) {
                        z[n] += h * w[n * HIDDEN + k];
                    }
                }
            }
            rnn_warp_sum<UNITS * 4>(z);
#pragma unroll
            for (int u = 0; u < UNITS; ++u) {
                const int j = j0 + u;
                if (lane == u && j < HIDDEN) {
                    const float i = rnn_sigmoid(xp[XP_AT(b, t, j)] + z[u * 4 + 0]);
                    const float f = rnn_sigmoid(xp[XP_AT(b, t, HIDDEN + j)] + z[u * 4 + 1]);
                    const float g = tanhf(xp[XP_AT(b, t, 2 * HIDDEN + j)] + z[u * 4 + 2]);
                    const float o = rnn_sigmoid(xp[XP_AT(b, t, 3 * HIDDEN + j)] + z[u * 4 + 3]);
                    float c_prev;
                    if (t == 0) {
                        c_prev = c0[(offset_t)b * C0_S0 + (offset_t)j * C0_S1];
                        states[ST_AT(0, 0, b, j)] = h0[(offset_t)b * H0_S0 + (offset_t)j * H0_S1];
                        states[ST_AT(1, 0, b, j)] = c_prev;
                    } else {
                        // Written by this thread at step t - 1.
                        c_prev = states[ST_AT(1, t, b, j)];
                    }
                    const float c = f * c_prev + i * g;
                    const float h = o * tanhf(c);
                    states[ST_AT(0, t + 1, b, j)] = h;
                    states[ST_AT(1, t + 1, b, j)] = c;
                    gates[GA_AT(t, b, j)] = i;
                    gates[GA_AT(t, b, HIDDEN + j)] = f;
                    gates[GA_AT(t, b, 2 * HIDDEN + j)] = g;
                    gates[GA_AT(t, b, 3 * HIDDEN + j)] = o;
                }
            }
        }
        if (t + 1 < TIME) {
            rnn_grid_sync(counter, t + 1);
        }
    }
}
