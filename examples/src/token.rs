//! A character-level language model and its data: int token inputs end to end.
//!
//! `Embedding` + `nn::Lstm` + `Linear`, trained with cross-entropy on the next token.
//! Its batch holds two int tensors, listed by `#[derive(StepInput)]`; a batch that
//! left them out would train every replay on the tokens of the captured step, which
//! the trainer's unlisted-input guard refuses.

use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, Lstm, LstmConfig};
use burn::prelude::*;
use burn_graph_capture::StepInput;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// Sizes of the language model.
#[derive(Config, Debug)]
pub struct CharLmConfig {
    /// Number of distinct tokens.
    pub vocab: usize,
    /// Embedding width.
    #[config(default = 16)]
    pub d_embed: usize,
    /// Hidden size of the LSTM.
    pub d_hidden: usize,
}

/// Embedding, LSTM, and a head scoring the next token at every position.
#[derive(Module, Debug)]
pub struct CharLm<B: Backend> {
    embedding: Embedding<B>,
    lstm: Lstm<B>,
    head: Linear<B>,
}

impl CharLmConfig {
    /// Builds the model with fresh weights from `B`'s RNG.
    pub fn init<B: Backend>(&self, device: &B::Device) -> CharLm<B> {
        CharLm {
            embedding: EmbeddingConfig::new(self.vocab, self.d_embed).init(device),
            lstm: LstmConfig::new(self.d_embed, self.d_hidden, true).init(device),
            head: LinearConfig::new(self.d_hidden, self.vocab).init(device),
        }
    }
}

impl<B: Backend> CharLm<B> {
    /// Token ids `[batch, time]` to next-token logits `[batch, time, vocab]`.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let (hidden, _state) = self.lstm.forward(self.embedding.forward(tokens), None);
        self.head.forward(hidden)
    }

    /// Mean cross-entropy of the next-token predictions against `targets` `[batch, time]`.
    pub fn loss(&self, tokens: Tensor<B, 2, Int>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        let logits = self.forward(tokens);
        let [batch, time, vocab] = logits.dims();
        let device = logits.device();
        CrossEntropyLossConfig::new().init(&device).forward(
            logits.reshape([batch * time, vocab]),
            targets.reshape([batch * time]),
        )
    }
}

/// One batch: token ids and the ids that follow them, both `[batch, time]`.
#[derive(Clone, Debug, StepInput)]
pub struct TokenBatch<B: Backend> {
    pub tokens: Tensor<B, 2, Int>,
    pub targets: Tensor<B, 2, Int>,
}

/// A deterministic token stream with structure to learn: each token follows from the
/// one before by a fixed rule, except where a seeded coin says otherwise.
#[derive(Debug)]
pub struct TokenTask {
    rng: StdRng,
    vocab: usize,
}

impl TokenTask {
    /// A task whose batches are fully determined by `seed`.
    pub fn new(seed: u64, vocab: usize) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
            vocab,
        }
    }

    /// Draws the next batch onto `device`.
    pub fn next_batch<B: Backend>(
        &mut self,
        batch: usize,
        time: usize,
        device: &B::Device,
    ) -> TokenBatch<B> {
        let vocab = self.vocab as i64;
        let mut stream = Vec::with_capacity(batch * (time + 1));
        for _ in 0..batch {
            let mut token = self.rng.random_range(0..vocab);
            for _ in 0..=time {
                stream.push(token);
                token = if self.rng.random_range(0..4) == 0 {
                    self.rng.random_range(0..vocab)
                } else {
                    (token * 5 + 3) % vocab
                };
            }
        }
        // Row b of the stream holds time + 1 tokens: inputs are the first `time`,
        // targets the last `time`.
        let shifted = |offset: usize| -> Vec<i64> {
            (0..batch)
                .flat_map(|b| (0..time).map(move |t| b * (time + 1) + t + offset))
                .map(|i| stream[i])
                .collect()
        };
        let (tokens, targets) = (shifted(0), shifted(1));
        TokenBatch {
            tokens: Tensor::from_data(TensorData::new(tokens, [batch, time]), device),
            targets: Tensor::from_data(TensorData::new(targets, [batch, time]), device),
        }
    }
}
