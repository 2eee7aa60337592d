//! Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011):
//! a counter-based generator, so the values of a draw are a pure function of the seed,
//! the draw's offset and each element's index. Nothing is carried from one element to
//! the next, so a kernel computes any element on its own, and a draw inside a graph
//! reads its offset from device memory instead of baking a host seed into the graph.
//!
//! The host implementation here is the reference that the CubeCL kernel follows, and
//! what CPU backends run.

/// Multipliers and Weyl increments of Philox4x32.
const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;
/// Rounds of Philox4x32-10.
const ROUNDS: usize = 10;

fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let product = u64::from(a) * u64::from(b);
    ((product >> 32) as u32, product as u32)
}

/// The four 32-bit words of block `counter` under `key`.
pub fn philox4x32(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for round in 0..ROUNDS {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let (hi0, lo0) = mulhilo(M0, c[0]);
        let (hi1, lo1) = mulhilo(M1, c[2]);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// The block holding element `index` of the draw at `offset` under `seed`: elements
/// `4b .. 4b + 4` come from block `b`, whose counter is `[b, b >> 32, offset,
/// offset >> 32]`.
pub fn block(seed: u64, offset: u64, index: u64) -> [u32; 4] {
    let b = index / 4;
    philox4x32(
        [
            b as u32,
            (b >> 32) as u32,
            offset as u32,
            (offset >> 32) as u32,
        ],
        [seed as u32, (seed >> 32) as u32],
    )
}

/// A uniform value in `[0, 1)` from 24 random bits (every value exact in f32).
pub fn unit(word: u32) -> f32 {
    (word >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// A uniform value in `(0, 1]`, for logarithms.
pub fn unit_open_low(word: u32) -> f32 {
    ((word >> 8) + 1) as f32 * (1.0 / 16_777_216.0)
}

/// Element `index` of a standard normal draw: elements `2p` and `2p + 1` are the two
/// Box–Muller values of the word pair `p` of their block.
pub fn standard_normal(words: [u32; 4], index: u64) -> f32 {
    let pair = (index % 4) as usize / 2;
    let radius = (-2.0 * unit_open_low(words[2 * pair]).ln()).sqrt();
    let angle = 2.0 * std::f32::consts::PI * unit(words[2 * pair + 1]);
    if index.is_multiple_of(2) {
        radius * angle.cos()
    } else {
        radius * angle.sin()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known-answer vectors of Random123's `kat_vectors` for philox4x32_10.
    #[test]
    fn matches_the_random123_known_answers() {
        assert_eq!(
            philox4x32([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn offsets_and_seeds_give_other_streams() {
        assert_ne!(block(1, 0, 0), block(1, 1, 0));
        assert_ne!(block(1, 0, 0), block(2, 0, 0));
        assert_eq!(block(1, 0, 0), block(1, 0, 3));
        assert_ne!(block(1, 0, 0), block(1, 0, 4));
    }

    #[test]
    fn units_stay_in_their_intervals() {
        for word in [0, 1, 255, 256, u32::MAX] {
            assert!((0.0..1.0).contains(&unit(word)));
            assert!(unit_open_low(word) > 0.0 && unit_open_low(word) <= 1.0);
        }
    }
}
