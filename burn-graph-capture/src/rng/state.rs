//! The generator's state as the device holds it: four 32-bit words `[key_lo, key_hi,
//! offset_lo, offset_hi]` in an int tensor of the backend's int type (their bits, read
//! as `u32` by the kernels). The `j`-th draw of a step reads offset `offset + j`; after
//! the step the offset advances by the number of draws, so every step, replayed or not,
//! draws fresh numbers.

use burn_backend::{DType, TensorData};

/// Words in the state.
pub const WORDS: usize = 4;

/// The state's key and offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Words {
    /// The Philox key.
    pub key: u64,
    /// The offset of the step's first draw.
    pub offset: u64,
}

impl Words {
    /// Its four 32-bit words.
    pub fn to_u32(self) -> [u32; WORDS] {
        let Words { key, offset } = self;
        [
            key as u32,
            (key >> 32) as u32,
            offset as u32,
            (offset >> 32) as u32,
        ]
    }

    /// From four 32-bit words.
    pub fn from_u32(words: [u32; WORDS]) -> Self {
        let wide = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
        Self {
            key: wide(words[0], words[1]),
            offset: wide(words[2], words[3]),
        }
    }

    /// The state after `draws` more draws.
    pub fn advanced(self, draws: u32) -> Self {
        Self {
            offset: self.offset.wrapping_add(u64::from(draws)),
            ..self
        }
    }

    /// As tensor data of `dtype`, an int type of 32 bits or more (each word's bits, in
    /// the low 32 bits of an element). `None` for narrower types.
    pub fn to_data(self, dtype: DType) -> Option<TensorData> {
        let words = self.to_u32();
        let data = match dtype {
            DType::I32 => TensorData::new(words.map(|w| w as i32).to_vec(), [WORDS]),
            DType::U32 => TensorData::new(words.to_vec(), [WORDS]),
            DType::I64 => TensorData::new(words.map(i64::from).to_vec(), [WORDS]),
            DType::U64 => TensorData::new(words.map(u64::from).to_vec(), [WORDS]),
            _ => return None,
        };
        Some(data)
    }

    /// From tensor data that [`to_data`](Self::to_data) wrote.
    pub fn from_data(data: &TensorData) -> Option<Self> {
        let words: Vec<u32> = match data.dtype {
            DType::I32 => data
                .as_slice::<i32>()
                .ok()?
                .iter()
                .map(|&w| w as u32)
                .collect(),
            DType::U32 => data.as_slice::<u32>().ok()?.to_vec(),
            DType::I64 => data
                .as_slice::<i64>()
                .ok()?
                .iter()
                .map(|&w| w as u32)
                .collect(),
            DType::U64 => data
                .as_slice::<u64>()
                .ok()?
                .iter()
                .map(|&w| w as u32)
                .collect(),
            _ => return None,
        };
        Some(Self::from_u32(words.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_through_both_int_types() {
        let words = Words {
            key: 0x0123_4567_89ab_cdef,
            offset: u64::MAX - 1,
        };
        assert_eq!(Words::from_u32(words.to_u32()), words);
        for dtype in [DType::I32, DType::U32, DType::I64, DType::U64] {
            let data = words.to_data(dtype).unwrap();
            assert_eq!(Words::from_data(&data), Some(words));
        }
        assert!(words.to_data(DType::I16).is_none());
    }

    #[test]
    fn advancing_carries_into_the_high_word() {
        let words = Words {
            key: 9,
            offset: u64::from(u32::MAX),
        };
        let next = words.advanced(3);
        assert_eq!(next.offset, u64::from(u32::MAX) + 3);
        assert_eq!(next.to_u32()[3], 1);
        assert_eq!(next.key, 9);
    }
}
