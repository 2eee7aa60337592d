//! Shakespeare's Sonnets (public domain; see `data/README.md`) as a character-level
//! language-modelling task with int token inputs.
//!
//! The vocabulary is the text's distinct characters. The first 90 % trains, the rest is
//! held out. A training batch is a set of random windows (seeded); the held-out score
//! is the mean cross-entropy in bits per character, against the unigram baseline (each
//! character predicted by its training frequency).

use burn::prelude::*;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::{CharLm, TokenBatch};

/// The embedded text.
const TEXT: &str = include_str!("../data/sonnets.txt");

/// Share of the text, from its start, used for training.
const TRAIN_SHARE: f64 = 0.9;

/// The text as token ids, with its vocabulary and split point.
#[derive(Clone, Debug)]
pub struct Corpus {
    /// Distinct characters, sorted; a token id indexes this.
    pub vocab: Vec<char>,
    /// The text as token ids.
    pub ids: Vec<i64>,
    /// First token of the held-out split.
    pub split: usize,
}

/// Held-out cross-entropy of the model and of the unigram baseline.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct TextEvaluation {
    /// The model's mean cross-entropy, in bits per character.
    pub bits_per_char: f32,
    /// The unigram baseline's, in bits per character.
    pub unigram_bits_per_char: f32,
    /// Characters scored.
    pub chars: usize,
}

impl Corpus {
    /// The embedded Sonnets.
    pub fn sonnets() -> Self {
        Self::new(TEXT)
    }

    /// Tokenizes `text` by character.
    pub fn new(text: &str) -> Self {
        let mut vocab: Vec<char> = text.chars().collect();
        vocab.sort_unstable();
        vocab.dedup();
        let ids: Vec<i64> = text
            .chars()
            .map(|c| vocab.binary_search(&c).expect("in the vocabulary") as i64)
            .collect();
        let split = (ids.len() as f64 * TRAIN_SHARE) as usize;
        Self { vocab, ids, split }
    }

    /// `batch` random training windows of `time` tokens, and the tokens after them.
    pub fn batch<B: Backend>(
        &self,
        rng: &mut StdRng,
        batch: usize,
        time: usize,
        device: &B::Device,
    ) -> TokenBatch<B> {
        let starts: Vec<usize> = (0..batch)
            .map(|_| rng.random_range(0..self.split - time - 1))
            .collect();
        self.windows(&starts, time, device)
    }

    /// The windows of `time` tokens starting at `starts`, with their next tokens.
    pub fn windows<B: Backend>(
        &self,
        starts: &[usize],
        time: usize,
        device: &B::Device,
    ) -> TokenBatch<B> {
        let take = |offset: usize| -> Vec<i64> {
            starts
                .iter()
                .flat_map(|&s| self.ids[s + offset..s + offset + time].to_vec())
                .collect()
        };
        let shape = [starts.len(), time];
        TokenBatch {
            tokens: Tensor::from_data(TensorData::new(take(0), shape), device),
            targets: Tensor::from_data(TensorData::new(take(1), shape), device),
        }
    }

    /// Scores `model` on every full held-out window of `time` tokens.
    pub fn evaluate<B: Backend>(
        &self,
        model: &CharLm<B>,
        time: usize,
        device: &B::Device,
    ) -> TextEvaluation {
        let starts: Vec<usize> = (self.split..self.ids.len() - time - 1)
            .step_by(time)
            .collect();
        let batch = self.windows::<B>(&starts, time, device);
        let nats: f32 = model.loss(batch.tokens, batch.targets).into_scalar().elem();
        TextEvaluation {
            bits_per_char: nats / std::f32::consts::LN_2,
            unigram_bits_per_char: self.unigram_bits(&starts, time),
            chars: starts.len() * time,
        }
    }

    /// Cross-entropy, in bits, of predicting each target of the windows by its
    /// training-split frequency (add-one smoothed).
    fn unigram_bits(&self, starts: &[usize], time: usize) -> f32 {
        let mut counts = vec![1.0f64; self.vocab.len()];
        for &id in &self.ids[..self.split] {
            counts[id as usize] += 1.0;
        }
        let total: f64 = counts.iter().sum();
        let targets = starts.iter().flat_map(|&s| &self.ids[s + 1..s + 1 + time]);
        let bits: f64 = targets
            .map(|&id| -(counts[id as usize] / total).log2())
            .sum();
        (bits / (starts.len() * time) as f64) as f32
    }
}

/// A seeded RNG for drawing training windows.
pub fn sampler(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    #[test]
    fn the_sonnets_tokenize_into_their_characters() {
        let corpus = Corpus::sonnets();
        assert_eq!(corpus.ids.len(), 95_728);
        assert_eq!(corpus.vocab.len(), 62);
        let decoded: String = corpus.ids[..11]
            .iter()
            .map(|&i| corpus.vocab[i as usize])
            .collect();
        assert_eq!(decoded, "THE SONNETS");
    }

    #[test]
    fn targets_are_the_next_tokens() {
        let corpus = Corpus::new("abcdefgh");
        let batch = corpus.windows::<Flex>(&[1], 3, &Default::default());
        assert_eq!(
            batch
                .tokens
                .into_data()
                .convert::<i64>()
                .to_vec::<i64>()
                .unwrap(),
            [1, 2, 3]
        );
        assert_eq!(
            batch
                .targets
                .into_data()
                .convert::<i64>()
                .to_vec::<i64>()
                .unwrap(),
            [2, 3, 4]
        );
    }

    #[test]
    fn training_windows_stay_in_the_training_split() {
        let corpus = Corpus::sonnets();
        let mut rng = sampler(3);
        let batch = corpus.batch::<Flex>(&mut rng, 64, 32, &Default::default());
        assert_eq!(batch.tokens.dims(), [64, 32]);
        let unigram = corpus.unigram_bits(&[corpus.split], 32);
        assert!((3.0..6.0).contains(&unigram), "{unigram}");
    }
}
