// The forward recurrence in one launch. Block `blockIdx.x` owns hidden units
// [j0, j0 + UNITS): their four gate columns of W_h stay in shared memory for the whole
// sequence. Per step, warp `w` takes ROWS batch rows at a time (w * ROWS, ..., then
// WARPS * ROWS further on): its lanes split the dot products of those rows of h_{t-1}
// with the block's columns, each weight read from shared memory once for all ROWS rows,
// and the warp adds them up. Lane r * UNITS + u then updates row r's unit j0 + u (its
// cell state stays with that lane from step to step). The blocks meet after each step,
// since step t + 1 reads every unit of h_t.
//
// Outputs as the stepwise kernels write them: states [2, TIME + 1, BATCH, HIDDEN]
// (hidden, cell; the initial state at index 0) and the activated gates
// [TIME, BATCH, 4H], packed [input, forget, cell, output].

#define XP_AT(b, t, c) ((offset_t)(b) * XP_S0 + (offset_t)(t) * XP_S1 + (offset_t)(c) * XP_S2)
#define ST_AT(kind, t, b, j) \
    ((offset_t)(kind) * ST_S0 + (offset_t)(t) * ST_S1 + (offset_t)(b) * ST_S2 + (offset_t)(j) * ST_S3)
#define GA_AT(t, b, c) ((offset_t)(t) * GA_S0 + (offset_t)(b) * GA_S1 + (offset_t)(c) * GA_S2)
#define H_ROUNDS ((HIDDEN + 31) / 32)
#define COLUMNS (UNITS * 4)

extern "C" __global__ void __launch_bounds__(THREADS, 1)
lstm_persistent_forward(const float* __restrict__ xp, const float* __restrict__ wh,
                        const float* __restrict__ h0, const float* __restrict__ c0,
                        float* states, float* __restrict__ gates, unsigned int* counter) {
    // w[(u * 4 + g) * HIDDEN + k] = W_h[k, g * HIDDEN + j0 + u]: lanes read along k.
    __shared__ float w[COLUMNS * HIDDEN];
    const int j0 = blockIdx.x * UNITS;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    for (int index = threadIdx.x; index < COLUMNS * HIDDEN; index += THREADS) {
        const int k = index % HIDDEN;
        const int column = index / HIDDEN;
        const int j = j0 + column / 4;
        const int gate = column % 4;
        w[index] = j < HIDDEN
            ? wh[(offset_t)k * WH_S0 + (offset_t)(gate * HIDDEN + j) * WH_S1]
            : 0.0f;
    }
    __syncthreads();
    // The (row, unit) this lane updates.
    const int my_row = lane / UNITS;
    const int my_unit = lane % UNITS;
    const int j = j0 + my_unit;

    for (int t = 0; t < TIME; ++t) {
        for (int b0 = warp * ROWS; b0 < BATCH; b0 += WARPS * ROWS) {
            float z[ROWS][COLUMNS];
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
#pragma unroll
                for (int n = 0; n < COLUMNS; ++n) {
                    z[r][n] = 0.0f;
                }
            }
#pragma unroll
            for (int round = 0; round < H_ROUNDS; ++round) {
                const int k = round * 32 + lane;
                if (k < HIDDEN) {
                    float h[ROWS];
#pragma unroll
                    for (int r = 0; r < ROWS; ++r) {
                        const int b = b0 + r;
                        // h_t of other blocks: read from L2 (`__ldcg`), never a stale L1 line.
                        h[r] = b >= BATCH ? 0.0f
                             : t == 0     ? h0[(offset_t)b * H0_S0 + (offset_t)k * H0_S1]
                                          : __ldcg(states + ST_AT(0, t, b, k));
                    }
#pragma unroll
                    for (int n = 0; n < COLUMNS; ++n) {
                        const float weight = w[n * HIDDEN + k];
#pragma unroll
                        for (int r = 0; r < ROWS; ++r) {
                            z[r][n] += h[r] * weight;
                        }
                    }
                }
            }
            // Every lane gets the totals, then keeps its own row's and unit's four.
            float mine[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                rnn_warp_sum<COLUMNS>(z[r]);
#pragma unroll
                for (int u = 0; u < UNITS; ++u) {
                    if (my_row == r && my_unit == u) {
#pragma unroll
                        for (int g = 0; g < 4; ++g) {
                            mine[g] = z[r][u * 4 + g];
                        }
                    }
                }
            }
            const int b = b0 + my_row;
            if (my_row < ROWS && b < BATCH && j < HIDDEN) {
                const float i = rnn_sigmoid(xp[XP_AT(b, t, j)] + mine[0]);
                const float f = rnn_sigmoid(xp[XP_AT(b, t, HIDDEN + j)] + mine[1]);
                const float g = tanhf(xp[XP_AT(b, t, 2 * HIDDEN + j)] + mine[2]);
                const float o = rnn_sigmoid(xp[XP_AT(b, t, 3 * HIDDEN + j)] + mine[3]);
                float c_prev;
                if (t == 0) {
                    c_prev = c0[(offset_t)b * C0_S0 + (offset_t)j * C0_S1];
                    states[ST_AT(0, 0, b, j)] = h0[(offset_t)b * H0_S0 + (offset_t)j * H0_S1];
                    states[ST_AT(1, 0, b, j)] = c_prev;
                } else {
                    // Written by this lane at step t - 1.
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
        if (t + 1 < TIME) {
            rnn_grid_sync(counter, t + 1);
        }
    }
}
